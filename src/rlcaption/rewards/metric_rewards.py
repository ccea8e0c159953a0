"""Caption-metric rewards: the per-caption value of a COCO metric, computed by the same code as `rlcaption.metrics`.

Each reward tokenizes completions and references with `normalize_caption` (the COCO toolkit's PTB tokenization) and
scores every completion against its own references, as one image of the metric's corpus. An empty completion (or one
that is only punctuation) scores 0.0.

- `cider`: CIDEr-D with document frequencies computed once from a training corpus (given, loaded from a file, or
  counted by `prepare` from the training set's `captions` and remembered by the training set's fingerprint, so that
  the next launch on the same data reads them) and reference vectors cached per image (`image_id` when the batch has
  it), scored in vectorized NumPy.
- `bleu`: per-image BLEU-n (default n = 4) with the COCO code's per-image smoothing.
- `rouge_l`: per-image ROUGE-L.
- `meteor`, `spice`: METEOR 1.5 and SPICE through Java (`rlcaption[java]`).
- `spider`: (CIDEr-D + SPICE) / 2 (Liu et al. 2017); it raises SPICE's error when SPICE cannot run, never substitutes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..data.fingerprint_cache import fingerprint_cache_file
from ..metrics.cider import CiderD, DocumentFrequencies, compute_cider_d_rows
from ..metrics.tokenization import normalize_caption
from .base import check_reward_inputs, row_keys
from .registry import register_reward

__all__ = ["MetricReward", "CiderReward", "BleuReward", "RougeReward", "MeteorReward", "SpiceReward", "SpiderReward"]

logger = logging.getLogger(__name__)


class MetricReward:
    """Base of the metric rewards: validates a call, tokenizes completions, gives empty completions 0.0.

    Subclasses set `__name__` (the logging name) and implement `_score`, which sees only the non-empty completions,
    unless `_scores_empty_completions` is set: then it sees every row and gives the empty completions 0.0 itself.
    """

    __name__ = "metric"
    _scores_empty_completions = False

    def __call__(self, *, completions: list[Any], references: list[list[str]] | None = None, **columns) -> list[float]:
        image_ids = row_keys(columns.get("image_id"), len(completions))
        texts, reference_lists = check_reward_inputs(completions, references, image_ids)
        candidates = [normalize_caption(text) for text in texts]
        rewards = np.zeros(len(candidates))
        rows = [row for row, candidate in enumerate(candidates) if candidate or self._scores_empty_completions]
        if rows:
            rewards[rows] = self._score(
                [candidates[row] for row in rows],
                [reference_lists[row] for row in rows],
                [image_ids[row] for row in rows] if image_ids is not None else None,
            )
        return rewards.tolist()

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        """Scores of tokenized, non-empty `candidates` against their raw `references`: `(num_candidates,)`."""
        raise NotImplementedError

    @staticmethod
    def _tokenized_corpus(
        candidates: list[str], references: list[Sequence[str]]
    ) -> tuple[dict[int, str], dict[int, list[str]]]:
        """Candidates and tokenized references keyed by position, the input form of `rlcaption.metrics`."""
        _check_reference_strings(references)
        tokenized = {
            row: [normalize_caption(reference) for reference in image_references]
            for row, image_references in enumerate(references)
        }
        return dict(enumerate(candidates)), tokenized

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.__name__!r})"


def _check_reference_strings(references: Sequence[Sequence[str]]) -> None:
    for row, image_references in enumerate(references):
        if not all(isinstance(reference, str) for reference in image_references):
            raise ValueError(f"References of row {row} must all be strings, got {image_references!r}.")


def _document_frequencies(
    source: DocumentFrequencies | str | os.PathLike | Sequence[Sequence[str]],
) -> DocumentFrequencies:
    if isinstance(source, DocumentFrequencies):
        return source
    if isinstance(source, str | os.PathLike):
        return DocumentFrequencies.load(source)
    corpus = [[normalize_caption(reference) for reference in image_references] for image_references in source]
    return DocumentFrequencies.from_references(corpus)


def _training_document_frequencies(train_dataset: Any, reward: str) -> DocumentFrequencies:
    """Document frequencies of a training set's `captions` column (one list of raw captions per image), counted once
    per training set: they are saved (in the format of `DocumentFrequencies.save`) under the `datasets` cache by the
    set's fingerprint, and read back by the next launch on the same set (see `rlcaption.data.fingerprint_cache`)."""
    column_names = getattr(train_dataset, "column_names", None)
    if train_dataset is None or column_names is None or "captions" not in column_names:
        found = "no training dataset" if train_dataset is None else f"a training dataset with columns {column_names}"
        raise ValueError(
            f"The {reward!r} reward counts CIDEr-D document frequencies from the training set's `captions` column "
            f"(one list of reference captions per image), but got {found}. Pass a training set with a `captions` "
            "column, or build the reward with `document_frequencies=` (a `DocumentFrequencies`, a file written by "
            "`DocumentFrequencies.save`, or one list of captions per image), e.g. "
            f"`get_reward({reward!r}, document_frequencies='train_df.json.gz')`."
        )
    cache_file = fingerprint_cache_file(train_dataset, "cider_document_frequencies", ".json.gz")
    if cache_file is not None and cache_file.is_file():
        try:
            document_frequencies = DocumentFrequencies.load(cache_file)
        except (OSError, ValueError) as error:  # damaged, or written by another file version: counted again
            logger.warning(f"Counting CIDEr-D document frequencies again: {cache_file} cannot be read ({error}).")
        else:
            logger.info(f"CIDEr-D document frequencies of this training set read from {cache_file}.")
            return document_frequencies
    document_frequencies = _document_frequencies(train_dataset["captions"])
    if cache_file is not None:
        document_frequencies.save(cache_file)
    return document_frequencies


