"""Saved datasets that reference their image files instead of copying them.

`save_to_disk` embeds the bytes of every image file in its Arrow files: a saved COCO is a second copy of its 19 GB of
JPEGs, and every dataset derived from it (the features of `rlcaption extract-features`) one more. A split saved with
references keeps in its `image` column each image's path relative to an image root, recorded in
`image_references.json` in the split's folder; [`resolve_image_references`] turns the paths back into a
`datasets.Image` column that decodes each file when a row is read, as the loaders' columns do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets

from .images import check_image_files

__all__ = [
    "IMAGE_REFERENCES_FILE",
    "image_root",
    "resolve_image_references",
    "with_image_paths_relative_to",
    "write_image_references",
]

IMAGE_REFERENCES_FILE = "image_references.json"
_IMAGE_COLUMN = "image"


def _replace_column(split: datasets.Dataset, values: list, feature) -> datasets.Dataset:
    """`split` with its image column replaced by `values` of type `feature`, at the same position and format."""
    order, format = split.column_names, split.format
    replaced = split.remove_columns(_IMAGE_COLUMN).add_column(_IMAGE_COLUMN, values, feature=feature)
    # `add_column` adds the column to a format's columns (a numpy format would read the image as an array)
    return replaced.select_columns(order).with_format(
        format["type"], format["columns"], format["output_all_columns"], **format["format_kwargs"]
    )


def _image_file_paths(split: datasets.Dataset) -> list[str] | None:
    """The absolute paths of the image files of `split`, or `None` when an image is held as bytes (a rendered image,
    or a dataset saved by `save_to_disk`, which embeds them) or has no file."""
    if not isinstance(split.features.get(_IMAGE_COLUMN), datasets.Image):
        return None
    storage = split.data.column(_IMAGE_COLUMN).combine_chunks()  # struct<bytes, path>, one per row
    paths = storage.field("path")
    if storage.null_count or paths.null_count or storage.field("bytes").null_count != len(storage):
        return None
    return [os.path.abspath(path) for path in paths.to_pylist()]


def image_root(split: datasets.Dataset) -> str | None:
    """The deepest folder holding every image file of `split`, or `None` when its images are not all files (see
    [`with_image_paths_relative_to`])."""
    paths = _image_file_paths(split)
    if not paths:
        return None
    return os.path.commonpath([os.path.dirname(path) for path in paths])


def with_image_paths_relative_to(split: datasets.Dataset, root: str) -> datasets.Dataset:
    """`split` with its `image` column replaced by the paths of its files relative to `root` (strings): saved, it
    holds no image bytes.

    Raises:
        `ValueError`: if an image of `split` is held as bytes rather than as a file.
    """
    paths = _image_file_paths(split)
    if paths is None:
        raise ValueError(
            f"The images of split {split.split} are not all files (some are held as bytes), so they cannot be "
            "referenced; save the dataset with `save_to_disk`, which copies them."
        )
    return _replace_column(split, [os.path.relpath(path, root) for path in paths], datasets.Value("string"))


def write_image_references(split_folder: str | os.PathLike, root: str) -> None:
    """Record, in a saved split's folder, the root its image paths are relative to."""
    references = {"image_root": os.path.abspath(root)}
    (Path(split_folder) / IMAGE_REFERENCES_FILE).write_text(json.dumps(references, indent=2), encoding="utf-8")


def resolve_image_references(split: datasets.Dataset, split_folder: str | os.PathLike) -> datasets.Dataset:
    """
    `split`, loaded from `split_folder`, with its referenced images as a `datasets.Image` column of files (decoded
    when a row is read); `split` itself when its folder records no image root.

    Raises:
        `FileNotFoundError`: if image files are missing under the recorded root (moved images: edit `image_root` in
            the folder's `image_references.json`).
    """
    references_path = Path(split_folder) / IMAGE_REFERENCES_FILE
    if not references_path.is_file():
        return split
    root = json.loads(references_path.read_text(encoding="utf-8"))["image_root"]
    paths = [os.path.join(root, path) for path in split.data.column(_IMAGE_COLUMN).to_pylist()]
    try:
        check_image_files(paths)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{split_folder} references its images under {root} ({references_path}): {error} If the images moved, "
            f"set image_root in {references_path} to their new folder."
        ) from error
    return _replace_column(split, [{"bytes": None, "path": path} for path in paths], datasets.Image())
