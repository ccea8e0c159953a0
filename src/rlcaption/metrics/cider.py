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
together: words are looked up once in a dict, n-grams get integer ids order by order from (prefix id, word id) pairs,
sparse TF-IDF vectors are sorted id arrays, and clipped dot products come from one `searchsorted` and a few
`bincount`s. The Python work is per word, not per n-gram.
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
from itertools import chain
from pathlib import Path
from typing import TypeVar

import numpy as np

__all__ = ["DocumentFrequencies", "CiderD", "compute_cider_d"]

K = TypeVar("K", bound=Hashable)

_FILE_FORMAT = "rlcaption.cider.document_frequencies"
_FILE_VERSION = 1
# Two ints are packed into one int64 key `high * stride + low` for sorting and searching: (batch row, n-gram id), so
# that one sorted array holds the reference vectors of a whole batch, and (prefix id, last word id), to identify an
# n-gram. Ids below 2**32 and high parts below 2**31 fit.
_KEY_STRIDE = 2**32


def _grouped_sum(groups: np.ndarray, values: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum of `values` per group id in `range(num_groups)`: `(num_groups,)` float64 (also when there are none)."""
    return np.bincount(groups, weights=values, minlength=num_groups).astype(np.float64, copy=False)


def _chunks(items: Iterable, size: int) -> Iterable[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _count_images_per_ngram(image_of_entry: np.ndarray, ngram_ids: np.ndarray) -> np.ndarray:
    """Number of distinct images per n-gram id, from (image, id) entries that may repeat: `(max id + 1,)`."""
    # a sort-based unique: NumPy's hash-based `np.unique` is far slower on these keys
    keys = np.sort(image_of_entry * _KEY_STRIDE + ngram_ids)
    distinct = np.concatenate([keys[:1] >= 0, keys[1:] != keys[:-1]])
    return np.bincount(keys[distinct] % _KEY_STRIDE)


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
        vocabulary = _NgramVocabulary(max_n)
        document_frequency = np.zeros(0, dtype=np.int64)
        num_documents = 0
        for chunk in _chunks(references, images_per_chunk):
            word_lists, image_of_reference = [], []
            for image, image_references in enumerate(chunk):
                for reference in _as_reference_list(image_references):
                    word_lists.append(reference.split())
                    image_of_reference.append(image)
            rows, _, ids, *_ = vocabulary.count_batch(word_lists, assign=True)
            chunk_frequency = _count_images_per_ngram(np.asarray(image_of_reference, np.int64)[rows], ids)
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
    """TF-IDF vectors of the references of one image, in the layout the batched scorer consumes.

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


class _NgramVocabulary:
    """Integer ids of n-grams, assigned and looked up for a whole batch of token lists at once.

    An n-gram of order n > 1 is identified by the pair (id of its first n - 1 words, id of its last word); every
    prefix of a known n-gram is known (it occurs in the same caption), so a batch needs one dict lookup per word and
    one `searchsorted` per order over sorted pair keys. Pairs added after the last sort (n-grams of newly cached
    references) wait in a dict until there are enough of them to merge.
    """

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.size = 0
        self.word_ids: dict[str, int] = {}  # word -> id of its unigram
        orders = range(2, max_n + 1)
        self.sorted_pair_keys = {order: np.zeros(0, dtype=np.int64) for order in orders}
        self.sorted_pair_ids = {order: np.zeros(0, dtype=np.int64) for order in orders}
        self.pending_pair_ids: dict[int, dict[int, int]] = {order: {} for order in orders}

    @classmethod
    def from_document_frequencies(cls, document_frequencies: DocumentFrequencies) -> _NgramVocabulary:
        """A vocabulary whose ids are the positions of the n-grams in `document_frequencies.index`."""
        vocabulary = cls(document_frequencies.max_n)
        index = document_frequencies.index
        vocabulary.word_ids = {ngram[0]: ngram_id for ngram, ngram_id in index.items() if len(ngram) == 1}
        for order in vocabulary.sorted_pair_keys:
            ngrams = [(ngram, ngram_id) for ngram, ngram_id in index.items() if len(ngram) == order]
            try:
                keys = [index[ngram[:-1]] * _KEY_STRIDE + vocabulary.word_ids[ngram[-1]] for ngram, _ in ngrams]
            except KeyError as error:
                raise ValueError(
                    f"The document frequencies lack {error.args[0]!r}, a part of one of their n-grams; counts of real "
                    "captions contain every prefix and word of an n-gram. Rebuild them with "
                    "`DocumentFrequencies.from_references`."
                ) from None
            vocabulary._merge(order, np.asarray(keys, np.int64), np.asarray([i for _, i in ngrams], np.int64))
        vocabulary.size = len(index)
        return vocabulary

    def _merge(self, order: int, keys: np.ndarray, ids: np.ndarray) -> None:
        keys = np.concatenate([self.sorted_pair_keys[order], keys])
        ids = np.concatenate([self.sorted_pair_ids[order], ids])
        by_key = np.argsort(keys, kind="stable")
        self.sorted_pair_keys[order], self.sorted_pair_ids[order] = keys[by_key], ids[by_key]

    def ngrams(self) -> list[tuple[str, ...]]:
        """The n-gram of every id, as a tuple of words: `(size,)`."""
        ngrams: list[tuple[str, ...] | None] = [None] * self.size
        for word, word_id in self.word_ids.items():
            ngrams[word_id] = (word,)
        for order in self.sorted_pair_keys:
            pairs = chain(
                zip(self.sorted_pair_keys[order].tolist(), self.sorted_pair_ids[order].tolist(), strict=True),
                self.pending_pair_ids[order].items(),
            )
            for key, ngram_id in pairs:
                ngrams[ngram_id] = ngrams[key // _KEY_STRIDE] + ngrams[key % _KEY_STRIDE]
        return ngrams

    def _pair_ids(self, order: int, keys: np.ndarray, assign: bool) -> np.ndarray:
        """Ids of the n-grams with the given (prefix id, last word id) keys; new ids when `assign`, else -1."""
        table = self.sorted_pair_keys[order]
        ids = np.full(len(keys), -1, dtype=np.int64)
        if len(table) and len(keys):
            positions = np.minimum(np.searchsorted(table, keys), len(table) - 1)
            found = table[positions] == keys
            ids[found] = self.sorted_pair_ids[order][positions[found]]
        pending = self.pending_pair_ids[order]
        missing = np.flatnonzero(ids < 0)
        if pending and len(missing):
            ids[missing] = [pending.get(key, -1) for key in keys[missing].tolist()]
            missing = missing[ids[missing] < 0]
        if assign and len(missing):
            new_keys, inverse = np.unique(keys[missing], return_inverse=True)
            new_ids = np.arange(self.size, self.size + len(new_keys), dtype=np.int64)
            self.size += len(new_keys)
            ids[missing] = new_ids[inverse]
            pending.update(zip(new_keys.tolist(), new_ids.tolist(), strict=True))
            if len(pending) > max(4096, len(table) // 8):  # sorting is cheaper than Python lookups from here on
                self._merge(order, np.fromiter(pending, np.int64), np.fromiter(pending.values(), np.int64))
                pending.clear()
        return ids

    def count_batch(self, word_lists: Sequence[Sequence[str]], assign: bool = False) -> tuple[np.ndarray, ...]:
        """Term frequencies of the n-grams of a batch of token lists, without Python work per n-gram.

        Args:
            word_lists (`Sequence[Sequence[str]]` of length `batch_size`): the tokens of each caption.
            assign (`bool`): give unseen n-grams new ids (references) instead of reporting them as unknown.

        Returns:
            `(rows, orders, ids, counts)` of the known n-grams (one entry per distinct n-gram and row; orders count
            from 0) and `(unknown_rows, unknown_orders, unknown_counts)` of the unseen ones (none with `assign`),
            which can match no reference and only enter the caption's norm.
        """
        max_n = self.max_n
        lengths = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
        words = list(chain.from_iterable(word_lists))
        word_get = self.word_ids.get
        tokens = [word_get(word) for word in words]
        if None in tokens:
            if assign:
                for word in words:
                    if word not in self.word_ids:
                        self.word_ids[word] = self.size
                        self.size += 1
                tokens = [self.word_ids[word] for word in words]
            else:
                # unseen words get distinct negative ids (-2, -3, ...) so that repeated unknown n-grams count up
                unseen: dict[str, int] = {}
                tokens = [
                    -2 - unseen.setdefault(word, len(unseen)) if token is None else token
                    for token, word in zip(tokens, words, strict=True)
                ]
        tokens = np.asarray(tokens, dtype=np.int64)  # (num_words,)
        num_words = len(tokens)
        positions = np.arange(num_words)
        row_of_word = np.repeat(np.arange(len(word_lists)), lengths)
        row_end = np.repeat(np.cumsum(lengths), lengths)

        # id of the n-gram starting at each word, order by order from its prefix's id; -1 when unknown
        starts_per_order, ids_per_order = [positions], [np.where(tokens >= 0, tokens, -1)]
        previous_ids = ids_per_order[0]
        for order in range(2, max_n + 1):
            starts = positions[positions + order - 1 < row_end]
            prefix_ids, last_tokens = previous_ids[starts], tokens[starts + order - 1]
            ids = np.full(len(starts), -1, dtype=np.int64)
            known_parts = (prefix_ids >= 0) & (last_tokens >= 0)
            ids[known_parts] = self._pair_ids(
                order, prefix_ids[known_parts] * _KEY_STRIDE + last_tokens[known_parts], assign
            )
            starts_per_order.append(starts)
            ids_per_order.append(ids)
            previous_ids = np.full(num_words, -1, dtype=np.int64)
            previous_ids[starts] = ids
        starts = np.concatenate(starts_per_order)
        ids = np.concatenate(ids_per_order)
        orders = np.repeat(np.arange(max_n), [len(order_starts) for order_starts in starts_per_order])
        rows = row_of_word[starts]

        # known n-grams: count repeats of (row, id)
        known = ids >= 0
        unique_keys, first, counts = np.unique(
            rows[known] * _KEY_STRIDE + ids[known], return_index=True, return_counts=True
        )
        known_rows, known_ids, known_orders = (
            unique_keys // _KEY_STRIDE,
            unique_keys % _KEY_STRIDE,
            orders[known][first],
        )

        # unknown n-grams: count repeats of (row, n-gram); the n-grams get batch-local codes order by order, from
        # (code of the prefix, code of the last word), so that equal n-grams get equal codes
        unknown = np.flatnonzero(~known)
        _, codes = np.unique(tokens, return_inverse=True)
        codes_per_order, previous_codes = [codes], codes
        for order_starts in starts_per_order[1:]:
            order = len(codes_per_order) + 1
            pair_keys = previous_codes[order_starts] * (num_words + 1) + codes[order_starts + order - 1]
            previous_codes = np.zeros(num_words, dtype=np.int64)
            previous_codes[order_starts] = np.unique(pair_keys, return_inverse=True)[1]
            codes_per_order.append(previous_codes[order_starts])
        ngram_codes = np.concatenate(codes_per_order)[unknown]
        row_order_keys = (rows[unknown] * max_n + orders[unknown]) * (num_words + 1) + ngram_codes
        unique_keys, unknown_counts = np.unique(row_order_keys, return_counts=True)
        unknown_row_orders = unique_keys // (num_words + 1)
        unknown_rows, unknown_orders = unknown_row_orders // max_n, unknown_row_orders % max_n
        return known_rows, known_orders, known_ids, counts, unknown_rows, unknown_orders, unknown_counts


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
        self._vocabulary = _NgramVocabulary.from_document_frequencies(document_frequencies)
        # n-grams of cached references that the corpus lacks get ids after the corpus's; their df is 0, so their IDF
        # is log(num_documents), like any unseen n-gram
        self._corpus_idf = document_frequencies.idf()
        self._log_num_documents = document_frequencies.log_num_documents
        self._cache: OrderedDict[Hashable, _ReferenceVectors] = OrderedDict()

    @classmethod
    def _for_evaluated_references(
        cls, keys: Sequence[Hashable], reference_lists: Sequence[Sequence[str]], sigma: float
    ) -> tuple[CiderD, list[_ReferenceVectors]]:
        """A scorer whose document frequencies come from the evaluated references (the official COCO evaluation),
        counted from the same n-gram ids as the reference vectors, and those vectors.

        The counts exist only as IDF weights by id: the scorer's `document_frequencies` attribute stays empty.
        """
        scorer = cls(DocumentFrequencies({}, num_documents=len(reference_lists)), sigma=sigma)
        counted = scorer._count_references(keys, reference_lists)
        rows, _, ids, _, image_of_reference = counted[:5]
        document_frequency = np.zeros(scorer._vocabulary.size, dtype=np.int64)
        images_per_ngram = _count_images_per_ngram(image_of_reference[rows], ids)
        document_frequency[: len(images_per_ngram)] = images_per_ngram
        scorer._corpus_idf = scorer._log_num_documents - np.log(np.maximum(document_frequency, 1).astype(np.float64))
        return scorer, scorer._reference_vectors(reference_lists, *counted)

    def clear_cache(self) -> None:
        """Forgets every cached reference vector."""
        self._cache.clear()

    @property
    def num_cached_images(self) -> int:
        return len(self._cache)

    def _words(self, text: str, normalize: bool = True) -> list[str]:
        if not isinstance(text, str):
            raise ValueError(f"Expected a caption string, got {type(text).__name__} {text!r}.")
        return (self.text_normalizer(text) if normalize and self.text_normalizer is not None else text).split()

    def _idf_of(self, ngram_ids: np.ndarray) -> np.ndarray:
        """IDF of each id; ids outside the corpus (extra reference n-grams) have df 0."""
        in_corpus = ngram_ids < len(self._corpus_idf)
        idf = np.full(ngram_ids.shape, self._log_num_documents)
        idf[in_corpus] = self._corpus_idf[ngram_ids[in_corpus]]
        return idf

    def _count_references(
        self, keys: Sequence[Hashable], reference_lists: Sequence[Sequence[str]]
    ) -> tuple[np.ndarray, ...]:
        """N-gram counts of every reference of several images: `(rows, orders, ids, counts)` with `rows` indexing
        the references in order, then `image_of_reference`, `first_reference` (per image, plus the total) and the
        references' lengths as the COCO code measures them (their number of bigrams)."""
        word_lists = []
        first_reference = [0]
        for key, references in zip(keys, reference_lists, strict=True):
            _check_reference_list(key, references)
            word_lists.extend(self._words(reference) for reference in references)
            first_reference.append(len(word_lists))
        rows, orders, ids, counts, *_ = self._vocabulary.count_batch(word_lists, assign=True)
        first_reference = np.asarray(first_reference)
        image_of_reference = np.repeat(np.arange(len(keys), dtype=np.int64), np.diff(first_reference))
        lengths = np.array([max(len(words) - 1, 0) for words in word_lists], dtype=np.float64)
        return rows, orders, ids, counts, image_of_reference, first_reference, lengths

    def _reference_vectors(
        self,
        reference_lists: Sequence[Sequence[str]],
        rows: np.ndarray,
        orders: np.ndarray,
        ids: np.ndarray,
        counts: np.ndarray,
        image_of_reference: np.ndarray,
        first_reference: np.ndarray,
        lengths: np.ndarray,
    ) -> list[_ReferenceVectors]:
        """Per-image TF-IDF vectors from the counts of `_count_references`."""
        max_n = self.max_n
        weights = counts * self._idf_of(ids)
        norms = np.sqrt(_grouped_sum(rows * max_n + orders, weights**2, len(lengths) * max_n)).reshape(-1, max_n)
        # union of n-grams per image: unique (image, id) keys, sorted by image then id
        reference_counts = np.diff(first_reference)
        image_of_entry = image_of_reference[rows]
        union_keys, inverse = np.unique(image_of_entry * _KEY_STRIDE + ids, return_inverse=True)
        union_bounds = np.searchsorted(union_keys // _KEY_STRIDE, np.arange(len(reference_lists) + 1))
        weight_matrix = np.zeros((len(union_keys), int(reference_counts.max())))
        weight_matrix[inverse, rows - first_reference[image_of_entry]] = weights
        return [
            _ReferenceVectors(
                raw_references=tuple(references),
                ngram_ids=union_keys[union_bounds[image] : union_bounds[image + 1]] - image * _KEY_STRIDE,
                weights=weight_matrix[union_bounds[image] : union_bounds[image + 1], : reference_counts[image]].copy(),
                norms=norms[first_reference[image] : first_reference[image + 1]],
                lengths=lengths[first_reference[image] : first_reference[image + 1]],
            )
            for image, references in enumerate(reference_lists)
        ]

    def _cached_vectors(
        self, keys: Sequence[Hashable], reference_lists: Sequence[Sequence[str]]
    ) -> list[_ReferenceVectors]:
        """The vectors of each row's references: from the cache, or built (all misses together) and cached.

        A key seen before with different references is rebuilt and re-cached, so a reused key never gives a stale
        score.
        """
        row_vectors: list[_ReferenceVectors | None] = []
        missing: dict[Hashable, Sequence[str]] = {}
        for key, references in zip(keys, reference_lists, strict=True):
            if key in missing:
                if tuple(missing[key]) != tuple(references):
                    raise ValueError(
                        f"Image key {key!r} appears twice in one batch with different references; give every image "
                        "a unique key (e.g. its image_id)."
                    )
                row_vectors.append(None)
                continue
            cached = self._cache.get(key)
            if cached is not None and cached.raw_references == tuple(references):
                self._cache.move_to_end(key)
                row_vectors.append(cached)
            else:
                missing[key] = references
                row_vectors.append(None)
        if missing:
            built = dict(
                zip(
                    missing,
                    self._reference_vectors(
                        list(missing.values()), *self._count_references(list(missing), list(missing.values()))
                    ),
                    strict=True,
                )
            )
            for key, vectors in built.items():
                self._cache[key] = vectors
                self._cache.move_to_end(key)
            row_vectors = [
                built[key] if vectors is None else vectors for key, vectors in zip(keys, row_vectors, strict=True)
            ]
            if self.max_cached_images is not None:
                while len(self._cache) > self.max_cached_images:
                    self._cache.popitem(last=False)
        return row_vectors

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

        # 1. reference vectors of every row, from the cache
        if keys is None:
            keys = [tuple(image_references) for image_references in references]
        row_vectors = self._cached_vectors(keys, references)
        return self._score_rows(candidates, row_vectors, normalize=normalize_candidates)

    def _score_rows(
        self, candidates: Sequence[str], row_vectors: Sequence[_ReferenceVectors], normalize: bool = True
    ) -> np.ndarray:
        """Scores of each candidate against the reference vectors of its row: `(batch_size,)`."""
        batch_size = len(candidates)
        max_n = self.max_n

        # 2. candidate n-grams: term frequencies of the known ones (row, order, id) and of the unknown ones, whose
        # IDF is log(num_documents) and which only enter the candidate's norm
        word_lists = [self._words(candidate, normalize) for candidate in candidates]
        candidate_lengths = np.array([max(len(words) - 1, 0) for words in word_lists], dtype=np.float64)
        counted = self._vocabulary.count_batch(word_lists)
        rows, orders, ids, counts, unknown_rows, unknown_orders, unknown_counts = counted
        candidate_weights = counts * self._idf_of(ids)
        unknown_weights = unknown_counts * self._log_num_documents
        row_orders = rows * max_n + orders
        squared_norms = _grouped_sum(row_orders, candidate_weights**2, batch_size * max_n)
        squared_norms += _grouped_sum(unknown_rows * max_n + unknown_orders, unknown_weights**2, batch_size * max_n)
        candidate_norms = np.sqrt(squared_norms).reshape(batch_size, max_n)

        # 3. batch reference layout: union n-grams of all rows in one sorted key array, weights padded to the
        # largest reference count (padded references have zero weights and norms, so they add nothing)
        union_sizes = np.array([len(vectors.ngram_ids) for vectors in row_vectors])
        reference_counts = np.array([vectors.weights.shape[1] for vectors in row_vectors])
        max_references = int(reference_counts.max())
        reference_keys = np.concatenate([vectors.ngram_ids for vectors in row_vectors])
        reference_keys += np.repeat(np.arange(batch_size, dtype=np.int64) * _KEY_STRIDE, union_sizes)
        if (reference_counts == max_references).all():
            reference_weights = np.concatenate([vectors.weights for vectors in row_vectors])
        else:
            reference_weights = np.zeros((len(reference_keys), max_references))
            offsets = np.concatenate([[0], np.cumsum(union_sizes)])
            for row, vectors in enumerate(row_vectors):
                reference_weights[offsets[row] : offsets[row + 1], : reference_counts[row]] = vectors.weights
        if (reference_counts == max_references).all():
            reference_norms = np.stack([vectors.norms for vectors in row_vectors])
            reference_lengths = np.stack([vectors.lengths for vectors in row_vectors])
        else:
            reference_norms = np.zeros((batch_size, max_references, max_n))
            reference_lengths = np.zeros((batch_size, max_references))
            for row, vectors in enumerate(row_vectors):
                reference_norms[row, : reference_counts[row]] = vectors.norms
                reference_lengths[row, : reference_counts[row]] = vectors.lengths

        # 4. clipped dot products: for each candidate n-gram found among its row's references,
        # min(w_cand, w_ref) * w_ref, summed per (row, order) for every reference
        candidate_keys = rows * _KEY_STRIDE + ids
        if len(reference_keys) == 0:  # every reference of the batch is empty
            positions = np.zeros(len(candidate_keys), dtype=np.int64)
            matched = np.zeros(len(candidate_keys), dtype=bool)
        else:
            positions = np.minimum(np.searchsorted(reference_keys, candidate_keys), len(reference_keys) - 1)
            matched = (ids >= 0) & (reference_keys[positions] == candidate_keys)
        matched_reference_weights = reference_weights[positions[matched]]  # (num_matched, max_references)
        clipped = np.minimum(candidate_weights[matched, None], matched_reference_weights) * matched_reference_weights
        matched_row_orders = row_orders[matched]
        similarity = np.stack(
            [
                _grouped_sum(matched_row_orders, clipped[:, reference], batch_size * max_n)
                for reference in range(max_references)
            ],
            axis=-1,
        ).reshape(batch_size, max_n, max_references)

        # 5. cosine: divide only where both norms are non-zero (the COCO code leaves the raw sum otherwise)
        denominators = candidate_norms[:, :, None] * reference_norms.transpose(0, 2, 1)  # (batch, max_n, max_refs)
        np.divide(similarity, denominators, out=similarity, where=denominators != 0)

        # 6. Gaussian length penalty, mean over orders, mean over references, x10
        delta = candidate_lengths[:, None] - reference_lengths  # (batch, max_references)
        penalty = np.e ** (-(delta**2) / (2 * self.sigma**2))
        per_order = (similarity * penalty[:, None, :]).sum(axis=2)  # (batch, max_n)
        return per_order.mean(axis=1) / reference_counts * 10.0


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
    if document_frequencies is None:
        scorer, row_vectors = CiderD._for_evaluated_references(keys, reference_lists, sigma)
    else:
        scorer = CiderD(document_frequencies, sigma=sigma)
        row_vectors = scorer._reference_vectors(reference_lists, *scorer._count_references(keys, reference_lists))
    scores = scorer._score_rows([predictions[key] for key in keys], row_vectors)
    return float(np.mean(scores)), {key: float(score) for key, score in zip(keys, scores, strict=True)}
