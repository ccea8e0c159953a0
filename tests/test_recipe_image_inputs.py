"""The recipes on every kind of image input: `train_xe.py` builds a warm start on pooled features, on regions whose
count varies and on a pretrained vision model, and the RL recipes train it for 2 steps on the same dataset (tiny
sizes, in process)."""

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTConfig, ViTImageProcessor, ViTModel

from rlcaption import ShowTellRL, recipes, rewards
from rlcaption.data import load_shapes
from rlcaption.data.images import decode_image
from rlcaption.objectives.base import get_objective_class
from rlcaption.recipes import RecipeArguments, parse_recipe_arguments
from test_recipes import load_recipe

FEATURE_SIZE = 6
REWARD_CLIP = Path(__file__).resolve().parent.parent / "checkpoints" / "shapes-clip-reward"
# a short run of any recipe: 2 optimizer steps of 4 images, no checkpoint, no evaluation during training
TWO_STEPS = [
    "--use_cpu", "--per_device_train_batch_size", "4", "--max_steps", "2", "--save_strategy", "no",
    "--eval_strategy", "no", "--max_caption_length", "8",
]  # fmt: skip


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A tiny shapes dataset, generated into a temporary cache instead of the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("datasets"))
        yield load_shapes(num_train=16, num_validation=4, num_test=4, image_size=48)


def save_features(shapes, folder, regions: bool, keep_images: bool = True):
    """`shapes` with random `image_features`, saved where `rlcaption extract-features` writes them: one pooled vector
    per image, or 1 to 3 regions per image. The features are noise: these tests check that the recipes run."""
    generator = np.random.default_rng(0)

    def with_features(split):
        shapes_of_rows = [(1 + row % 3, FEATURE_SIZE) if regions else (FEATURE_SIZE,) for row in range(len(split))]
        features = [generator.normal(size=shape).astype(np.float32).tolist() for shape in shapes_of_rows]
        split = split.add_column("image_features", features)
        return split if keep_images else split.remove_columns("image")

    datasets.DatasetDict({name: with_features(split) for name, split in shapes.items()}).save_to_disk(
        folder / "dataset"
    )
    return folder


@pytest.fixture(scope="module")
def pooled_features(shapes, tmp_path_factory):
    return save_features(shapes, tmp_path_factory.mktemp("pooled"), regions=False)


@pytest.fixture(scope="module")
def region_features(shapes, tmp_path_factory):
    return save_features(shapes, tmp_path_factory.mktemp("regions"), regions=True)


