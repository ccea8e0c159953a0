"""The CLIP recipe: its batching helpers on real shapes data, and a tiny run end to end as a user launches it."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModel, AutoProcessor

from rlcaption.data import load_shapes
from rlcaption.models import ShapesCLIPModel
from rlcaption.shapes.dataset import most_specific_reference
from test_recipes import EXAMPLES, load_recipe


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("train_clip")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(60, 4, 4, image_size=48, seed=5, cache_dir=tmp_path_factory.mktemp("shapes"))


def test_families_are_runs_of_one_attribute_variants(recipe, shapes):
    scenes = shapes["train"]["scene"]
    families = recipe.family_ids(scenes)
    assert families == sorted(families) and families[0] == 0  # consecutive rows, numbered in order
    sizes = Counter(families).values()
    assert max(sizes) <= 3 and any(size > 1 for size in sizes)  # a base and at most two variants
    for row in range(1, len(scenes)):
        if families[row] == families[row - 1]:
            base = scenes[families.index(families[row])]
            assert recipe._is_variant(base, scenes[row])


def test_family_sampler_keeps_families_together_and_reshuffles_each_epoch(recipe):
    families = [0, 0, 1, 2, 2, 2, 3]
    sampler = recipe.FamilySampler(families, seed=0)
    epochs = [list(sampler) for _ in range(4)]
    for order in epochs:
        assert sorted(order) == list(range(7))
        for family in set(families):
            positions = [position for position, row in enumerate(order) if families[row] == family]
            assert positions == list(range(positions[0], positions[0] + len(positions)))  # adjacent rows
    assert len({tuple(order) for order in epochs}) > 1


def test_generic_references_are_recognised(recipe, shapes):
    references = [caption for captions in shapes["train"]["captions"] for caption in captions]
    generic = [caption for caption in references if recipe.is_generic(caption)]
    assert len(generic) == 2 * len(shapes["train"])  # two generic references per image
    assert not recipe.is_generic("a grey circle") and recipe.is_generic("two simple figures on a white canvas")
    specific = [caption for caption in references if recipe.is_specific(caption)]
    assert len(shapes["train"]) <= len(specific) <= 2 * len(shapes["train"])  # one or two specific ones per image
    # the retrieval query of every image is one of its specific references
    assert all(recipe.is_specific(most_specific_reference(captions)) for captions in shapes["train"]["captions"])


def test_collator_draws_specific_references_with_the_given_probability(recipe, shapes):
    references = shapes["train"]["captions"]
    processor = None  # choose_reference does not tokenize
    always = recipe.ContrastiveCollator(processor, specific_reference_probability=1.0)
    never = recipe.ContrastiveCollator(processor, specific_reference_probability=0.0)
    for captions in references:
        assert recipe.is_specific(always.choose_reference(captions))
        chosen = never.choose_reference(captions)
        assert not recipe.is_generic(chosen)
        assert not recipe.is_specific(chosen) or all(recipe.is_specific(c) or recipe.is_generic(c) for c in captions)
    with pytest.raises(ValueError, match="not in"):
        recipe.ContrastiveCollator(processor, specific_reference_probability=1.5)


def test_recipe_trains_and_writes_a_hub_ready_folder(tmp_path):
    output_dir = tmp_path / "clip"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, str(EXAMPLES / "train_clip.py"), "--output_dir", str(output_dir), "--use_cpu",
        "--num_train_images", "24", "--num_validation_images", "6", "--num_test_images", "6", "--image_size", "16",
        "--cnn_channels", "4", "8", "--word_embedding_size", "8", "--text_hidden_size", "8", "--projection_dim", "8",
        "--per_device_train_batch_size", "8", "--max_steps", "3", "--logging_steps", "1", "--disable_tqdm", "true",
        "--report_to", "none", "--hub_model_id", "org/tiny-clip",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    names = {path.name for path in output_dir.iterdir()}
    assert {"config.json", "model.safetensors", "processor_config.json", "tokenizer.json", "README.md"} <= names
    assert not [name for name in names if name.endswith(".py") or name == "training_args.bin"]
    model = AutoModel.from_pretrained(output_dir)
    assert type(model) is ShapesCLIPModel and model.config.image_size == 16
    processor = AutoProcessor.from_pretrained(output_dir)
    assert processor.image_processor.size == {"height": 16, "width": 16}

    results = json.loads((output_dir / "eval_results.json").read_text())
    card = ModelCard.load(output_dir / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert reported["text-to-image R@1"] == round(results["test"]["t2i_R@1"], 4)
    assert set(reported) == {f"{way} R@{k}" for way in ("text-to-image", "image-to-text") for k in (1, 5, 10)}
    assert 'AutoModel.from_pretrained("org/tiny-clip")' in card.text
    with torch.no_grad():
        inputs = processor(images=[torch.rand(3, 64, 64)], text=["a red circle"])
        assert model(**inputs).logits_per_image.shape == (1, 1)
