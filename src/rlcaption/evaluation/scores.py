"""Scoring a split's captions: consensus metrics, grounding in the scene, diversity and an evaluator CLIP; and
[`evaluate_model`], which captions a split and scores it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..metrics import clip_retrieval, clip_score, evaluate_captions, self_bleu, set_diversity
from ..metrics.tokenization import normalize_caption
from ..shapes import scene_grounding
from .captions import caption_dataset

__all__ = [
    "clip_scores",
    "diversity_scores",
    "evaluate_model",
    "scene_grounding_scores",
]

# The keys `set_diversity` reports, by the name `diversity_scores` takes.
_SET_DIVERSITY_KEYS = {"div_1": "Div-1", "div_2": "Div-2", "mbleu_4": "mBLEU-4"}


def scene_grounding_scores(predictions: Mapping[Any, str], dataset) -> dict[str, float]:
    """
    [`rlcaption.shapes.scene_grounding`] of captions keyed by `image_id` against the `scene` column of `dataset`
    (the embedded shapes dataset has one); `{}` when `dataset` has no `scene` column.

    Raises:
        `ValueError`: when `dataset` has a `scene` column but no `image_id` column to match captions to scenes, or
            a captioned image id is not in `dataset`.
    """
    column_names = getattr(dataset, "column_names", None) or []
    if "scene" not in column_names:
        return {}
    if "image_id" not in column_names:
        raise ValueError(
            "The dataset has a `scene` column but no `image_id` column, so captions cannot be matched to scenes; add "
            "one, e.g. `dataset.add_column('image_id', list(range(len(dataset))))`."
        )
    # only the two small columns are read: images are never decoded here
    scenes = {row["image_id"]: row["scene"] for row in dataset.select_columns(["image_id", "scene"])}
    unknown = [key for key in predictions if key not in scenes]
    if unknown:
        raise ValueError(
            f"Captioned image id {unknown[0]!r} is not in the dataset's `image_id` column ({len(unknown)} such ids)."
        )
    return scene_grounding(predictions, {key: scenes[key] for key in predictions})


def diversity_scores(
    predictions: Mapping[Any, str],
    beams: Mapping[Any, Sequence[str]] | None,
    metrics: Sequence[str],
) -> dict[str, float]:
    """
    Diversity of generated captions ([`rlcaption.metrics.diversity`], on normalized captions).

    Args:
        predictions: the caption of each image, keyed by `image_id`.
        beams: several captions of each image (e.g. its best beams), for `div_1`, `div_2` and `mbleu_4`.
        metrics: among `div_1`, `div_2`, `mbleu_4` (over each image's `beams`, averaged over images), `self_bleu`
            and `distinct_captions` (over `predictions`: Self-BLEU-4, and the number of different captions).

    Returns:
        `Div-1`, `Div-2`, `mBLEU-4`, `Self-BLEU`, `distinct_captions`: those of `metrics`.
    """
    scores: dict[str, float] = {}
    set_metrics = [name for name in metrics if name in _SET_DIVERSITY_KEYS]
    if set_metrics:
        if beams is None:
            raise ValueError(f"{set_metrics} compare several captions of each image: pass them as `beams`.")
        per_set, _ = set_diversity(beams, normalize=True)
        scores.update({_SET_DIVERSITY_KEYS[name]: per_set[_SET_DIVERSITY_KEYS[name]] for name in set_metrics})
    if "self_bleu" in metrics:
        scores["Self-BLEU"] = self_bleu(list(predictions.values()), normalize=True)
    if "distinct_captions" in metrics:
        scores["distinct_captions"] = float(len({normalize_caption(text) for text in predictions.values()}))
    return scores


def clip_scores(predictions: Mapping[Any, str], dataset, clip: Any, batch_size: int = 64) -> dict[str, float]:
    """
    CLIP-S and the text-to-image and image-to-text retrieval recalls (R@1, R@5, R@10) of each image's caption among
    all the captioned images ([`rlcaption.metrics.clip_score`], [`rlcaption.metrics.clip_retrieval`]).

    Args:
        predictions: the caption of each image, keyed by `image_id`.
        dataset: a split with `image_id` and `image` columns; every captioned id's first row gives its image.
        clip: a CLIP as [`rlcaption.metrics.load_clip`] takes it; pass a loaded `(model, processor)` pair to load it
            once for many calls.

    Returns:
        `CLIP-S`, `t2i_R@1`, ..., `i2t_R@10`.
    """
    column_names = getattr(dataset, "column_names", None) or []
    if "image" not in column_names or "image_id" not in column_names:
        raise ValueError(
            f"CLIP metrics need the split's `image` and `image_id` columns; it has {column_names}. Keep the images "
            "in the evaluation split, or leave the CLIP out."
        )
    images = {}
    for row in dataset.select_columns(["image_id", "image"]):
        if row["image_id"] in predictions and row["image_id"] not in images:
            images[row["image_id"]] = row["image"]
    missing = [key for key in predictions if key not in images]
    if missing:
        raise ValueError(f"Captioned image id {missing[0]!r} is not in the dataset ({len(missing)} such ids).")
    keys = list(predictions)
    pictures, captions = [images[key] for key in keys], [predictions[key] for key in keys]
    scores = {"CLIP-S": clip_score(pictures, captions, clip, batch_size=batch_size)[0]}
    scores.update(clip_retrieval(pictures, captions, clip, batch_size=batch_size))
    return scores


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    processor: Any,
    dataset,
    metrics: Sequence[str] | None = ("cider", "bleu"),
    batch_size: int = 64,
    **generation_kwargs: Any,
) -> dict[str, float]:
    """
    Corpus caption metrics of `model` on `dataset`, keyed like the COCO toolkit (`CIDEr`, `Bleu_4`, ...), plus the
    scene grounding scores (`object_f1`, `generic_share`, ..., see [`scene_grounding_scores`]) when `dataset` has a
    `scene` column.

    Args:
        metrics: metric names for [`rlcaption.metrics.evaluate_captions`]; `None` for all of them (Java ones
            included).
        generation_kwargs: decoding settings, e.g. `num_beams=3, max_length=21`.
    """
    predictions, references = caption_dataset(model, processor, dataset, batch_size=batch_size, **generation_kwargs)
    scores = evaluate_captions(predictions, references, metrics=metrics)
    return {**scores, **scene_grounding_scores(predictions, dataset)}
