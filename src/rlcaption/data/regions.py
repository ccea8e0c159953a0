"""Released region features (bottom-up attention, Anderson et al. 2018) joined to a captioning dataset by image id.

Most RL captioning papers train on the bottom-up attention features: for each image, a variable number of detected
regions (10 to 100, or a fixed 36), each with a 2048-wide feature and a box. Two layouts of them are read, neither
loaded in memory as a whole:

- [`BottomUpTSVRegions`]: the TSV files of the bottom-up attention release (e.g.
  `trainval_resnet101_faster_rcnn_genome_36.tsv.0` to `.3`): one line per image with the tab-separated fields
  `image_id, image_w, image_h, num_boxes, boxes, features`, where `boxes` and `features` are base64-encoded float32
  arrays of shape `(num_boxes, 4)` and `(num_boxes, feature_size)`. The files are read once to index the byte offset
  of each image's line; a line is read and decoded when its image is.
- [`RegionFeatureFolder`]: a folder of per-image files, `<image_id>.npz` (array `feat`, `features` or `x`, and
  optionally `boxes` or `bbox`) or `<image_id>.npy` (the features), as self-critical.pytorch's preprocessing writes
  them (`cocobu_att/<image_id>.npz` with `feat`; boxes in `cocobu_box/<image_id>.npy`). `.npy` files are
  memory-mapped.

[`add_region_features`] joins either to the splits of a dataset by `image_id` (e.g. a Karpathy split loaded without
images, `load_karpathy(json_path, images_root=None)`) as a memory-mapped column, written once to the `datasets` cache:
a row's `image_features` is `(num_regions, feature_size)`. [`CaptionCollator`] pads a batch's regions to
`(batch_size, max_regions, feature_size)` and marks the real ones in `image_feature_mask` `(batch_size,
max_regions)`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

__all__ = [
    "BottomUpTSVRegions",
    "ImageRegions",
    "RegionFeatureFolder",
    "RegionFeatures",
    "add_region_features",
    "open_region_features",
]

FEATURES_COLUMN = "image_features"
BOXES_COLUMN = "image_boxes"
# The fields of a bottom-up attention TSV line, in order.
TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
# Array names of per-image `.npz` files, in order of preference: self-critical.pytorch writes `feat`, other
# extractors `features` or `x` (and `bbox` for the boxes).
NPZ_FEATURE_KEYS = ("feat", "features", "x")
NPZ_BOX_KEYS = ("boxes", "bbox")


@dataclass(frozen=True)
class ImageRegions:
    """The regions of one image.

    Args:
        features (`np.ndarray` of shape `(num_regions, feature_size)`): float32 region features.
        boxes (`np.ndarray` of shape `(num_regions, 4)`, *optional*): float32 boxes `x1, y1, x2, y2` in pixels of
            the original image, where the layout has them.
        image_width, image_height (`int`, *optional*): size of the original image, where the layout has it.
    """

    features: np.ndarray
    boxes: np.ndarray | None = None
    image_width: int | None = None
    image_height: int | None = None


class RegionFeatures:
    """Region features indexed by image id: `regions[image_id]` is an [`ImageRegions`], read on access.

    Subclasses fill `self.source` (what the error messages name) and `self._locations` (image id -> where its
    regions are) and read one image in `_read`.
    """

    source: str
    _locations: dict[int, object]

    def __len__(self) -> int:
        return len(self._locations)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._locations

    def __iter__(self) -> Iterator[int]:
        """The image ids, in the order of the files."""
        return iter(self._locations)

    def __getitem__(self, image_id: int) -> ImageRegions:
        if image_id not in self._locations:
            raise KeyError(
                f"Image {image_id!r} has no region features in {self.source} ({len(self)} images). Use the features "
                "released for the same images (COCO image ids are the Karpathy JSON's `cocoid`)."
            )
        return _checked(self._read(image_id, self._locations[image_id]), image_id, self.source)

    def _read(self, image_id: int, location: object) -> ImageRegions:
        raise NotImplementedError

    def fingerprint(self) -> list:
        """What identifies the files cheaply (paths, sizes, modification times), for caching what is built on them."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, {len(self)} images)"


