"""Evaluate a captioning model on a dataset split: caption every image, then score with the caption metrics, the
diversity metrics and an evaluator CLIP."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import GenerationConfig

from .data.collator import CaptionCollator
from .decoding import generate_captions, image_inputs_of
from .metrics import clip_retrieval, clip_score, evaluate_captions, scene_grounding, self_bleu, set_diversity
from .metrics.tokenization import normalize_caption

__all__ = [
    "CAPTION_SET_DECODINGS",
    "caption_batches",
    "caption_dataset",
    "caption_set_batches",
    "caption_set_generation_config",
    "caption_set_prefix",
    "caption_set_scores",
    "caption_sets",
    "check_image_ids",
    "clip_scores",
    "diversity_scores",
    "evaluate_model",
    "scene_grounding_scores",
    "with_image_ids",
]

# The keys `set_diversity` reports, by the name `diversity_scores` takes.
_SET_DIVERSITY_KEYS = {"div_1": "Div-1", "div_2": "Div-2", "mbleu_4": "mBLEU-4"}

# How the several captions of an image are drawn in the protocol of Chen & Jin 2020 (Table 4): random samples, or the
# top of a beam search.
CAPTION_SET_DECODINGS = ("sample", "beam")


def with_image_ids(dataset):
    """
    `dataset` with an `image_id` column to group captions and references by image: itself when it has one, else a
    copy whose `image_id` is the row index (`datasets.Dataset.add_column`; the images are not read). Other datasets
    are returned as they are; [`caption_batches`] refuses their rows if they carry no `image_id`.
    """
    column_names = getattr(dataset, "column_names", None)
    if column_names is None or "image_id" in column_names or not hasattr(dataset, "add_column"):
        return dataset
    return dataset.add_column("image_id", list(range(len(dataset))))


def check_image_ids(batch: Mapping[str, Any]) -> None:
    """Refuses a collated batch without `image_id`: captions of different batches could not be told apart."""
    if batch.get("image_id") is None:
        raise ValueError(
            "The batch has no `image_id`, so captions cannot be grouped with their references across batches; "
            "add an `image_id` column (a `datasets.Dataset` gets its row index through `with_image_ids`)."
        )


def caption_batches(
    model: nn.Module,
    processor: Any,
    batches: Iterable[Mapping[str, Any]],
    generation_config: GenerationConfig | None = None,
    **generation_kwargs: Any,
) -> list[tuple[Any, str, list[str]]]:
    """
    Captions collated batches (see [`CaptionCollator`]) with [`generate_captions`]: exactly `generation_config`, or
    `model.generate(**generation_kwargs)` on top of the model's own generation config.

    Returns:
        `(image_id, caption, references)` for every image, in order.

    Raises:
        `ValueError`: when a batch has no `image_id`: captions of different batches could not be told apart.
    """
    device = next(model.parameters()).device
    captioned = []
    for batch in batches:
        check_image_ids(batch)
        image_inputs = {name: tensor.to(device) for name, tensor in image_inputs_of(batch).items()}
        generated = generate_captions(model, processor, image_inputs, generation_config, **generation_kwargs)
        captioned.extend(zip(batch["image_id"], generated.texts, batch["references"], strict=True))
    return captioned


def caption_dataset(
    model: nn.Module,
    processor: Any,
    dataset,
    batch_size: int = 64,
    generation_config: GenerationConfig | None = None,
    **generation_kwargs: Any,
) -> tuple[dict[Any, str], dict[Any, list[str]]]:
    """
    Captions every image of `dataset` (columns `image`/`pixel_values`/`image_features`, `captions`, and `image_id`
    or, without it, the row index as the id); decoding as in [`caption_batches`].

    Returns:
        `(predictions, references)` keyed by `image_id`, ready for [`rlcaption.metrics.evaluate_captions`].
    """
    loader = DataLoader(
        with_image_ids(dataset),
        batch_size=batch_size,
        collate_fn=CaptionCollator(processor, tokenize_references=False),
        shuffle=False,
    )
    captioned = caption_batches(model, processor, loader, generation_config, **generation_kwargs)
    return {key: text for key, text, _ in captioned}, {key: refs for key, _, refs in captioned}


def scene_grounding_scores(predictions: Mapping[Any, str], dataset) -> dict[str, float]:
    """
    [`rlcaption.metrics.scene_grounding`] of captions keyed by `image_id` against the `scene` column of `dataset`
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


def caption_set_prefix(decoding: str, set_size: int) -> str:
    """How the scores of a caption set are named beside the others: `sample5_CIDEr`, `beam5_Div-2`, ..."""
    return f"{decoding}{set_size}_"


