import base64
import json
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from rlcaption.data import (
    BottomUpTSVRegions,
    CaptionCollator,
    RegionFeatureFolder,
    add_region_features,
    load_karpathy,
    open_region_features,
)
from rlcaption.processing import CaptionProcessor

FEATURE_SIZE = 8
# image id -> number of detected regions: variable, as in the adaptive 10-100 release
NUM_REGIONS = {391895: 3, 522418: 5, 184613: 1, 318219: 4}


def _image_regions(image_id: int) -> dict:
    """Distinct, exactly representable float32 values per image, so that a mix-up of images or rows shows."""
    num_boxes = NUM_REGIONS[image_id]
    rng = np.random.default_rng(image_id)
    return {
        "image_w": 640,
        "image_h": 480 + num_boxes,
        "boxes": rng.uniform(0, 400, size=(num_boxes, 4)).astype(np.float32),
        "features": rng.standard_normal((num_boxes, FEATURE_SIZE)).astype(np.float32),
    }


def _tsv_line(image_id: int, image: dict) -> str:
    encoded = [
        base64.b64encode(np.ascontiguousarray(image[name]).tobytes()).decode("ascii") for name in ("boxes", "features")
    ]
    fields = [image_id, image["image_w"], image["image_h"], len(image["boxes"]), *encoded]
    return "\t".join(str(field) for field in fields) + "\n"


def _write_tsv(path: Path, image_ids: list[int]) -> Path:
    """A bottom-up attention TSV as the release writes it: one line per image, base64 float32 boxes and features."""
    path.write_text("".join(_tsv_line(image_id, _image_regions(image_id)) for image_id in image_ids))
    return path


def _write_karpathy_json(path: Path, image_ids_by_split: dict[str, list[int]]) -> Path:
    entries = [
        {
            "filepath": "val2014",
            "filename": f"COCO_val2014_{image_id:012d}.jpg",
            "split": split,
            "cocoid": image_id,
            "sentences": [{"raw": f"a photo of image {image_id}.", "tokens": ["a", "photo"]}],
        }
        for split, image_ids in image_ids_by_split.items()
        for image_id in image_ids
    ]
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return path


def _assert_regions_equal(image_id: int, regions) -> None:
    expected = _image_regions(image_id)
    np.testing.assert_array_equal(regions.features, expected["features"])
    np.testing.assert_array_equal(regions.boxes, expected["boxes"])


@pytest.fixture
def tsv_parts(tmp_path):
    """The release's layout: one TSV split into parts."""
    return [
        _write_tsv(tmp_path / "trainval_36.tsv.0", [391895, 522418]),
        _write_tsv(tmp_path / "trainval_36.tsv.1", [184613, 318219]),
    ]


def test_tsv_lines_are_read_back_by_image_id(tsv_parts):
    regions = BottomUpTSVRegions(tsv_parts)
    assert len(regions) == 4 and list(regions) == [391895, 522418, 184613, 318219]
    for image_id in (318219, 391895, 184613):  # any order: each line is found by its offset
        image = regions[image_id]
        _assert_regions_equal(image_id, image)
        assert image.features.shape == (NUM_REGIONS[image_id], FEATURE_SIZE)
        assert (image.image_width, image.image_height) == (640, 480 + NUM_REGIONS[image_id])
    assert 123 not in regions
    with pytest.raises(KeyError, match="Image 123 has no region features in .*trainval_36.tsv.0"):
        regions[123]


def test_tsv_index_holds_no_features(tsv_parts):
    regions = BottomUpTSVRegions(tsv_parts)
    # three integers per image; the features are read from the file at each access
    assert all(len(location) == 3 for location in regions._locations.values())
    tsv_parts[1].write_text(tsv_parts[1].read_text().replace(_tsv_line(184613, _image_regions(184613)), ""))
    with pytest.raises(ValueError, match="The line of image 318219"):
        regions[318219]  # the file changed under the index: the offset now points past its end


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda fields: fields[:5], r"has 5 tab-separated fields; a bottom-up attention TSV line has 6"),
        (lambda fields: [*fields[:3], "x3", *fields[4:]], r"has num_boxes b'x3', not an integer"),
        (
            lambda fields: [*fields[:3], "2", *fields[4:]],
            r"has 12 float32 values of boxes for num_boxes=2; expected 2 x 4",
        ),
        (lambda fields: [*fields[:4], "not base64!", fields[5]], r"has a boxes field that is not base64-encoded"),
    ],
)
def test_malformed_tsv_lines_are_named(tmp_path, corrupt, message):
    fields = _tsv_line(391895, _image_regions(391895)).rstrip("\n").split("\t")
    path = tmp_path / "bad.tsv"
    path.write_text(_tsv_line(522418, _image_regions(522418)) + "\t".join(corrupt(fields)) + "\n")
    regions = BottomUpTSVRegions(path)
    _assert_regions_equal(522418, regions[522418])  # a bad line spoils only its image
    with pytest.raises(ValueError, match=rf"The line of image 391895 \(byte \d+ of .*bad.tsv\) {message}"):
        regions[391895]


