"""load_caption_dataset checks every image of a saved or Hub dataset before training, naming the bad ones, and
remembers the outcome by the dataset's fingerprint."""

import io
import logging

import datasets
import pytest
from PIL import Image

from rlcaption.data import image_checks, load_caption_dataset
from rlcaption.data.coco import caption_features


def png_bytes(color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path, monkeypatch):
    """Image checks remembered in this test's own cache: none from an earlier run is found."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


@pytest.fixture
def decoded_images(monkeypatch) -> list[int]:
    """Counts the images the checks decode: one entry per call, the number of images it was given."""
    counts = []
    find_undecodable_images = image_checks.find_undecodable_images

    def counting(image_files, num_threads=None):
        image_files = list(image_files)
        counts.append(len(image_files))
        return find_undecodable_images(image_files, num_threads)

    monkeypatch.setattr(image_checks, "find_undecodable_images", counting)
    return counts


@pytest.fixture
def saved_dataset(tmp_path):
    """A DatasetDict saved with `save_to_disk` whose train split holds one image that does not decode."""
    train_images = [
        {"bytes": png_bytes("red"), "path": "photos/0.png"},
        {"bytes": png_bytes("blue"), "path": "photos/1.png"},
        {"bytes": b"\xff\xd8\xff not a jpeg", "path": "photos/broken.jpg"},
        {"bytes": png_bytes("green"), "path": "photos/3.png"},
    ]
    splits = {
        "train": {"image": train_images, "captions": [["a caption"]] * 4, "image_id": [10, 11, 12, 13]},
        "test": {"image": train_images[:1], "captions": [["a caption"]], "image_id": [20]},
    }
    dataset = datasets.DatasetDict(
        {name: datasets.Dataset.from_dict(columns, features=caption_features()) for name, columns in splits.items()}
    )
    dataset.save_to_disk(tmp_path / "dataset")
    return str(tmp_path / "dataset")


def test_an_undecodable_image_is_refused_when_the_dataset_is_loaded(saved_dataset):
    # datasets keeps the file name of encoded images, not their folder
    message = (
        r"1 of 4 images of split 'train' cannot be decoded:\n  image_id 12 \(broken\.jpg\): .*not an image format"
    )
    with pytest.raises(ValueError, match=message):
        load_caption_dataset(saved_dataset)
    assert load_caption_dataset(saved_dataset, verify_images=False)["train"].num_rows == 4


def test_undecodable_images_can_be_skipped_and_are_named(saved_dataset, caplog):
    with caplog.at_level(logging.WARNING):
        dataset = load_caption_dataset(saved_dataset, skip_unreadable_images=True)
    assert dataset["train"]["image_id"] == [10, 11, 13]
    assert dataset["test"]["image_id"] == [20]
    assert isinstance(dataset["train"][2]["image"], Image.Image)  # images still decode as usual
    assert "Skipped 1 of 4 images of split 'train' that cannot be decoded" in caplog.text
    assert "image_id 12 (broken.jpg)" in caplog.text


def test_rows_are_named_by_position_without_an_image_id_column(saved_dataset, tmp_path):
    dataset = datasets.load_from_disk(saved_dataset).remove_columns("image_id")
    dataset.save_to_disk(tmp_path / "without_ids")
    with pytest.raises(ValueError, match=r"row 2 \(broken\.jpg\)"):
        load_caption_dataset(str(tmp_path / "without_ids"))


def test_a_second_check_of_the_same_dataset_decodes_nothing_and_says_the_same(saved_dataset, decoded_images, caplog):
    with pytest.raises(ValueError, match=r"1 of 4 images of split 'train' cannot be decoded") as first:
        load_caption_dataset(saved_dataset)
    assert sum(decoded_images) == 5  # the corrupt image is found on the first check
    decoded_images.clear()
    with pytest.raises(ValueError) as second:
        load_caption_dataset(saved_dataset)
    assert decoded_images == [] and str(second.value) == str(first.value)
    with caplog.at_level(logging.WARNING):
        skipped = load_caption_dataset(saved_dataset, skip_unreadable_images=True)
    assert decoded_images == [] and skipped["train"]["image_id"] == [10, 11, 13]
    assert "image_id 12 (broken.jpg)" in caplog.text


def test_a_changed_dataset_is_checked_again(saved_dataset, decoded_images, tmp_path):
    load_caption_dataset(saved_dataset, skip_unreadable_images=True)
    repaired = datasets.load_from_disk(saved_dataset)
    repaired["train"] = repaired["train"].select([0, 1, 3])  # without image_id 12
    repaired.save_to_disk(tmp_path / "repaired")
    decoded_images.clear()
    assert load_caption_dataset(str(tmp_path / "repaired"))["train"].num_rows == 3
    assert decoded_images == [3, 1]  # a saved copy is another dataset, its test split too
    decoded_images.clear()
    load_caption_dataset(str(tmp_path / "repaired"))
    assert decoded_images == []
    # nothing is remembered with caching disabled, as for datasets' own cache
    datasets.disable_caching()
    try:
        load_caption_dataset(str(tmp_path / "repaired"))
    finally:
        datasets.enable_caching()
    assert decoded_images == [3, 1]
