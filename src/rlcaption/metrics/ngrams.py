"""Integer ids and counts of the n-grams of a batch of token lists, with NumPy operations over the whole batch.

CIDEr-D's scorer and its document-frequency counts use these: words get ids from one dict lookup each, an n-gram of
order n > 1 gets its id from the pair (id of its first n - 1 words, id of its last word) through sorted arrays, and
term frequencies come from sorting one array of packed keys. The Python work is per word, not per n-gram.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat

import numpy as np

__all__ = ["KEY_BITS", "KEY_STRIDE", "NgramVocabulary", "distinct_sorted", "documents_per_ngram", "grouped_sum"]

# Two ints are packed into one int64 key `high * KEY_STRIDE + low` for sorting and searching: (image, n-gram id),
# (caption row and order, n-gram id), (prefix id, last word id). Ids below 2**32 and high parts below 2**31 fit.
KEY_BITS = 32
KEY_STRIDE = 1 << KEY_BITS


def grouped_sum(groups: np.ndarray, values: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum of `values` per group id in `range(num_groups)`: `(num_groups,)` float64 (also when there are none)."""
    return np.bincount(groups, weights=values, minlength=num_groups).astype(np.float64, copy=False)


def documents_per_ngram(document_of_entry: np.ndarray, ngram_ids: np.ndarray) -> np.ndarray:
    """Number of documents containing each n-gram id, from (document, id) entries that may repeat: `(max id + 1,)`."""
    # a sort-based unique: NumPy's hash-based `np.unique` is far slower on these keys
    keys = np.sort(document_of_entry * KEY_STRIDE + ngram_ids)
    distinct = np.concatenate([keys[:1] >= 0, keys[1:] != keys[:-1]])
    return np.bincount(keys[distinct] % KEY_STRIDE)


