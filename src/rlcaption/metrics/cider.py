"""CIDEr-D (Vedantam et al., CVPR 2015) exactly as the COCO caption evaluation code computes it, vectorized.

The numbers equal `pycocoevalcap` 1.2's `Cider` on the same tokens: n-grams of order 1..4 weighted by TF-IDF with
`idf = log(num_documents) - log(max(1, df))`, per-order cosine similarity in which the candidate's weights are clipped
by the reference's (`min(w_cand, w_ref) * w_ref`), a Gaussian penalty `exp(-delta^2 / (2 sigma^2))` on the length
difference to each reference (sigma = 6; "length" counts bigrams, as the COCO code does), the mean over orders and
references, times 10.

Document frequencies come either from the evaluated references (`document_frequencies=None`, the official evaluation)
or from a training corpus computed once (`DocumentFrequencies`, the usual choice for rewards, as self-critical
training does: the IDF's `log(num_documents)` then counts the images of that corpus).

`CiderD` is the fast scorer shared by `compute_cider_d` and the `cider` reward: reference n-gram vectors are built once
per image key and cached; a batch of candidates is scored with NumPy operations over all candidates and references
together: n-grams get integer ids and counts from `rlcaption.metrics.ngrams` (Python work per word, not per n-gram),
sparse TF-IDF vectors are sorted id arrays, and clipped dot products come from one `searchsorted` and a few array
reductions. Rows that share references (the samples of one image) share one set of reference vectors; with document
frequencies from the evaluated references (`compute_cider_d_rows`), a reference list shared by several rows is
counted once and weighted by the number of rows, which equals counting every row.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import TypeVar

import numpy as np

from .ngrams import KEY_BITS, KEY_STRIDE, NgramVocabulary, distinct_sorted, documents_per_ngram, grouped_sum

__all__ = ["DocumentFrequencies", "CiderD", "compute_cider_d", "compute_cider_d_rows"]

K = TypeVar("K", bound=Hashable)

_FILE_FORMAT = "rlcaption.cider.document_frequencies"
_FILE_VERSION = 1


def _chunks(items: Iterable, size: int) -> Iterable[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _as_reference_list(references: Sequence[str]) -> Sequence[str]:
    if isinstance(references, str):
        raise ValueError(
            f"Got the string {references!r} where a list of reference captions for one image was expected; pass one "
            "list of captions per image."
        )
    return references


def _check_reference_list(key: Hashable, references: Sequence[str]) -> None:
    if isinstance(references, str) or len(references) == 0:
        kind = "a single string as" if isinstance(references, str) else "no"
        raise ValueError(
            f"Image {key!r} has {kind} references; CIDEr-D needs a non-empty list of reference captions per image. "
            "Drop the image or add its references."
        )


class DocumentFrequencies:
    """Number of images (documents) whose references contain each n-gram, for CIDEr-D's IDF weights.

    An image counts once per n-gram however many of its references contain it, as in the COCO code.

    Args:
        counts (`Mapping[tuple[str, ...], int]`): document frequency of every n-gram (tuple of tokens).
        num_documents (`int`): number of images in the corpus the counts come from; `log(num_documents)` is the
            IDF's first term.
        max_n (`int`, defaults to 4): the highest n-gram order counted.
    """

    def __init__(self, counts: Mapping[tuple[str, ...], int], num_documents: int, max_n: int = 4):
        if num_documents < 1:
            raise ValueError(
                f"num_documents={num_documents}: document frequencies need a corpus of at least one image."
            )
        if max_n < 1:
            raise ValueError(f"max_n={max_n}: the highest n-gram order must be at least 1.")
        self.num_documents = int(num_documents)
        self.max_n = int(max_n)
        self.index: dict[tuple[str, ...], int] = {ngram: position for position, ngram in enumerate(counts)}
        self.counts = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
        if len(self.counts) and int(self.counts.max()) > self.num_documents:
            raise ValueError(
                f"A document frequency of {int(self.counts.max())} exceeds num_documents={self.num_documents}; "
                "an n-gram cannot occur in more images than the corpus has. Rebuild the counts with "
                "`DocumentFrequencies.from_references`."
            )

    @classmethod
    def from_references(
        cls, references: Iterable[Sequence[str]], max_n: int = 4, images_per_chunk: int = 20_000
    ) -> DocumentFrequencies:
        """Counts document frequencies over a corpus of tokenized reference lists (one list per image).

        Args:
            references (`Iterable[Sequence[str]]`): for every image, its reference captions as space-joined tokens
                (e.g. the output of `normalize_caption`).
            max_n (`int`, defaults to 4): the highest n-gram order.
            images_per_chunk (`int`, defaults to 20000): images counted together, which bounds the memory of the
                n-gram arrays on large corpora.

        Returns:
            `DocumentFrequencies`
        """
        vocabulary = NgramVocabulary(max_n)
        document_frequency = np.zeros(0, dtype=np.int64)
        num_documents = 0
        for chunk in _chunks(references, images_per_chunk):
            word_lists, image_of_reference = [], []
            for image, image_references in enumerate(chunk):
                for reference in _as_reference_list(image_references):
                    word_lists.append(reference.split())
                    image_of_reference.append(image)
            rows, _, ids, _ = vocabulary.count_batch(word_lists, assign=True)
            chunk_frequency = documents_per_ngram(np.asarray(image_of_reference, np.int64)[rows], ids)
            document_frequency = np.pad(document_frequency, (0, vocabulary.size - len(document_frequency)))
            document_frequency[: len(chunk_frequency)] += chunk_frequency
            num_documents += len(chunk)
        if num_documents == 0:
            raise ValueError("Cannot compute document frequencies from an empty corpus: pass at least one image.")
        counts = dict(zip(vocabulary.ngrams(), document_frequency.tolist(), strict=True))
        return cls(counts, num_documents, max_n)

    @property
    def log_num_documents(self) -> float:
        """`log(num_documents)`, the COCO code's `ref_len`."""
        return math.log(float(self.num_documents))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, ngram: tuple[str, ...]) -> int:
        position = self.index.get(ngram)
        return 0 if position is None else int(self.counts[position])

    def idf(self) -> np.ndarray:
        """IDF weight of every n-gram in `index` order, `log(num_documents) - log(max(1, df))`: `(len(self),)`."""
        return self.log_num_documents - np.log(np.maximum(self.counts, 1).astype(np.float64))

    def save(self, path: str | os.PathLike) -> None:
        """Writes the counts as JSON (gzip-compressed when `path` ends in `.gz`), atomically.

        Args:
            path (`str` or `os.PathLike`): destination file; its directory must exist.
        """
        path = Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"Cannot save document frequencies to {path}: directory {path.parent} is missing.")
        payload = {
            "format": _FILE_FORMAT,
            "version": _FILE_VERSION,
            "max_n": self.max_n,
            "num_documents": self.num_documents,
            # tokens never contain whitespace (they come from str.split), so joining with a space is lossless
            "ngrams": [" ".join(ngram) for ngram in self.index],
            "counts": self.counts.tolist(),
        }
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        if path.suffix == ".gz":
            data = gzip.compress(data)
        # write next to the target and rename, so a crash never leaves a truncated file under the final name
        handle, temporary_path = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.replace(temporary_path, path)
        except BaseException:
            Path(temporary_path).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> DocumentFrequencies:
        """Reads counts written by `save`.

        Args:
            path (`str` or `os.PathLike`): a file written by `DocumentFrequencies.save`.

        Returns:
            `DocumentFrequencies`
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"No document-frequency file at {path}; create one with `DocumentFrequencies.from_references(...)"
                ".save(path)`."
            )
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        try:
            payload = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(
                f"{path} is not a document-frequency file written by DocumentFrequencies.save."
            ) from error
        if not isinstance(payload, dict) or payload.get("format") != _FILE_FORMAT:
            raise ValueError(f"{path} is not a document-frequency file written by DocumentFrequencies.save.")
        if payload.get("version") != _FILE_VERSION:
            raise ValueError(
                f"{path} has document-frequency file version {payload.get('version')!r}; this rlcaption reads "
                f"version {_FILE_VERSION}. Recompute it with `DocumentFrequencies.from_references`."
            )
        if len(payload["ngrams"]) != len(payload["counts"]):
            raise ValueError(
                f"{path} is corrupt: {len(payload['ngrams'])} n-grams but {len(payload['counts'])} counts."
            )
        counts = {
            tuple(ngram.split(" ")): count for ngram, count in zip(payload["ngrams"], payload["counts"], strict=True)
        }
        return cls(counts, payload["num_documents"], payload["max_n"])


@dataclass
class _ReferenceVectors:
    """TF-IDF vectors of the references of one image, as the cache keeps them.

    Attributes:
        raw_references (`tuple[str, ...]`): the references as given, to detect a key reused for other references.
        ngram_ids (`np.ndarray` of shape `(num_ngrams,)`): sorted ids of the union of the references' n-grams.
        weights (`np.ndarray` of shape `(num_ngrams, num_references)`): TF-IDF weight of each n-gram in each
            reference (0 where absent).
        norms (`np.ndarray` of shape `(num_references, max_n)`): L2 norm of each reference's vector per order.
        lengths (`np.ndarray` of shape `(num_references,)`): each reference's length as the COCO code measures it
            (its number of bigrams).
    """

    raw_references: tuple[str, ...]
    ngram_ids: np.ndarray
    weights: np.ndarray
    norms: np.ndarray
    lengths: np.ndarray


@dataclass
class _ReferenceBatch:
    """TF-IDF vectors of the references of several groups (images), in the layout the batched scorer consumes.

    Each scored row names its group, so rows that share references (the samples of one image) share one group and
    their references are laid out once. Groups with fewer references than the largest are padded with references of
    zero weights and norms, which add nothing to a score.

    Attributes:
        keys (`np.ndarray` of shape `(num_entries,)`): sorted `group * KEY_STRIDE + ngram_id` over the union of the
            n-grams of each group's references.
        weights (`np.ndarray` of shape `(num_entries, max_references)`): TF-IDF weight of each entry's n-gram in each
            reference of its group (0 where absent).
        norms (`np.ndarray` of shape `(num_groups, max_references, max_n)`): L2 norm of each reference's vector per
            order.
        lengths (`np.ndarray` of shape `(num_groups, max_references)`): each reference's length as the COCO code
            measures it (its number of bigrams).
        reference_counts (`np.ndarray` of shape `(num_groups,)`): the number of references of each group.
    """

    keys: np.ndarray
    weights: np.ndarray
    norms: np.ndarray
    lengths: np.ndarray
    reference_counts: np.ndarray

    @classmethod
    def stack(cls, vectors: Sequence[_ReferenceVectors]) -> _ReferenceBatch:
        """The batch whose group `i` is image `vectors[i]`."""
        sizes = [len(image_vectors.ngram_ids) for image_vectors in vectors]
        reference_counts = np.array([len(image_vectors.lengths) for image_vectors in vectors])
        max_references = int(reference_counts.max())
        keys = np.concatenate([image_vectors.ngram_ids for image_vectors in vectors])
        keys += np.repeat(np.arange(len(vectors), dtype=np.int64) * KEY_STRIDE, sizes)
        if (reference_counts == max_references).all():
            weights = np.concatenate([image_vectors.weights for image_vectors in vectors])
            norms = np.stack([image_vectors.norms for image_vectors in vectors])
            lengths = np.stack([image_vectors.lengths for image_vectors in vectors])
        else:
            weights = np.zeros((len(keys), max_references))
            norms = np.zeros((len(vectors), max_references, vectors[0].norms.shape[1]))
            lengths = np.zeros((len(vectors), max_references))
            offsets = np.cumsum([0, *sizes])
            for group, (image_vectors, count) in enumerate(zip(vectors, reference_counts.tolist(), strict=True)):
                weights[offsets[group] : offsets[group + 1], :count] = image_vectors.weights
                norms[group, :count] = image_vectors.norms
                lengths[group, :count] = image_vectors.lengths
        return cls(keys, weights, norms, lengths, reference_counts)

    def split(self, raw_reference_lists: Sequence[Sequence[str]]) -> list[_ReferenceVectors]:
        """The vectors of each group on their own, for the cache, labelled with the group's raw references."""
        bounds = np.searchsorted(self.keys, np.arange(len(self.reference_counts) + 1) * KEY_STRIDE).tolist()
        return [
            _ReferenceVectors(
                raw_references=tuple(references),
                ngram_ids=self.keys[bounds[group] : bounds[group + 1]] - group * KEY_STRIDE,
                weights=self.weights[bounds[group] : bounds[group + 1], :count].copy(),
                norms=self.norms[group, :count],
                lengths=self.lengths[group, :count],
            )
            for group, (references, count) in enumerate(
                zip(raw_reference_lists, self.reference_counts.tolist(), strict=True)
            )
        ]


