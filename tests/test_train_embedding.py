"""The embedding recipe (`examples/train_embedding.py`): a tiny run end to end, its Hub folder, card and reward, and
the inputs it refuses."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import huggingface_hub
import numpy as np
import pytest
from huggingface_hub import ModelCard
from PIL import Image
from transformers import AutoModel, ViTConfig, ViTModel

from rlcaption.data import load_shapes
from rlcaption.models import VisualSemanticEmbedding
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import get_reward
from rlcaption.shapes.dataset import most_specific_reference
from test_published_checkpoints import offline_hub_cache
from test_recipes import EXAMPLES, load_recipe

XE_CAPTIONER = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
HUB_ID = "org/tiny-embedding"
# Few images and a small GRU over the published XE captioner's fixed CNN: enough steps to learn, seconds to run.
TINY_RUN = [
    "--captioner_name_or_path", str(XE_CAPTIONER),
    "--num_train_images", "200", "--num_validation_images", "1", "--num_test_images", "12",
    "--word_embedding_size", "16", "--hidden_size", "32", "--joint_embedding_size", "16",
    "--num_steps", "300", "--batch_size", "32", "--learning_rate", "3e-3", "--logging_steps", "100",
]  # fmt: skip


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("train_embedding")


@pytest.fixture(scope="module")
def shapes_cache(tmp_path_factory):
    """The shapes datasets of this module, generated into a temporary cache instead of the user's."""
    cache = tmp_path_factory.mktemp("datasets")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
        yield cache


@pytest.fixture(scope="module")
def trained(recipe, shapes_cache, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("runs") / "tiny-embedding"
    results = recipe.main(["--output_dir", str(output_dir), *TINY_RUN, "--hub_model_id", HUB_ID])
    return output_dir, results


@pytest.fixture(scope="module")
def test_split(shapes_cache):
    return load_shapes(num_train=200, num_validation=1, num_test=12, image_size=48)["test"]


def test_the_output_folder_is_hub_ready_and_loads_with_from_pretrained(trained):
    output_dir, _ = trained
    names = {path.name for path in output_dir.iterdir()}
    assert {"config.json", "model.safetensors", "processor_config.json", "README.md", "eval_results.json"} <= names
    assert not [name for name in names if name.endswith((".py", ".bin", ".pt"))]
    model = AutoModel.from_pretrained(output_dir)
    assert type(model) is VisualSemanticEmbedding and model.config.joint_embedding_size == 16
    # the XE captioner's fixed CNN and vocabulary, so that the reward reads the captioner's words and images
    assert model.config.freeze_image_encoder and model.config.cnn_channels == [32, 64, 64, 64]
    processor = CaptionProcessor.from_pretrained(output_dir)
    assert processor.tokenizer.get_vocab() == CaptionProcessor.from_pretrained(XE_CAPTIONER).tokenizer.get_vocab()


def test_training_lowered_the_loss_and_the_reward_prefers_a_captions_own_image(trained, test_split):
    output_dir, results = trained
    assert results["train_loss_last"] < 0.5 * results["train_loss_first"], results
    reward = get_reward("embedding", model=str(output_dir))
    captions = [most_specific_reference(references) for references in test_split["captions"]]
    matching = np.array(reward(completions=captions, image=test_split["image"]))
    # each image with the caption of the next one: a near-duplicate (one attribute changed) or another scene
    mismatched = np.array(reward(completions=captions[1:] + captions[:1], image=test_split["image"]))
    assert matching.mean() > mismatched.mean() + 0.15, (matching, mismatched)
    assert results["test"]["matching_cosine"] > results["test"]["mismatched_cosine"]


def test_the_card_reports_the_recalls_of_eval_results(trained):
    output_dir, results = trained
    assert json.loads((output_dir / "eval_results.json").read_text()) == results
    card = ModelCard.load(output_dir / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    expected = {
        f"{name} R@{k}": round(results["test"][f"{key}_R@{k}"], 4)
        for key, name in (("t2i", "text-to-image"), ("i2t", "image-to-text"))
        for k in (1, 5, 10)
    }
    assert reported == expected
    assert all(result.dataset_split == "test" for result in card.data.eval_results)
    # the exact command, and how to load it by its Hub id
    assert f"python examples/train_embedding.py --output_dir {output_dir} --captioner_name_or_path" in card.text
    assert f'get_reward("embedding", model="{HUB_ID}")' in card.text


# slow: the published embedding loads by hub id in the main suite (tests/test_published_checkpoints.py)
@pytest.mark.slow
def test_the_embedding_loads_by_hub_id_through_a_local_hub_cache_offline(trained, test_split, tmp_path):
    output_dir, _ = trained
    image_path = tmp_path / "scene.png"
    test_split[0]["image"].save(image_path)
    caption = most_specific_reference(test_split[0]["captions"])
    script = textwrap.dedent(
        f"""
        import json
        from PIL import Image
        from rlcaption.rewards import get_reward
        reward = get_reward("embedding", model={HUB_ID!r})
        print(json.dumps(reward(completions=[{caption!r}], image=[Image.open({str(image_path)!r})])))
        """
    )
    env = offline_hub_cache(tmp_path, HUB_ID, output_dir)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    from_hub_id = json.loads(result.stdout.strip().splitlines()[-1])
    from_folder = get_reward("embedding", model=str(output_dir))(completions=[caption], image=[Image.open(image_path)])
    assert from_hub_id == pytest.approx(from_folder)


def test_an_output_folder_with_a_model_is_only_replaced_when_asked(recipe, trained):
    output_dir, _ = trained
    with pytest.raises(ValueError, match="already holds a saved model.*--overwrite_output_dir"):
        recipe.main(["--output_dir", str(output_dir), *TINY_RUN])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--image_encoder", "resnet"], "--image_encoder 'resnet' is not one of"),
        (["--margin", "0"], "--margin > 0"),
        (["--cnn_channels", "8", "16"], "--cnn_channels shapes a new CNN"),
        (["--captioner_name_or_path", "checkpoints/show-tell-rl-shapes-xee"], "no such folder"),
    ],
)
def test_bad_arguments_fail_before_training_naming_the_option(recipe, tmp_path, monkeypatch, arguments, message):
    monkeypatch.chdir(EXAMPLES.parent)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        recipe.main(["--output_dir", str(tmp_path / "out"), *arguments])
    assert not (tmp_path / "out").exists()