def distinct_sorted(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(keys, return_inverse=True)` of 1-d int64 keys: the sorted distinct keys and each key's position
    among them, in fewer passes than NumPy's general version."""
    # a stable argsort (timsort) beats the default quicksort on these keys, which come in partly sorted runs (the
    # n-grams of one caption, the captions of one image)
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    first = np.empty(len(keys), dtype=bool)
    first[:1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[by_key] = np.cumsum(first) - 1
    return sorted_keys[first], inverse


def _lookup(table_keys: np.ndarray, table_ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The ids of `keys` in the table sorted by key; -1 for keys it lacks."""
    if len(table_keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    positions = np.searchsorted(table_keys, keys)
    positions[positions == len(table_keys)] = 0
    return np.where(table_keys[positions] == keys, table_ids[positions], -1)


class NgramVocabulary:
    """Integer ids of n-grams, assigned and looked up for a whole batch of token lists at once.

    An n-gram of order n > 1 is identified by the pair (id of its first n - 1 words, id of its last word); every
    prefix of a known n-gram is known (it occurs in the same caption), so a batch needs one dict lookup per word and
    one `searchsorted` per order over sorted pair keys. Pairs added after the last merge (n-grams of newly counted
    references) wait in small sorted arrays of their own, so that adding a few does not re-sort the large tables,
    until there are enough of them to merge.

    Args:
        max_n (`int`, defaults to 4): the highest n-gram order.
    """

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.size = 0
        self.word_ids: dict[str, int] = {}  # word -> id of its unigram
        orders = range(2, max_n + 1)
        self.sorted_pair_keys = {order: np.zeros(0, dtype=np.int64) for order in orders}
        self.sorted_pair_ids = {order: np.zeros(0, dtype=np.int64) for order in orders}
        self.recent_pair_keys = {order: np.zeros(0, dtype=np.int64) for order in orders}
        self.recent_pair_ids = {order: np.zeros(0, dtype=np.int64) for order in orders}

    @classmethod
    def from_ngrams(cls, index: dict[tuple[str, ...], int], max_n: int) -> NgramVocabulary:
        """A vocabulary whose ids are the values of `index` (n-gram -> id, ids `0..len(index) - 1`).

        Raises:
            `KeyError`: naming a prefix or word of one of the n-grams that `index` lacks.
        """
        vocabulary = cls(max_n)
        vocabulary.word_ids = {ngram[0]: ngram_id for ngram, ngram_id in index.items() if len(ngram) == 1}
        for order in vocabulary.sorted_pair_keys:
            ngrams = [(ngram, ngram_id) for ngram, ngram_id in index.items() if len(ngram) == order]
            if not ngrams:
                continue
            keys = [index[ngram[:-1]] * KEY_STRIDE + vocabulary.word_ids[ngram[-1]] for ngram, _ in ngrams]
            table = (np.asarray(keys, np.int64), np.asarray([ngram_id for _, ngram_id in ngrams], np.int64))
            vocabulary.sorted_pair_keys[order], vocabulary.sorted_pair_ids[order] = _sorted_union(table)
        vocabulary.size = len(index)
        return vocabulary

    def ngrams(self) -> list[tuple[str, ...]]:
        """The n-gram of every id, as a tuple of words: `(size,)`."""
        ngrams: list[tuple[str, ...] | None] = [None] * self.size
        for word, word_id in self.word_ids.items():
            ngrams[word_id] = (word,)
        for order in self.sorted_pair_keys:
            keys = chain(self.sorted_pair_keys[order].tolist(), self.recent_pair_keys[order].tolist())
            ids = chain(self.sorted_pair_ids[order].tolist(), self.recent_pair_ids[order].tolist())
            for key, ngram_id in zip(keys, ids, strict=True):
                ngrams[ngram_id] = ngrams[key // KEY_STRIDE] + ngrams[key % KEY_STRIDE]
        return ngrams

    def _add_pairs(self, order: int, keys: np.ndarray, ids: np.ndarray) -> None:
        """Adds n-grams by their (prefix id, last word id) keys, sorted and new to the vocabulary."""
        recent = (keys, ids)
        if len(self.recent_pair_keys[order]):
            recent = _sorted_union((self.recent_pair_keys[order], self.recent_pair_ids[order]), recent)
        if len(recent[0]) > max(4096, len(self.sorted_pair_keys[order]) // 8):  # sorting is cheap enough from here on
            table = (self.sorted_pair_keys[order], self.sorted_pair_ids[order])
            self.sorted_pair_keys[order], self.sorted_pair_ids[order] = _sorted_union(table, recent)
            recent = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.recent_pair_keys[order], self.recent_pair_ids[order] = recent

    def _pair_ids(self, order: int, keys: np.ndarray) -> np.ndarray:
        """Ids of the n-grams with the given (prefix id, last word id) keys; -1 for those the vocabulary lacks."""
        ids = _lookup(self.sorted_pair_keys[order], self.sorted_pair_ids[order], keys)
        if len(self.recent_pair_keys[order]):
            missing = np.flatnonzero(ids < 0)
            ids[missing] = _lookup(self.recent_pair_keys[order], self.recent_pair_ids[order], keys[missing])
        return ids

    def _word_ids(self, words: list[str], next_id: int, assign: bool) -> tuple[np.ndarray, int]:
        """Ids of `words`, numbering the words the vocabulary lacks from `next_id` on (and keeping them when
        `assign`); also the next free id."""
        # the vocabulary is asked once per distinct word; a dict local to the batch maps every word
        distinct = dict.fromkeys(words)
        ids = list(map(self.word_ids.get, distinct, repeat(-1)))
        new_words = [word for word, word_id in zip(distinct, ids, strict=True) if word_id < 0]
        if new_words:
            new_ids = dict(zip(new_words, range(next_id, next_id + len(new_words)), strict=True))
            ids = [new_ids[word] if word_id < 0 else word_id for word, word_id in zip(distinct, ids, strict=True)]
            next_id += len(new_words)
            if assign:
                self.word_ids.update(new_ids)
        local_ids = dict(zip(distinct, ids, strict=True))
        return np.array(list(map(local_ids.__getitem__, words)), dtype=np.int64), next_id

    def count_batch(self, word_lists: Sequence[Sequence[str]], assign: bool = False) -> tuple[np.ndarray, ...]:
        """Term frequencies of the n-grams of a batch of token lists, without Python work per n-gram.

        Args:
            word_lists (`Sequence[Sequence[str]]` of length `batch_size`): the tokens of each caption.
            assign (`bool`): keep the ids given to n-grams the vocabulary lacks (references), instead of numbering
                them for this batch only (candidates).

        Returns:
            `(rows, orders, ids, counts)`: one entry per distinct n-gram of each row, sorted by row, order (counted
            from 0) and id. Without `assign`, an id >= `size` is an n-gram the vocabulary lacks, numbered for this
            batch only (equal n-grams get equal ids); it can match no reference.
        """
        max_n = self.max_n
        lengths = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
        tokens, next_id = self._word_ids(list(chain.from_iterable(word_lists)), self.size, assign)
        row_of_word = np.repeat(np.arange(len(word_lists), dtype=np.int64), lengths)
        words_to_row_end = np.repeat(np.cumsum(lengths), lengths) - np.arange(len(tokens))

        # id of the n-gram starting at each word, order by order from its prefix's id; the starts of order n are
        # those of order n - 1 with at least n words to the end of their caption
        starts, ids = np.arange(len(tokens)), tokens
        row_keys = row_of_word * (max_n * KEY_STRIDE)  # (row, order 0) part of the counting keys below
        entry_keys = [row_keys + tokens]
        for order in range(2, max_n + 1):
            longer = words_to_row_end[starts] >= order
            starts = starts[longer]
            pair_keys = ids[longer] * KEY_STRIDE + tokens[starts + order - 1]
            if len(self.sorted_pair_keys[order]) or len(self.recent_pair_keys[order]):
                ids = self._pair_ids(order, pair_keys)
                missing = np.flatnonzero(ids < 0)
                new_keys, codes = distinct_sorted(pair_keys[missing])
                ids[missing] = next_id + codes
            else:  # the vocabulary has no n-gram of this order: all are new
                new_keys, ids = distinct_sorted(pair_keys)
                ids += next_id
            if assign and len(new_keys):
                self._add_pairs(order, new_keys, np.arange(next_id, next_id + len(new_keys), dtype=np.int64))
            next_id += len(new_keys)
            entry_keys.append(row_keys[starts] + ((order - 1) * KEY_STRIDE + ids))
        if assign:
            self.size = next_id

        # count repeats of (row, order, id): the keys of each order come in runs ordered by row, which a stable sort
        # (timsort) merges instead of sorting from scratch as `np.unique`'s quicksort does
        keys = np.sort(np.concatenate(entry_keys), kind="stable")
        first = np.flatnonzero(np.diff(keys, prepend=-1))
        counts = np.diff(first, append=len(keys))
        keys = keys[first]
        row_orders, ids = keys >> KEY_BITS, keys & (KEY_STRIDE - 1)
        rows, orders = np.divmod(row_orders, max_n)
        return rows, orders, ids, counts


def _sorted_union(*tables: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The (keys, ids) tables, whose keys are disjoint, as one table sorted by key."""
    keys = np.concatenate([table[0] for table in tables])
    ids = np.concatenate([table[1] for table in tables])
    by_key = np.argsort(keys)
    return keys[by_key], ids[by_key]
