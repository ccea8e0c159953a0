"""Disk use of the COCO path: a saved dataset and the features of `extract-features` reference the JPEG files instead
of copying them, and a finished extraction holds its features once (in `dataset/`, its shards deleted)."""

import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, ConvNextImageProcessor, ResNetConfig, ResNetModel

from rlcaption.data import features as features_module
from rlcaption.data import load_karpathy, load_shapes
from rlcaption.data.features import extract_features
from rlcaption.data.loading import load_caption_dataset, load_saved_dataset, save_dataset_referencing_images


class SimulatedInterruption(Exception):
    pass


@pytest.fixture(scope="module")
def tiny_resnet(tmp_path_factory):
    """A random 2-stage ResNet whose last feature map is 4x4x12 for 32-pixel images, saved with its processor."""
    path = tmp_path_factory.mktemp("tiny-resnet")
    torch.manual_seed(0)
    ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1])).save_pretrained(path)
    ConvNextImageProcessor(size={"shortest_edge": 32}).save_pretrained(path)
    return str(path)


@pytest.fixture
def coco(tmp_path):
    """A Karpathy split file over 7 noisy 48x40 JPEGs in `coco/val2014` (3 train, 2 val, 2 test)."""
    (tmp_path / "coco" / "val2014").mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries = []
    for index, split in enumerate(["train"] * 3 + ["val"] * 2 + ["test"] * 2):
        name = f"COCO_val2014_{index:012d}.jpg"
        pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "coco" / "val2014" / name, format="JPEG", quality=90)
        entries.append(
            {"filepath": "val2014", "filename": name, "split": split, "cocoid": index, "sentences": [{"raw": "noise"}]}
        )
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": entries}))
    return tmp_path


def _jpeg_files(root: Path) -> list[Path]:
    return sorted((root / "coco" / "val2014").glob("*.jpg"))


def _holds_a_copy_of(folder: Path, files: list[Path]) -> list[str]:
    """The files whose bytes are found in a file under `folder`."""
    stored = b"".join(path.read_bytes() for path in folder.rglob("*") if path.is_file())
    return [file.name for file in files if file.read_bytes() in stored]


def _backbone_grids(images: list, model_path: str) -> np.ndarray:
    """The backbone's feature map image by image, straight from transformers: `(num_images, H * W, C)`."""
    model = AutoModel.from_pretrained(model_path).eval()
    processor = AutoImageProcessor.from_pretrained(model_path)
    with torch.no_grad():
        maps = [model(**processor(images=image, return_tensors="pt")).last_hidden_state[0] for image in images]
    return np.stack([feature_map.flatten(1).T.numpy() for feature_map in maps])


def test_a_dataset_saved_by_reference_holds_no_image_and_loads_the_files(coco):
    dataset = load_karpathy(coco / "dataset_coco.json", coco / "coco")
    # the region join's format: numpy features, every other column (the images) as it is
    save_dataset_referencing_images(dataset.with_format("numpy", ["image_id"], output_all_columns=True), coco / "data")
    assert _holds_a_copy_of(coco / "data", _jpeg_files(coco)) == []
    raw = datasets.load_from_disk(str(coco / "data"))
    assert raw["train"]["image"][0] == "COCO_val2014_000000000000.jpg"  # relative to the images' folder
    loaded = load_caption_dataset(str(coco / "data"))
    assert loaded["train"].features["image"] == datasets.Image()
    assert loaded["train"].column_names == ["image", "captions", "image_id"]
    for row, path in zip(loaded["test"], _jpeg_files(coco)[5:], strict=True):
        assert isinstance(row["image"], Image.Image) and isinstance(row["image_id"], np.integer)
        np.testing.assert_array_equal(np.asarray(row["image"]), np.asarray(Image.open(path)))


def test_images_that_moved_are_named_with_the_file_to_edit(coco):
    save_dataset_referencing_images(load_karpathy(coco / "dataset_coco.json", coco / "coco"), coco / "data")
    (coco / "coco").rename(coco / "moved")
    with pytest.raises(FileNotFoundError, match=r"(?s)missing.*set image_root in .*train/image_references\.json"):
        load_saved_dataset(coco / "data")


def test_images_held_as_bytes_cannot_be_referenced(tmp_path):
    shapes = load_shapes(num_train=2, num_validation=1, num_test=1, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="images are held as bytes.*save it with `save_to_disk`"):
        save_dataset_referencing_images(shapes, tmp_path / "saved")


