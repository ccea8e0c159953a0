"""ROUGE-L (Lin, 2004) exactly as the COCO caption evaluation code computes it.

The numbers equal `pycocoevalcap` 1.2's `Rouge` on the same tokens: for each image, the longest common subsequence
(LCS) of the candidate with every reference gives a precision `lcs / len(candidate)` and a recall
`lcs / len(reference)`; the image score is the F-measure with `beta = 1.2` of the *maximum* precision and the
*maximum* recall (taken over references independently), and the corpus score is the mean over images.

Like the COCO code, captions are split on single spaces, so an empty caption counts as one empty token (its score is
0 unless a reference is empty as well). The LCS is computed with the bit-parallel algorithm of Allison and Dix (1986)
on Python integers: one addition, subtraction and a few bit operations per reference token instead of a dynamic
programming table, which makes long captions cheap.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from .bleu import check_caption_corpus

__all__ = ["ROUGE_BETA", "compute_rouge_l", "longest_common_subsequence", "rouge_l_score"]

K = TypeVar("K", bound=Hashable)

# The COCO code's recall weight ("updated based on discussion with Hovy").
ROUGE_BETA = 1.2


def longest_common_subsequence(first: Sequence[str], second: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token sequences.

    Bit-parallel (Allison & Dix 1986; Hyyrö 2004): bit `i` of `row` tracks row `i` of the dynamic programming table
    over `first`; each token of `second` updates all rows at once with integer arithmetic.

    Args:
        first (`Sequence[str]`): tokens of one caption.
        second (`Sequence[str]`): tokens of the other caption.

    Returns:
        `int`: the LCS length.
    """
    if len(first) < len(second):
        first, second = second, first
    match_masks: dict[str, int] = {}
    for position, token in enumerate(first):
        match_masks[token] = match_masks.get(token, 0) | (1 << position)
    all_rows = (1 << len(first)) - 1
    row = all_rows
    for token in second:
        matches = row & match_masks.get(token, 0)
        row = ((row + matches) | (row - matches)) & all_rows
    return len(first) - row.bit_count()


def rouge_l_score(candidate: str, references: Sequence[str]) -> float:
    """ROUGE-L F-measure of one tokenized caption against its tokenized references (`Rouge.calc_score`)."""
    candidate_tokens = candidate.split(" ")
    best_precision = 0.0
    best_recall = 0.0
    for reference in references:
        reference_tokens = reference.split(" ")
        lcs = longest_common_subsequence(reference_tokens, candidate_tokens)
        best_precision = max(best_precision, lcs / float(len(candidate_tokens)))
        best_recall = max(best_recall, lcs / float(len(reference_tokens)))
    if best_precision == 0 or best_recall == 0:
        return 0.0
    # the COCO code's operation order, so the floats agree exactly
    return ((1 + ROUGE_BETA**2) * best_precision * best_recall) / float(best_recall + ROUGE_BETA**2 * best_precision)


def compute_rouge_l(
    predictions: Mapping[K, str], references: Mapping[K, Sequence[str]]
) -> tuple[float, dict[K, float]]:
    """Corpus and per-image ROUGE-L as `pycocoevalcap.rouge.Rouge` computes them.

    Args:
        predictions (`Mapping[K, str]`): one tokenized caption (tokens joined by spaces) per key.
        references (`Mapping[K, Sequence[str]]`): the tokenized reference captions of each key (same keys).

    Returns:
        `tuple[float, dict[K, float]]`: the corpus ROUGE-L (mean over images) and each image's ROUGE-L.

    Example:
    ```python
    >>> corpus, per_image = compute_rouge_l({1: "a cat on a mat"}, {1: ["a cat on the mat"]})
    >>> round(corpus, 4)
    0.8
    ```
    """
    keys = check_caption_corpus(predictions, references, "ROUGE-L")
    per_image = {key: rouge_l_score(predictions[key], references[key]) for key in keys}
    return float(np.mean(np.array(list(per_image.values())))), per_image
