"""Decoding every image of a dataset once before training, so that a corrupt one fails at once, named, rather than
stopping a run mid-way; the outcome is remembered by the split's fingerprint ([`fingerprint_cache_file`]), so that the
next launch on the same data decodes nothing (about 123k images on COCO).

A split whose images are file paths (the Karpathy and image-folder loaders, a `save_to_disk` of theirs) is remembered
with the size and modification time of each file as well: its fingerprint covers the paths only, and a file replaced
since is checked again.
"""

from __future__ import annotations

import hashlib
import os

import datasets

from .fingerprint_cache import fingerprint_cache_file, read_json_file, write_json_atomically
from .images import find_undecodable_images

__all__ = ["check_dataset_images"]

# Rows whose encoded images are read and checked at a time: bounds the memory of the check.
_CHECK_BATCH_SIZE = 256
# Rows whose image paths are read at a time to sign their files (no image bytes are copied).
_SIGNATURE_BATCH_SIZE = 10_000
_CACHE_FORMAT = "rlcaption.image_check"
_CACHE_VERSION = 1

logger = datasets.utils.logging.get_logger(__name__)

# (position in the split, row name, why its image cannot be decoded)
Problem = tuple[int, str, str]


def check_dataset_images(
    dataset: datasets.DatasetDict, skip_unreadable_images: bool = False, num_threads: int | None = None
) -> datasets.DatasetDict:
    """Decode the `image` column (`datasets.Image`) of every split once, raising ONE error for all bad images.

    Images are read undecoded (their file bytes, or their path) and checked as `check_image_files(verify=True)`
    checks files; rows are named by their `image_id` (else their position) and the image's path when it has one.
    The outcome of a split is remembered by its fingerprint under the `datasets` cache: checking the same split again
    (the next launch of a recipe) decodes nothing and gives the same error, or drops the same rows. A split whose
    images are files is checked again when a file's size or modification time changed.

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
        problems = _remembered_undecodable_rows(split, num_threads)
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


def _remembered_undecodable_rows(split: datasets.Dataset, num_threads: int | None) -> list[Problem]:
    """[`_undecodable_rows`] of `split`, read from the cache when this split (and its image files) was checked."""
    cache_file = fingerprint_cache_file(split, "image_checks", ".json")
    if cache_file is None:
        return _undecodable_rows(split, num_threads)
    files_signature = _image_files_signature(split)
    remembered = read_json_file(cache_file)
    if (
        isinstance(remembered, dict)
        and remembered.get("format") == _CACHE_FORMAT
        and remembered.get("version") == _CACHE_VERSION
        and remembered.get("num_rows") == split.num_rows
        and remembered.get("files_signature") == files_signature
    ):
        logger.info(f"The images of this split were checked before ({cache_file}): not decoding them again.")
        return [(position, row_name, problem) for position, row_name, problem in remembered["problems"]]
    problems = _undecodable_rows(split, num_threads)
    write_json_atomically(
        cache_file,
        {
            "format": _CACHE_FORMAT,
            "version": _CACHE_VERSION,
            "num_rows": split.num_rows,
            "files_signature": files_signature,
            "problems": problems,
        },
    )
    return problems


def _image_files_signature(split: datasets.Dataset) -> str:
    """A digest of the path, size and modification time of every image file `split` refers to (rows that hold their
    image's bytes are covered by the fingerprint). A missing file signs as missing, so its return is seen too."""
    encoded = split.select_columns(["image"]).cast_column("image", datasets.Image(decode=False)).with_format("arrow")
    digest = hashlib.sha256()
    for start in range(0, split.num_rows, _SIGNATURE_BATCH_SIZE):
        for chunk in encoded[start : start + _SIGNATURE_BATCH_SIZE]["image"].chunks:
            # flatten() respects the chunk's offset and validity, unlike field(); the bytes are not copied
            fields = dict(zip((field.name for field in chunk.type), chunk.flatten(), strict=True))
            refers_to_file = fields["bytes"].is_null().to_pylist()  # a row without bytes reads its path
            for is_file, path in zip(refers_to_file, fields["path"].to_pylist(), strict=True):
                if not is_file or not path:
                    continue
                try:
                    status = os.stat(path)
                    digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\n".encode())
                except OSError:
                    digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()


def _undecodable_rows(split: datasets.Dataset, num_threads: int | None) -> list[Problem]:
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
