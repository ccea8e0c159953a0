"""The README and the pages of `docs/`: their snippets run as written, their commands name only options their scripts
take, their links lead somewhere, and the README stays a front page."""

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from rlcaption.cli import build_parser
from test_recipes import load_recipe

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
# the README and every page of docs/, methods included
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
README_MAX_LINES = 250
SHAPES = ("circle", "square", "triangle", "star", "diamond", "hexagon")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPOSITORY))


def _section(heading: str, page: Path = README) -> str:
    """The text of `page` under its `## heading`, up to the next heading of that level."""
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n", text, re.MULTILINE)
    assert match, f"{_page_id(page)} has no section '## {heading}'"
    section = text[match.end() :]
    end = section.find("\n## ")
    return section if end == -1 else section[:end]


def _python_block_after(heading: str, page: Path = README) -> str:
    """The first Python block of the section `## heading` of `page`."""
    block = re.search(r"```python\n(.*?)```", _section(heading, page), re.DOTALL)
    assert block, f"the section '## {heading}' of {_page_id(page)} has no Python block"
    return block.group(1)


def _without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def _shell_commands(text: str) -> list[list[str]]:
    """The commands of the text's bash blocks, continuation lines joined, comments left out."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line, comments=True))
    return commands


@pytest.fixture(scope="module")
def datasets_cache(tmp_path_factory) -> Path:
    """One `datasets` cache for the snippets that run, so the shapes benchmark is generated once for all of them."""
    return tmp_path_factory.mktemp("datasets")


def _run_snippet(code: str, folder: Path, datasets_cache: Path) -> subprocess.CompletedProcess:
    """Runs `code` where a user of a clone runs it, its root, with the repository's checkpoints and nothing else."""
    (folder / "checkpoints").symlink_to(REPOSITORY / "checkpoints")
    env = {**os.environ, "HF_DATASETS_CACHE": str(datasets_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _in_fewer_steps(code: str, steps: int = 2) -> str:
    """`code` with its training run cut to `steps` optimizer steps: the test runs every line, not every step."""
    assert len(re.findall(r"\bmax_steps=\d+", code)) == 1, code
    return re.sub(r"\bmax_steps=\d+", f"max_steps={steps}", code)


# ------------------------------------------------------------------ the README, a front page


def test_the_readme_is_a_front_page_with_the_two_commands_first():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the details into docs/"
    opening = "\n".join(lines[:40])
    assert "make demo" in opening and "make test" in opening


def test_the_published_checkpoint_snippet_captions_an_image_and_leaves_it_for_the_command_line(
    tmp_path, datasets_cache
):
    result = _run_snippet(_python_block_after("Use a published checkpoint"), tmp_path, datasets_cache)
    (caption,) = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert any(shape in caption for shape in SHAPES), caption
    assert (tmp_path / "scene.png").is_file()  # what the shell example after it captions


def test_the_training_snippet_trains_the_published_warm_start_with_scst(tmp_path, datasets_cache):
    code = _python_block_after("Train")
    assert "SCSTConfig(" in code and "checkpoints/show-tell-rl-shapes-xe" in code
    result = _run_snippet(_in_fewer_steps(code), tmp_path, datasets_cache)
    scores = result.stdout.strip().splitlines()[-1]  # the evaluation's dict, its NaNs included
    assert re.search(r"'eval_CIDEr': \d", scores) and re.search(r"'eval_object_f1': \d", scores), scores
    assert (tmp_path / "runs" / "scst").is_dir()


# ------------------------------------------------------------------ docs/ pages that run


def test_the_custom_reward_snippet_trains_with_a_reward_beside_a_built_in(tmp_path, datasets_cache):
    code = _python_block_after("Your own rewards", DOCS / "rewards.md")
    assert "reward_funcs=[" in code
    _run_snippet(_in_fewer_steps(code), tmp_path, datasets_cache)
    assert (tmp_path / "runs" / "scst-short").is_dir()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_python_block_parses(page):
    for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
        ast.parse(block)


# ------------------------------------------------------------------ commands


class _Parsed(Exception):
    """Stops a recipe once its arguments are parsed."""


def _parse_recipe_command(words: list[str], monkeypatch) -> tuple[str, object, object, list[str]]:
    """Parses a recipe's command line (`[VAR=value ...] python|accelerate launch [...] examples/<recipe>.py ...`) with
    the script's own parser, its method config's checks included: `(recipe, script_args, training_args, arguments)`."""
    script_index = next(i for i, word in enumerate(words) if word.endswith(".py"))
    script, arguments = words[script_index], words[script_index + 1 :]
    recipe = Path(script).stem
    module = load_recipe(recipe)
    if "--bf16" in arguments:  # a GPU command: parsed as on a GPU with bfloat16, which this machine may lack
        monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    if recipe == "train_embedding":  # parses its own training arguments, not a method config
        parser = HfArgumentParser((module.ScriptArguments, module.EmbeddingTrainingArguments))
        script_args, training_args = parser.parse_args_into_dataclasses(args=arguments)
    else:
        parse = module.parse_recipe_arguments

        def parse_then_stop(*args, parse=parse, **kwargs):
            raise _Parsed(parse(*args, **kwargs))

        monkeypatch.setattr(module, "parse_recipe_arguments", parse_then_stop)
        with pytest.raises(_Parsed) as parsed:
            module.main(arguments)
        script_args, training_args = parsed.value.args[0]
    # written in full: argparse would also take an abbreviation of an option
    options = {word[2:] for word in arguments if word.startswith("--")}
    assert options <= set(vars(script_args)) | set(vars(training_args)), (recipe, options)
    return recipe, script_args, training_args, arguments


def _recipe_commands(page: Path) -> list[list[str]]:
    return [
        words
        for words in _shell_commands(page.read_text(encoding="utf-8"))
        if any(re.fullmatch(r"examples/train_\w+\.py", word) for word in words) and "..." not in words
    ]


def test_the_coco_commands_name_only_options_their_scripts_take(tmp_path, monkeypatch):
    """Every command of "From shapes to COCO" parses with its script's own parser (the recipe's method config, its
    checks included), and every recipe has one."""
    monkeypatch.chdir(tmp_path)  # the commands' relative output folders resolve in an empty folder
    section = _section("From shapes to COCO", DOCS / "coco.md")
    recipes = []
    for words in _shell_commands(section):
        if words[0] == "rlcaption":
            build_parser().parse_args(words[1:])
            continue
        if words[:2] == ["python", "-c"]:
            ast.parse(words[2])
            continue
        recipe, script_args, _, _ = _parse_recipe_command(words, monkeypatch)
        recipes.append(recipe)
        assert script_args.image_features == "features/coco", recipe
    assert sorted(recipes) == sorted(
        ["train_xe", "train_scst", "train_spider", "train_sle", "train_wtf", "train_psst", "train_embedding",
         "train_actor_critic"]
    )  # fmt: skip
    ast.parse(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))


@pytest.mark.parametrize("page", [page for page in PAGES if _recipe_commands(page)], ids=_page_id)
def test_every_recipe_command_names_only_options_its_script_takes(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for words in _recipe_commands(page):
        _parse_recipe_command(words, monkeypatch)


def _rlcaption_commands(page: Path) -> list[list[str]]:
    return [words for words in _shell_commands(page.read_text(encoding="utf-8")) if words[0] == "rlcaption"]


@pytest.mark.parametrize("page", [page for page in PAGES if _rlcaption_commands(page)], ids=_page_id)
def test_every_rlcaption_command_parses(page):
    for words in _rlcaption_commands(page):
        build_parser().parse_args(words[1:])


# ------------------------------------------------------------------ links


def _heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation but `-` and `_` dropped, spaces `-`."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _without_code_blocks(page.read_text(encoding="utf-8")), re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    text = _without_code_blocks(page.read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(target)
        elif anchor and destination.suffix == ".md" and anchor not in _heading_anchors(destination):
            broken.append(target)
    assert broken == [], f"{_page_id(page)} links to what does not exist: {broken}"
