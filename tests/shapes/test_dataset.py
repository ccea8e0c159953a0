import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest

from rlcaption.shapes import dataset as shapes
from rlcaption.shapes.dataset import COLORS, SHAPES, SceneObject, load_shapes, render_scene, shapes_cache_path

SPLITS = ("train", "validation", "test")
CAPTION_PATTERN = re.compile(r"^[a-z]+( [a-z]+)*\.?$")


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory):
    return load_shapes(
        num_train=40, num_validation=15, num_test=15, image_size=64, seed=0, cache_dir=tmp_path_factory.mktemp("c")
    )


@pytest.fixture(scope="module")
def medium_shapes(tmp_path_factory):
    return load_shapes(num_train=400, num_validation=100, num_test=100, seed=3, cache_dir=tmp_path_factory.mktemp("m"))


def _scene_key(scene):
    return tuple(sorted((obj["shape"], obj["color"], obj["size"], obj["row"], obj["column"]) for obj in scene))


def _single_attribute_change(scene_a, scene_b) -> bool:
    """True when the scenes (objects in the same order) differ in exactly one attribute of exactly one object."""
    if len(scene_a) != len(scene_b):
        return False
    differences = 0
    for obj_a, obj_b in zip(scene_a, scene_b, strict=True):
        for attribute in ("shape", "color", "size"):
            differences += obj_a[attribute] != obj_b[attribute]
        differences += (obj_a["row"], obj_a["column"]) != (obj_b["row"], obj_b["column"])
    return differences == 1


def test_splits_columns_and_sizes(small_shapes):
    assert list(small_shapes) == list(SPLITS)
    assert [small_shapes[split].num_rows for split in SPLITS] == [40, 15, 15]
    assert isinstance(small_shapes["train"].features["image"], datasets.Image)
    assert set(small_shapes["train"].column_names) == {"image", "captions", "image_id", "scene"}
    image = small_shapes["train"][0]["image"]
    assert image.mode == "RGB" and image.size == (64, 64)


def test_image_ids_unique_across_splits(small_shapes):
    image_ids = [image_id for split in SPLITS for image_id in small_shapes[split]["image_id"]]
    assert len(image_ids) == len(set(image_ids)) == 70


def test_five_short_lowercase_captions(medium_shapes):
    for split in SPLITS:
        for captions in medium_shapes[split]["captions"]:
            assert len(captions) == 5
            for caption in captions:
                assert CAPTION_PATTERN.match(caption), caption
                assert len(caption.split()) <= 16, caption


def test_vocabulary_is_small(medium_shapes):
    vocabulary = {word for split in SPLITS for captions in medium_shapes[split]["captions"] for c in captions
                  for word in c.split()}  # fmt: skip
    assert len(vocabulary) < 80
    # every colour and shape name is used
    assert set(COLORS) <= vocabulary and set(SHAPES) <= vocabulary


def test_scenes_have_one_to_three_objects_in_distinct_cells(medium_shapes):
    counts = Counter()
    for scene in medium_shapes["train"]["scene"]:
        counts[len(scene)] += 1
        cells = [(obj["row"], obj["column"]) for obj in scene]
        assert len(set(cells)) == len(cells)
        for obj in scene:
            assert -1.0 <= obj["x"] <= 1.0 and -1.0 <= obj["y"] <= 1.0
    assert set(counts) == {1, 2, 3}


def test_captions_describe_the_scene(medium_shapes):
    for scene, captions in zip(medium_shapes["test"]["scene"], medium_shapes["test"]["captions"], strict=True):
        text = " ".join(captions)
        for obj in scene:
            color_words = ("gray", "grey") if obj["color"] == "gray" else (obj["color"],)
            # at least one reference names each object with its colour
            assert any(f"{color} {obj['shape']}" in text for color in color_words), (scene, captions)
        count_word = {1: "one", 2: "two", 3: "three"}[len(scene)]
        assert not any(word in text.split() for word in {"one", "two", "three"} - {count_word}), captions


def test_references_mix_generic_and_specific(medium_shapes):
    size_words = {"small", "little", "large", "big"}
    color_words = set(COLORS) | {"grey"}
    for captions in medium_shapes["train"]["captions"]:
        generic = [c for c in captions if not color_words & set(c.split())]
        specific = [c for c in captions if size_words & set(c.split())]
        assert len(generic) == 2 and 1 <= len(specific) <= 2, captions
    # no generic sentence is shared by many images (copying one must not pay under CIDEr-D), yet the generic
    # references use few words: their n-grams recur across the data, as COCO's generic phrases do
    generic_counts = Counter(c for captions in medium_shapes["train"]["captions"] for c in set(captions)
                             if not color_words & set(c.split()))  # fmt: skip
    assert generic_counts.most_common(1)[0][1] < 0.02 * medium_shapes["train"].num_rows
    bigram_counts = Counter(
        bigram for caption in generic_counts for bigram in zip(caption.split(), caption.split()[1:], strict=False)
    )
    assert bigram_counts["white", "background"] > 0.1 * medium_shapes["train"].num_rows


