"""Resolve a dataset argument of the recipes (`shapes`, a saved folder, a folder of images with captions, or a Hub
dataset id) to a DatasetDict, with every image checked before training starts."""

from __future__ import annotations

import os
from typing import Any

import datasets

from .coco import load_caption_imagefolder
from .images import find_undecodable_images
from .shapes import load_shapes

__all__ = ["check_dataset_images", "load_caption_dataset"]

_REQUIRED_COLUMNS = ("captions",)
_IMAGE_COLUMNS = ("image", "pixel_values", "image_features")
# Rows whose encoded images are read and checked at a time: bounds the memory of the check.
_CHECK_BATCH_SIZE = 256

logger = datasets.utils.logging.get_logger(__name__)


def load_caption_dataset(
    name_or_path: str, verify_images: bool = True, skip_unreadable_images: bool = False, **shapes_kwargs: Any
) -> datasets.DatasetDict:
    """
    Loads a captioning dataset for training or evaluation.

    Args:
        name_or_path: `"shapes"` (the embedded synthetic dataset; `shapes_kwargs` such as `num_train` are passed to
            [`load_shapes`]), a folder written by `DatasetDict.save_to_disk`, a folder of images with their captions
            in `metadata.jsonl` files (read by [`load_caption_imagefolder`]), or a Hub dataset id.
        verify_images: decode every image of an `image` column once ([`check_dataset_images`]), so that a corrupt
            one fails now, named, rather than stopping training mid-run. The shapes images, rendered here, are not
            checked.
        skip_unreadable_images: drop the rows whose image does not decode, naming them in a warning, instead of
            raising.

    Returns:
        `datasets.DatasetDict` whose splits have a `captions` column and an image column (`image`, `pixel_values`
        or `image_features`).
    """
    if name_or_path == "shapes":
        return load_shapes(**shapes_kwargs)
    if shapes_kwargs:
        raise ValueError(f"Options {sorted(shapes_kwargs)} apply to the shapes dataset only, not {name_or_path!r}.")
    if os.path.isdir(name_or_path) and not _is_saved_dataset(name_or_path):
        try:
            return load_caption_imagefolder(name_or_path, verify_images, skip_unreadable_images)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"Dataset {name_or_path!r} is not a folder written by `save_to_disk` (it has no "
                f"{datasets.config.DATASETDICT_JSON_FILENAME}), so it was read as a folder of images: {error}"
            ) from error
    if os.path.isdir(name_or_path):
        dataset = datasets.load_from_disk(name_or_path)
    elif os.path.exists(name_or_path) or name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(
            f"Dataset {name_or_path!r} is not a folder written by `save_to_disk`; pass such a folder, `shapes`, "
            "or a Hub dataset id."
        )
    else:
        dataset = datasets.load_dataset(name_or_path)
    if not isinstance(dataset, datasets.DatasetDict):
        raise ValueError(f"Dataset {name_or_path!r} has no splits; save a DatasetDict (train/validation/test).")
    for split_name, split in dataset.items():
        missing = [column for column in _REQUIRED_COLUMNS if column not in split.column_names]
        if missing or not any(column in split.column_names for column in _IMAGE_COLUMNS):
            raise ValueError(
                f"Split {split_name!r} of {name_or_path!r} has columns {split.column_names}; a captioning dataset "
                f"needs `captions` and one of {_IMAGE_COLUMNS} (see rlcaption.data.load_karpathy / load_coco)."
            )
    if verify_images or skip_unreadable_images:
        dataset = check_dataset_images(dataset, skip_unreadable_images)
    return dataset


def _is_saved_dataset(folder: str) -> bool:
    """Whether `folder` was written by `save_to_disk` (of a `DatasetDict`, or of a single `Dataset`)."""
    return any(
        os.path.isfile(os.path.join(folder, file_name))
        for file_name in (datasets.config.DATASETDICT_JSON_FILENAME, datasets.config.DATASET_STATE_JSON_FILENAME)
    )


def check_dataset_images(
    dataset: datasets.DatasetDict, skip_unreadable_images: bool = False, num_threads: int | None = None
) -> datasets.DatasetDict:
    """Decode the `image` column (`datasets.Image`) of every split once, raising ONE error for all bad images.

    Images are read undecoded (their file bytes, or their path) and checked as `check_image_files(verify=True)`
    checks files; rows are named by their `image_id` (else their position) and the image's path when it has one.

    Args:
        dataset (`datasets.DatasetDict`): the splits; a split without an `image` column is returned unchanged.
        skip_unreadable_images (`bool`, *optional*, defaults to `False`): drop the rows whose image does not decode,
            naming them in a warning, instead of raising.
        num_threads (`int`, *optional*): decoding threads; see [`find_undecodable_images`].

    Returns:
        `datasets.DatasetDict`: `dataset`, without the rows of undecodable images when they are skipped.

    Raises:
        `ValueError`: if images cannot be decoded (and are not skipped); the message gives, per split, their count,
            the first rows and why each failed.
    """
    checked, errors = {}, []
    for split_name, split in dataset.items():
        if not isinstance(split.features.get("image"), datasets.Image):
            checked[split_name] = split  # pixel_values or image_features: nothing to decode
            continue
        problems = _undecodable_rows(split, num_threads)
        if problems and not skip_unreadable_images:
            listing = "\n".join(f"  {row_name}: {problem}" for _, row_name, problem in problems[:5])
            more = f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else ""
            errors.append(
                f"{len(problems)} of {split.num_rows} images of split {split_name!r} cannot be decoded:\n"
                f"{listing}{more}"
            )
        elif problems:
            listing = "\n".join(f"  {row_name}: {problem}" for _, row_name, problem in problems)
            logger.warning(
                f"Skipped {len(problems)} of {split.num_rows} images of split {split_name!r} that cannot be "
                f"decoded:\n{listing}"
            )
            undecodable = {position for position, _, _ in problems}
            split = split.select([position for position in range(split.num_rows) if position not in undecodable])
        checked[split_name] = split
    if errors:
        raise ValueError(
            "\n".join(errors) + "\nRe-encode or remove these images, or load the dataset with "
            "skip_unreadable_images=True to drop them."
        )
    return datasets.DatasetDict(checked)


def _undecodable_rows(split: datasets.Dataset, num_threads: int | None) -> list[tuple[int, str, str]]:
    """`(position, row name, why)` of every row of `split` whose image cannot be decoded."""
    image_ids = split["image_id"] if "image_id" in split.column_names else None
    encoded = split.select_columns(["image"]).cast_column("image", datasets.Image(decode=False))
    problems = []
    for start in range(0, split.num_rows, _CHECK_BATCH_SIZE):
        images = encoded[start : start + _CHECK_BATCH_SIZE]["image"]  # {"bytes", "path"} per row
        # a row without bytes refers to a file; an unreadable one is reported like a corrupt one
        image_files = [image["bytes"] if image["bytes"] is not None else image["path"] or "" for image in images]
        for offset, problem in find_undecodable_images(image_files, num_threads).items():
            position = start + offset
            row_name = f"image_id {image_ids[position]!r}" if image_ids is not None else f"row {position}"
            path = images[offset]["path"]
            problems.append((position, f"{row_name} ({path})" if path else row_name, problem))
    return problems