@register_reward("cider")
class CiderReward(MetricReward):
    """CIDEr-D of each completion, with fixed document frequencies and cached reference vectors.

    A completion's reward equals `compute_cider_d`'s per-image value for the same (tokenized) inputs and document
    frequencies.

    Args:
        document_frequencies (`DocumentFrequencies`, `str`, `os.PathLike` or `Sequence[Sequence[str]]`, *optional*):
            the IDF statistics: an object, a file written by `DocumentFrequencies.save`, or a training corpus given
            as one list of raw reference captions per image (tokenized and counted once here). `None` lets
            `prepare(train_dataset, processor)` count them from the training set's `captions` column, as
            `RLCaptionTrainer` does before training, or read them when the same training set was counted before
            (they are remembered by its fingerprint under the `datasets` cache). Until then (e.g. in
            `trl.GRPOTrainer`, which never calls `prepare`), each call takes them from its own references, which
            equals running the COCO code's `Cider` on that batch: every completion is one document (an empty one
            too), so an image with `k` completions counts `k` times (no cache across calls, and the weights change
            from batch to batch; within a call the references of an image are tokenized and counted once).
        sigma (`float`, defaults to 6.0): standard deviation of the Gaussian length penalty.
        max_cached_images (`int`, *optional*): bound on the number of images whose reference vectors are cached.
    """

    # with document frequencies from the call, every row is a document, an empty completion's too (as in the COCO
    # code); the scorer gives an empty completion 0.0
    _scores_empty_completions = True

    @property
    def scores_captions_independently(self) -> bool:
        # with document frequencies from each call's references, a caption's reward depends on the call's other rows
        return self.scorer is not None

    def __init__(
        self,
        document_frequencies: DocumentFrequencies | str | os.PathLike | Sequence[Sequence[str]] | None = None,
        sigma: float = 6.0,
        max_cached_images: int | None = None,
    ):
        self.__name__ = "cider"
        self.sigma = sigma
        self.max_cached_images = max_cached_images
        # given frequencies are the user's choice and survive `prepare`; those counted by `prepare` are replaced by
        # the next training set's
        self._given_document_frequencies = document_frequencies is not None
        self.document_frequencies = None
        self.scorer = None
        if document_frequencies is not None:
            self._use_document_frequencies(_document_frequencies(document_frequencies))

    def _use_document_frequencies(self, document_frequencies: DocumentFrequencies) -> None:
        self.document_frequencies = document_frequencies
        self.scorer = CiderD(
            document_frequencies,
            sigma=self.sigma,
            text_normalizer=normalize_caption,
            max_cached_images=self.max_cached_images,
        )

    def prepare(self, train_dataset: Any, processor: Any = None) -> None:
        """Counts the document frequencies from `train_dataset["captions"]` (or reads those counted from the same
        training set at an earlier launch), unless they were given when built.

        Args:
            train_dataset (`datasets.Dataset`): the training set, with a `captions` column (one list of raw
                reference captions per image).
            processor (*optional*): the captioner's processor; unused.

        Raises:
            `ValueError`: naming this reward when the dataset has no `captions` column.
        """
        self._prepare(train_dataset, self.__name__)

    def _prepare(self, train_dataset: Any, reward: str) -> None:
        if not self._given_document_frequencies:
            self._use_document_frequencies(_training_document_frequencies(train_dataset, reward))

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        if self.scorer is None:
            return self._score_with_call_document_frequencies(candidates, references)
        return self.scorer.score(candidates, references, keys=image_ids, normalize_candidates=False)

    def _score_with_call_document_frequencies(
        self, candidates: list[str], references: list[Sequence[str]]
    ) -> np.ndarray:
        """`Cider` of the COCO code on these rows: each distinct reference list (an image's, repeated for each of its
        completions) is tokenized and counted once and stands for the rows sharing it."""
        list_of_references: dict[tuple[str, ...], int] = {}
        try:
            list_of_row = [list_of_references.setdefault(tuple(refs), len(list_of_references)) for refs in references]
        except TypeError:  # an unhashable reference, so not a string
            _check_reference_strings(references)
            raise
        if not all(isinstance(reference, str) for refs in list_of_references for reference in refs):
            _check_reference_strings(references)
        reference_lists = [[normalize_caption(reference) for reference in refs] for refs in list_of_references]
        scored = [row for row, candidate in enumerate(candidates) if candidate]
        rewards = np.zeros(len(candidates))
        if scored:
            rewards[scored] = compute_cider_d_rows(
                [candidates[row] for row in scored],
                reference_lists,
                [list_of_row[row] for row in scored],
                documents_per_list=np.bincount(list_of_row, minlength=len(reference_lists)),
                sigma=self.sigma,
            )
        return rewards