def test_relation_in_specific_caption_matches_geometry():
    rng = random.Random(0)
    left = SceneObject("circle", "red", "small", row=1, column=0)
    right = SceneObject("square", "blue", "large", row=0, column=2)
    for _ in range(20):
        captions = shapes.describe_scene((left, right), rng)
        for caption in captions:
            if "small red circle" in caption or "little red circle" in caption:
                words = caption.split()
                # either "<circle> ... left of <square>" or "<square> ... right of <circle>"
                circle_first = words.index("circle") < words.index("square")
                assert ("left" in words) == circle_first and ("right" in words) == (not circle_first), caption


def test_deterministic_by_seed(small_shapes, tmp_path):
    again = load_shapes(
        num_train=40, num_validation=15, num_test=15, image_size=64, seed=0, cache_dir=tmp_path / "again"
    )
    other_seed = load_shapes(num_train=40, num_validation=15, num_test=15, seed=1, cache_dir=tmp_path / "other")
    for split in SPLITS:
        assert again[split]["captions"] == small_shapes[split]["captions"]
        assert again[split]["scene"] == small_shapes[split]["scene"]
        first, second = again[split][0]["image"], small_shapes[split][0]["image"]
        assert np.array_equal(np.asarray(first), np.asarray(second))
    assert other_seed["train"]["scene"] != small_shapes["train"]["scene"]


def test_evaluation_splits_do_not_depend_on_num_train(small_shapes, tmp_path):
    bigger_train = load_shapes(num_train=60, num_validation=15, num_test=15, seed=0, cache_dir=tmp_path)
    assert bigger_train["test"]["scene"] == small_shapes["test"]["scene"]
    assert bigger_train["validation"]["captions"] == small_shapes["validation"]["captions"]


def test_splits_have_disjoint_scenes(medium_shapes):
    keys = {split: [_scene_key(scene) for scene in medium_shapes[split]["scene"]] for split in SPLITS}
    all_keys = [key for split_keys in keys.values() for key in split_keys]
    assert len(all_keys) == len(set(all_keys)), "a scene appears twice"
    assert not set(keys["train"]) & set(keys["test"])
    assert not set(keys["train"]) & set(keys["validation"])
    assert not set(keys["validation"]) & set(keys["test"])


def test_near_duplicates_exist_within_each_split(medium_shapes):
    for split in SPLITS:
        scenes = medium_shapes[split]["scene"]
        # families are generated consecutively: a variant follows its base or a sibling
        with_near_duplicate = {
            index
            for index in range(len(scenes))
            for other in range(max(0, index - 2), min(len(scenes), index + 3))
            if other != index and _single_attribute_change(scenes[index], scenes[other])
        }
        assert len(with_near_duplicate) > 0.4 * len(scenes), split
        # near-duplicates are distinguishable in words: their reference sets differ
        captions = medium_shapes[split]["captions"]
        for index in with_near_duplicate:
            for other in (index - 1, index + 1):
                if 0 <= other < len(scenes) and _single_attribute_change(scenes[index], scenes[other]):
                    assert set(captions[index]) != set(captions[other])


