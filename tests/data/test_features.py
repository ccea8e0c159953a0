import json
import shutil

import datasets
import huggingface_hub
import numpy as np
import pytest
import torch
from transformers import (
    AutoImageProcessor,
    AutoModel,
    ConvNextImageProcessor,
    ResNetConfig,
    ResNetModel,
    ViTConfig,
    ViTImageProcessor,
    ViTModel,
)

from rlcaption.cli import build_parser
from rlcaption.data import features as features_module
from rlcaption.data import load_shapes
from rlcaption.data.features import (
    extract_features,
    run_extract_features,
)
from rlcaption.models.show_tell_rl.encoders import encode_images_with_backbone
from rlcaption.processing import image_processor_of_extractor


class SimulatedInterruption(Exception):
    pass


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory):
    """A randomly initialised 1-layer ViT with its image processor, saved like a Hub checkpoint."""
    path = tmp_path_factory.mktemp("tiny-vit")
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    ViTModel(config).save_pretrained(path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_resnet(tmp_path_factory):
    """A randomly initialised 2-stage ResNet whose last feature map is 4x4x12 for 32-pixel images."""
    path = tmp_path_factory.mktemp("tiny-resnet")
    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1], num_channels=3)
    ResNetModel(config).save_pretrained(path)
    ConvNextImageProcessor(size={"shortest_edge": 32}).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(num_train=13, num_validation=5, num_test=4, cache_dir=tmp_path_factory.mktemp("shapes"))


def _reference_features(dataset: datasets.Dataset, model_path: str) -> np.ndarray:
    """The ViT pooler output computed image by image, straight from transformers."""
    model = ViTModel.from_pretrained(model_path).eval()
    processor = ViTImageProcessor.from_pretrained(model_path)
    rows = []
    for image in dataset["image"]:
        with torch.no_grad():
            rows.append(model(**processor(images=image, return_tensors="pt")).pooler_output[0].numpy())
    return np.stack(rows)


def _reference_grids(dataset: datasets.Dataset, model_path: str) -> np.ndarray:
    """The backbone's last hidden state image by image, as `(num_images, num_positions, feature_size)`."""
    model = AutoModel.from_pretrained(model_path).eval()
    processor = AutoImageProcessor.from_pretrained(model_path)
    rows = []
    for image in dataset["image"]:
        with torch.no_grad():
            hidden = model(**processor(images=image, return_tensors="pt")).last_hidden_state[0]
        rows.append((hidden if hidden.dim() == 2 else hidden.flatten(1).T).numpy())  # (C, H, W) -> (H * W, C)
    return np.stack(rows)


def test_features_equal_the_backbone_pooler_output(shapes, tiny_vit, tmp_path):
    result = extract_features(shapes, tiny_vit, tmp_path / "out", batch_size=4, shard_size=5)
    assert list(result) == ["train", "validation", "test"]
    for split in result:
        assert result[split].column_names == ["image", "captions", "image_id", "scene", "image_features"]
        assert result[split]["image_id"] == shapes[split]["image_id"]
        features = np.asarray(result[split]["image_features"], dtype=np.float32)
        assert features.shape == (shapes[split].num_rows, 16)
        np.testing.assert_allclose(features, _reference_features(shapes[split], tiny_vit), atol=1e-5)
    reloaded = datasets.load_from_disk(str(tmp_path / "out" / "dataset"))
    assert reloaded["test"]["image_features"] == result["test"]["image_features"]


def test_single_split_and_plain_dataset(shapes, tiny_vit, tmp_path):
    result = extract_features(shapes, tiny_vit, tmp_path / "one", split="test", shard_size=3)
    assert list(result) == ["test"] and result["test"].num_rows == 4
    plain = extract_features(shapes["validation"], tiny_vit, tmp_path / "plain")
    assert list(plain) == ["validation"]
    with pytest.raises(ValueError, match="Split 'dev' is not in the dataset"):
        extract_features(shapes, tiny_vit, tmp_path / "bad", split="dev")


class ShardRecorder:
    """Records the shards extraction computes, as `(split, first row)`, and stops the process in the middle of the
    `crash_at_call`-th one (`None`: never)."""

    def __init__(self, monkeypatch, crash_at_call: int | None):
        self.original = features_module._extract_shard
        self.calls: list[tuple[str, int]] = []
        self.crash_at_call = crash_at_call
        monkeypatch.setattr(features_module, "_extract_shard", self)

    def __call__(self, dataset, start, stop, *args):
        self.calls.append((dataset.split, start))
        if len(self.calls) == self.crash_at_call:
            raise SimulatedInterruption
        return self.original(dataset, start, stop, *args)

    def resume(self) -> None:
        self.calls.clear()
        self.crash_at_call = None