def test_tsv_index_errors_name_the_line(tmp_path):
    line = _tsv_line(391895, _image_regions(391895))
    with pytest.raises(ValueError, match=r"Line 2 of .*twice.tsv repeats image_id 391895, already at byte 0"):
        BottomUpTSVRegions(_write_tsv(tmp_path / "twice.tsv", [391895, 391895]))
    (tmp_path / "id.tsv").write_text("COCO_391895" + line[len("391895") :])
    with pytest.raises(ValueError, match=r"Line 1 of .*id.tsv has image_id b'COCO_391895', not an integer"):
        BottomUpTSVRegions(tmp_path / "id.tsv")
    (tmp_path / "csv.tsv").write_text(line.replace("\t", ","))
    with pytest.raises(ValueError, match=r"Line 1 of .*csv.tsv has no tab"):
        BottomUpTSVRegions(tmp_path / "csv.tsv")
    with pytest.raises(FileNotFoundError, match="nowhere.tsv does not exist"):
        BottomUpTSVRegions(tmp_path / "nowhere.tsv")


def test_npz_folder_with_a_boxes_folder_as_self_critical_writes_it(tmp_path):
    features_dir, boxes_dir = tmp_path / "cocobu_att", tmp_path / "cocobu_box"
    features_dir.mkdir(), boxes_dir.mkdir()
    for image_id in NUM_REGIONS:
        image = _image_regions(image_id)
        np.savez_compressed(features_dir / f"{image_id}.npz", feat=image["features"])
        np.save(boxes_dir / f"{image_id}.npy", image["boxes"])
    (features_dir / "README.txt").write_text("not a feature file")
    regions = open_region_features(features_dir, boxes_dir=boxes_dir)
    assert isinstance(regions, RegionFeatureFolder) and sorted(regions) == sorted(NUM_REGIONS)
    for image_id in NUM_REGIONS:
        _assert_regions_equal(image_id, regions[image_id])
    (boxes_dir / "184613.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"Image 184613 has features in .*184613.npz but no boxes at"):
        regions[184613]


def test_npz_and_npy_files_in_one_folder(tmp_path):
    image = _image_regions(391895)
    np.savez(tmp_path / "391895.npz", features=image["features"], boxes=image["boxes"], image_w=640, image_h=483)
    np.save(tmp_path / "522418.npy", _image_regions(522418)["features"])
    np.savez(tmp_path / "184613.npz", pooled=np.zeros(FEATURE_SIZE, dtype=np.float32))
    np.save(tmp_path / "318219.npy", np.zeros((2, 3, FEATURE_SIZE), dtype=np.float32))
    regions = RegionFeatureFolder(tmp_path)
    _assert_regions_equal(391895, regions[391895])
    assert (regions[391895].image_width, regions[391895].image_height) == (640, 483)
    memory_mapped = regions[522418]
    assert isinstance(memory_mapped.features, np.memmap) and memory_mapped.boxes is None
    np.testing.assert_array_equal(memory_mapped.features, _image_regions(522418)["features"])
    with pytest.raises(
        ValueError, match=r"184613.npz holds the arrays \['pooled'\] but no features: name them one of"
    ):
        regions[184613]
    with pytest.raises(ValueError, match=r"Image 318219 has region features of shape \(2, 3, 8\)"):
        regions[318219]
    np.save(tmp_path / "391895.npy", image["features"])
    with pytest.raises(ValueError, match="Image 391895 has two feature files"):
        RegionFeatureFolder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds no region features: expected files named <image_id>"):
        RegionFeatureFolder(tmp_path / "empty")


def test_open_region_features_tells_the_layouts_apart(tsv_parts, tmp_path):
    from_folder = open_region_features(tmp_path)  # the folder of TSV parts
    assert isinstance(from_folder, BottomUpTSVRegions) and len(from_folder) == 4
    assert isinstance(open_region_features(tsv_parts[0]), BottomUpTSVRegions)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither <image_id>.npz / .npy files nor bottom-up attention .tsv"):
        open_region_features(tmp_path / "empty")


def test_karpathy_split_joined_by_image_id_as_a_memory_mapped_column(tsv_parts, tmp_path, monkeypatch):
    json_path = _write_karpathy_json(tmp_path / "dataset_coco.json", {"train": [522418, 391895], "test": [318219]})
    karpathy = load_karpathy(json_path, images_root=None)
    regions = BottomUpTSVRegions(tsv_parts)
    reads = []
    original_read = BottomUpTSVRegions._read
    monkeypatch.setattr(
        BottomUpTSVRegions, "_read", lambda self, *args: reads.append(args[0]) or original_read(self, *args)
    )
    joined = add_region_features(karpathy, regions, with_boxes=True, cache_dir=tmp_path / "cache")
    assert sorted(reads) == [318219, 391895, 522418]  # each image read once, when written to the Arrow file
    assert all(Path(file["filename"]).is_relative_to(tmp_path / "cache") for file in joined["train"].cache_files)

    row = joined["train"][1]
    assert row["image_id"] == 391895 and row["captions"] == ["a photo of image 391895."]
    assert row["image_features"].dtype == np.float32
    np.testing.assert_array_equal(row["image_features"], _image_regions(391895)["features"])
    np.testing.assert_array_equal(row["image_boxes"], _image_regions(391895)["boxes"])
    assert joined["test"][0]["image_features"].shape == (4, FEATURE_SIZE)
    # the ids come from the Karpathy JSON, the features from the TSV: the join is by id, not by position
    np.testing.assert_array_equal(joined["train"][0]["image_features"], _image_regions(522418)["features"])
    assert joined["train"]["captions"][:] == [["a photo of image 522418."], ["a photo of image 391895."]]

    reads.clear()
    again = add_region_features(karpathy, regions, with_boxes=True, cache_dir=tmp_path / "cache")
    assert reads == []  # same files, same image ids: the Arrow file is reused
    np.testing.assert_array_equal(again["train"][1]["image_features"], row["image_features"])
    tsv_parts[1].write_text(tsv_parts[1].read_text() + _tsv_line(522418 + 1, _image_regions(391895)))
    add_region_features(karpathy, BottomUpTSVRegions(tsv_parts), with_boxes=True, cache_dir=tmp_path / "cache")
    assert sorted(reads) == [318219, 391895, 522418]  # a feature file changed: written again


def test_join_refuses_missing_ids_and_wrong_feature_sizes(tsv_parts, tmp_path):
    json_path = _write_karpathy_json(tmp_path / "dataset_coco.json", {"val": [391895, 7, 8], "test": [318219]})
    karpathy = load_karpathy(json_path, images_root=None)
    with pytest.raises(
        ValueError, match=r"2 of the 3 images of split 'validation' have no region features in .*: image_id \[7, 8\]"
    ):
        add_region_features(karpathy, BottomUpTSVRegions(tsv_parts), cache_dir=tmp_path / "cache")
    wider = tmp_path / "wider"
    wider.mkdir()
    np.save(wider / "391895.npy", np.ones((2, FEATURE_SIZE), dtype=np.float32))
    np.save(wider / "318219.npy", np.ones((2, FEATURE_SIZE + 1), dtype=np.float32))
    mixed = datasets.Dataset.from_dict({"image_id": [391895, 318219], "captions": [["a"], ["b"]]})
    with pytest.raises(Exception) as raised:
        add_region_features(mixed, RegionFeatureFolder(wider), cache_dir=tmp_path / "cache")
    assert re.search(r"Image 318219 has region features of size 9 .* unlike the 8 of image 391895", _messages(raised))
    with pytest.raises(Exception) as raised:
        add_region_features(mixed.select([0]), RegionFeatureFolder(wider), with_boxes=True, cache_dir=tmp_path / "c")
    assert re.search(r"Image 391895 has no boxes .* pass its boxes folder", _messages(raised))
    with pytest.raises(ValueError, match=r"has no `image_id` column"):
        add_region_features(mixed.remove_columns("image_id"), RegionFeatureFolder(wider))


def _messages(raised: pytest.ExceptionInfo) -> str:
    """The messages of an error and of the errors it was raised from (`datasets` wraps a generator's errors)."""
    messages, error = [], raised.value
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    return " | ".join(messages)


def test_joined_split_batches_padded_regions_with_a_mask(tsv_parts, tmp_path):
    json_path = _write_karpathy_json(tmp_path / "dataset_coco.json", {"train": [184613, 522418, 391895]})
    karpathy = load_karpathy(json_path, images_root=None)
    joined = add_region_features(karpathy, BottomUpTSVRegions(tsv_parts), with_boxes=True, cache_dir=tmp_path / "c")
    processor = CaptionProcessor.from_captions([f"a photo of image {i}." for i in NUM_REGIONS], image_size=16)
    loader = torch.utils.data.DataLoader(joined["train"], batch_size=3, collate_fn=CaptionCollator(processor))
    batch = next(iter(loader))
    assert batch["image_features"].shape == (3, 5, FEATURE_SIZE) and batch["image_features"].dtype == torch.float32
    assert batch["image_feature_mask"].tolist() == [[1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["image_boxes"].shape == (3, 5, 4)
    for row, image_id in enumerate([184613, 522418, 391895]):
        expected = _image_regions(image_id)
        num_regions = NUM_REGIONS[image_id]
        assert torch.equal(batch["image_features"][row, :num_regions], torch.from_numpy(expected["features"]))
        assert torch.equal(batch["image_boxes"][row, :num_regions], torch.from_numpy(expected["boxes"]))
        assert not batch["image_features"][row, num_regions:].any()  # zero padding
    assert batch["image_id"] == [184613, 522418, 391895]
    assert "image" not in batch and batch["caption_input_ids"].shape[0] == 3
