"""Load a published captioner by path or hub id and caption image files or folders of images."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from . import models as _models  # noqa: F401  (registers our Auto classes)
from .data.images import check_image_files, open_image
from .generation.decoding import generate_captions
from .hub import check_pretrained_reference

__all__ = ["caption_image_files", "list_image_files", "load_captioner"]


def load_captioner(
    model_name_or_path: str,
    device: str | torch.device | None = None,
    *,
    argument_name: str = "model_name_or_path",
    **kwargs: Any,
):
    """
    Loads a captioning model and its processor from a folder or a Hub id (`revision=`, `cache_dir=`, ... are passed
    to `from_pretrained`). A mistyped folder, or a Hub id that is not cached while the Hub cannot be reached, fails
    at once ([`rlcaption.hub.check_pretrained_reference`]), the error naming `argument_name` (the CLI's `--model`).

    Returns:
        `(model, processor)`, the model in evaluation mode on `device` (CPU by default).
    """
    hub_options = {key: kwargs[key] for key in ("revision", "cache_dir", "local_files_only") if key in kwargs}
    if check_pretrained_reference(model_name_or_path, option=argument_name, **hub_options):
        kwargs["local_files_only"] = True  # a cached Hub id while the Hub cannot be reached
    processor = AutoProcessor.from_pretrained(model_name_or_path, **kwargs)
    model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, **kwargs)
    model.to(device or "cpu").eval()
    return model, processor


def list_image_files(paths: Sequence[str | os.PathLike]) -> list[str]:
    """
    The image files of `paths`, in order: a file as is, a folder as the files directly in it whose extension Pillow
    knows (`.png`, `.jpg`, ...), sorted by name.

    Raises:
        `FileNotFoundError`: paths that do not exist, or a folder without image files; the message names them.
    """
    image_extensions = set(Image.registered_extensions())
    files: list[str] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(str(path))
            continue
        in_folder = sorted(
            str(file) for file in path.iterdir() if file.is_file() and file.suffix.lower() in image_extensions
        )
        if not in_folder:
            raise FileNotFoundError(
                f"Folder {path} has no image files (looked for {', '.join(sorted(image_extensions)[:8])}, ... "
                "directly in it, not in its subfolders). Pass image files or a folder of images."
            )
        files.extend(in_folder)
    check_image_files(files)
    return files


@torch.no_grad()
def caption_image_files(
    model, processor, paths: Sequence[str], batch_size: int = 16, **generation_kwargs: Any
) -> list[str]:
    """
    Captions image files (any mode Pillow reads; converted to RGB as documented in [`rlcaption.data.images`]).

    Args:
        generation_kwargs: decoding settings for `generate`, e.g. `num_beams=3, max_length=21`.

    Returns:
        One caption per path, in order.
    """
    device = next(model.parameters()).device
    captions: list[str] = []
    for start in range(0, len(paths), batch_size):
        images = [open_image(path) for path in paths[start : start + batch_size]]
        pixel_values = processor(images=images, return_tensors="pt")["pixel_values"].to(device)
        captions.extend(generate_captions(model, processor, {"pixel_values": pixel_values}, **generation_kwargs).texts)
    return captions
