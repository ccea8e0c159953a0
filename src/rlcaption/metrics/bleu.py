"""BLEU-1..4 (Papineni et al., ACL 2002) exactly as the COCO caption evaluation code computes it.

The numbers equal `pycocoevalcap` 1.2's `Bleu(4)` on the same tokens, bit for bit:

- clipped n-gram counts: a candidate n-gram counts at most as often as in the reference where it is most frequent;
- the effective reference length of an image is the reference length *closest* to the candidate's (ties go to the
  shorter reference);
- corpus BLEU-n pools the clipped counts and lengths of all images, then applies one brevity penalty
  `exp(1 - r / c)` when the pooled candidate length `c` is below the pooled reference length `r`;
- per-image BLEU-n applies the same formula to one image; like the COCO code, it adds `1e-15` to every count and
  `1e-9` to every denominator, so an n-gram order without matches gives a tiny positive score instead of a division
  by zero.

Inputs are already tokenized captions (tokens joined by spaces, see `rlcaption.metrics.normalize_caption`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

__all__ = ["bleu_from_statistics", "check_caption_corpus", "compute_bleu", "corpus_bleu_statistics"]

K = TypeVar("K", bound=Hashable)

# The COCO code's smoothing constants (pycocoevalcap/bleu/bleu_scorer.py): they keep every ratio finite.
_TINY = 1e-15
_SMALL = 1e-9


def check_caption_corpus(predictions: Mapping[K, str], references: Mapping[K, Sequence[str]], metric: str) -> list[K]:
    """Check that predictions and references describe the same images, one caption each against a reference list.

    Args:
        predictions (`Mapping[K, str]`): one caption per key.
        references (`Mapping[K, Sequence[str]]`): a non-empty list of reference captions per key.
        metric (`str`): the metric's name, for error messages.

    Returns:
        `list[K]`: the keys, in the order of `predictions`.

    Raises:
        `ValueError`: naming the first offending key when the key sets differ, a key has no references, or a
        caption is not a string.
    """
    if len(predictions) == 0:
        raise ValueError(f"{metric} got no predictions; pass at least one {{key: caption}} pair.")
    missing = [key for key in predictions if key not in references]
    if missing:
        raise ValueError(
            f"{metric}: prediction key {missing[0]!r} has no entry in references ({len(missing)} such keys); "
            "predictions and references must have the same keys."
        )
    extra = [key for key in references if key not in predictions]
    if extra:
        raise ValueError(
            f"{metric}: reference key {extra[0]!r} has no prediction ({len(extra)} such keys); predictions and "
            "references must have the same keys."
        )
    for key, caption in predictions.items():
        if not isinstance(caption, str):
            raise ValueError(
                f"{metric}: the prediction for key {key!r} is a {type(caption).__name__}, expected one caption "
                "string per key."
            )
        captions = references[key]
        if isinstance(captions, str) or len(captions) == 0:
            problem = "a single string" if isinstance(captions, str) else "an empty list"
            raise ValueError(
                f"{metric}: the references for key {key!r} are {problem}; expected a non-empty list of caption "
                "strings. Drop the key or add its references."
            )
        for reference in captions:
            if not isinstance(reference, str):
                raise ValueError(
                    f"{metric}: a reference for key {key!r} is a {type(reference).__name__}, expected a string."
                )
    return list(predictions)


def _ngram_counts(words: list[str], max_n: int) -> Counter[tuple[str, ...]]:
    counts: Counter[tuple[str, ...]] = Counter(zip(words))
    for order in range(2, max_n + 1):
        counts.update(zip(*(words[start:] for start in range(order)), strict=False))
    return counts


def _image_statistics(prediction: str, references: Sequence[str], max_n: int) -> tuple[int, int, list[int], list[int]]:
    """(candidate length, closest reference length, guessed n-grams per order, clipped matches per order)."""
    words = prediction.split()
    candidate_length = len(words)
    reference_words = [reference.split() for reference in references]
    reference_counts = [_ngram_counts(tokens, max_n) for tokens in reference_words]
    closest_length = min((abs(len(tokens) - candidate_length), len(tokens)) for tokens in reference_words)[1]
    guessed = [max(0, candidate_length - order + 1) for order in range(1, max_n + 1)]
    matched = [0] * max_n
    # clipping needs the maximum reference count of the candidate's n-grams only, not of every reference n-gram
    for ngram, count in _ngram_counts(words, max_n).items():
        clip = max(counts.get(ngram, 0) for counts in reference_counts)
        if clip:
            matched[len(ngram) - 1] += min(count, clip)
    return candidate_length, closest_length, guessed, matched


def bleu_from_statistics(
    candidate_length: float, reference_length: float, guessed: Sequence[int], matched: Sequence[int]
) -> list[float]:
    # the same operations in the same order as the COCO code, so the floats agree exactly
    scores = []
    product = 1.0
    for order in range(len(guessed)):
        product *= (float(matched[order]) + _TINY) / (float(guessed[order]) + _SMALL)
        scores.append(product ** (1.0 / (order + 1)))
    ratio = (candidate_length + _TINY) / (reference_length + _SMALL)
    if ratio < 1:
        penalty = math.exp(1 - 1 / ratio)
        scores = [score * penalty for score in scores]
    return scores


def _pool(
    statistics: list[tuple[int, int, list[int], list[int]]], max_n: int
) -> tuple[int, int, list[int], list[int]]:
    """Sum the per-image statistics over the corpus."""
    candidate_length = sum(image[0] for image in statistics)
    reference_length = sum(image[1] for image in statistics)
    guessed = [sum(image[2][order] for image in statistics) for order in range(max_n)]
    matched = [sum(image[3][order] for image in statistics) for order in range(max_n)]
    return candidate_length, reference_length, guessed, matched


def corpus_bleu_statistics(
    predictions: Mapping[K, str], references: Mapping[K, Sequence[str]], max_n: int = 4
) -> dict[str, int | list[int]]:
    """The pooled counts behind corpus BLEU, as the COCO code prints them.

    Returns:
        `dict`: `testlen` and `reflen` (pooled candidate and closest-reference lengths), `guess` and `correct`
        (pooled n-gram counts and clipped matches per order, lists of length `max_n`).
    """
    keys = check_caption_corpus(predictions, references, "BLEU")
    statistics = [_image_statistics(predictions[key], references[key], max_n) for key in keys]
    candidate_length, reference_length, guessed, matched = _pool(statistics, max_n)
    return {"testlen": candidate_length, "reflen": reference_length, "guess": guessed, "correct": matched}


def compute_bleu(
    predictions: Mapping[K, str], references: Mapping[K, Sequence[str]], max_n: int = 4
) -> tuple[list[float], dict[K, list[float]]]:
    """Corpus and per-image BLEU-1..`max_n` as `pycocoevalcap.bleu.Bleu` computes them.

    Args:
        predictions (`Mapping[K, str]`): one tokenized caption (tokens joined by spaces) per key.
        references (`Mapping[K, Sequence[str]]`): the tokenized reference captions of each key (same keys).
        max_n (`int`, *optional*, defaults to 4): the highest n-gram order.

    Returns:
        `tuple[list[float], dict[K, list[float]]]`: the corpus BLEU-1..`max_n` (a list of length `max_n`) and, per
        key, that image's BLEU-1..`max_n`.

    Example:
    ```python
    >>> corpus, per_image = compute_bleu({1: "a cat on a mat"}, {1: ["a cat on a mat", "a cat sits"]})
    >>> round(corpus[3], 6)
    1.0
    ```
    """
    if max_n < 1:
        raise ValueError(f"max_n={max_n} must be at least 1 (BLEU-1).")
    keys = check_caption_corpus(predictions, references, "BLEU")
    statistics = [_image_statistics(predictions[key], references[key], max_n) for key in keys]
    per_image = {key: bleu_from_statistics(*image) for key, image in zip(keys, statistics, strict=True)}
    return bleu_from_statistics(*_pool(statistics, max_n)), per_image