def test_resume_after_interruption_computes_only_missing_shards(shapes, tiny_vit, tmp_path, monkeypatch):
    shards = ShardRecorder(monkeypatch, crash_at_call=3)  # stopped in the middle of the third shard
    output_dir = tmp_path / "resumed"
    with pytest.raises(SimulatedInterruption):
        extract_features(shapes, tiny_vit, output_dir, batch_size=2, shard_size=5)
    finished = sorted(path.name for path in (output_dir / "shards" / "train").iterdir())
    assert finished == ["shard-00000.npy", "shard-00001.npy"]  # no partial shard left behind
    assert not (output_dir / "dataset").exists()
    # a temporary file left by a killed process is never mistaken for a shard
    (output_dir / "shards" / "train" / ".shard-00002.npy.tmp-killed").write_bytes(b"partial")

    shards.resume()
    resumed = extract_features(shapes, tiny_vit, output_dir, batch_size=2, shard_size=5)
    # train has shards at rows 0, 5, 10; only the third is recomputed, plus validation and test
    assert shards.calls == [("train", 10), ("validation", 0), ("test", 0)]

    monkeypatch.setattr(features_module, "_extract_shard", shards.original)
    uninterrupted = extract_features(shapes, tiny_vit, tmp_path / "straight", batch_size=2, shard_size=5)
    for split in uninterrupted:
        np.testing.assert_allclose(
            np.asarray(resumed[split]["image_features"]), np.asarray(uninterrupted[split]["image_features"]), atol=1e-6
        )

    shards.resume()
    monkeypatch.setattr(features_module, "_extract_shard", shards)
    extract_features(shapes, tiny_vit, output_dir, batch_size=2, shard_size=5)
    assert shards.calls == []  # everything done: nothing is recomputed


def test_rerun_with_other_settings_is_refused(shapes, tiny_vit, tmp_path):
    extract_features(shapes, tiny_vit, tmp_path, split="test")
    with pytest.raises(ValueError, match="shard_size=1024.*not 7"):
        extract_features(shapes, tiny_vit, tmp_path, split="test", shard_size=7)
    other_test = datasets.DatasetDict({"test": shapes["validation"]})
    with pytest.raises(ValueError, match="different 'test' split"):
        extract_features(other_test, tiny_vit, tmp_path)


def test_command_line(shapes, tiny_vit, tmp_path, capsys):
    saved = tmp_path / "saved"
    shapes.save_to_disk(str(saved))
    parser = build_parser()
    args = parser.parse_args(
        ["extract-features", "--dataset", str(saved), "--model", tiny_vit, "--output-dir", str(tmp_path / "cli"),
         "--batch-size", "8"]
    )  # fmt: skip
    result = run_extract_features(args)
    assert result["train"].num_rows == 13 and len(result["train"][0]["image_features"]) == 16
    assert "image_features" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="neither `shapes` nor a folder"):
        run_extract_features(
            parser.parse_args(["extract-features", "--dataset", "nowhere", "--model", "m", "--output-dir", "o"])
        )


def test_backbone_by_hub_id_from_a_local_hub_cache(shapes, tiny_vit, tmp_path, monkeypatch):
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_cache = tmp_path / "hub" / "models--rlcaption-tests--tiny-vit"
    shutil.copytree(tiny_vit, repo_cache / "snapshots" / revision)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    result = extract_features(shapes, "rlcaption-tests/tiny-vit", tmp_path / "out", split="test")
    np.testing.assert_allclose(
        np.asarray(result["test"]["image_features"]), _reference_features(shapes["test"], tiny_vit), atol=1e-5
    )


@pytest.mark.parametrize(
    "backbone, grid_shape",
    [("tiny_resnet", (16, 12)), ("tiny_vit", (17, 16))],  # a 4x4 feature map; the [CLS] token and 4x4 patches
)
def test_grid_features_keep_every_position(shapes, backbone, grid_shape, request, tmp_path):
    model_path = request.getfixturevalue(backbone)
    result = extract_features(shapes, model_path, tmp_path, batch_size=4, shard_size=5, pooling="none")
    assert result["train"].features["image_features"] == datasets.Array2D(shape=grid_shape, dtype="float32")
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["pooling"] == "none" and manifest["feature_shape"] == list(grid_shape)
    for split in result:
        grids = np.asarray(result[split].with_format("numpy")["image_features"])
        assert grids.shape == (shapes[split].num_rows, *grid_shape)
        np.testing.assert_allclose(grids, _reference_grids(shapes[split], model_path), atol=1e-5)
    assert not list(tmp_path.glob(".features-cache-*"))  # the dataset is built through a cache removed after