def caption_set_generation_config(decoding: str, set_size: int, max_new_tokens: int) -> GenerationConfig:
    """
    The decoding of the protocol of Chen & Jin 2020 (Table 4): `set_size` captions per image, drawn by pure sampling
    (`"sample"`: temperature 1, no top-k or nucleus cut) or the `set_size` best of a beam search of that width
    (`"beam"`).
    """
    if decoding not in CAPTION_SET_DECODINGS:
        raise ValueError(f"Unknown caption set decoding {decoding!r}; choose one of {CAPTION_SET_DECODINGS}.")
    if set_size < 2:
        raise ValueError(f"A caption set needs at least 2 captions to measure diversity, got set_size={set_size}.")
    if decoding == "sample":
        return GenerationConfig(
            do_sample=True, top_k=0, top_p=1.0, temperature=1.0, num_beams=1,
            num_return_sequences=set_size, max_new_tokens=max_new_tokens,
        )  # fmt: skip
    return GenerationConfig(
        do_sample=False, num_beams=set_size, num_return_sequences=set_size, max_new_tokens=max_new_tokens
    )


@torch.no_grad()
def caption_set_batches(
    model: nn.Module,
    processor: Any,
    batches: Iterable[Mapping[str, Any]],
    decoding: str = "sample",
    set_size: int = 5,
    max_new_tokens: int = 20,
    seed: int = 0,
) -> list[tuple[Any, list[str], list[str]]]:
    """
    `set_size` captions of every image of collated `batches` ([`caption_set_generation_config`]), the model's own
    generation settings ignored. Sampling draws from the random state seeded with `seed`, so that the sets are the
    same at every call, and the caller's random state is left as it was.

    Returns:
        `(image_id, captions, references)` for every image, in order.
    """
    generation_config = caption_set_generation_config(decoding, set_size, max_new_tokens)
    device = next(model.parameters()).device
    captioned = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for batch in batches:
            check_image_ids(batch)
            image_inputs = {name: tensor.to(device) for name, tensor in image_inputs_of(batch).items()}
            texts = generate_captions(model, processor, image_inputs, generation_config).texts
            for row, image_id in enumerate(batch["image_id"]):
                captioned.append((image_id, texts[row * set_size : (row + 1) * set_size], batch["references"][row]))
    return captioned


def caption_sets(
    model: nn.Module,
    processor: Any,
    dataset,
    decoding: str = "sample",
    set_size: int = 5,
    max_new_tokens: int = 20,
    batch_size: int = 64,
    seed: int = 0,
) -> tuple[dict[Any, list[str]], dict[Any, list[str]]]:
    """
    `set_size` captions of every image of `dataset`, drawn as in [`caption_set_batches`].

    Returns:
        `(sets, references)` keyed by `image_id` (or row index), as [`caption_set_scores`] takes them.
    """
    loader = DataLoader(
        with_image_ids(dataset),
        batch_size=batch_size,
        collate_fn=CaptionCollator(processor, tokenize_references=False),
        shuffle=False,
    )
    captioned = caption_set_batches(model, processor, loader, decoding, set_size, max_new_tokens, seed)
    return {key: texts for key, texts, _ in captioned}, {key: references for key, _, references in captioned}


def caption_set_scores(
    sets: Mapping[Any, Sequence[str]], references: Mapping[Any, Sequence[str]], dataset=None
) -> dict[str, float]:
    """
    The scores of Chen & Jin's Table 4 for several captions of every image: the mean CIDEr-D of all the captions (each
    against its image's references; document frequencies from the references, as for one caption per image), the
    diversity within each image's set (Div-1, Div-2, mBLEU-4, [`rlcaption.metrics.set_diversity`]) and, when
    `dataset` has a `scene` column, the scene grounding of all the captions, so that diversity bought with wrong
    objects shows.

    Returns:
        `CIDEr`, `Div-1`, `Div-2`, `mBLEU-4` and, with scenes, `object_f1` and `parse_failure_share`.
    """
    missing = [key for key in sets if key not in references]
    if missing:
        raise ValueError(f"Image {missing[0]!r} has captions but no references ({len(missing)} such images).")
    # one row per caption; every row repeats its image's references, which scales each document frequency and the
    # number of documents alike and so leaves CIDEr-D's idf as it is for one caption per image
    rows = {(key, index): caption for key, captions in sets.items() for index, caption in enumerate(captions)}
    row_references = {(key, index): list(references[key]) for key, index in rows}
    scores = {"CIDEr": evaluate_captions(rows, row_references, metrics=["cider"])["CIDEr"]}
    scores.update(set_diversity(sets, normalize=True)[0])
    column_names = getattr(dataset, "column_names", None) or []
    if "scene" in column_names:
        scenes = {
            row["image_id"]: row["scene"] for row in with_image_ids(dataset).select_columns(["image_id", "scene"])
        }
        grounding = scene_grounding(rows, {(key, index): scenes[key] for key, index in rows})
        scores.update({name: grounding[name] for name in ("object_f1", "parse_failure_share")})
    return scores