def test_a_new_image_encoder_is_trainable_and_reads_the_captioners_images(recipe):
    script_args = recipe.ScriptArguments(
        captioner_name_or_path=str(XE_CAPTIONER), image_encoder="new", cnn_channels=[8, 16], hidden_size=8
    )
    model, processor = recipe.new_embedding(script_args)
    assert model.config.cnn_channels == [8, 16] and not model.config.freeze_image_encoder
    assert all(parameter.requires_grad for parameter in model.parameters())
    assert model.config.image_size == processor.image_processor.size["height"] == 48
    assert model.config.vocab_size == len(processor.tokenizer)


def test_push_to_hub_offline_fails_before_training(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match="Nothing was trained yet"):
        recipe.main(["--output_dir", str(tmp_path / "out"), "--push_to_hub", "--hub_model_id", HUB_ID])
    assert not (tmp_path / "out").exists()


def test_a_new_image_encoder_can_be_a_pretrained_vision_model(recipe, tmp_path):
    vision_model = tmp_path / "tiny-vit"
    ViTModel(
        ViTConfig(image_size=48, patch_size=16, hidden_size=24, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(vision_model)
    script_args = recipe.ScriptArguments(
        captioner_name_or_path=str(XE_CAPTIONER), image_encoder="new", vision_model=str(vision_model), hidden_size=8
    )
    model, _ = recipe.new_embedding(script_args)
    assert model.config.encoder_type == "backbone" and model.config.freeze_backbone
    assert not model.config.use_pretrained_backbone  # loaded once, now the model's own
    assert not any(parameter.requires_grad for parameter in model.embedding.image_encoder.parameters())


def test_training_on_region_features_of_varying_count(recipe, shapes_cache, tmp_path):
    """`--image_features` names a dataset folder with an `image_features` column, here 1 to 4 regions per image:
    the embedding reads their mean, trains, and scores retrieval on the test split's features."""
    shapes = load_shapes(num_train=40, num_validation=1, num_test=8, image_size=48)
    generator = np.random.default_rng(0)

    def with_regions(split):
        regions = [generator.normal(size=(1 + row % 4, 6)).astype(np.float32).tolist() for row in range(len(split))]
        return split.remove_columns("image").add_column("image_features", regions)

    features = datasets.DatasetDict({name: with_regions(split) for name, split in shapes.items()})
    features.save_to_disk(tmp_path / "features" / "dataset")  # where `rlcaption extract-features` writes it
    output_dir = tmp_path / "embedding"
    results = recipe.main([
        "--output_dir", str(output_dir), "--captioner_name_or_path", str(XE_CAPTIONER), "--image_encoder", "new",
        "--image_features", str(tmp_path / "features"), "--hidden_size", "8", "--word_embedding_size", "8",
        "--joint_embedding_size", "8", "--num_steps", "3", "--batch_size", "8", "--logging_steps", "1",
    ])  # fmt: skip
    model = VisualSemanticEmbedding.from_pretrained(output_dir)
    assert model.config.encoder_type == "features" and model.config.image_feature_layout == "grid"
    assert model.config.image_feature_size == 6
    assert results["num_train_images"] == 40 and results["test"]["num_captions"] > 8


def test_the_shared_options_and_a_batch_larger_than_the_train_split(recipe, tmp_path, capsys):
    """`--max_steps` and `--per_device_train_batch_size`, as every recipe names them; the default batch (128) exceeds a
    small train split, whose images then all make each step."""
    shapes = load_shapes(num_train=12, num_validation=1, num_test=4, image_size=48)
    features = datasets.DatasetDict(
        {name: split.remove_columns("image").add_column("image_features", [[row / 9] * 6 for row in range(len(split))])
         for name, split in shapes.items()}
    )  # fmt: skip
    features.save_to_disk(tmp_path / "features")
    arguments = [
        "--output_dir", str(tmp_path / "embedding"), "--captioner_name_or_path", str(XE_CAPTIONER), "--image_encoder",
        "new", "--image_features", str(tmp_path / "features"), "--hidden_size", "8", "--word_embedding_size", "8",
        "--joint_embedding_size", "8", "--max_steps", "2", "--logging_steps", "1",
    ]  # fmt: skip
    results = recipe.main(arguments)
    printed = capsys.readouterr().out
    assert "--per_device_train_batch_size 128 exceeds the 12 training images" in printed
    assert "step 2/2" in printed and results["num_train_images"] == 12