def test_grid_extraction_resumes_after_interruption(shapes, tiny_resnet, tmp_path, monkeypatch):
    shards = ShardRecorder(monkeypatch, crash_at_call=2)  # stopped in the middle of the second shard
    output_dir = tmp_path / "resumed"
    with pytest.raises(SimulatedInterruption):
        extract_features(shapes, tiny_resnet, output_dir, split="train", shard_size=5, pooling="none")
    assert [path.name for path in (output_dir / "shards" / "train").iterdir()] == ["shard-00000.npy"]
    assert np.load(output_dir / "shards" / "train" / "shard-00000.npy").shape == (5, 16, 12)

    shards.resume()
    resumed = extract_features(shapes, tiny_resnet, output_dir, split="train", shard_size=5, pooling="none")
    assert shards.calls == [("train", 5), ("train", 10)]  # the finished shard is not recomputed
    np.testing.assert_allclose(
        np.asarray(resumed["train"].with_format("numpy")["image_features"]),
        _reference_grids(shapes["train"], tiny_resnet),
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="pooling='none', not 'auto'"):
        extract_features(shapes, tiny_resnet, output_dir, split="train", shard_size=5)


def test_unknown_pooling_and_pooled_manifests_of_older_versions(shapes, tiny_vit, tmp_path):
    with pytest.raises(ValueError, match=r"Unknown pooling 'max'; expected one of \('auto', 'none'\)"):
        extract_features(shapes, tiny_vit, tmp_path, split="test", pooling="max")
    extract_features(shapes, tiny_vit, tmp_path, split="test")
    manifest_path = tmp_path / "shards" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["feature_shape"] == [16]
    del manifest["pooling"]  # written before the pooling could be chosen: it pooled
    manifest_path.write_text(json.dumps(manifest))
    extract_features(shapes, tiny_vit, tmp_path, split="test")
    with pytest.raises(ValueError, match="pooling='auto', not 'none'"):
        extract_features(shapes, tiny_vit, tmp_path, split="test", pooling="none")


def test_command_line_grid_features(shapes, tiny_vit, tmp_path):
    saved = tmp_path / "saved"
    shapes.save_to_disk(str(saved))
    parser = build_parser()
    arguments = [
        "extract-features", "--dataset", str(saved), "--model", tiny_vit, "--output-dir", str(tmp_path / "cli"),
    ]  # fmt: skip
    result = run_extract_features(parser.parse_args([*arguments, "--split", "test", "--pooling", "none"]))
    assert np.asarray(result["test"][0]["image_features"]).shape == (17, 16)
    with pytest.raises(SystemExit):
        parser.parse_args([*arguments, "--pooling", "max"])


def test_a_mistyped_model_leaves_the_output_folder_free(shapes, tiny_vit, tmp_path, monkeypatch):
    with pytest.raises((OSError, ValueError)):
        extract_features(shapes, tiny_vit + "-typo", tmp_path, split="test")
    assert not (tmp_path / "shards" / "manifest.json").exists()
    # the corrected command runs, and the same backbone named by a relative path resumes it
    extract_features(shapes, tiny_vit, tmp_path, split="test")
    monkeypatch.chdir(tmp_path.parent)
    relative = shutil.os.path.relpath(tiny_vit)
    assert relative != tiny_vit
    extract_features(shapes, relative, tmp_path, split="test")
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["model"] == tiny_vit  # recorded resolved, whatever the spelling


def test_the_manifest_records_the_extractor(shapes, tiny_resnet, tmp_path):
    extract_features(shapes, tiny_resnet, tmp_path, split="test", pooling="none")
    record = features_module.read_feature_extractor(tmp_path / "dataset")
    assert record["model"] == tiny_resnet and record["pooling"] == "none" and record["layout"] == "grid"
    assert record["image_processor"] == json.loads(AutoImageProcessor.from_pretrained(tiny_resnet).to_json_string())
    # the record rebuilds the extraction: its image processor, then the backbone pooled as recorded
    pixel_values = image_processor_of_extractor(record)(images=list(shapes["test"]["image"]), return_tensors="pt")
    with torch.inference_mode():
        backbone = AutoModel.from_pretrained(record["model"]).eval()
        features = encode_images_with_backbone(backbone, pixel_values["pixel_values"], record["pooling"])
    np.testing.assert_allclose(features.numpy(), _reference_grids(shapes["test"], tiny_resnet), atol=1e-5)
    assert features_module.read_feature_extractor(tmp_path / "elsewhere") is None
