"""Resolve a dataset argument of the recipes (`shapes`, a saved folder, a folder of images with captions, or a Hub
dataset id) to a DatasetDict, with every image checked before training starts."""

from __future__ import annotations

import os
from typing import Any

import datasets

from ..shapes.dataset import load_shapes
from .coco import load_caption_imagefolder
from .image_checks import check_dataset_images
from .image_references import (
    image_root,
    resolve_image_references,
    with_image_paths_relative_to,
    write_image_references,
)

__all__ = ["load_caption_dataset", "load_saved_dataset", "save_dataset_referencing_images", "saved_dataset_folder"]

_REQUIRED_COLUMNS = ("captions",)
_IMAGE_COLUMNS = ("image", "pixel_values", "image_features")


def load_caption_dataset(
    name_or_path: str, verify_images: bool = True, skip_unreadable_images: bool = False, **shapes_kwargs: Any
) -> datasets.DatasetDict:
    """
    Loads a captioning dataset for training or evaluation.

    Args:
        name_or_path: `"shapes"` (the embedded synthetic dataset; `shapes_kwargs` such as `num_train` are passed to
            [`load_shapes`]), a folder written by `DatasetDict.save_to_disk`, an `rlcaption extract-features` output
            folder (its `dataset/` is read, as the recipes' `--image_features` reads it), a folder of images with their
            captions in `metadata.jsonl` files (read by [`load_caption_imagefolder`]), or a Hub dataset id.
        verify_images: decode every image of an `image` column once ([`check_dataset_images`]), so that a corrupt
            one fails now, named, rather than stopping training mid-run; a later launch on the same data remembers
            the outcome instead of decoding again. The shapes images, rendered here, are not checked.
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
    if os.path.isdir(name_or_path):
        name_or_path = saved_dataset_folder(name_or_path)
    if os.path.isdir(name_or_path) and not _is_saved_dataset(name_or_path):
        try:
            return load_caption_imagefolder(name_or_path, verify_images, skip_unreadable_images)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"Dataset {name_or_path!r} is not a folder written by `save_to_disk` (it has no "
                f"{datasets.config.DATASETDICT_JSON_FILENAME}), so it was read as a folder of images: {error}"
            ) from error
    if os.path.isdir(name_or_path):
        dataset = load_saved_dataset(name_or_path)
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


def load_saved_dataset(folder: str | os.PathLike) -> datasets.Dataset | datasets.DatasetDict:
    """
    `datasets.load_from_disk` of `folder` (of its `dataset/` for an `rlcaption extract-features` output folder), with
    the images of splits saved by reference ([`save_dataset_referencing_images`], `extract-features`) as a
    `datasets.Image` column of their files. Folders written by `save_to_disk` load as it loads them.
    """
    folder = saved_dataset_folder(str(folder))
    dataset = datasets.load_from_disk(folder)
    if isinstance(dataset, datasets.DatasetDict):
        return datasets.DatasetDict(
            {name: resolve_image_references(split, os.path.join(folder, name)) for name, split in dataset.items()}
        )
    return resolve_image_references(dataset, folder)


def save_dataset_referencing_images(
    dataset: datasets.Dataset | datasets.DatasetDict, folder: str | os.PathLike
) -> None:
    """
    `dataset.save_to_disk(folder)` without a copy of the image files: each split keeps its images' paths relative to
    their common folder, recorded beside it (`image_references.json`), and [`load_saved_dataset`] (so every
    `--dataset` and `extract-features`) reads the files from there. A saved COCO takes a few MB instead of 19 GB; the
    image files must stay where they are.

    Args:
        dataset (`datasets.DatasetDict` or `datasets.Dataset`): with an `image` column of files, as
            [`rlcaption.data.load_karpathy`], `load_coco` and `load_caption_imagefolder` return.
        folder (`str` or `os.PathLike`): where to save it.

    Raises:
        `ValueError`: if a split has no `image` column of files (images held as bytes: use `save_to_disk`).
    """
    splits = dataset if isinstance(dataset, datasets.DatasetDict) else {None: dataset}
    roots = {name: image_root(split) for name, split in splits.items()}
    for name, root in roots.items():
        if root is None:
            raise ValueError(
                f"Split {name or splits[name].split} has no `image` column of image files (its images are held as "
                "bytes, or it has none), so there is nothing to reference; save it with `save_to_disk`."
            )
    referencing = {name: with_image_paths_relative_to(split, roots[name]) for name, split in splits.items()}
    if isinstance(dataset, datasets.DatasetDict):
        datasets.DatasetDict(referencing).save_to_disk(str(folder))
        for name, root in roots.items():
            write_image_references(os.path.join(folder, name), root)
    else:
        referencing[None].save_to_disk(str(folder))
        write_image_references(folder, roots[None])


def saved_dataset_folder(folder: str) -> str:
    """The folder `datasets.load_from_disk` reads for `folder`: its `dataset/` when `folder` is an `rlcaption
    extract-features` output folder, else `folder` itself. Every command names a features folder the same way."""
    extracted = os.path.join(folder, "dataset")
    if not _is_saved_dataset(folder) and os.path.isdir(extracted) and _is_saved_dataset(extracted):
        return extracted
    return folder


def _is_saved_dataset(folder: str) -> bool:
    """Whether `folder` was written by `save_to_disk` (of a `DatasetDict`, or of a single `Dataset`)."""
    return any(
        os.path.isfile(os.path.join(folder, file_name))
        for file_name in (datasets.config.DATASETDICT_JSON_FILENAME, datasets.config.DATASET_STATE_JSON_FILENAME)
    )
