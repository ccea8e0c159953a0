"""Load a published captioner by path or hub id and caption image files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from . import models as _models  # noqa: F401  (registers our Auto classes)
from .data.images import open_image
from .decoding import generate_captions

__all__ = ["caption_image_files", "load_captioner"]


def load_captioner(model_name_or_path: str, device: str | torch.device | None = None, **kwargs: Any):
    """
    Loads a captioning model and its processor from a folder or a Hub id (`revision=`, `cache_dir=`, ... are passed
    to `from_pretrained`).

    Returns:
        `(model, processor)`, the model in evaluation mode on `device` (CPU by default).
    """
    processor = AutoProcessor.from_pretrained(model_name_or_path, **kwargs)
    model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, **kwargs)
    model.to(device or "cpu").eval()
    return model, processor


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