def train_xe(output_dir, *arguments):
    load_recipe("train_xe").main(["--output_dir", str(output_dir), "--hidden_size", "16", *arguments, *TWO_STEPS])
    return json.loads((output_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def regions_warm_start(region_features, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("runs") / "xe-regions"
    config = train_xe(output_dir, "--image_features", str(region_features))
    return output_dir, config


def test_xe_on_pooled_features_reads_them_once_then_scst_trains_it(pooled_features, tmp_path):
    config = train_xe(tmp_path / "xe", "--image_features", str(pooled_features))
    assert (config["encoder_type"], config["image_feature_layout"]) == ("features", "pooled")
    assert config["image_feature_size"] == FEATURE_SIZE
    assert not config["image_attention"]  # a pooled vector has no grid to attend over
    load_recipe("train_scst").main([
        "--model_name_or_path", str(tmp_path / "xe"), "--output_dir", str(tmp_path / "scst"),
        "--image_features", str(pooled_features), "--num_samples_per_image", "2", *TWO_STEPS,
    ])  # fmt: skip
    assert (tmp_path / "scst" / "model.safetensors").is_file()


def test_xe_on_regions_of_varying_count_attends_over_them_then_actor_critic_trains_it(
    regions_warm_start, region_features, tmp_path
):
    xe_dir, config = regions_warm_start
    assert (config["encoder_type"], config["image_feature_layout"]) == ("features", "grid")
    assert config["image_attention"]
    assert "precomputed grid or region features of width 6" in (xe_dir / "README.md").read_text()
    load_recipe("train_actor_critic").main([
        "--model_name_or_path", str(xe_dir), "--output_dir", str(tmp_path / "actor-critic"),
        "--image_features", str(region_features), "--num_samples_per_image", "2", "--value_pretraining_steps", "1",
        "--value_hidden_size", "8", *TWO_STEPS,
    ])  # fmt: skip
    assert (tmp_path / "actor-critic" / "model.safetensors").is_file()


def test_xe_on_a_pretrained_vision_model_sizes_images_as_its_processor_then_scst_trains_it(shapes, tmp_path):
    vision_model = tmp_path / "tiny-vit"
    ViTModel(
        ViTConfig(image_size=32, patch_size=16, hidden_size=24, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(vision_model)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.4] * 3, image_std=[0.3] * 3).save_pretrained(
        vision_model
    )
    config = train_xe(
        tmp_path / "xe", "--vision_model", str(vision_model), "--num_train_images", "16",
        "--num_validation_images", "4", "--num_test_images", "4",
    )  # fmt: skip
    assert (config["encoder_type"], config["backbone"], config["freeze_backbone"]) == (
        "backbone", str(vision_model), True,
    )  # fmt: skip
    assert config["image_attention"]  # over the ViT's patch tokens
    processor_config = json.loads((tmp_path / "xe" / "processor_config.json").read_text())["image_processor"]
    assert processor_config["size"] == {"height": 32, "width": 32} and processor_config["image_mean"] == [0.4] * 3
    load_recipe("train_scst").main([
        "--model_name_or_path", str(tmp_path / "xe"), "--output_dir", str(tmp_path / "scst"),
        "--num_train_images", "16", "--num_validation_images", "4", "--num_test_images", "4",
        "--num_samples_per_image", "2", *TWO_STEPS,
    ])  # fmt: skip
    assert (tmp_path / "scst" / "model.safetensors").is_file()


def test_wtf_on_features_reads_the_images_kept_beside_them(regions_warm_start, region_features, tmp_path):
    """The reward CLIP mines and scores the `image` column; the captioner reads the regions."""
    load_recipe("train_wtf").main([
        "--model_name_or_path", str(regions_warm_start[0]), "--output_dir", str(tmp_path / "wtf"),
        "--image_features", str(region_features), "--discriminator_pretraining_steps", "1", *TWO_STEPS,
    ])  # fmt: skip
    scores = json.loads((tmp_path / "wtf" / "eval_results.json").read_text())["test"]
    assert "reward_clip_t2i_R@1" in scores


@pytest.mark.parametrize(
    ("arguments", "kept"),
    [
        (["--objective", "wtf", "--reward_clip", str(REWARD_CLIP)], True),
        (["--objective", "scst", "--reward_funcs", "clip_score"], True),
        (["--objective", "scst", "--reward_funcs", "cider"], False),
        (["--objective", "scst", "--reward_funcs", "cider", "pixel_count"], True),  # a reward of the user's
    ],
)
def test_beside_features_the_training_images_stay_undecoded_until_a_reward_asks(
    arguments, kept, regions_warm_start, region_features, tmp_path, monkeypatch
):
    monkeypatch.setitem(
        rewards.registry._REWARD_FACTORIES, "pixel_count", type("PixelCount", (), {"reads_images": True})
    )
    training_args = parse_recipe_arguments(
        RecipeArguments,
        argv=["--output_dir", str(tmp_path), "--image_features", str(region_features), *arguments],
        config_classes=[get_objective_class(arguments[1]).config_class],
    )[1]
    model = ShowTellRL.from_pretrained(regions_warm_start[0])
    dataset = recipes.fit_image_columns_to_run(
        model, datasets.load_from_disk(region_features / "dataset"), training_args
    )
    if not kept:  # nothing reads the images: they are not loaded at all
        assert all("image" not in split.column_names for split in dataset.values())
        return
    assert dataset["train"].features["image"].decode is False
    undecoded = dataset["train"][0]["image"]
    assert set(undecoded) == {"bytes", "path"}
    assert np.array_equal(np.asarray(decode_image(undecoded)), np.asarray(load_shapes_row_image(region_features)))
    # the splits scored once after training are decoded as they are read
    assert dataset["test"].features["image"].decode is True


def load_shapes_row_image(features_folder):
    return datasets.load_from_disk(features_folder / "dataset")["train"][0]["image"]


@pytest.mark.parametrize("recipe", ["train_wtf", "train_scst"])
def test_a_clip_on_features_without_images_fails_before_training_saying_how_to_keep_them(
    recipe, regions_warm_start, shapes, tmp_path, monkeypatch
):
    features_only = save_features(shapes, tmp_path / "features", regions=True, keep_images=False)
    module = load_recipe(recipe)
    monkeypatch.setattr(recipes, "RLCaptionTrainer", lambda *args, **kwargs: pytest.fail("trainer built"))
    reward = ["--discriminator_pretraining_steps", "1"] if recipe == "train_wtf" else ["--reward_funcs", "clip_score"]
    message = "reads images, not precomputed features.*extract-features` keeps the `image` column"
    with pytest.raises(ValueError, match=message):
        module.main([
            "--model_name_or_path", str(regions_warm_start[0]), "--output_dir", str(tmp_path / "run"),
            "--image_features", str(features_only), *reward, *TWO_STEPS,
        ])  # fmt: skip


def test_a_features_captioner_on_a_dataset_of_images_fails_naming_the_option(regions_warm_start, tmp_path):
    with pytest.raises(ValueError, match="reads precomputed image features .* pass them with --image_features"):
        load_recipe("train_scst").main([
            "--model_name_or_path", str(regions_warm_start[0]), "--output_dir", str(tmp_path / "scst"),
            "--num_train_images", "8", "--num_validation_images", "2", "--num_test_images", "2", *TWO_STEPS,
        ])  # fmt: skip


@pytest.mark.parametrize(
    "arguments, min_word_count",
    [
        ([], 1),
        (["--dataset", "data/coco"], 5),
        (["--image_features", "features/coco"], 5),
        (["--min_word_count", "3"], 3),
    ],
)
def test_the_vocabulary_keeps_words_of_5_captions_off_the_shapes_dataset(arguments, min_word_count, tmp_path):
    module = load_recipe("train_xe")
    script_args, _ = parse_recipe_arguments(
        module.ScriptArguments, module.RECIPE_DEFAULTS, ["--output_dir", str(tmp_path), *arguments]
    )
    assert script_args.min_word_count == min_word_count


def test_xe_refuses_two_image_encoders(tmp_path):
    with pytest.raises(ValueError, match="pass one of them"):
        load_recipe("train_xe").main([
            "--output_dir", str(tmp_path), "--vision_model", "google/vit-base-patch16-224", "--image_features", "f",
        ])  # fmt: skip


def test_actor_critic_on_regions_resumes_as_if_never_stopped(regions_warm_start, region_features, tmp_path, capsys):
    """The value network's region encoder and masks are saved and restored with the policy's: a run stopped after a
    checkpoint and resumed ends with the weights of a run that never stopped."""

    def actor_critic(output_dir, max_steps):
        arguments = [
            "--model_name_or_path", str(regions_warm_start[0]), "--output_dir", str(output_dir),
            "--image_features", str(region_features), "--num_samples_per_image", "2",
            "--value_pretraining_steps", "1", "--value_hidden_size", "8", *TWO_STEPS,
            # a schedule that does not depend on --max_steps, so that the stopped run is the start of the other
            "--lr_scheduler_type", "constant",
        ]  # fmt: skip
        arguments[arguments.index("--max_steps") + 1] = str(max_steps)
        arguments[arguments.index("--save_strategy") + 1] = "steps"
        load_recipe("train_actor_critic").main([*arguments, "--save_steps", "1"])
        return load_file(output_dir / "model.safetensors")

    uninterrupted = actor_critic(tmp_path / "uninterrupted", 3)
    actor_critic(tmp_path / "resumed", 2)  # stops after the value network's step and one policy step
    capsys.readouterr()
    resumed = actor_critic(tmp_path / "resumed", 3)
    assert f"Resuming from {tmp_path / 'resumed' / 'checkpoint-2'}" in capsys.readouterr().out
    assert json.loads((tmp_path / "resumed" / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert resumed.keys() == uninterrupted.keys() and any(name.startswith("value_network.") for name in resumed)
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name
