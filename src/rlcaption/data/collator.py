"""Batches dataset rows (image, references, id) into model inputs for every objective."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["CaptionCollator"]

# Columns the collator turns into tensors or reads itself; any other column is passed through as a list.
_HANDLED_COLUMNS = ("image", "pixel_values", "image_features", "captions", "image_id")


class CaptionCollator:
    """
    Collates rows of a captioning dataset (columns `image` or `pixel_values` or `image_features`, `captions`,
    `image_id`, and any others) into:

    - `pixel_values` (`torch.FloatTensor` of shape `(B, 3, H, W)`) or `image_features` (`(B, F)`);
    - `references` (`list[list[str]]`): every reference of every image, as written;
    - `image_id` (`list`): the rows' ids (rewards cache reference statistics by them);
    - `caption_input_ids`, `caption_attention_mask` (`(N, T)`) and `caption_image_index` (`(N,)`, the row of
      each caption's image): the tokenized references for teacher forcing, all of them or
      `captions_per_image` drawn at random per image;
    - every other column as a list under its own name (datasets columns reach reward functions this way).

    Args:
        processor: a [`CaptionProcessor`] (or any processor taking `images=` and `text=`).
        captions_per_image (`int`, *optional*): references tokenized per image; all when `None`.
        max_caption_length (`int`, *optional*): truncation length of tokenized references (special tokens included).
    """

    def __init__(self, processor: Any, captions_per_image: int | None = None, max_caption_length: int | None = None):
        if captions_per_image is not None and captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1 or None, got {captions_per_image}.")
        self.processor = processor
        self.captions_per_image = captions_per_image
        self.max_caption_length = max_caption_length

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            raise ValueError("Cannot collate an empty list of rows.")
        batch: dict[str, Any] = {}
        first = rows[0]
        # 1. image inputs
        if "image_features" in first and first["image_features"] is not None:
            batch["image_features"] = torch.as_tensor(np.stack([np.asarray(row["image_features"]) for row in rows]))
            batch["image_features"] = batch["image_features"].float()
        elif "pixel_values" in first and first["pixel_values"] is not None:
            batch["pixel_values"] = torch.stack([torch.as_tensor(row["pixel_values"]) for row in rows]).float()
        elif "image" in first:
            images = [row["image"] for row in rows]
            batch["pixel_values"] = self.processor(images=images, return_tensors="pt")["pixel_values"]
        else:
            raise ValueError(
                "Rows have no image column: expected `image`, `pixel_values` or `image_features`, got "
                f"{sorted(first)}."
            )

        # 2. references, as written, and ids
        references = None
        if "captions" in first:
            references = []
            for row in rows:
                captions = row["captions"]
                if (
                    not isinstance(captions, list | tuple)
                    or not captions
                    or not all(isinstance(caption, str) for caption in captions)
                ):
                    raise ValueError(
                        f"Image {row.get('image_id', '?')!r} has no usable references: `captions` must be a "
                        f"non-empty list of strings, got {captions!r}."
                    )
                references.append(list(captions))
            batch["references"] = references
        batch["image_id"] = [row.get("image_id", index) for index, row in enumerate(rows)]

        # 3. tokenized references for teacher forcing
        if references is not None:
            texts, image_index = [], []
            for row_index, captions in enumerate(references):
                chosen = captions
                if self.captions_per_image is not None and len(captions) > self.captions_per_image:
                    chosen = random.sample(captions, self.captions_per_image)
                texts.extend(chosen)
                image_index.extend([row_index] * len(chosen))
            encoded = self.processor(text=texts, max_length=self.max_caption_length, return_tensors="pt")
            batch["caption_input_ids"] = encoded["input_ids"]
            batch["caption_attention_mask"] = encoded["attention_mask"]
            batch["caption_image_index"] = torch.tensor(image_index, dtype=torch.long)

        # 4. pass-through columns
        for name in first:
            if name not in _HANDLED_COLUMNS:
                batch[name] = [row[name] for row in rows]
        return batch
