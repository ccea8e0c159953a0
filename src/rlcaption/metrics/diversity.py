"""Diversity of generated captions: Div-1, Div-2 and mBLEU-4 per image, Self-BLEU, vocabulary size, copy rate.

Definitions (all on tokenized captions, tokens joined by single spaces; pass `normalize=True` to tokenize raw
captions with `rlcaption.metrics.normalize_caption` first):

- **Div-n** over the k captions of one image (Chen & Jin 2020, Table 4, after Wang et al. 2017): the number of distinct
  n-grams in the k captions divided by the number of words in the k captions. Higher is more diverse. n-grams do not
  cross caption boundaries.
- **mBLEU-4** of one image (Chen & Jin 2020): the BLEU-4 of each of its k captions against the other k - 1 as
  references, averaged over the k captions. Lower is more diverse. Each BLEU-4 is the COCO toolkit's per-image
  (sentence) BLEU-4, `rlcaption.metrics.compute_bleu`'s per-key value. The corpus value is the mean over images.
- **Self-BLEU** of a set of generated captions (Chaffin et al. 2024, after Zhu et al. 2018, "Texygen"): the BLEU-4 of
  each caption against all the other captions of the set as references, averaged over captions. Lower is more diverse.
  We take, as Texygen does, the mean of sentence-level scores rather than one corpus-level BLEU: every caption is a
  query of its own, and a mean over queries lets a random subset of queries (`sample_size`) estimate the full value
  without bias, while the references always stay the whole set. The sentence-level BLEU-4 is the COCO toolkit's
  (closest reference length, its smoothing constants) — equal to `compute_bleu`'s per-key value for the caption
  against the list of all others — computed here from corpus-wide n-gram maxima so that a 5,000-caption set takes
  seconds instead of the hours of 5,000 separate 4,999-reference BLEU calls.
- **Vocabulary size**: the number of distinct tokens over all generated captions.
- **Copy rate**: the share of generated captions that occur verbatim among the training references (after the
  same normalization); 1 - copy rate is the share of novel captions.
- **Pairwise caption distances** among the k captions of one image (Chen & Jin's d(y, y'), the diversity reward of
  `sle`): `bleu`, 1 - (BLEU-3 + BLEU-4) / 2 of one caption against the other as its single reference (the COCO
  toolkit's per-image BLEU), or `edit`, the word-level edit distance divided by the longer caption's length.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from .bleu import _SMALL, _TINY, bleu_from_statistics, compute_bleu
from .ngrams import NgramVocabulary
from .tokenization import normalize_caption

__all__ = [
    "PAIRWISE_DISTANCES",
    "copy_rate",
    "div_n",
    "mbleu",
    "pairwise_caption_distances",
    "self_bleu",
    "set_diversity",
    "vocabulary_size",
]

K = TypeVar("K", bound=Hashable)

# The `kind`s of `pairwise_caption_distances`.
PAIRWISE_DISTANCES = ("bleu", "edit")


def _prepared(captions: Iterable[str], normalize: bool) -> list[str]:
    captions = list(captions)
    for caption in captions:
        if not isinstance(caption, str):
            raise ValueError(f"Captions must be strings, got {type(caption).__name__} ({caption!r}).")
    return [normalize_caption(caption) for caption in captions] if normalize else captions


def _ngrams(words: Sequence[str], n: int) -> Iterable[tuple[str, ...]]:
    return zip(*(words[start:] for start in range(n)), strict=False)


def div_n(captions: Sequence[str], n: int, normalize: bool = False) -> float:
    """Div-n of one set of captions: distinct n-grams / words over the set (0 for a set without words).

    Args:
        captions (`Sequence[str]`): the k captions of one image.
        n (`int`): n-gram order (1 for Div-1, 2 for Div-2).
        normalize (`bool`, *optional*, defaults to `False`): tokenize raw captions first.
    """
    if n < 1:
        raise ValueError(f"n={n} must be at least 1.")
    tokenized = [caption.split() for caption in _prepared(captions, normalize)]
    word_count = sum(len(words) for words in tokenized)
    if word_count == 0:
        return 0.0
    distinct = {ngram for words in tokenized for ngram in _ngrams(words, n)}
    return len(distinct) / word_count


def mbleu(captions: Sequence[str], max_n: int = 4, normalize: bool = False) -> float:
    """mBLEU-`max_n` of one set of captions: the mean BLEU-`max_n` of each caption against the others.

    Args:
        captions (`Sequence[str]`): the k >= 2 captions of one image.
        max_n (`int`, *optional*, defaults to 4): the BLEU order.
        normalize (`bool`, *optional*, defaults to `False`): tokenize raw captions first.
    """
    captions = _prepared(captions, normalize)
    if len(captions) < 2:
        raise ValueError(f"mBLEU needs at least 2 captions per image, got {len(captions)}: {captions!r}.")
    predictions = dict(enumerate(captions))
    references = {index: captions[:index] + captions[index + 1 :] for index in range(len(captions))}
    _, per_caption = compute_bleu(predictions, references, max_n=max_n)
    return sum(scores[max_n - 1] for scores in per_caption.values()) / len(captions)


def set_diversity(
    captions_per_image: Mapping[K, Sequence[str]], normalize: bool = False
) -> tuple[dict[str, float], dict[K, dict[str, float]]]:
    """Div-1, Div-2 and mBLEU-4 of the k captions of every image (Chen & Jin 2020, Table 4), and their means.

    Args:
        captions_per_image (`Mapping[K, Sequence[str]]`):
            For each image, its k >= 2 generated captions (e.g. 5 samples, or the beam-5 top 5).
        normalize (`bool`, *optional*, defaults to `False`): tokenize raw captions first.

    Returns:
        `tuple[dict[str, float], dict[K, dict[str, float]]]`: the means over images keyed `"Div-1"`, `"Div-2"`,
        `"mBLEU-4"`, and the same three values per image.
    """
    if not captions_per_image:
        raise ValueError("set_diversity needs at least one image; got an empty mapping.")
    per_image: dict[K, dict[str, float]] = {}
    for key, captions in captions_per_image.items():
        if isinstance(captions, str) or len(captions) < 2:
            raise ValueError(f"Image {key!r} needs a list of at least 2 captions, got {captions!r}.")
        captions = _prepared(captions, normalize)
        per_image[key] = {"Div-1": div_n(captions, 1), "Div-2": div_n(captions, 2), "mBLEU-4": mbleu(captions)}
    means = {
        name: sum(scores[name] for scores in per_image.values()) / len(per_image)
        for name in ("Div-1", "Div-2", "mBLEU-4")
    }
    return means, per_image


def self_bleu(
    captions: Sequence[str],
    max_n: int = 4,
    sample_size: int | None = None,
    seed: int = 0,
    normalize: bool = False,
) -> float:
    """Self-BLEU-`max_n`: the mean sentence-level BLEU of each caption against all other captions (Chaffin et al.
    2024).

    Args:
        captions (`Sequence[str]`):
            The generated captions of a test set (one or more per image), at least 2.
        max_n (`int`, *optional*, defaults to 4): the BLEU order.
        sample_size (`int`, *optional*):
            Score only this many captions, drawn at random without replacement (each still against all the other
            captions); all captions when None or when it is not smaller than their number.
        seed (`int`, *optional*, defaults to 0): seed of the draw when `sample_size` is set.
        normalize (`bool`, *optional*, defaults to `False`): tokenize raw captions first.

    Returns:
        `float`: Self-BLEU in [0, 1]; lower is more diverse.
    """
    tokenized = [caption.split() for caption in _prepared(captions, normalize)]
    if len(tokenized) < 2:
        raise ValueError(f"Self-BLEU needs at least 2 captions, got {len(tokenized)}.")
    if max_n < 1:
        raise ValueError(f"max_n={max_n} must be at least 1.")
    if sample_size is not None and sample_size < 1:
        raise ValueError(f"sample_size={sample_size} must be a positive number of captions, or None for all.")

    # 1. Per caption n-gram counts; per n-gram the two largest counts over the set and the caption holding the
    #    largest, so that the maximum over "all captions but i" (BLEU's clipping count) is read in O(1).
    counts = [
        Counter(ngram for order in range(1, max_n + 1) for ngram in _ngrams(words, order)) for words in tokenized
    ]
    first_count: dict[tuple[str, ...], int] = {}
    first_owner: dict[tuple[str, ...], int] = {}
    second_count: Counter[tuple[str, ...]] = Counter()
    for index, caption_counts in enumerate(counts):
        for ngram, count in caption_counts.items():
            best = first_count.get(ngram, 0)
            if count > best:
                second_count[ngram] = best
                first_count[ngram] = count
                first_owner[ngram] = index
            elif count > second_count[ngram]:
                second_count[ngram] = count
    # 2. Reference lengths: the closest to the caption's own among the others (ties go to the shorter, as in COCO).
    length_counts = Counter(len(words) for words in tokenized)

    def closest_other_length(own_length: int) -> int:
        candidates = (
            (abs(length - own_length), length)
            for length, number in length_counts.items()
            if number > (1 if length == own_length else 0)
        )
        return min(candidates)[1]

    # 3. Sentence BLEU of each scored caption, averaged.
    indices = list(range(len(tokenized)))
    if sample_size is not None and sample_size < len(indices):
        indices = sorted(random.Random(seed).sample(indices, sample_size))
    total = 0.0
    for index in indices:
        length = len(tokenized[index])
        matched = [0] * max_n
        for ngram, count in counts[index].items():
            others_max = first_count[ngram] if first_owner[ngram] != index else second_count[ngram]
            matched[len(ngram) - 1] += min(count, others_max)
        guessed = [max(0, length - order + 1) for order in range(1, max_n + 1)]
        total += bleu_from_statistics(length, closest_other_length(length), guessed, matched)[max_n - 1]
    return total / len(indices)


def vocabulary_size(captions: Iterable[str], normalize: bool = False) -> int:
    """The number of distinct tokens over all `captions`."""
    return len({token for caption in _prepared(captions, normalize) for token in caption.split()})


def copy_rate(captions: Iterable[str], training_references: Iterable[str], normalize: bool = False) -> float:
    """The share of `captions` that occur verbatim among `training_references` (1 - copy rate = novelty).

    Args:
        captions (`Iterable[str]`): generated captions (duplicates count once per occurrence).
        training_references (`Iterable[str]`): all reference captions of the training split.
        normalize (`bool`, *optional*, defaults to `False`):
            Normalize both sides first (recommended for raw captions: "A dog." then equals "a dog").
    """
    captions = _prepared(captions, normalize)
    if not captions:
        raise ValueError("copy_rate needs at least one generated caption.")
    # Comparing token sequences, not raw strings, so that spacing differences do not hide a copy.
    seen = {" ".join(reference.split()) for reference in _prepared(training_references, normalize)}
    return sum(" ".join(caption.split()) in seen for caption in captions) / len(captions)


def pairwise_caption_distances(captions: Sequence[str], kind: str = "bleu", normalize: bool = False) -> np.ndarray:
    """Distances between every ordered pair of the k captions of one image, Chen & Jin's d(y, y').

    All k * k pairs are scored in one NumPy computation on n-gram counts (or edit-distance tables), not k * k calls of
    a sentence-level scorer.

    - `bleu`: `1 - (BLEU-3 + BLEU-4) / 2` of caption j as the candidate against caption k as its single reference,
      each BLEU the COCO toolkit's per-image value (`pycocoevalcap`'s `BleuScorer`, its smoothing constants
      included). It is not symmetric when the lengths differ (the brevity penalty and the number of candidate
      n-grams depend on which caption is the candidate), and the diagonal is not 0 for captions of fewer than 4
      words (they have no 4-gram to match).
    - `edit`: the word-level Levenshtein distance divided by the longer caption's length (0 for two empty
      captions): symmetric, in [0, 1], 0 on the diagonal.

    Args:
        captions (`Sequence[str]`): the k captions of one image, tokenized (tokens joined by spaces).
        kind (`str`, *optional*, defaults to `"bleu"`): one of [`PAIRWISE_DISTANCES`].
        normalize (`bool`, *optional*, defaults to `False`): tokenize raw captions first.

    Returns:
        `np.ndarray` of shape `(k, k)`, float64: entry `[j, k]` is d(captions[j], captions[k]).
    """
    if kind not in PAIRWISE_DISTANCES:
        raise ValueError(f"Unknown caption distance kind={kind!r}; choose one of {PAIRWISE_DISTANCES}.")
    tokenized = [caption.split() for caption in _prepared(captions, normalize)]
    if not tokenized:
        raise ValueError("pairwise_caption_distances needs at least one caption, got none.")
    if kind == "bleu":
        bleu = _pairwise_bleu(tokenized, max_n=4)  # (k, k, 4)
        return 1.0 - (bleu[..., 2] + bleu[..., 3]) / 2
    return _pairwise_normalized_edit_distances(tokenized)


def _pairwise_bleu(tokenized: list[list[str]], max_n: int) -> np.ndarray:
    """Per-image BLEU-1..`max_n` of every caption (first axis) against every caption as its single reference (second
    axis), with the COCO toolkit's operations: `(k, k, max_n)`."""
    num_captions = len(tokenized)
    # 1. n-gram counts as a dense (k, G) matrix; the vocabulary numbers the n-grams of all orders in one id space
    rows, orders, ids, counts = NgramVocabulary(max_n).count_batch(tokenized)
    num_ngrams = int(ids.max()) + 1 if len(ids) else 0
    ngram_counts = np.zeros((num_captions, num_ngrams))
    ngram_counts[rows, ids] = counts
    order_of_ngram = np.zeros((num_ngrams, max_n))
    order_of_ngram[ids, orders] = 1.0  # one-hot order of each n-gram id
    # 2. clipped matches of candidate j against reference k: the smaller of the two counts, summed per order (sums of
    # small integers, exact in float64)
    matched = np.minimum(ngram_counts[:, None, :], ngram_counts[None, :, :]) @ order_of_ngram  # (k, k, max_n)
    # 3. BLEU from the counts, in the COCO code's order of operations (see `bleu_from_statistics`)
    lengths = np.array([len(words) for words in tokenized], dtype=np.float64)  # (k,)
    n = np.arange(1, max_n + 1)
    guessed = np.maximum(0.0, lengths[:, None] - n + 1)  # (k, max_n), candidate n-grams
    precisions = (matched + _TINY) / (guessed[:, None, :] + _SMALL)  # (k, k, max_n)
    scores = np.cumprod(precisions, axis=-1) ** (1.0 / n)
    ratio = (lengths[:, None] + _TINY) / (lengths[None, :] + _SMALL)  # (k, k), candidate over reference length
    penalty = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return scores * penalty[..., None]


