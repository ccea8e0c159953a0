"""
Cross-modal retrieval recall R@K in both directions, from caption and image embeddings (Chaffin et al. 2024 and Vered
et al. 2019).

Text-to-image (T2I): each text queries all images; a hit at K when its own image is among the K most similar.
Image-to-text (I2T): each image queries all texts; a hit at K when any of its own texts is among the K most similar.
Similarity is the cosine similarity of the embeddings.

Ties are counted against the query: a candidate is ranked at the number of wrong candidates whose similarity is
greater than *or equal to* the right one's. Degenerate embeddings (e.g. a collapsed text encoder giving every caption
the same vector) then score R@K = 0 instead of a perfect recall, and the result never depends on the sort order of
tied values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["retrieval_recall"]

# Texts scored per matrix product: bounds memory at (chunk, number of images) similarities.
_TEXT_CHUNK = 1024


def _as_matrix(embeddings: Any, name: str) -> np.ndarray:
    """A float64 numpy copy of `embeddings` (numpy array, torch tensor, or nested lists) of shape (n, dim)."""
    if hasattr(embeddings, "detach"):  # torch.Tensor, without importing torch
        embeddings = embeddings.detach().float().cpu().numpy()
    matrix = np.asarray(embeddings, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        raise ValueError(f"`{name}` must have shape (count, dim) with count >= 1, got shape {matrix.shape}.")
    if not np.isfinite(matrix).all():
        raise ValueError(f"`{name}` contains NaN or infinite values.")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    zero_rows = np.flatnonzero(norms[:, 0] == 0)
    if zero_rows.size:
        raise ValueError(
            f"`{name}` rows {zero_rows[:5].tolist()} are zero vectors, whose cosine similarity is undefined."
        )
    return matrix / norms


def retrieval_recall(
    text_embeddings: Any,
    image_embeddings: Any,
    ks: Sequence[int] = (1, 5, 10),
    text_to_image_index: Sequence[int] | np.ndarray | None = None,
) -> dict[str, float]:
    """Recall@K for text-to-image and image-to-text retrieval from cosine similarities.

    Args:
        text_embeddings (`np.ndarray` or `torch.Tensor` of shape `(num_texts, dim)`):
            One embedding per caption.
        image_embeddings (`np.ndarray` or `torch.Tensor` of shape `(num_images, dim)`):
            One embedding per image.
        ks (`Sequence[int]`, *optional*, defaults to `(1, 5, 10)`):
            The cut-offs K.
        text_to_image_index (`Sequence[int]` of length `num_texts`, *optional*):
            The image (row of `image_embeddings`) each text describes, so that an image may have several texts.
            When None, text i describes image i (requires `num_texts == num_images`). Every image needs at least
            one text.

    Returns:
        `dict[str, float]`: `"t2i_R@K"` and `"i2t_R@K"` for every K in `ks`, each in [0, 1] (the share of queries
        with a hit).
    """
    texts = _as_matrix(text_embeddings, "text_embeddings")
    images = _as_matrix(image_embeddings, "image_embeddings")
    num_texts, num_images = texts.shape[0], images.shape[0]
    if texts.shape[1] != images.shape[1]:
        raise ValueError(
            f"Text and image embeddings must share one space: dims {texts.shape[1]} and {images.shape[1]} differ."
        )
    ks = list(ks)
    if not ks or any(int(k) != k or k < 1 for k in ks):
        raise ValueError(f"ks={ks} must be a non-empty list of positive integers.")
    if text_to_image_index is None:
        if num_texts != num_images:
            raise ValueError(
                f"{num_texts} texts and {num_images} images: pass `text_to_image_index` to say which image each "
                "text describes."
            )
        owner = np.arange(num_texts)
    else:
        owner = np.asarray(text_to_image_index)
        if owner.shape != (num_texts,) or not np.issubdtype(owner.dtype, np.integer):
            raise ValueError(
                f"`text_to_image_index` must hold one integer image index per text ({num_texts}), got shape "
                f"{owner.shape} and dtype {owner.dtype}."
            )
        out_of_range = np.flatnonzero((owner < 0) | (owner >= num_images))
        if out_of_range.size:
            raise ValueError(
                f"`text_to_image_index` entries {owner[out_of_range[:5]].tolist()} (texts "
                f"{out_of_range[:5].tolist()}) are not image indices in [0, {num_images})."
            )
    images_without_text = np.setdiff1d(np.arange(num_images), owner)
    if images_without_text.size:
        raise ValueError(
            f"Images {images_without_text[:5].tolist()} have no text, so image-to-text recall is undefined for "
            "them; drop them from `image_embeddings` or add their captions."
        )

    # 1. T2I rank of each text (wrong images at least as similar as its own), and for each image the similarity of
    #    its best text.
    t2i_rank = np.empty(num_texts, dtype=np.int64)
    best_own_similarity = np.full(num_images, -np.inf)
    chunks = [slice(start, min(start + _TEXT_CHUNK, num_texts)) for start in range(0, num_texts, _TEXT_CHUNK)]
    for chunk in chunks:
        similarity = texts[chunk] @ images.T  # (chunk, num_images)
        rows = np.arange(similarity.shape[0])
        own = similarity[rows, owner[chunk]]
        t2i_rank[chunk] = (similarity >= own[:, None]).sum(axis=1) - 1  # minus the own image itself
        np.maximum.at(best_own_similarity, owner[chunk], own)
    # 2. I2T rank of each image: texts of other images at least as similar as its best own text.
    i2t_rank = np.zeros(num_images, dtype=np.int64)
    for chunk in chunks:
        similarity = texts[chunk] @ images.T  # (chunk, num_images), the same products as in stage 1
        similarity[np.arange(similarity.shape[0]), owner[chunk]] = -np.inf  # a text never outranks its own image
        i2t_rank += (similarity >= best_own_similarity[None, :]).sum(axis=0)

    recalls: dict[str, float] = {}
    for k in ks:
        recalls[f"t2i_R@{k}"] = float((t2i_rank < k).mean())
    for k in ks:
        recalls[f"i2t_R@{k}"] = float((i2t_rank < k).mean())
    return recalls