class CiderD:
    """Vectorized CIDEr-D scorer with fixed document frequencies and a per-image cache of reference vectors.

    Args:
        document_frequencies (`DocumentFrequencies`): the IDF statistics (a training corpus for rewards, the evaluated
            references for the official corpus score).
        sigma (`float`, defaults to 6.0): standard deviation of the Gaussian length penalty.
        text_normalizer (`Callable[[str], str]`, *optional*): applied to every candidate and reference before
            splitting on whitespace (e.g. `normalize_caption` for raw captions); `None` means the inputs are already
            space-joined tokens.
        max_cached_images (`int`, *optional*): keep at most this many images' reference vectors (least recently used
            evicted first); `None` keeps all of them.
    """

    def __init__(
        self,
        document_frequencies: DocumentFrequencies,
        sigma: float = 6.0,
        text_normalizer: Callable[[str], str] | None = None,
        max_cached_images: int | None = None,
    ):
        if sigma <= 0:
            raise ValueError(f"sigma={sigma}: the length penalty's standard deviation must be positive.")
        if max_cached_images is not None and max_cached_images < 1:
            raise ValueError(f"max_cached_images={max_cached_images}: pass a positive number, or None for no limit.")
        self.document_frequencies = document_frequencies
        self.sigma = float(sigma)
        self.text_normalizer = text_normalizer
        self.max_cached_images = max_cached_images
        self.max_n = document_frequencies.max_n
        try:
            self._vocabulary = NgramVocabulary.from_ngrams(document_frequencies.index, document_frequencies.max_n)
        except KeyError as error:
            raise ValueError(
                f"The document frequencies lack {error.args[0]!r}, a part of one of their n-grams; counts of real "
                "captions contain every prefix and word of an n-gram. Rebuild them with "
                "`DocumentFrequencies.from_references`."
            ) from None
        self._log_num_documents = document_frequencies.log_num_documents
        self._idf = self._idf_table(document_frequencies.idf())
        self._cache: OrderedDict[Hashable, _ReferenceVectors] = OrderedDict()

    def clear_cache(self) -> None:
        """Forgets every cached reference vector."""
        self._cache.clear()

    @property
    def num_cached_images(self) -> int:
        return len(self._cache)

    def _word_lists(self, texts: Sequence[str], normalize: bool = True) -> list[list[str]]:
        """The words of each caption, after `text_normalizer` when there is one and `normalize`."""
        if not all(map(isinstance, texts, repeat(str))):
            text = next(text for text in texts if not isinstance(text, str))
            raise ValueError(f"Expected a caption string, got {type(text).__name__} {text!r}.")
        if normalize and self.text_normalizer is not None:
            texts = map(self.text_normalizer, texts)
        return list(map(str.split, texts))

    def _idf_table(self, corpus_idf: np.ndarray) -> np.ndarray:
        """The IDF of every corpus n-gram by id, then that of any other: n-grams of cached references that the corpus
        lacks get ids after the corpus's, and unseen candidate n-grams ids of their own; their df is 0, so their IDF
        is log(num_documents)."""
        return np.append(corpus_idf, self._log_num_documents)

    def _idf_of(self, ngram_ids: np.ndarray) -> np.ndarray:
        """IDF of each id (see `_idf_table`)."""
        return self._idf[np.minimum(ngram_ids, len(self._idf) - 1)]

    def _reference_words(
        self, keys: Iterable[Hashable], reference_lists: Sequence[Sequence[str]]
    ) -> tuple[list[list[str]], np.ndarray]:
        """The words of every reference of several images, in order, and `first_reference`: the position of each
        image's first reference, plus the total."""
        texts = []
        first_reference = [0]
        for key, references in zip(keys, reference_lists, strict=True):
            _check_reference_list(key, references)
            texts.extend(references)
            first_reference.append(len(texts))
        return self._word_lists(texts), np.asarray(first_reference)

    def _new_reference_batch(
        self, keys: Iterable[Hashable], reference_lists: Sequence[Sequence[str]]
    ) -> _ReferenceBatch:
        """The TF-IDF vectors of several images' references, image `i` as group `i`; their n-grams join the
        vocabulary."""
        word_lists, first_reference = self._reference_words(keys, reference_lists)
        counted = self._vocabulary.count_batch(word_lists, assign=True)
        return self._reference_batch(counted, _bigram_counts(word_lists), first_reference)

    def _reference_batch(
        self,
        counted: tuple[np.ndarray, ...],
        lengths: np.ndarray,
        first_reference: np.ndarray,
        documents_per_image: np.ndarray | None = None,
    ) -> _ReferenceBatch:
        """The TF-IDF vectors of references from their n-gram counts `(rows, orders, ids, counts)` (rows indexing the
        references), lengths (numbers of bigrams) and `first_reference` (see `_reference_words`).

        With `documents_per_image`, the document frequencies are first counted from these references (the official
        evaluation), image `i` standing for `documents_per_image[i]` documents: its n-grams count that many times,
        exactly as counting each of those documents would. They exist only as IDF weights by id: the scorer's
        `document_frequencies` attribute is not updated.
        """
        rows, orders, ids, counts = counted
        image_of_reference = np.repeat(np.arange(len(first_reference) - 1), np.diff(first_reference))
        max_n = self.max_n
        # union of n-grams per image: unique (image, id) keys, sorted by image then id
        keys, inverse = distinct_sorted(image_of_reference[rows] * KEY_STRIDE + ids)
        if documents_per_image is not None:
            images, ngram_ids = keys >> KEY_BITS, keys & (KEY_STRIDE - 1)
            frequency = np.bincount(ngram_ids, weights=documents_per_image[images])
            self._idf = self._idf_table(self._log_num_documents - np.log(np.maximum(frequency, 1.0)))
        num_references = len(lengths)
        weights = counts * self._idf_of(ids)
        norms = np.sqrt(grouped_sum(rows * max_n + orders, weights**2, num_references * max_n))
        reference_counts = np.diff(first_reference)
        max_references = int(reference_counts.max())
        slot = np.arange(num_references) - first_reference[image_of_reference]  # place of a reference in its image
        weight_matrix = np.zeros((len(keys), max_references))
        weight_matrix[inverse, slot[rows]] = weights
        padded_norms = np.zeros((len(reference_counts), max_references, max_n))
        padded_norms[image_of_reference, slot] = norms.reshape(num_references, max_n)
        padded_lengths = np.zeros((len(reference_counts), max_references))
        padded_lengths[image_of_reference, slot] = lengths
        return _ReferenceBatch(keys, weight_matrix, padded_norms, padded_lengths, reference_counts)

    def _row_references(
        self, keys: Sequence[Hashable], reference_lists: Sequence[Sequence[str]]
    ) -> tuple[_ReferenceBatch, np.ndarray]:
        """The vectors of each distinct key's references as one batch, from the cache or built (all misses together)
        and cached, and the group of each row's key in it: `(vectors, group_of_row)`.

        A key seen before with different references is rebuilt and re-cached, so a reused key never gives a stale
        score.
        """
        group_of_key: dict[Hashable, int] = {}
        group_references: list[Sequence[str]] = []
        group_of_row = []
        for key, references in zip(keys, reference_lists, strict=True):
            group = group_of_key.get(key)
            if group is None:
                group = group_of_key[key] = len(group_references)
                group_references.append(references)
            elif references is not group_references[group] and tuple(references) != tuple(group_references[group]):
                raise ValueError(
                    f"Image key {key!r} appears twice in one batch with different references; give every image a "
                    "unique key (e.g. its image_id)."
                )
            group_of_row.append(group)
        vectors: list[_ReferenceVectors | None] = []
        missing = []
        for group, (key, references) in enumerate(zip(group_of_key, group_references, strict=True)):
            cached = self._cache.get(key)
            if cached is not None and cached.raw_references == tuple(references):
                self._cache.move_to_end(key)
            else:
                missing.append(group)
            vectors.append(cached)
        group_of_row = np.asarray(group_of_row, dtype=np.int64)
        if not missing:
            return _ReferenceBatch.stack(vectors), group_of_row
        group_keys = list(group_of_key)
        missing_keys = [group_keys[group] for group in missing]
        missing_lists = [group_references[group] for group in missing]
        built = self._new_reference_batch(missing_keys, missing_lists)
        for group, key, image_vectors in zip(missing, missing_keys, built.split(missing_lists), strict=True):
            vectors[group] = self._cache[key] = image_vectors
            self._cache.move_to_end(key)
        if self.max_cached_images is not None:
            while len(self._cache) > self.max_cached_images:
                self._cache.popitem(last=False)
        if len(missing) == len(vectors):  # every image is new: the batch just built is already the one needed
            return built, group_of_row
        return _ReferenceBatch.stack(vectors), group_of_row

    def score(
        self,
        candidates: Sequence[str],
        references: Sequence[Sequence[str]],
        keys: Sequence[Hashable] | None = None,
        normalize_candidates: bool = True,
    ) -> np.ndarray:
        """CIDEr-D of each candidate against its own references.

        Args:
            candidates (`Sequence[str]` of length `batch_size`): one caption per row.
            references (`Sequence[Sequence[str]]` of length `batch_size`): the references of each row's image.
            keys (`Sequence[Hashable]` of length `batch_size`, *optional*): image keys under which the reference
                vectors are cached (e.g. `image_id`); by default the tuple of references is the key.
            normalize_candidates (`bool`, defaults to `True`): apply `text_normalizer` to the candidates; `False` when
                the caller has normalized them already (references are always normalized).

        Returns:
            `np.ndarray` of shape `(batch_size,)`: the per-candidate scores (0 for an empty candidate).
        """
        batch_size = len(candidates)
        if len(references) != batch_size:
            raise ValueError(
                f"Got {batch_size} candidates but {len(references)} reference lists; pass one list per candidate."
            )
        if keys is not None and len(keys) != batch_size:
            raise ValueError(f"Got {batch_size} candidates but {len(keys)} keys; pass one key per candidate.")
        if batch_size == 0:
            return np.zeros(0)
        if keys is None:
            keys = [tuple(image_references) for image_references in references]
        vectors, group_of_row = self._row_references(keys, references)
        return self._score_batch(candidates, vectors, group_of_row, normalize=normalize_candidates)

    def _score_batch(
        self,
        candidates: Sequence[str],
        references: _ReferenceBatch,
        group_of_row: np.ndarray,
        normalize: bool = True,
    ) -> np.ndarray:
        """Scores of each candidate against the references of its row's group: `(batch_size,)`."""
        word_lists = self._word_lists(candidates, normalize)
        counted = self._vocabulary.count_batch(word_lists)
        return self._score_counted(counted, _bigram_counts(word_lists), references, group_of_row)

    def _score_counted(
        self,
        counted: tuple[np.ndarray, ...],
        candidate_lengths: np.ndarray,
        references: _ReferenceBatch,
        group_of_row: np.ndarray,
    ) -> np.ndarray:
        """Scores of candidates from their n-gram counts `(rows, orders, ids, counts)` (sorted by row and order) and
        lengths (numbers of bigrams), against the references of each row's group: `(batch_size,)`."""
        batch_size = len(candidate_lengths)
        max_n = self.max_n
        max_references = references.weights.shape[1]

        # 1. candidate vectors; ids outside the corpus (df 0) weigh log(num_documents), and those the vocabulary lacks
        # match no reference and only enter the norm
        rows, orders, ids, counts = counted
        candidate_weights = counts * self._idf_of(ids)
        row_orders = rows * max_n + orders
        candidate_norms = np.sqrt(grouped_sum(row_orders, candidate_weights**2, batch_size * max_n))

        # 2. clipped dot products: for each candidate n-gram found among its group's references,
        # min(w_cand, w_ref) * w_ref for every reference, summed per (row, order)
        similarity = np.zeros((batch_size * max_n, max_references))
        if len(references.keys):
            candidate_keys = group_of_row[rows] * KEY_STRIDE + ids
            positions = np.searchsorted(references.keys, candidate_keys)
            positions[positions == len(references.keys)] = 0
            matched = np.flatnonzero(references.keys[positions] == candidate_keys)
            if len(matched):
                reference_weights = references.weights[positions[matched]]  # (num_matched, max_references)
                clipped = np.minimum(candidate_weights[matched, None], reference_weights) * reference_weights
                # the entries of one (row, order) are contiguous: sum each run
                matched_row_orders = row_orders[matched]
                run_starts = np.flatnonzero(np.diff(matched_row_orders, prepend=-1))
                similarity[matched_row_orders[run_starts]] = np.add.reduceat(clipped, run_starts, axis=0)
        similarity = similarity.reshape(batch_size, max_n, max_references)

        # 3. cosine: divide only where both norms are non-zero (the COCO code leaves the raw sum otherwise)
        reference_norms = references.norms[group_of_row].transpose(0, 2, 1)  # (batch, max_n, max_references)
        denominators = candidate_norms.reshape(batch_size, max_n, 1) * reference_norms
        np.divide(similarity, denominators, out=similarity, where=denominators != 0)

        # 4. Gaussian length penalty, mean over orders, mean over references, x10
        delta = candidate_lengths[:, None] - references.lengths[group_of_row]  # (batch, max_references)
        penalty = np.e ** (-(delta**2) / (2 * self.sigma**2))
        per_order = (similarity * penalty[:, None, :]).sum(axis=2)  # (batch, max_n)
        return per_order.mean(axis=1) / references.reference_counts[group_of_row] * 10.0


