"""The README's snippets run as written."""

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from rlcaption.cli import _build_parser
from test_recipes import load_recipe

REPOSITORY = Path(__file__).resolve().parents[1]


def _python_block_after(heading: str) -> str:
    readme = (REPOSITORY / "README.md").read_text()
    section = readme[readme.index(f"## {heading}\n") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_published_checkpoint_snippet_captions_an_image_and_leaves_it_for_the_command_line(tmp_path):
    # run where a user of a clone runs it, its root, with the repository's checkpoints and nothing else
    (tmp_path / "checkpoints").symlink_to(REPOSITORY / "checkpoints")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _python_block_after("Use a published checkpoint")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (caption,) = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert any(shape in caption for shape in ("circle", "square", "triangle", "star", "diamond", "hexagon")), caption
    assert (tmp_path / "scene.png").is_file()  # what the shell example after it captions


def _section(heading: str) -> str:
    readme = (REPOSITORY / "README.md").read_text()
    section = readme[readme.index(f"## {heading}\n") + 1 :]
    return section[: section.find("\n## ")]


def _shell_commands(section: str) -> list[list[str]]:
    """The commands of the section's bash blocks, continuation lines joined, comments left out."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line))
    return commands


class _Parsed(Exception):
    """Stops a recipe once its arguments are parsed."""


def test_the_coco_commands_name_only_options_their_scripts_take(tmp_path, monkeypatch):
    """Every command of "From shapes to COCO" parses with its script's own parser (the recipe's method config, its
    checks included), and every recipe has one."""
    monkeypatch.chdir(tmp_path)  # the commands' relative output folders resolve in an empty folder
    section = _section("From shapes to COCO")
    recipes = []
    for words in _shell_commands(section):
        if words[0] == "rlcaption":
            _build_parser().parse_args(words[1:])
            continue
        if words[:2] == ["python", "-c"]:
            ast.parse(words[2])
            continue
        script, arguments = (words[2], words[3:]) if words[0] == "accelerate" else (words[1], words[2:])
        recipe = Path(script).stem
        recipes.append(recipe)
        module = load_recipe(recipe)
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
        assert script_args.image_features == "features/coco", recipe
        # written in full: argparse would also take an abbreviation of an option
        options = {word[2:] for word in arguments if word.startswith("--")}
        assert options <= set(vars(script_args)) | set(vars(training_args)), (recipe, options)
    assert sorted(recipes) == sorted(
        ["train_xe", "train_scst", "train_spider", "train_sle", "train_wtf", "train_psst", "train_embedding",
         "train_actor_critic"]
    )  # fmt: skip
    ast.parse(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))
