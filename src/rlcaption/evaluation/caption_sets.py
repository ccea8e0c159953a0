"""
Several captions per image, scored as a set: the protocol of Chen & Jin 2020 (Table 4), random samples or the top of
a beam search, judged by their mean CIDEr-D and their diversity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import GenerationConfig

from ..data.collator import CaptionCollator
from ..generation.decoding import generate_captions, image_inputs_of
from ..metrics import evaluate_captions, set_diversity
from ..shapes import scene_grounding
from .captions import check_image_ids, with_image_ids

__all__ = [
    "CAPTION_SET_DECODINGS",
    "caption_set_batches",
    "caption_set_generation_config",
    "caption_set_prefix",
    "caption_set_scores",
    "caption_sets",
]

# How the several captions of an image are drawn in the protocol of Chen & Jin 2020 (Table 4): random samples, or the
# top of a beam search.
CAPTION_SET_DECODINGS = ("sample", "beam")


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