def test_extraction_stores_the_features_once_and_references_the_jpegs(coco, tiny_resnet):
    save_dataset_referencing_images(load_karpathy(coco / "dataset_coco.json", coco / "coco"), coco / "data")
    output_dir = coco / "features"
    result = extract_features(load_saved_dataset(coco / "data"), tiny_resnet, output_dir, shard_size=2, pooling="none")
    assert sorted(path.name for path in (output_dir / "shards").iterdir()) == ["manifest.json"]
    assert not list(output_dir.rglob("*.npy"))
    assert _holds_a_copy_of(output_dir, _jpeg_files(coco)) == []
    for split in result:
        images = load_saved_dataset(coco / "data")[split]["image"]
        grids = np.asarray(result[split]["image_features"], dtype=np.float32)
        np.testing.assert_allclose(grids, _backbone_grids(images, tiny_resnet), atol=1e-5)
        # WTF-RL's CLIPs read these beside the features: the same pixels as the files
        for row_image, image in zip(result[split]["image"], images, strict=True):
            np.testing.assert_array_equal(np.asarray(row_image), np.asarray(image))
    assert load_caption_dataset(str(output_dir))["test"]["image_id"] == [5, 6]


def test_an_extraction_stopped_after_saving_a_split_resumes_without_recomputing(coco, tiny_resnet, monkeypatch):
    dataset = load_karpathy(coco / "dataset_coco.json", coco / "coco")
    output_dir = coco / "features"

    def stopped(*args):
        raise SimulatedInterruption

    monkeypatch.setattr(features_module, "_record_split_in_dataset", stopped)
    with pytest.raises(SimulatedInterruption):
        extract_features(dataset, tiny_resnet, output_dir, shard_size=2)
    assert (output_dir / "dataset" / "train").is_dir() and (output_dir / "shards" / "train").is_dir()
    monkeypatch.undo()

    computed = []
    original = features_module._extract_shard
    monkeypatch.setattr(
        features_module, "_extract_shard", lambda split, *args: computed.append(split.split) or original(split, *args)
    )
    resumed = extract_features(dataset, tiny_resnet, output_dir, shard_size=2)
    assert computed == []  # every shard was written before the stop: the rerun only stores them
    assert not list(output_dir.rglob("*.npy"))
    reference = extract_features(dataset, tiny_resnet, coco / "straight", shard_size=2)
    for split in reference:
        assert resumed[split]["image_features"] == reference[split]["image_features"]
    # a finished extraction reruns in no time: nothing to compute, nothing to store
    computed.clear()
    assert extract_features(dataset, tiny_resnet, output_dir, shard_size=2)["test"].num_rows == 2 and computed == []


def test_features_folders_of_the_previous_layout_load_and_lose_their_copies_on_rerun(coco, tiny_resnet):
    """The previous version kept the shards and saved `dataset/` with `save_to_disk`, the JPEGs embedded."""
    dataset = load_karpathy(coco / "dataset_coco.json", coco / "coco")
    output_dir = coco / "features"
    extracted = extract_features(dataset, tiny_resnet, output_dir, shard_size=2)
    manifest_path = output_dir / "shards" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["splits_in_dataset"]
    manifest_path.write_text(json.dumps(manifest))
    for split, rows in extracted.items():
        features = np.asarray(rows["image_features"], dtype=np.float32)
        (output_dir / "shards" / split).mkdir()
        for index, start in enumerate(range(0, len(features), 2)):
            np.save(output_dir / "shards" / split / f"shard-{index:05d}.npy", features[start : start + 2])
    datasets.DatasetDict(extracted).save_to_disk(str(coco / "embedded"))
    shutil.rmtree(output_dir / "dataset")
    (coco / "embedded").rename(output_dir / "dataset")
    assert len(_holds_a_copy_of(output_dir, _jpeg_files(coco))) == 7

    old = load_caption_dataset(str(output_dir))
    assert old["train"]["image_features"] == extracted["train"]["image_features"]
    assert np.asarray(old["test"][0]["image"]).shape == (40, 48, 3)

    rerun = extract_features(dataset, tiny_resnet, output_dir, shard_size=2)
    assert _holds_a_copy_of(output_dir, _jpeg_files(coco)) == [] and not list(output_dir.rglob("*.npy"))
    assert rerun["train"]["image_features"] == extracted["train"]["image_features"]