@register_reward("bleu")
class BleuReward(MetricReward):
    """Per-image BLEU-n of each completion, as the COCO code's `Bleu` reports per image.

    Args:
        n (`int`, defaults to 4): the n-gram order of the BLEU score returned (BLEU-n uses orders 1..n).
    """

    scores_captions_independently = True

    def __init__(self, n: int = 4):
        if n < 1:
            raise ValueError(f"n={n}: BLEU needs an n-gram order of at least 1.")
        self.n = n
        self.__name__ = f"bleu_{n}"

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        from ..metrics.bleu import compute_bleu

        _, per_row = compute_bleu(*self._tokenized_corpus(candidates, references), max_n=self.n)
        return np.array([per_row[row][self.n - 1] for row in range(len(candidates))])


@register_reward("rouge_l")
class RougeReward(MetricReward):
    """Per-image ROUGE-L (F-measure with beta = 1.2, as the COCO code) of each completion."""

    scores_captions_independently = True

    def __init__(self):
        self.__name__ = "rouge_l"

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        from ..metrics.rouge import compute_rouge_l

        _, per_row = compute_rouge_l(*self._tokenized_corpus(candidates, references))
        return np.array([per_row[row] for row in range(len(candidates))])


@register_reward("meteor")
class MeteorReward(MetricReward):
    """METEOR 1.5 of each completion, through the shared long-lived METEOR process (needs Java)."""

    def __init__(self):
        self.__name__ = "meteor"

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        from ..metrics.meteor import compute_meteor

        _, per_row = compute_meteor(*self._tokenized_corpus(candidates, references))
        return np.array([per_row[row] for row in range(len(candidates))])


@register_reward("spice")
class SpiceReward(MetricReward):
    """SPICE of each completion (needs Java and Stanford CoreNLP 3.6.0; raises where SPICE cannot run)."""

    def __init__(self):
        self.__name__ = "spice"

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        from ..metrics.spice import compute_spice

        _, per_row = compute_spice(*self._tokenized_corpus(candidates, references))
        return np.array([per_row[row] for row in range(len(candidates))])


@register_reward("spider")
class SpiderReward(MetricReward):
    """SPIDEr = (CIDEr-D + SPICE) / 2 of each completion (Liu et al. 2017).

    SPICE runs first, so a machine where it cannot run fails with SPICE's own error before any CIDEr-D work; the
    reward is never computed from CIDEr-D alone.

    Args:
        document_frequencies: as for `CiderReward` (`None`: counted by `prepare` from the training set).
        sigma (`float`, defaults to 6.0): CIDEr-D's length-penalty standard deviation.
        max_cached_images (`int`, *optional*): as for `CiderReward`.
    """

    def __init__(
        self,
        document_frequencies: DocumentFrequencies | str | os.PathLike | Sequence[Sequence[str]] | None = None,
        sigma: float = 6.0,
        max_cached_images: int | None = None,
    ):
        self.__name__ = "spider"
        self.cider = CiderReward(document_frequencies, sigma=sigma, max_cached_images=max_cached_images)
        self.spice = SpiceReward()

    def prepare(self, train_dataset: Any, processor: Any = None) -> None:
        """Counts CIDEr-D's document frequencies from `train_dataset["captions"]`, as `CiderReward.prepare`."""
        self.cider._prepare(train_dataset, self.__name__)

    def _score(
        self, candidates: list[str], references: list[Sequence[str]], image_ids: list[Hashable] | None
    ) -> np.ndarray:
        spice = self.spice._score(candidates, references, image_ids)
        cider = self.cider._score(candidates, references, image_ids)
        return (cider + spice) / 2.0
