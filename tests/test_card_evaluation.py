"""One shapes benchmark: `load_shapes()` is the dataset of the recipes, the CLI, the demo and the published cards, and
each card's "How to evaluate" snippet, run as a user runs it, gives the card's numbers."""

import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from rlcaption.data import load_shapes
from rlcaption.recipes import RecipeArguments
from rlcaption.shapes.dataset import shapes_cache_path
from rlcaption.shapes.demo import DemoSettings
from test_published_checkpoints import offline_hub_cache

REPOSITORY = Path(__file__).resolve().parents[1]
CHECKPOINTS = REPOSITORY / "checkpoints"
PUBLISHED = sorted(folder.name for folder in CHECKPOINTS.iterdir() if (folder / "README.md").is_file())
# card metric name -> key of the snippet's scores
CARD_KEYS = {"CIDEr-D": "CIDEr", "BLEU-4": "Bleu_4", "ROUGE-L": "ROUGE_L", "Object F1 (colour+shape)": "object_f1"}


def _card_section(name: str, heading: str) -> str:
    text = (CHECKPOINTS / name / "README.md").read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _snippet(name: str) -> str:
    match = re.search(r"```python\n(.*?)```", _card_section(name, "How to evaluate"), re.DOTALL)
    assert match, f"{name}: no Python snippet under 'How to evaluate'"
    return match.group(1)


def test_load_shapes_defaults_are_the_dataset_of_the_recipes_the_cli_and_the_demo():
    defaults = {name: parameter.default for name, parameter in inspect.signature(load_shapes).parameters.items()}
    benchmark = (defaults["num_train"], defaults["num_validation"], defaults["num_test"], defaults["image_size"])
    # `rlcaption evaluate --dataset shapes` and every recipe load `RecipeArguments()`'s shapes
    recipe = RecipeArguments()
    assert benchmark == (
        recipe.num_train_images, recipe.num_validation_images, recipe.num_test_images, recipe.image_size
    )  # fmt: skip
    assert defaults["seed"] == recipe.shapes_seed
    demo = DemoSettings()
    assert benchmark == (demo.num_train, demo.num_validation, demo.num_test, demo.image_size)
    # the same arguments are the same cached dataset, image for image
    assert shapes_cache_path() == shapes_cache_path(
        recipe.num_train_images, recipe.num_validation_images, recipe.num_test_images, recipe.image_size
    )


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_card_loads_by_its_published_id_and_shows_how_to_evaluate(name):
    card = ModelCard.load(CHECKPOINTS / name / "README.md")
    published_id = f"rlcaption/{card.data.model_name}"
    assert f"`{published_id}`" in (REPOSITORY / "model_cards" / "README.md").read_text()  # the id the index lists
    usage, snippet = _card_section(name, "How to use"), _snippet(name)
    assert f'from_pretrained("{published_id}")' in usage or f'model="{published_id}"' in usage
    assert f'"{published_id}"' in snippet and "load_shapes(" in snippet
    assert not re.search(r'from_pretrained\("(?!rlcaption/)', usage + snippet)  # no folder names
    text = (CHECKPOINTS / name / "README.md").read_text()
    assert (REPOSITORY / "model_cards" / f"{name}.md").read_text() == text
    # the pictures the card shows are beside it on the Hub and beside its copy, the same picture
    for picture in re.findall(r"!\[[^\]]*\]\(([^)/]+\.png)\)", text):
        assert (REPOSITORY / "model_cards" / picture).read_bytes() == (CHECKPOINTS / name / picture).read_bytes()


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_name_a_card_snippet_imports_exists(name):
    # the slow test below runs two snippets whole; every snippet's imports are checked here
    imports = re.findall(r"^from ([\w.]+) import ([\w, ]+?)(?:\s+#.*)?$", _snippet(name), flags=re.MULTILINE)
    assert imports
    for module_name, names in imports:
        module = importlib.import_module(module_name)
        for imported in names.split(","):
            assert hasattr(module, imported.strip()), f"{module_name}.{imported.strip()}"


def _run_snippet_offline(name: str, tmp_path) -> dict:
    env = offline_hub_cache(tmp_path, f"rlcaption/{name}", CHECKPOINTS / name)
    script = _snippet(name) + "\nimport json\nprint(json.dumps(scores))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["show-tell-rl-shapes-xe", "show-tell-rl-shapes-spider-pg-cider"])
def test_the_card_snippet_reproduces_the_card(name, tmp_path):
    card = ModelCard.load(CHECKPOINTS / name / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    scores = _run_snippet_offline(name, tmp_path)
    for metric_name, key in CARD_KEYS.items():
        assert scores[key] == pytest.approx(reported[metric_name], abs=1e-3), textwrap.shorten(str(scores), 500)