def _file_stamp(path: Path) -> list:
    status = path.stat()
    return [str(path.resolve()), status.st_size, status.st_mtime_ns]


def _checked(regions: ImageRegions, image_id: int, source: str) -> ImageRegions:
    """`regions` if their features are `(num_regions, feature_size)` with at least one region and boxes `(num_regions,
    4)`; else an error naming the image."""
    features, boxes = regions.features, regions.boxes
    if features.ndim != 2 or features.shape[0] == 0:
        raise ValueError(
            f"Image {image_id} has region features of shape {features.shape} in {source}; expected (num_regions, "
            "feature_size) with at least one region. Re-extract or re-download this image's features."
        )
    if boxes is not None and boxes.shape != (features.shape[0], 4):
        raise ValueError(
            f"Image {image_id} has boxes of shape {boxes.shape} in {source} for {features.shape[0]} regions; expected "
            f"({features.shape[0]}, 4). Check that the boxes and features files belong together."
        )
    return regions


class BottomUpTSVRegions(RegionFeatures):
    """The bottom-up attention TSV files, indexed by the byte offset of each image's line.

    Building the index reads every file once (about as long as copying them); it holds three integers per image, and
    no feature. Reading an image reads and decodes its line only.

    Args:
        paths (`str`, `os.PathLike` or a sequence of them): the TSV file(s), e.g. the four parts
            `trainval_resnet101_faster_rcnn_genome_36.tsv.0` to `.3`.

    Raises:
        `FileNotFoundError`: if a file does not exist.
        `ValueError`: on a line without a tab or with a non-integer `image_id`, or on an image id found twice (each
            named with its file and line).
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]):
        if isinstance(paths, str | os.PathLike):
            paths = [paths]
        self.paths = [Path(path) for path in paths]
        if not self.paths:
            raise ValueError("Pass at least one bottom-up attention TSV file.")
        for path in self.paths:
            if not path.is_file():
                raise FileNotFoundError(f"Bottom-up attention TSV file {path} does not exist.")
        self.source = ", ".join(str(path) for path in self.paths)
        # image id -> (file index, byte offset of its line, line length in bytes)
        self._locations: dict[int, tuple[int, int, int]] = {}
        for file_index, path in enumerate(self.paths):
            self._index_file(file_index, path)

    def _index_file(self, file_index: int, path: Path) -> None:
        offset = 0
        with open(path, "rb") as file:
            for line_number, line in enumerate(file, start=1):
                where = f"Line {line_number} of {path}"
                tab = line.find(b"\t")
                if tab < 0:
                    if line.strip():
                        raise ValueError(
                            f"{where} has no tab: not a bottom-up attention TSV line "
                            f"({', '.join(TSV_FIELDS)}, separated by tabs)."
                        )
                else:
                    image_id = _parse_int(line[:tab], "image_id", where)
                    if image_id in self._locations:
                        first_file, first_offset, _ = self._locations[image_id]
                        raise ValueError(
                            f"{where} repeats image_id {image_id}, already at byte {first_offset} of "
                            f"{self.paths[first_file]}. Pass each TSV file once."
                        )
                    self._locations[image_id] = (file_index, offset, len(line))
                offset += len(line)

    def fingerprint(self) -> list:
        return [_file_stamp(path) for path in self.paths]

    def _read(self, image_id: int, location: tuple[int, int, int]) -> ImageRegions:
        file_index, offset, length = location
        path = self.paths[file_index]
        # a file opened per read, not kept open: dataloader workers forked from this process then share no offset
        with open(path, "rb") as file:
            file.seek(offset)
            line = file.read(length)
        return _parse_tsv_line(line, f"The line of image {image_id} (byte {offset} of {path})")


def _parse_int(field: bytes, name: str, where: str) -> int:
    try:
        return int(field)
    except ValueError:
        raise ValueError(
            f"{where} has {name} {field[:40]!r}, not an integer: expected the bottom-up attention TSV fields "
            f"{', '.join(TSV_FIELDS)}."
        ) from None


def _decode_float32(field: bytes, name: str, num_boxes: int, where: str, width: int | None = None) -> np.ndarray:
    """A base64-encoded float32 array as `(num_boxes, width)`, the width inferred when `None`."""
    try:
        flat = np.frombuffer(base64.b64decode(field, validate=True), dtype=np.float32)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"{where} has a {name} field that is not base64-encoded float32 data: {error}.") from None
    if width is None:
        fits = num_boxes >= 1 and flat.size > 0 and flat.size % num_boxes == 0
        expected = "a positive multiple of num_boxes"
    else:
        fits = num_boxes >= 1 and flat.size == num_boxes * width
        expected = f"{num_boxes} x {width}"
    if not fits:
        raise ValueError(
            f"{where} has {flat.size} float32 values of {name} for num_boxes={num_boxes}; expected {expected}. "
            "The file is truncated or not a bottom-up attention TSV."
        )
    return flat.reshape(num_boxes, -1)


def _parse_tsv_line(line: bytes, where: str) -> ImageRegions:
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != len(TSV_FIELDS):
        raise ValueError(
            f"{where} has {len(fields)} tab-separated fields; a bottom-up attention TSV line has {len(TSV_FIELDS)}: "
            f"{', '.join(TSV_FIELDS)}."
        )
    image_width, image_height, num_boxes = (
        _parse_int(fields[position], TSV_FIELDS[position], where) for position in (1, 2, 3)
    )
    boxes = _decode_float32(fields[4], "boxes", num_boxes, where, width=4)  # x1, y1, x2, y2
    features = _decode_float32(fields[5], "features", num_boxes, where)
    return ImageRegions(features, boxes, image_width, image_height)


class RegionFeatureFolder(RegionFeatures):
    """A folder of per-image region features: `<image_id>.npz` or `<image_id>.npy`.

    An `.npz` file holds the features as `feat`, `features` or `x` (`(num_regions, feature_size)`) and may hold the
    boxes as `boxes` or `bbox` (`(num_regions, 4)`) and the image size as `image_w`, `image_h`; an `.npy` file holds
    the features only and is memory-mapped. Files whose name is not an integer image id are ignored.

    Args:
        features_dir (`str` or `os.PathLike`): the folder, e.g. self-critical.pytorch's `data/cocobu_att`.
        boxes_dir (`str` or `os.PathLike`, *optional*): a folder of `<image_id>.npy` boxes, e.g. `data/cocobu_box`;
            they take the place of boxes stored in the `.npz` files.

    Raises:
        `FileNotFoundError`: if a folder does not exist or holds no `<image_id>.npz` / `.npy` file.
        `ValueError`: if an image has both an `.npz` and an `.npy` file.
    """

    def __init__(self, features_dir: str | os.PathLike, boxes_dir: str | os.PathLike | None = None):
        self.features_dir = Path(features_dir)
        self.boxes_dir = None if boxes_dir is None else Path(boxes_dir)
        for folder in (self.features_dir, self.boxes_dir):
            if folder is not None and not folder.is_dir():
                raise FileNotFoundError(f"Region feature folder {folder} does not exist.")
        self.source = str(self.features_dir)
        self._locations: dict[int, Path] = {}
        with os.scandir(self.features_dir) as entries:
            for entry in entries:
                stem, suffix = os.path.splitext(entry.name)
                if suffix not in (".npz", ".npy") or not stem.isdigit():
                    continue
                image_id = int(stem)
                if image_id in self._locations:
                    raise ValueError(
                        f"Image {image_id} has two feature files in {self.features_dir}: "
                        f"{self._locations[image_id].name} and {entry.name}. Keep one."
                    )
                self._locations[image_id] = Path(entry.path)
        if not self._locations:
            raise FileNotFoundError(
                f"{self.features_dir} holds no region features: expected files named <image_id>.npz or "
                "<image_id>.npy (e.g. 391895.npz)."
            )

    def fingerprint(self) -> list:
        # a folder's time changes when a file is added, removed or renamed in it
        return [_file_stamp(folder) for folder in (self.features_dir, self.boxes_dir) if folder is not None]

    def _read(self, image_id: int, location: Path) -> ImageRegions:
        boxes = width = height = None
        if location.suffix == ".npy":
            features = np.load(location, mmap_mode="r")
        else:
            with np.load(location) as archive:
                feature_key = next((key for key in NPZ_FEATURE_KEYS if key in archive.files), None)
                if feature_key is None:
                    raise ValueError(
                        f"{location} holds the arrays {archive.files} but no features: name them one of "
                        f"{NPZ_FEATURE_KEYS}."
                    )
                features = archive[feature_key]
                box_key = next((key for key in NPZ_BOX_KEYS if key in archive.files), None)
                boxes = None if box_key is None else archive[box_key]
                if "image_w" in archive.files and "image_h" in archive.files:
                    width, height = int(archive["image_w"]), int(archive["image_h"])
        if self.boxes_dir is not None:
            boxes_path = self.boxes_dir / f"{image_id}.npy"
            if not boxes_path.is_file():
                raise FileNotFoundError(f"Image {image_id} has features in {location} but no boxes at {boxes_path}.")
            boxes = np.load(boxes_path)
        # astype only where needed: it would copy a memory-mapped float32 file into memory
        features = features if features.dtype == np.float32 else features.astype(np.float32)
        boxes = None if boxes is None else np.asarray(boxes, dtype=np.float32)
        return ImageRegions(features, boxes, width, height)


def open_region_features(
    path: str | os.PathLike | Sequence[str | os.PathLike], boxes_dir: str | os.PathLike | None = None
) -> RegionFeatures:
    """Open released region features in either layout, told apart by what `path` holds.

    Args:
        path (`str`, `os.PathLike` or a sequence of them): a bottom-up attention TSV file, several of them, a folder
            of them (every `*.tsv*` file in it, in name order), or a folder of `<image_id>.npz` / `.npy` files.
        boxes_dir (`str` or `os.PathLike`, *optional*): for a folder of per-image files, a folder of
            `<image_id>.npy` boxes.

    Returns:
        [`BottomUpTSVRegions`] or [`RegionFeatureFolder`].
    """
    if not isinstance(path, str | os.PathLike):
        return BottomUpTSVRegions(path)
    path = Path(path)
    if not path.is_dir():
        return BottomUpTSVRegions(path)
    names = sorted(os.listdir(path))
    if any(name.endswith((".npz", ".npy")) for name in names):
        return RegionFeatureFolder(path, boxes_dir)
    tsv_files = [path / name for name in names if ".tsv" in name]
    if not tsv_files:
        raise FileNotFoundError(
            f"{path} holds neither <image_id>.npz / .npy files nor bottom-up attention .tsv files."
        )
    return BottomUpTSVRegions(tsv_files)


def _region_rows(
    regions: RegionFeatures, image_ids: tuple[int, ...], with_boxes: bool
) -> Iterator[dict[str, np.ndarray]]:
    """The regions of `image_ids`, in order, as rows of the columns `add_region_features` adds."""
    feature_size = None
    for image_id in image_ids:
        image = regions[image_id]
        feature_size = feature_size or image.features.shape[1]  # the first image's
        if image.features.shape[1] != feature_size:
            raise ValueError(
                f"Image {image_id} has region features of size {image.features.shape[1]} in {regions.source}, unlike "
                f"the {feature_size} of image {image_ids[0]}: use the features of one extractor for every image."
            )
        if not with_boxes:
            yield {FEATURES_COLUMN: image.features}
        elif image.boxes is None:
            raise ValueError(
                f"Image {image_id} has no boxes in {regions.source}; pass its boxes folder (boxes_dir) or "
                "with_boxes=False."
            )
        else:
            yield {FEATURES_COLUMN: image.features, BOXES_COLUMN: image.boxes}


def add_region_features(
    dataset: datasets.Dataset | datasets.DatasetDict,
    regions: RegionFeatures,
    with_boxes: bool = False,
    keep_images: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset | datasets.DatasetDict:
    """Join region features to a captioning dataset by `image_id`, as a memory-mapped column.

    Every image id of every split is looked up first, so that a missing one fails at once. The regions are then
    written image by image to an Arrow file in the `datasets` cache and memory-mapped from there: no split's features
    are ever in memory at once, reading a row reads its regions only, and reading another column (`captions`,
    `image_id`) reads no feature. The file is named by a fingerprint of the feature files (paths, sizes and
    modification times) and of the split's image ids, so a later run with the same inputs reuses it; a feature file
    rewritten in place with the same size and time is not noticed (pass another `cache_dir`).

    A row's `image_features` is a `np.ndarray` of shape `(num_regions, feature_size)`, `num_regions` varying by
    image. [`CaptionCollator`] pads them into `image_features` `(batch_size, max_regions, feature_size)` with
    `image_feature_mask` `(batch_size, max_regions)`.

    Args:
        dataset (`datasets.Dataset` or `datasets.DatasetDict`): splits with an `image_id` column, e.g.
            `load_karpathy(json_path, images_root=None)`.
        regions ([`RegionFeatures`]): from [`open_region_features`], [`BottomUpTSVRegions`] or
            [`RegionFeatureFolder`].
        with_boxes (`bool`, *optional*, defaults to `False`): also add `image_boxes`, `(num_regions, 4)` per row.
        keep_images (`bool`, *optional*, defaults to `False`): keep an `image` column; by default it is dropped, as
            the features stand for the images and decoding them at every step would be wasted.
        cache_dir (`str` or `os.PathLike`, *optional*): where the Arrow files are written; the `datasets` cache
            (`~/.cache/huggingface/datasets`) by default.

    Returns:
        The same kind of dataset, each split with its columns (`image` dropped unless kept) and `image_features`
        (and `image_boxes`), formatted as `np.ndarray` float32.

    Raises:
        `ValueError`: if a split has no `image_id` column or image ids without region features (the count and the
            first ids are named), or an image has features of another size than the split's first.
    """
    if isinstance(dataset, datasets.DatasetDict):
        return datasets.DatasetDict(
            {
                name: _join_split(split, name, regions, with_boxes, keep_images, cache_dir)
                for name, split in dataset.items()
            }
        )
    return _join_split(dataset, str(dataset.split or "dataset"), regions, with_boxes, keep_images, cache_dir)


def _join_split(
    split: datasets.Dataset,
    name: str,
    regions: RegionFeatures,
    with_boxes: bool,
    keep_images: bool,
    cache_dir: str | os.PathLike | None,
) -> datasets.Dataset:
    if "image_id" not in split.column_names:
        raise ValueError(
            f"Split {name!r} has no `image_id` column (columns: {split.column_names}); region features are joined "
            "by image id."
        )
    image_ids = list(split.select_columns("image_id").with_format(None)["image_id"])
    missing = [image_id for image_id in image_ids if image_id not in regions]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(image_ids)} images of split {name!r} have no region features in "
            f"{regions.source}: image_id {missing[:5]}{' ...' if len(missing) > 5 else ''}. Use the features released "
            "for the same images (COCO image ids are the Karpathy JSON's `cocoid`), or keep the rows that have them: "
            "`dataset.filter(lambda row: row['image_id'] in regions)`."
        )
    columns = {FEATURES_COLUMN: datasets.List(datasets.List(datasets.Value("float32")))}
    if with_boxes:
        columns[BOXES_COLUMN] = datasets.List(datasets.List(datasets.Value("float32"), length=4))
    fingerprint = hashlib.sha256(
        json.dumps([regions.fingerprint(), with_boxes, np.asarray(image_ids, dtype=np.int64).tobytes().hex()]).encode(
            "utf-8"
        )
    ).hexdigest()
    joined_columns = datasets.Dataset.from_generator(
        _region_rows,
        features=datasets.Features(columns),
        cache_dir=None if cache_dir is None else str(cache_dir),
        # a tuple, not a list: `datasets` would split a list into one generator call per item
        gen_kwargs={"regions": regions, "image_ids": tuple(image_ids), "with_boxes": with_boxes},
        fingerprint=fingerprint,
        # rows of 36 x 2048 float32 are 300 kB: the default 1000-row write batches would hold 300 MB
        writer_batch_size=64,
    )
    existing = [column for column in (*columns, *([] if keep_images else ["image"])) if column in split.column_names]
    joined = datasets.concatenate_datasets([split.remove_columns(existing), joined_columns], axis=1, split=split.split)
    return joined.with_format("numpy", columns=list(columns), output_all_columns=True)
