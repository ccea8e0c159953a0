"""Load a published captioner by path or hub id and caption image files or folders of images."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from . import models as _models  # noqa: F401  (registers our Auto classes)
from .data.features import describe_feature_extractor, read_feature_extractor
from .data.images import check_image_files, open_image
from .generation.decoding import generate_captions
from .hub import check_pretrained_reference, model_loading_kwargs

__all__ = [
    "caption_image_files",
    "check_features_match_model",
    "features_captioner_config",
    "list_image_files",
    "load_captioner",
]


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
    model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, **model_loading_kwargs(kwargs))
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


def features_captioner_config(model):
    """The config of the captioner in `model` that reads precomputed features (its own, its policy's or its
    speaker's), or `None` when it reads images."""
    for config in (model.config, *(getattr(model.config, name, None) for name in ("policy_config", "speaker_config"))):
        if getattr(config, "encoder_type", None) == "features":
            return config
    return None


def check_features_match_model(model, dataset, features_folder: str | None) -> None:
    """
    Refuses features other than those `model` was trained on: another width, or another backbone or pooling than the
    extractor its config records (`image_feature_extractor`) and the manifest of `features_folder` names. Configs and
    folders without a record (region features, checkpoints of older versions) are compared by width alone.

    Raises:
        `ValueError`: naming both the features given and the ones the model was trained on.
    """
    config = features_captioner_config(model)
    split = dataset["train"] if "train" in dataset else next(iter(dataset.values()))
    if config is None or "image_features" not in split.column_names:
        return
    trained_on = getattr(config, "image_feature_extractor", None)
    given = read_feature_extractor(features_folder) if features_folder is not None else None
    width = np.asarray(split[0]["image_features"]).shape[-1]
    differs = width != config.image_feature_size
    if trained_on is not None and given is not None:
        differs = differs or any(trained_on.get(key) != given.get(key) for key in ("model", "pooling"))
    if differs:
        raise ValueError(
            f"The captioner was trained on {describe_feature_extractor(trained_on)}, of width "
            f"{config.image_feature_size}; {features_folder or 'the dataset'} holds "
            f"{describe_feature_extractor(given)}, of width {width}. Pass the features it was trained on, or "
            f"extract them again: rlcaption extract-features --model {(trained_on or {}).get('model', '<backbone>')}"
            f" --pooling {(trained_on or {}).get('pooling', 'auto')}."
        )


@torch.no_grad()
def caption_image_files(
    model, processor, paths: Sequence[str], batch_size: int = 16, **generation_kwargs: Any
) -> list[str]:
    """
    Captions image files (any mode Pillow reads; converted to RGB as documented in [`rlcaption.data.images`]) from the
    processor's `pixel_values`, as the `image-text-to-text` pipeline does. A model trained on precomputed features
    turns them into features with the backbone that extracted its training features (its config's
    `image_feature_extractor`), the processor preparing them with that backbone's image processor.

    Args:
        generation_kwargs: decoding settings for `generate`, e.g. `num_beams=3, max_length=21`.

    Returns:
        One caption per path, in order.
    """
    device = next(model.parameters()).device
    captions: list[str] = []
    for start in range(0, len(paths), batch_size):
        images = [open_image(path) for path in paths[start : start + batch_size]]
        inputs = {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"].to(device)}
        captions.extend(generate_captions(model, processor, inputs, **generation_kwargs).texts)
    return captions