def _pairwise_normalized_edit_distances(tokenized: list[list[str]]) -> np.ndarray:
    """Word-level Levenshtein distance of every ordered pair of captions over the longer length: `(k, k)`."""
    num_captions = len(tokenized)
    word_ids: dict[str, int] = {}
    lengths = np.array([len(words) for words in tokenized])
    width = max(int(lengths.max()), 1)
    # padding never influences a cell that is read: cell (i, j) of the table depends on the first i and j words only
    padded = np.full((num_captions, width), -1)
    for row, words in enumerate(tokenized):
        padded[row, : len(words)] = [word_ids.setdefault(word, len(word_ids)) for word in words]
    first = np.repeat(np.arange(num_captions), num_captions)  # (P,), P = k * k ordered pairs
    second = np.tile(np.arange(num_captions), num_captions)
    first_words, second_words = padded[first], padded[second]  # (P, W)
    first_lengths, second_lengths = lengths[first], lengths[second]

    # the dynamic-programming table row by row (one row per word of the first caption), all pairs at once; a row is
    # the minimum of deletion and substitution, then insertions: row[j] = min over j' <= j of row[j'] + (j - j'), a
    # running minimum of row - j
    columns = np.arange(width + 1)
    previous = np.broadcast_to(columns, (len(first), width + 1))  # row 0: j insertions
    distances = second_lengths.copy()  # pairs whose first caption is empty
    for i in range(1, int(lengths.max()) + 1):
        substitution = previous[:, :-1] + (first_words[:, i - 1 : i] != second_words)  # (P, W)
        deletion = previous[:, 1:] + 1
        current = np.concatenate([np.full((len(first), 1), i), np.minimum(substitution, deletion)], axis=1)
        current = np.minimum.accumulate(current - columns, axis=1) + columns  # (P, W + 1)
        ended = first_lengths == i
        distances[ended] = current[ended, second_lengths[ended]]
        previous = current
    longer = np.maximum(first_lengths, second_lengths)
    normalized = np.divide(distances, longer, out=np.zeros(len(first)), where=longer > 0)
    return normalized.reshape(num_captions, num_captions)