def _bigram_counts(word_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """The length of each caption as the COCO code measures it (its number of bigrams): `(num_captions,)` float64."""
    lengths = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
    return np.maximum(lengths - 1, 0).astype(np.float64)


def compute_cider_d(
    predictions: Mapping[K, str],
    references: Mapping[K, Sequence[str]],
    document_frequencies: DocumentFrequencies | None = None,
    sigma: float = 6.0,
) -> tuple[float, dict[K, float]]:
    """Corpus CIDEr-D and per-image scores of tokenized captions, equal to `pycocoevalcap`'s `Cider`.

    Args:
        predictions (`Mapping[K, str]`): one candidate per image key, as space-joined tokens.
        references (`Mapping[K, Sequence[str]]`): the reference captions of the same keys, as space-joined tokens.
        document_frequencies (`DocumentFrequencies`, *optional*): IDF statistics; `None` computes them from
            `references`, as the COCO evaluation code does.
        sigma (`float`, defaults to 6.0): standard deviation of the Gaussian length penalty.

    Returns:
        `tuple[float, dict[K, float]]`: the corpus score (mean over images) and each image's score.
    """
    if set(predictions) != set(references):
        missing = [key for key in references if key not in predictions][:5]
        extra = [key for key in predictions if key not in references][:5]
        raise ValueError(
            "predictions and references must have the same keys; "
            f"keys without a prediction: {missing}, keys without references: {extra} (first 5 of each shown)."
        )
    if not predictions:
        raise ValueError("CIDEr-D of an empty corpus is undefined: pass at least one prediction.")
    keys = list(references)
    reference_lists = [references[key] for key in keys]
    for key, image_references in zip(keys, reference_lists, strict=True):
        _check_reference_list(key, image_references)
    candidates = [predictions[key] for key in keys]
    if document_frequencies is None:
        list_of_references: dict[tuple[str, ...], int] = {}
        list_of_row = [list_of_references.setdefault(tuple(refs), len(list_of_references)) for refs in reference_lists]
        scores = compute_cider_d_rows(candidates, list(list_of_references), list_of_row, sigma=sigma)
    else:
        scorer = CiderD(document_frequencies, sigma=sigma)
        vectors = scorer._new_reference_batch(keys, reference_lists)
        scores = scorer._score_batch(candidates, vectors, np.arange(len(keys)))
    return float(np.mean(scores)), {key: float(score) for key, score in zip(keys, scores, strict=True)}


def compute_cider_d_rows(
    candidates: Sequence[str],
    reference_lists: Sequence[Sequence[str]],
    reference_list_of_row: Sequence[int],
    documents_per_list: Sequence[int] | None = None,
    sigma: float = 6.0,
) -> np.ndarray:
    """Per-row CIDEr-D with document frequencies from the rows' own references, equal to `pycocoevalcap`'s `Cider` on
    the same rows (every row is one document), with rows that share references counted together.

    Rows that share references (the samples of one image) name the same list: its n-grams are counted and its vectors
    built once, and its n-grams count once per document it stands for, which is exactly what counting every row
    gives (a document frequency counts documents).

    Args:
        candidates (`Sequence[str]` of length `batch_size`): one caption per row, as space-joined tokens.
        reference_lists (`Sequence[Sequence[str]]`): the distinct reference lists, as space-joined tokens.
        reference_list_of_row (`Sequence[int]` of length `batch_size`): the index in `reference_lists` of each row's
            references.
        documents_per_list (`Sequence[int]`, *optional*): how many documents each list stands for; by default the
            number of rows naming it. Larger counts add documents that are not scored, e.g. rows whose empty
            candidate the caller scores 0 itself but that the COCO code still counts.
        sigma (`float`, defaults to 6.0): standard deviation of the Gaussian length penalty.

    Returns:
        `np.ndarray` of shape `(batch_size,)`: each row's score.
    """
    list_of_row = np.asarray(reference_list_of_row, dtype=np.int64).reshape(-1)
    if len(list_of_row) != len(candidates):
        raise ValueError(f"Got {len(candidates)} candidates but {len(list_of_row)} reference-list indices.")
    if len(list_of_row) and (list_of_row.min() < 0 or list_of_row.max() >= len(reference_lists)):
        raise ValueError(f"reference_list_of_row must index the {len(reference_lists)} reference lists.")
    rows_per_list = np.bincount(list_of_row, minlength=len(reference_lists))
    documents = rows_per_list if documents_per_list is None else np.asarray(documents_per_list, dtype=np.int64)
    if documents.shape != rows_per_list.shape or (documents < rows_per_list).any():
        raise ValueError(
            f"documents_per_list must give each of the {len(reference_lists)} reference lists at least as many "
            f"documents as rows name it ({rows_per_list.tolist()}), got {documents.tolist()}."
        )
    if len(candidates) == 0:
        return np.zeros(0)
    scorer = CiderD(DocumentFrequencies({}, num_documents=int(documents.sum())), sigma=sigma)
    word_lists, first_reference = scorer._reference_words(range(len(reference_lists)), reference_lists)
    candidate_words = scorer._word_lists(candidates)
    # references and candidates are counted in one pass, with ids local to it (the scorer's vocabulary stays empty);
    # a candidate n-gram that no reference has gets df 0, like any n-gram the corpus lacks
    rows, orders, ids, counts = scorer._vocabulary.count_batch([*word_lists, *candidate_words])
    split = np.searchsorted(rows, len(word_lists))  # the entries are sorted by row
    vectors = scorer._reference_batch(
        (rows[:split], orders[:split], ids[:split], counts[:split]),
        _bigram_counts(word_lists),
        first_reference,
        documents_per_image=documents,
    )
    candidate_counts = (rows[split:] - len(word_lists), orders[split:], ids[split:], counts[split:])
    return scorer._score_counted(candidate_counts, _bigram_counts(candidate_words), vectors, list_of_row)
