"""CLIP rewards: the CLIP-S of each generated caption for its own image (Hessel et al. 2021), as a reward function.

`get_reward("clip_score", model=...)` takes any CLIP given by Hub id, local folder or `(model, processor)` pair, as
`rlcaption.metrics.clip_score` does, and scores with the same functions (`embed_images`, `embed_texts`, `clip_s`), so
the reward of a caption equals its per-caption CLIP-S metric. The images come from the columns the trainer passes:

- `pixel_values` (`torch.FloatTensor` of shape `(N, 3, H, W)`, one row per completion, as `RLCaptionTrainer` passes
  them): the captioner's inputs, normalised by the captioner's processor with `pixel_mean` / `pixel_std`. They are
  turned back into 8-bit images, which the CLIP's own processor then resizes and normalises for the CLIP, so a 48-pixel
  captioner and a 224-pixel CLIP work together.
- `image` (a list of PIL images or arrays, one per completion): a dataset's image column, as TRL passes it.

An image's embedding is computed once per call however many completions share it, and is kept across calls under its
`image_id` when the batch has that column (images of a dataset repeat every epoch). `score_groups` takes the
completions grouped per image with every image column once per image (`pixel_values` of shape `(num_images, 3, H, W)`),
so the trainer never copies an image's pixels for each of its completions; its values equal the plain call's on the
flattened rows.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..data.images import decode_image
from ..metrics.clip import CLIP_S_WEIGHT, clip_s, embed_images, embed_texts, load_clip
from .base import completion_texts, group_sizes, row_keys
from .registry import register_reward

__all__ = ["ClipScoreReward", "pixel_values_to_images"]


def pixel_values_to_images(
    pixel_values: Any, pixel_mean: Sequence[float] = (0.5, 0.5, 0.5), pixel_std: Sequence[float] = (0.5, 0.5, 0.5)
) -> list[np.ndarray]:
    """Undo a processor's normalisation: `(N, C, H, W)` normalised pixel values -> `N` uint8 arrays `(H, W, C)`.

    Args:
        pixel_values (`torch.Tensor` or `np.ndarray` of shape `(N, C, H, W)`): `(x / 255 - mean) / std` per channel.
        pixel_mean, pixel_std (`Sequence[float]`): the `image_mean` and `image_std` of the processor that made them
            (`CaptionProcessor`'s defaults are 0.5).
    """
    if hasattr(pixel_values, "detach"):
        pixel_values = pixel_values.detach().float().cpu().numpy()
    values = np.asarray(pixel_values, dtype=np.float64)
    if values.ndim != 4:
        raise ValueError(f"pixel_values must have shape (N, C, H, W), got {values.shape}.")
    mean = np.asarray(pixel_mean, dtype=np.float64).reshape(1, -1, 1, 1)
    std = np.asarray(pixel_std, dtype=np.float64).reshape(1, -1, 1, 1)
    if mean.shape[1] != values.shape[1] or std.shape[1] != values.shape[1]:
        raise ValueError(
            f"pixel_mean {list(pixel_mean)} and pixel_std {list(pixel_std)} need one value per channel of "
            f"pixel_values ({values.shape[1]})."
        )
    unit = values * std + mean  # (N, C, H, W) in [0, 1]
    uint8 = np.clip(np.round(unit * 255.0), 0, 255).astype(np.uint8)
    return list(uint8.transpose(0, 2, 3, 1))  # N x (H, W, C)


@register_reward("clip_score")
class ClipScoreReward:
    """CLIP-S `w * max(cos(image, caption), 0)` of each completion for its own image.

    Args:
        model (`str`, `os.PathLike` or `(model, processor)`): the CLIP, as for `rlcaption.metrics.clip_score`.
        w (`float`, *optional*, defaults to 2.5): the CLIP-S weight.
        prompt (`str`, *optional*, defaults to `""`): text put before every caption ("A photo depicts " for OpenAI
            CLIP in Hessel et al. 2021).
        pixel_mean, pixel_std (`Sequence[float]`, *optional*, default to 0.5 per channel): how the `pixel_values`
            the trainer passes were normalised (the captioner's processor's `image_mean` and `image_std`).
        batch_size (`int`, *optional*, defaults to 64): images per CLIP forward pass (4x as many captions).
        max_cached_images (`int`, *optional*, defaults to 100,000): image embeddings kept by `image_id` across calls
            (least recently used dropped first); 0 keeps none.
        local_files_only (`bool`, *optional*, defaults to `False`): never contact the Hub when loading `model`.

    Example:
        ```python
        >>> reward = get_reward("clip_score", model="checkpoints/shapes-clip-reward")
        >>> reward(completions=["a red circle"], references=[[...]], pixel_values=pixel_values, image_id=[7])
        ```
    """

    reads_images = True  # the CLIP reads each caption's image (see `reward_reads_images`)

    def __init__(
        self,
        model: Any = None,
        w: float = CLIP_S_WEIGHT,
        prompt: str = "",
        pixel_mean: Sequence[float] = (0.5, 0.5, 0.5),
        pixel_std: Sequence[float] = (0.5, 0.5, 0.5),
        batch_size: int = 64,
        max_cached_images: int = 100_000,
        local_files_only: bool = False,
    ):
        if model is None:
            raise ValueError(
                "The clip_score reward needs a CLIP: get_reward('clip_score', model=...) with a hub id (e.g. "
                "'openai/clip-vit-base-patch32'), a local folder (e.g. 'checkpoints/shapes-clip-reward') or a "
                "(model, processor) pair; pass the built reward to RLCaptionTrainer(reward_funcs=[...])."
            )
        if max_cached_images < 0:
            raise ValueError(f"max_cached_images must be >= 0, got {max_cached_images}.")
        self.__name__ = "clip_score"
        self.model, self.processor = load_clip(model, local_files_only=local_files_only)
        self.model_name = os.fspath(model) if isinstance(model, str | os.PathLike) else type(self.model).__name__
        self.w = w
        self.prompt = prompt
        self.pixel_mean = tuple(pixel_mean)
        self.pixel_std = tuple(pixel_std)
        self.batch_size = batch_size
        self.max_cached_images = max_cached_images
        self._image_cache: OrderedDict[Hashable, Any] = OrderedDict()

    def __call__(self, *, completions: list[Any], references: list[list[str]] | None = None, **columns) -> list[float]:
        texts = completion_texts(completions)
        image_ids = row_keys(columns.get("image_id"), len(texts))
        keys = image_ids if image_ids is not None else list(range(len(texts)))
        return self._clip_s(texts, keys, keys, columns, cached=image_ids is not None, unit="completion").tolist()

    def score_groups(
        self, *, completions: list[list[Any]], references: list[list[str]] | None = None, **image_columns
    ) -> list[list[float]]:
        """CLIP-S of every completion for its group's image, each image embedded once.

        Args:
            completions (`list[list[str]]` of length `num_images`): group `i` holds image `i`'s completions.
            references: unused (CLIP-S needs no references).
            **image_columns: one row per image: `pixel_values` (`torch.FloatTensor` of shape `(num_images, 3, H, W)`)
                or `image` (a list of PIL images or arrays), and optionally `image_id` (embeddings cached by it).

        Returns:
            `list[list[float]]`: one list per group, as long as the group.
        """
        sizes = group_sizes(completions)
        image_ids = row_keys(image_columns.get("image_id"), len(sizes))
        keys = image_ids if image_ids is not None else list(range(len(sizes)))
        texts = [text for group in completions for text in completion_texts(group)]
        text_keys = [key for key, size in zip(keys, sizes, strict=True) for _ in range(size)]
        values = self._clip_s(texts, text_keys, keys, image_columns, cached=image_ids is not None, unit="image")
        ends = np.cumsum(sizes)
        return [values[end - size : end].tolist() for end, size in zip(ends, sizes, strict=True)]

    def _clip_s(
        self,
        texts: list[str],
        text_keys: list[Hashable],
        image_keys: list[Hashable],
        columns: dict[str, Any],
        cached: bool,
        unit: str,
    ) -> np.ndarray:
        """CLIP-S of `texts[i]` for the image of key `text_keys[i]`; row `j` of the image columns is `image_keys[j]`.

        Returns:
            `np.ndarray` of shape `(len(texts),)`.
        """
        import torch

        if not texts:  # nothing to score: no CLIP pass, and torch.stack refuses an empty list
            return np.zeros(0)
        image_embeddings = self._image_embeddings(image_keys, columns, cached, unit)  # key -> (D,)
        unique_texts = list(dict.fromkeys(texts))
        text_embeddings = embed_texts(
            self.model, self.processor, unique_texts, batch_size=4 * self.batch_size, prompt=self.prompt
        )
        text_row = {text: row for row, text in enumerate(unique_texts)}
        images = torch.stack([image_embeddings[key] for key in text_keys])  # (N, D)
        captions = text_embeddings[[text_row[text] for text in texts]]  # (N, D)
        return clip_s(images, captions, w=self.w)

    def _image_embeddings(
        self, keys: list[Hashable], columns: dict[str, Any], cache: bool, unit: str
    ) -> dict[Hashable, Any]:
        """The embedding of every key's image (row `i` of the image columns has key `keys[i]`): cached ones, and the
        others computed from their first row."""
        found = {}
        first_rows: dict[Hashable, int] = {}
        for row, key in enumerate(keys):
            if key in found or key in first_rows:
                continue
            if cache and key in self._image_cache:
                self._image_cache.move_to_end(key)
                found[key] = self._image_cache[key]
            else:
                first_rows[key] = row
        if first_rows:
            images = self._images(columns, list(first_rows.values()), len(keys), unit)
            embeddings = embed_images(self.model, self.processor, images, batch_size=self.batch_size)
            for key, embedding in zip(first_rows, embeddings, strict=True):
                found[key] = embedding
                if cache and self.max_cached_images > 0:
                    self._image_cache[key] = embedding
            while len(self._image_cache) > self.max_cached_images:
                self._image_cache.popitem(last=False)
        return found

    def _images(self, columns: dict[str, Any], rows: list[int], num_rows: int, unit: str) -> list[Any]:
        """The images of `rows`, from the `pixel_values` or `image` column, which hold one row per `unit`."""
        if columns.get("pixel_values") is not None:
            pixel_values = columns["pixel_values"]
            if len(pixel_values) != num_rows:
                raise ValueError(
                    f"pixel_values holds {len(pixel_values)} images for {num_rows} {unit}s; pass one per {unit}."
                )
            return pixel_values_to_images(pixel_values[rows], self.pixel_mean, self.pixel_std)
        if columns.get("image") is not None:
            images = list(columns["image"])
            if len(images) != num_rows:
                raise ValueError(f"image holds {len(images)} images for {num_rows} {unit}s; pass one per {unit}.")
            return [decode_image(images[row]) for row in rows]
        raise ValueError(
            "The clip_score reward needs each completion's image: a `pixel_values` tensor (N, 3, H, W), as "
            "RLCaptionTrainer passes it, or an `image` column of PIL images; got columns "
            f"{sorted(columns)}. A captioner trained on precomputed `image_features` cannot be scored by a CLIP."
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r}, w={self.w})"