def test_render_scene_draws_the_right_colours_in_the_right_cells():
    scene = (
        SceneObject("circle", "red", "large", row=0, column=0),
        SceneObject("circle", "blue", "small", row=2, column=2),
    )
    pixels = np.asarray(render_scene(scene, 96))
    cell = 96 // 3
    assert (pixels[cell // 2, cell // 2] == COLORS["red"]).all()
    assert (pixels[cell * 5 // 2, cell * 5 // 2] == COLORS["blue"]).all()
    assert (pixels[cell * 3 // 2, cell * 3 // 2] == 255).all()  # the empty centre cell stays white
    # the large circle covers about (0.45 / 0.26) ** 2 = 3 times the pixels of the small one
    red_area = (pixels == COLORS["red"]).all(axis=-1).sum()
    blue_area = (pixels == COLORS["blue"]).all(axis=-1).sum()
    assert red_area > 2 * blue_area


@pytest.mark.parametrize("shape", SHAPES)
def test_objects_stay_inside_their_cell(shape):
    cell = 64 / 3
    for x in (-1.0, 1.0):
        for y in (-1.0, 1.0):
            obj = SceneObject(shape, "green", "large", row=1, column=1, x=x, y=y)
            pixels = np.asarray(render_scene((obj,), 64))
            rows, columns = np.nonzero((pixels != 255).any(axis=-1))
            assert rows.min() >= int(cell) - 1 and rows.max() <= int(2 * cell) + 1
            assert columns.min() >= int(cell) - 1 and columns.max() <= int(2 * cell) + 1


def test_cache_is_reused(tmp_path, monkeypatch):
    first = load_shapes(num_train=10, num_validation=3, num_test=3, cache_dir=tmp_path)
    path = shapes_cache_path(num_train=10, num_validation=3, num_test=3, cache_dir=tmp_path)
    assert (path / "dataset_dict.json").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("the cached dataset should have been loaded")

    monkeypatch.setattr(shapes, "_generate", fail)
    second = load_shapes(num_train=10, num_validation=3, num_test=3, cache_dir=tmp_path)
    assert second["train"]["captions"] == first["train"]["captions"]
    assert shapes_cache_path(num_train=10, seed=1, cache_dir=tmp_path) != shapes_cache_path(
        num_train=10, cache_dir=tmp_path
    )


def test_default_cache_lives_under_the_hf_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    assert shapes_cache_path().parent == tmp_path / "rlcaption_shapes"


def test_interrupted_write_leaves_no_trusted_cache(tmp_path, monkeypatch):
    original_save = datasets.DatasetDict.save_to_disk

    def interrupted_save(self, dataset_path, **kwargs):
        original_save(self, dataset_path, **kwargs)  # everything written, but the process dies before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        load_shapes(num_train=5, num_validation=2, num_test=2, cache_dir=tmp_path)
    path = shapes_cache_path(num_train=5, num_validation=2, num_test=2, cache_dir=tmp_path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary directory was removed

    # a temporary directory left by a killed process is ignored, not trusted
    (tmp_path / f".{path.name}.tmp-killed").mkdir()
    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", original_save)
    dataset = load_shapes(num_train=5, num_validation=2, num_test=2, cache_dir=tmp_path)
    assert dataset["train"].num_rows == 5 and path.is_dir()


@pytest.mark.parametrize("bad_size", [0, -1, 2.5, True, "3"])
@pytest.mark.parametrize("split", SPLITS)
def test_every_split_needs_at_least_one_image(split, bad_size, tmp_path):
    sizes = {"num_train": 3, "num_validation": 2, "num_test": 2, f"num_{split}": bad_size}
    message = rf"num_{split} must be an integer of at least 1.*got {re.escape(repr(bad_size))}"
    for _attempt in range(2):  # the refusal writes nothing, so a second call is refused the same way
        with pytest.raises(ValueError, match=message):
            load_shapes(cache_dir=tmp_path, **sizes)
        assert list(tmp_path.iterdir()) == []


def _remove_a_data_file(path):
    os.remove(next(path.glob("train/*.arrow")))


def _truncate_a_data_file(path):
    data_file = next(path.glob("train/*.arrow"))
    data_file.write_bytes(data_file.read_bytes()[:100])


def _remove_the_split_list(path):
    os.remove(path / "dataset_dict.json")


def _list_no_data_files(path):
    # what saving an empty split leaves: a split whose state lists no data file
    state_file = path / "train" / "state.json"
    state = json.loads(state_file.read_text())
    state["_data_files"] = []
    state_file.write_text(json.dumps(state))


@pytest.mark.parametrize(
    "damage", [_remove_a_data_file, _truncate_a_data_file, _remove_the_split_list, _list_no_data_files]
)
def test_a_broken_cache_entry_is_regenerated(damage, tmp_path):
    sizes = {"num_train": 5, "num_validation": 2, "num_test": 2, "cache_dir": tmp_path}
    captions = list(load_shapes(**sizes)["train"]["captions"])
    path = shapes_cache_path(**sizes)
    damage(path)
    with pytest.raises((OSError, ValueError, LookupError)):
        datasets.load_from_disk(str(path))
    again = load_shapes(**sizes)
    assert {split: again[split].num_rows for split in SPLITS} == {"train": 5, "validation": 2, "test": 2}
    assert list(again["train"]["captions"]) == captions
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]  # the broken copy is gone
    datasets.load_from_disk(str(path))  # and the new one is complete


def test_a_save_that_cannot_be_loaded_back_is_not_cached(tmp_path, monkeypatch):
    original_save = datasets.DatasetDict.save_to_disk

    def incomplete_save(self, dataset_path, **kwargs):
        original_save(self, dataset_path, **kwargs)
        _remove_a_data_file(Path(dataset_path))  # reports success, but a split cannot be read back

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", incomplete_save)
    sizes = {"num_train": 5, "num_validation": 2, "num_test": 2, "cache_dir": tmp_path}
    with pytest.raises(RuntimeError, match="cannot be loaded back"):
        load_shapes(**sizes)
    assert list(tmp_path.iterdir()) == []  # neither the cache entry nor the temporary directory remains

    monkeypatch.setattr(datasets.DatasetDict, "save_to_disk", original_save)
    assert load_shapes(**sizes)["train"].num_rows == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_train": -1}, "num_train"),
        ({"num_train": 0, "num_validation": 0, "num_test": 0}, "num_train must be an integer of at least 1"),
        ({"image_size": 8}, "image_size"),
    ],
)
def test_invalid_arguments(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        load_shapes(cache_dir=tmp_path, **kwargs)


def test_large_request_falls_back_when_single_object_scenes_run_out():
    # only 756 single-object scenes exist; asking for more must not loop forever nor repeat scenes
    seen: set = set()
    scenes = shapes.generate_split_scenes(3000, random.Random(0), seen)
    assert len(scenes) == 3000 and len(seen) == 3000
    assert sum(len(scene) == 1 for scene in scenes) <= 756
