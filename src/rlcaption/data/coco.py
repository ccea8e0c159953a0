"""Loaders for real captioning datasets: Karpathy-split JSON (COCO, Flickr8k, Flickr30k), COCO caption annotation
files, and image folders with a `metadata.jsonl`.

All return a `datasets.DatasetDict` with the columns of the shapes dataset except `scene`: `image`
(`datasets.Image`, decoded lazily from the file path), `captions` (list of `str`, at least one) and `image_id`
(`int`); `load_karpathy` without `images_root` leaves out `image`, for precomputed features joined by image id
(`rlcaption.data.regions`). Every loader checks that all image files exist and decode before returning, so that a
missing or corrupt file fails at once, with one error listing the count and the first paths (or rows), instead of
stopping training mid-run; `skip_unreadable_images=True` drops the files that do not decode instead, naming them in a
warning.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets

from .image_checks import check_dataset_images
from .images import check_image_files

__all__ = [
    "caption_features",
    "load_caption_imagefolder",
    "load_coco",
    "load_karpathy",
    "validate_captions",
]

# Karpathy's split names -> ours ("restval" is the rest of COCO val2014, used for training by convention).
_KARPATHY_SPLITS = {"train": "train", "restval": "restval", "val": "validation", "test": "test"}
_SPLIT_ORDER = ("train", "validation", "test", "restval")
_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation"}


def caption_features() -> datasets.Features:
    """Columns of the real-data loaders: `image`, `captions` and `image_id`."""
    return datasets.Features(
        {
            "image": datasets.Image(),
            "captions": datasets.List(datasets.Value("string")),
            "image_id": datasets.Value("int64"),
        }
    )


def validate_captions(captions: Any, image_name: str) -> list[str]:
    """Check that `captions` is a non-empty list of non-empty strings and return them stripped.

    Args:
        captions: the captions read from an annotation file.
        image_name (`str`): the image they describe, named in the error message.

    Raises:
        `ValueError`: if the list is empty or a caption is not a string or is blank.
    """
    if not isinstance(captions, list) or not captions:
        raise ValueError(
            f"Image {image_name} has no captions (got {captions!r}); every image needs at least one reference "
            "caption. Remove the image or add its captions to the annotation file."
        )
    cleaned = []
    for caption in captions:
        if not isinstance(caption, str):
            raise ValueError(
                f"Image {image_name} has a caption of type {type(caption).__name__} ({caption!r}); captions must be "
                "strings. Fix the annotation file."
            )
        if not caption.strip():
            raise ValueError(f"Image {image_name} has an empty caption; remove it from the annotation file.")
        cleaned.append(caption.strip())
    return cleaned


def _read_json(path: str | os.PathLike, what: str) -> Any:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} does not exist.")
    with open(path, encoding="utf-8") as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"{what} {path} is not valid JSON: {error}.") from error


def _require_key(entry: dict, key: str, where: str) -> Any:
    if not isinstance(entry, dict) or key not in entry:
        raise ValueError(f"{where} has no {key!r} field: {str(entry)[:200]}.")
    return entry[key]


def _build_dataset_dict(
    records: dict[str, list[tuple[str | None, list[str], int]]], verify_images: bool, skip_unreadable_images: bool
) -> datasets.DatasetDict:
    """`records[split]` lists `(image path, captions, image id)`; all files are checked before anything is built.
    Records without image paths (`None`) make splits without an `image` column."""
    image_ids = [image_id for rows in records.values() for _, _, image_id in rows]
    if len(set(image_ids)) != len(image_ids):
        duplicated = sorted(image_id for image_id, count in Counter(image_ids).items() if count > 1)[:5]
        raise ValueError(
            f"image_id values must be unique (the metrics key references by them); duplicated: {duplicated}."
        )
    paths = [path for rows in records.values() for path, _, _ in rows]
    with_images = None not in paths
    if with_images:
        check_image_files(paths)  # all there: cheap, never remembered
    features = caption_features()
    if not with_images:
        del features["image"]
    splits = {}
    for split in sorted(records, key=lambda name: (_SPLIT_ORDER + (name,)).index(name)):
        rows = records[split]
        columns = {
            "image": [path for path, _, _ in rows],
            "captions": [captions for _, captions, _ in rows],
            "image_id": [image_id for _, _, image_id in rows],
        }
        if not with_images:
            del columns["image"]
        splits[split] = datasets.Dataset.from_dict(columns, features=features, split=datasets.NamedSplit(split))
    dataset = datasets.DatasetDict(splits)
    if with_images and (verify_images or skip_unreadable_images):
        # decoded once, then remembered by each split's fingerprint: a later launch on the same files decodes nothing
        dataset = check_dataset_images(dataset, skip_unreadable_images)
    return dataset


def _normalize_split_names(splits: Iterable[str] | None, allowed: Sequence[str]) -> set[str] | None:
    if splits is None:
        return None
    if isinstance(splits, str):
        splits = [splits]
    normalized = {_SPLIT_ALIASES.get(split, split) for split in splits}
    unknown = normalized - set(allowed)
    if unknown:
        raise ValueError(f"Unknown split(s) {sorted(unknown)}; expected some of {list(allowed)}.")
    return normalized


def load_karpathy(
    json_path: str | os.PathLike,
    images_root: str | os.PathLike | None,
    splits: Iterable[str] | None = None,
    restval_to_train: bool = True,
    verify_images: bool = True,
    skip_unreadable_images: bool = False,
) -> datasets.DatasetDict:
    """Load a Karpathy-split caption file (`dataset_coco.json`, `dataset_flickr8k.json`, `dataset_flickr30k.json`).

    The file holds `{"images": [{"filepath"?, "filename", "split", "sentences": [{"raw", "tokens"}],
    "cocoid" | "imgid"}]}`; the image of an entry is `images_root / filepath / filename` (`filepath` is absent in
    the Flickr files). Captions are the `raw` sentences (the space-joined `tokens` where `raw` is missing); the
    metrics tokenize them as the COCO evaluation code does.

    Args:
        json_path (`str` or `os.PathLike`): the Karpathy JSON file.
        images_root (`str` or `os.PathLike`, *optional*): folder the image paths are relative to (for COCO, the
            folder holding `train2014/` and `val2014/`); `None` for captions and image ids only, without an `image`
            column or any image file, to join precomputed features to
            ([`rlcaption.data.regions.add_region_features`]).
        splits (`Iterable[str]`, *optional*): splits to return among `train`, `validation` (or `val`), `test` and
            `restval`; all present splits by default.
        restval_to_train (`bool`, *optional*, defaults to `True`): add Karpathy's `restval` images (the remaining
            30k COCO val2014 images) to `train`, as every published COCO result does; `False` keeps a `restval`
            split.
        verify_images (`bool`, *optional*, defaults to `True`): check that every image decodes (reads every file
            once; the outcome is remembered, so loading the same unchanged files again decodes nothing, see
            [`check_dataset_images`]); `False` checks only that the files exist.
        skip_unreadable_images (`bool`, *optional*, defaults to `False`): drop the images that do not decode,
            naming them in a warning, instead of raising.

    Returns:
        `datasets.DatasetDict`: splits among `train`, `validation`, `test` (and `restval`), columns `image` (unless
        `images_root` is `None`), `captions`, `image_id` (`cocoid` for COCO, `imgid` otherwise).

    Raises:
        `FileNotFoundError`: if the JSON file or image files are missing (one error listing the count and the first
            paths).
        `ValueError`: on malformed entries, unknown split names, empty caption lists, non-string captions, or image
            files that cannot be decoded (unless skipped).
    """
    data = _read_json(json_path, "Karpathy split file")
    entries = _require_key(data, "images", f"Karpathy split file {json_path}")
    wanted = _normalize_split_names(splits, ("train", "validation", "test", "restval"))
    records: dict[str, list[tuple[str | None, list[str], int]]] = defaultdict(list)
    for position, entry in enumerate(entries):
        where = f"Entry {position} of {json_path}"
        filename = _require_key(entry, "filename", where)
        relative_path = os.path.join(entry.get("filepath") or "", filename)
        karpathy_split = _require_key(entry, "split", where)
        if karpathy_split not in _KARPATHY_SPLITS:
            raise ValueError(
                f"Image {relative_path} has split {karpathy_split!r}; expected one of {list(_KARPATHY_SPLITS)}."
            )
        split = _KARPATHY_SPLITS[karpathy_split]
        if split == "restval" and restval_to_train:
            split = "train"
        if wanted is not None and split not in wanted:
            continue
        image_id = entry.get("cocoid", entry.get("imgid"))
        if not isinstance(image_id, int):
            raise ValueError(f"Image {relative_path} has no integer 'cocoid' or 'imgid' (got {image_id!r}).")
        sentences = _require_key(entry, "sentences", f"Image {relative_path}")
        raw_captions = [
            sentence.get("raw", " ".join(sentence.get("tokens", []))) if isinstance(sentence, dict) else sentence
            for sentence in sentences
        ]
        captions = validate_captions(raw_captions, relative_path)
        image_path = None if images_root is None else str(Path(images_root) / relative_path)
        records[split].append((image_path, captions, image_id))
    if not records:
        raise ValueError(f"No images of split(s) {sorted(wanted) if wanted else 'any'} in {json_path}.")
    return _build_dataset_dict(records, verify_images, skip_unreadable_images)


def load_coco(
    annotation_file: str | os.PathLike,
    images_root: str | os.PathLike,
    split_name: str = "train",
    verify_images: bool = True,
    skip_unreadable_images: bool = False,
) -> datasets.DatasetDict:
    """Load a COCO caption annotation file (e.g. `captions_train2014.json`) and its image folder.

    The file holds `{"images": [{"id", "file_name"}], "annotations": [{"image_id", "caption"}]}`; the image of an
    entry is `images_root / file_name`.

    Args:
        annotation_file (`str` or `os.PathLike`): the COCO annotation JSON file.
        images_root (`str` or `os.PathLike`): the folder holding the images (e.g. `train2014/`).
        split_name (`str`, *optional*, defaults to `"train"`): name of the returned split.
        verify_images (`bool`, *optional*, defaults to `True`): check that every image decodes (reads every file
            once; the outcome is remembered, so loading the same unchanged files again decodes nothing, see
            [`check_dataset_images`]); `False` checks only that the files exist.
        skip_unreadable_images (`bool`, *optional*, defaults to `False`): drop the images that do not decode,
            naming them in a warning, instead of raising.

    Returns:
        `datasets.DatasetDict`: one split `split_name` with columns `image`, `captions` (in annotation order),
        `image_id` (COCO `id`), images in the order of the file's `images` list.

    Raises:
        `FileNotFoundError`: if the annotation file or image files are missing.
        `ValueError`: on malformed entries, an image without captions, a non-string caption, an annotation that
            refers to an image not in `images`, or image files that cannot be decoded (unless skipped).
    """
    data = _read_json(annotation_file, "COCO annotation file")
    images = _require_key(data, "images", f"COCO annotation file {annotation_file}")
    annotations = _require_key(data, "annotations", f"COCO annotation file {annotation_file}")
    file_names = {}
    for position, image in enumerate(images):
        where = f"Image entry {position} of {annotation_file}"
        file_names[_require_key(image, "id", where)] = _require_key(image, "file_name", where)
    captions_by_image: dict[int, list] = {image_id: [] for image_id in file_names}
    for position, annotation in enumerate(annotations):
        image_id = _require_key(annotation, "image_id", f"Annotation {position} of {annotation_file}")
        if image_id not in captions_by_image:
            raise ValueError(
                f"Annotation {position} of {annotation_file} refers to image_id {image_id!r}, which is not in the "
                "file's 'images' list."
            )
        captions_by_image[image_id].append(_require_key(annotation, "caption", f"Annotation {position}"))
    records = [
        (
            str(Path(images_root) / file_name),
            validate_captions(captions_by_image[image_id], f"{file_name} (id {image_id})"),
            image_id,
        )
        for image_id, file_name in file_names.items()
    ]
    return _build_dataset_dict({split_name: records}, verify_images, skip_unreadable_images)


def _read_metadata(metadata_path: Path, first_image_id: int) -> list[tuple[str, list[str], int]]:
    records = []
    with open(metadata_path, encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"Line {line_number} of {metadata_path}"
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where} is not valid JSON: {error}.") from error
            file_name = _require_key(entry, "file_name", where)
            if "captions" in entry:
                captions = entry["captions"]
            elif "caption" in entry:
                captions = [entry["caption"]]
            else:
                raise ValueError(f"{where} ({file_name}) has neither a 'captions' list nor a 'caption' string.")
            image_id = entry.get("image_id", first_image_id + len(records))
            if not isinstance(image_id, int):
                raise ValueError(f"{where} ({file_name}) has a non-integer image_id {image_id!r}.")
            records.append((str(metadata_path.parent / file_name), validate_captions(captions, file_name), image_id))
    return records


def load_caption_imagefolder(
    folder: str | os.PathLike, verify_images: bool = True, skip_unreadable_images: bool = False
) -> datasets.DatasetDict:
    """Load an image folder described by `metadata.jsonl` files, the Hugging Face `imagefolder` convention.

    Each line of `metadata.jsonl` is `{"file_name": <path relative to the metadata file>, "captions": [...]}` or
    `{"file_name": ..., "caption": "..."}`, with an optional integer `"image_id"` (default: running index, unique
    across splits). Either `folder/metadata.jsonl` exists (one split, `train`), or split folders
    `folder/<split>/metadata.jsonl` with `<split>` among `train`, `validation` (or `val`) and `test`.

    Args:
        folder (`str` or `os.PathLike`): the dataset folder.
        verify_images (`bool`, *optional*, defaults to `True`): check that every image decodes (reads every file
            once; the outcome is remembered, so loading the same unchanged files again decodes nothing, see
            [`check_dataset_images`]); `False` checks only that the files exist.
        skip_unreadable_images (`bool`, *optional*, defaults to `False`): drop the images that do not decode,
            naming them in a warning, instead of raising.

    Returns:
        `datasets.DatasetDict`: columns `image`, `captions`, `image_id`.

    Raises:
        `FileNotFoundError`: if there is no `metadata.jsonl`, or image files are missing.
        `ValueError`: on malformed lines, empty caption lists, non-string captions, or image files that cannot be
            decoded (unless skipped).
    """
    folder = Path(folder)
    if (folder / "metadata.jsonl").is_file():
        metadata_files = {"train": folder / "metadata.jsonl"}
    else:
        metadata_files = {}
        for split_folder in ("train", "validation", "val", "test"):
            if (folder / split_folder / "metadata.jsonl").is_file():
                split = _SPLIT_ALIASES.get(split_folder, split_folder)
                if split in metadata_files:
                    raise ValueError(f"{folder} has both 'val' and 'validation' split folders; keep one.")
                metadata_files[split] = folder / split_folder / "metadata.jsonl"
    if not metadata_files:
        raise FileNotFoundError(
            f"No metadata.jsonl in {folder} nor in its train/validation/test subfolders. Write one line per image: "
            '{"file_name": "images/0001.jpg", "captions": ["a caption", "another caption"]}.'
        )
    records = {}
    next_image_id = 0
    for split, metadata_path in metadata_files.items():
        records[split] = _read_metadata(metadata_path, next_image_id)
        next_image_id += len(records[split])
    return _build_dataset_dict(records, verify_images, skip_unreadable_images)
