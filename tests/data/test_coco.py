import json
import logging
from pathlib import Path

import datasets
import pytest
from PIL import Image

from rlcaption.data import image_checks, load_caption_imagefolder, load_coco, load_karpathy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "coco_captions"


def _draw(path: Path, color=(200, 0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), color).save(path)


def _karpathy_entry(index: int, split: str, coco: bool = True, num_sentences: int = 5) -> dict:
    entry = {
        "filename": f"img{index}.jpg",
        "split": split,
        "sentences": [
            {"raw": f"Caption {k} of image {index}.", "tokens": ["caption", str(k)]} for k in range(num_sentences)
        ],
    }
    if coco:
        entry.update(filepath="val2014" if split != "train" else "train2014", cocoid=1000 + index)
    else:
        entry["imgid"] = index
    return entry


def _write_karpathy(tmp_path: Path, entries: list[dict], draw: bool = True) -> Path:
    for entry in entries:
        if draw:
            _draw(tmp_path / "images" / entry.get("filepath", "") / entry["filename"])
    json_path = tmp_path / "dataset_coco.json"
    json_path.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return json_path


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path, monkeypatch):
    """Image checks remembered in this test's own cache: none from an earlier run is found."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


@pytest.fixture
def karpathy_coco(tmp_path):
    splits = ["train", "train", "restval", "val", "val", "test"]
    return _write_karpathy(tmp_path, [_karpathy_entry(i, split) for i, split in enumerate(splits)])


def test_karpathy_coco_splits_and_columns(karpathy_coco, tmp_path):
    dataset = load_karpathy(karpathy_coco, tmp_path / "images")
    assert list(dataset) == ["train", "validation", "test"]
    assert [dataset[split].num_rows for split in dataset] == [3, 2, 1]  # restval joins train
    assert dataset["train"]["image_id"] == [1000, 1001, 1002]
    assert dataset["validation"][0]["captions"] == [f"Caption {k} of image 3." for k in range(5)]
    assert isinstance(dataset["test"].features["image"], datasets.Image)
    image = dataset["test"][0]["image"]
    assert image.size == (8, 6)
    assert Path(image.filename) == tmp_path / "images" / "val2014" / "img5.jpg"


def test_karpathy_split_selection_and_restval(karpathy_coco, tmp_path):
    dataset = load_karpathy(karpathy_coco, tmp_path / "images", splits=["val", "test"])
    assert list(dataset) == ["validation", "test"]
    kept = load_karpathy(karpathy_coco, tmp_path / "images", splits="restval", restval_to_train=False)
    assert list(kept) == ["restval"] and kept["restval"]["image_id"] == [1002]
    with pytest.raises(ValueError, match="Unknown split"):
        load_karpathy(karpathy_coco, tmp_path / "images", splits=["dev2"])


def test_karpathy_without_images_root_has_captions_and_ids_only(tmp_path):
    splits = ["train", "restval", "val", "test"]
    json_path = _write_karpathy(tmp_path, [_karpathy_entry(i, split) for i, split in enumerate(splits)], draw=False)
    dataset = load_karpathy(json_path, images_root=None)  # no image file exists: none is looked for
    assert list(dataset) == ["train", "validation", "test"]
    assert dataset["train"].column_names == ["captions", "image_id"]
    assert dataset["train"]["image_id"] == [1000, 1001]
    assert dataset["test"][0]["captions"][0] == "Caption 0 of image 3."


def test_karpathy_flickr_format_uses_imgid_and_no_filepath(tmp_path):
    entries = [_karpathy_entry(i, split, coco=False) for i, split in enumerate(["train", "val", "test"])]
    entries[0]["sentences"] = [{"tokens": ["a", "dog", "runs"]}]  # no raw sentence: tokens are joined
    dataset = load_karpathy(_write_karpathy(tmp_path, entries), tmp_path / "images")
    assert dataset["train"][0]["captions"] == ["a dog runs"]
    assert dataset["validation"]["image_id"] == [1]


def test_karpathy_missing_images_one_error(tmp_path):
    entries = [_karpathy_entry(i, "train") for i in range(8)]
    json_path = _write_karpathy(tmp_path, entries, draw=False)
    _draw(tmp_path / "images" / "train2014" / "img0.jpg")
    with pytest.raises(FileNotFoundError, match=r"7 of 8 image files are missing") as error:
        load_karpathy(json_path, tmp_path / "images")
    assert "img1.jpg" in str(error.value) and "and 2 more" in str(error.value)


def test_karpathy_corrupt_image_is_found_before_training(karpathy_coco, tmp_path):
    (tmp_path / "images" / "val2014" / "img3.jpg").write_bytes(b"\xff\xd8\xff broken")
    with pytest.raises(ValueError, match=r"1 of 2 images of split .validation. cannot be decoded:\n  .*img3.jpg"):
        load_karpathy(karpathy_coco, tmp_path / "images")
    assert load_karpathy(karpathy_coco, tmp_path / "images", verify_images=False)["validation"].num_rows == 2


def test_karpathy_corrupt_images_can_be_skipped_and_are_named(karpathy_coco, tmp_path, caplog):
    (tmp_path / "images" / "val2014" / "img3.jpg").write_bytes(b"\xff\xd8\xff broken")
    with caplog.at_level(logging.WARNING):
        dataset = load_karpathy(karpathy_coco, tmp_path / "images", skip_unreadable_images=True)
    assert dataset["validation"]["image_id"] == [1004]
    assert "Skipped 1 of 2 images of split 'validation' that cannot be decoded" in caplog.text
    assert "img3.jpg" in caplog.text
    assert dataset["train"].num_rows == 3 and dataset["test"].num_rows == 1


def test_karpathy_images_are_decoded_once_until_a_file_changes(karpathy_coco, tmp_path, monkeypatch):
    decoded = []
    find_undecodable_images = image_checks.find_undecodable_images

    def counting(image_files, num_threads=None):
        decoded.extend(image_files)
        return find_undecodable_images(image_files, num_threads)

    monkeypatch.setattr(image_checks, "find_undecodable_images", counting)
    load_karpathy(karpathy_coco, tmp_path / "images")
    assert len(decoded) == 6
    decoded.clear()
    load_karpathy(karpathy_coco, tmp_path / "images")
    assert decoded == []  # the same files: remembered
    # a file replaced since (same path, so the same fingerprint) is checked again
    (tmp_path / "images" / "val2014" / "img3.jpg").write_bytes(b"\xff\xd8\xff broken")
    with pytest.raises(ValueError, match=r"1 of 2 images of split .validation. cannot be decoded:\n  .*img3.jpg"):
        load_karpathy(karpathy_coco, tmp_path / "images")
    assert len(decoded) == 2  # the validation split only


@pytest.mark.parametrize(
    "sentences, message",
    [
        ([], "img0.jpg has no captions"),
        ([{"raw": 42}], "img0.jpg has a caption of type int"),
        ([{"raw": "   "}], "img0.jpg has an empty caption"),
    ],
)
def test_karpathy_bad_captions_name_the_image(tmp_path, sentences, message):
    entry = _karpathy_entry(0, "train")
    entry["sentences"] = sentences
    with pytest.raises(ValueError, match=message):
        load_karpathy(_write_karpathy(tmp_path, [entry]), tmp_path / "images")


def test_karpathy_malformed_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_karpathy(bad, tmp_path)
    bad.write_text(json.dumps({"annotations": []}))
    with pytest.raises(ValueError, match="no 'images' field"):
        load_karpathy(bad, tmp_path)
    entry = _karpathy_entry(0, "holdout")
    with pytest.raises(ValueError, match="split 'holdout'"):
        load_karpathy(_write_karpathy(tmp_path, [entry]), tmp_path / "images")
    with pytest.raises(FileNotFoundError, match="absent.json"):
        load_karpathy(tmp_path / "absent.json", tmp_path)


def test_coco_annotation_file_from_real_fixture(tmp_path):
    annotation_file = FIXTURES / "captions_val2014_subset.json"
    annotations = json.loads(annotation_file.read_text())
    for image in annotations["images"]:
        _draw(tmp_path / image["file_name"])
    dataset = load_coco(annotation_file, tmp_path, split_name="validation")
    assert list(dataset) == ["validation"]
    split = dataset["validation"]
    assert split["image_id"] == [image["id"] for image in annotations["images"]]
    for row in split:
        expected = [a["caption"].strip() for a in annotations["annotations"] if a["image_id"] == row["image_id"]]
        assert row["captions"] == expected and len(expected) >= 5
    assert split[0]["captions"][1] == "A cow running in a field next to a dog lying down."


def _write_coco(tmp_path: Path, images: list[dict], annotations: list[dict]) -> Path:
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    for image in images:
        _draw(tmp_path / image["file_name"])
    return path


def test_coco_image_without_captions_is_named(tmp_path):
    images = [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}]
    path = _write_coco(tmp_path, images, [{"image_id": 1, "caption": "a thing"}])
    with pytest.raises(ValueError, match=r"b.png \(id 2\) has no captions"):
        load_coco(path, tmp_path)


def test_coco_non_string_caption_and_unknown_image(tmp_path):
    images = [{"id": 1, "file_name": "a.png"}]
    with pytest.raises(ValueError, match=r"a.png \(id 1\) has a caption of type NoneType"):
        load_coco(_write_coco(tmp_path, images, [{"image_id": 1, "caption": None}]), tmp_path)
    with pytest.raises(ValueError, match="refers to image_id 7"):
        load_coco(_write_coco(tmp_path, images, [{"image_id": 7, "caption": "x"}]), tmp_path)


def test_coco_missing_images(tmp_path):
    path = tmp_path / "captions.json"
    images = [{"id": i, "file_name": f"gone{i}.jpg"} for i in range(3)]
    path.write_text(json.dumps({"images": images, "annotations": [{"image_id": i, "caption": "x"} for i in range(3)]}))
    with pytest.raises(FileNotFoundError, match="3 of 3 image files are missing"):
        load_coco(path, tmp_path)


def _write_metadata(folder: Path, lines: list) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metadata.jsonl", "w") as file:
        for line in lines:
            file.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def test_imagefolder_single_split(tmp_path):
    _draw(tmp_path / "pics" / "one.png")
    _draw(tmp_path / "two.png", color=(0, 0, 200))
    _write_metadata(
        tmp_path,
        [
            {"file_name": "pics/one.png", "captions": ["a red box", "red"]},
            "",
            {"file_name": "two.png", "caption": "a blue box", "image_id": 42},
        ],
    )
    dataset = load_caption_imagefolder(tmp_path)
    assert list(dataset) == ["train"]
    assert dataset["train"]["captions"] == [["a red box", "red"], ["a blue box"]]
    assert dataset["train"]["image_id"] == [0, 42]
    assert dataset["train"][1]["image"].getpixel((0, 0)) == (0, 0, 200)


def test_imagefolder_split_folders_have_unique_ids(tmp_path):
    for split in ("train", "val", "test"):
        for index in range(2):
            _draw(tmp_path / split / f"{index}.png")
        _write_metadata(tmp_path / split, [{"file_name": f"{i}.png", "caption": f"{split} {i}"} for i in range(2)])
    dataset = load_caption_imagefolder(tmp_path)
    assert list(dataset) == ["train", "validation", "test"]
    assert [i for split in dataset for i in dataset[split]["image_id"]] == list(range(6))
    assert dataset["validation"][1]["captions"] == ["val 1"]


def test_imagefolder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No metadata.jsonl"):
        load_caption_imagefolder(tmp_path)
    _draw(tmp_path / "a.png")
    _write_metadata(tmp_path, [{"file_name": "a.png", "captions": []}])
    with pytest.raises(ValueError, match="a.png has no captions"):
        load_caption_imagefolder(tmp_path)
    _write_metadata(tmp_path, [{"file_name": "a.png", "captions": ["ok", 3]}])
    with pytest.raises(ValueError, match="a.png has a caption of type int"):
        load_caption_imagefolder(tmp_path)
    _write_metadata(tmp_path, [{"file_name": "a.png"}])
    with pytest.raises(ValueError, match="neither a 'captions' list nor a 'caption'"):
        load_caption_imagefolder(tmp_path)
    _write_metadata(tmp_path, ["{oops"])
    with pytest.raises(ValueError, match="Line 1 .* not valid JSON"):
        load_caption_imagefolder(tmp_path)
    _write_metadata(
        tmp_path,
        [{"file_name": "a.png", "caption": "x", "image_id": 1}, {"file_name": "a.png", "caption": "y", "image_id": 1}],
    )
    with pytest.raises(ValueError, match=r"unique.*duplicated: \[1\]"):
        load_caption_imagefolder(tmp_path)
