"""
Vered et al.'s discriminability evaluation: how well a listener finds each image of a split from the speaker's
caption.

Every image of the split is captioned by the speaker of a [`SpeakerListener`] (test-time words are discrete), greedily
or by beam search; the caption then ranks all the split's images, and the recall R@K is the share of captions whose own
image is among the K best. The naturalness of the same captions (CIDEr-D, ...) can be scored in the same call, so that
both axes of the paper's trade-off judge one set of captions. The paper ranks among 5,000 test images (its own and
4,999 distractors); here every image of the split takes part. The ranking is done by the model's own listener, and,
when one is given, by an evaluator CLIP that no training used, which cannot have co-adapted with the speaker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import GenerationConfig

from ..data.collator import CaptionCollator
from ..generation.decoding import generate_captions, image_inputs_of
from ..metrics import clip_retrieval, evaluate_captions
from ..metrics.retrieval import retrieval_recall
from ..models.speaker_listener import SpeakerListener

__all__ = ["listener_recall"]


@torch.no_grad()
def listener_recall(
    model: SpeakerListener,
    processor: Any,
    dataset,
    ks: Sequence[int] = (1, 5, 10),
    clip: Any = None,
    batch_size: int = 64,
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    caption_metrics: Sequence[str] = (),
) -> dict[str, float]:
    """
    Recall@K of each image of `dataset` among all of its images, from the speaker's caption (greedy, or the best beam
    of a beam search), and optionally the caption metrics of the same captions.

    Ties count against the caption, as in [`rlcaption.metrics.retrieval.retrieval_recall`].

    Args:
        model ([`SpeakerListener`]): the speaker captions, the listener ranks.
        processor: the model's processor ([`CaptionProcessor`]).
        dataset: a split with one row per image (`image`, `pixel_values` or `image_features`, and `captions`).
        ks (`Sequence[int]`, *optional*, defaults to `(1, 5, 10)`): the cut-offs K.
        clip (*optional*): an evaluator CLIP as [`rlcaption.metrics.load_clip`] takes it (a folder, a Hub id, or a
            loaded `(model, processor)` pair); the split then needs its `image` column.
        batch_size (`int`, *optional*, defaults to 64): images captioned and embedded at once.
        num_beams (`int`, *optional*, defaults to 1): 1 for greedy decoding, else beam search with as many beams, as
            `RLCaptionTrainer.evaluate` decodes with `eval_num_beams`.
        max_new_tokens (`int`, *optional*): the longest caption; defaults to the speaker's `max_caption_length`.
        caption_metrics (`Sequence[str]`, *optional*): metrics of [`rlcaption.metrics.evaluate_captions`] (`"cider"`,
            ...) to score the same captions with against the split's `captions`.

    Returns:
        `dict[str, float]`: `listener_R@K` for every K, `clip_R@K` with a CLIP, each in [0, 1], and the keys of
        `evaluate_captions` for `caption_metrics`.
    """
    if not isinstance(model, SpeakerListener):
        raise ValueError(
            f"listener_recall ranks images with a SpeakerListener's listener; {type(model).__name__} has none. Score "
            "another captioner's captions with an evaluator CLIP (`rlcaption.evaluation.clip_scores`)."
        )
    if max_new_tokens is None:
        max_new_tokens = model.config.speaker_config.max_caption_length
    decoding = GenerationConfig(do_sample=False, num_beams=num_beams, max_new_tokens=max_new_tokens)
    loader = DataLoader(
        dataset, batch_size=batch_size, collate_fn=CaptionCollator(processor, tokenize_references=False)
    )
    device = model.speaker.device
    caption_embeddings, image_embeddings, captions, references = [], [], [], []
    for batch in loader:
        image_inputs = {name: tensor.to(device) for name, tensor in image_inputs_of(batch).items()}
        generated = generate_captions(model, processor, image_inputs, decoding)
        caption_embeddings.append(model.embed_captions(generated.sequences))
        image_embeddings.append(model.embed_images(**image_inputs))
        captions.extend(generated.texts)
        references.extend(batch["references"])
    recalls = retrieval_recall(torch.cat(caption_embeddings), torch.cat(image_embeddings), ks=ks)
    scores = {f"listener_R@{k}": recalls[f"t2i_R@{k}"] for k in ks}
    if caption_metrics:
        scores.update(
            evaluate_captions(dict(enumerate(captions)), dict(enumerate(references)), metrics=list(caption_metrics))
        )
    if clip is not None:
        if "image" not in (getattr(dataset, "column_names", None) or []):
            raise ValueError(
                "Ranking with an evaluator CLIP needs the split's `image` column; keep the images in the split, or "
                "leave the CLIP out."
            )
        clip_recalls = clip_retrieval(list(dataset["image"]), captions, clip, ks=ks, batch_size=batch_size)
        scores.update({f"clip_R@{k}": clip_recalls[f"t2i_R@{k}"] for k in ks})
    return scores
