"""CIDEr-D: parity with pycocoevalcap 1.2 (both document-frequency modes, rows sharing references), the published
fakecap score, the cache, the n-gram counts."""

import copy
import gzip
import json
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

from metric_fixtures import load_fakecap
from rlcaption.metrics.cider import CiderD, DocumentFrequencies, compute_cider_d, compute_cider_d_rows
from rlcaption.metrics.ngrams import NgramVocabulary
from rlcaption.metrics.tokenization import normalize_caption


class FixedDocumentFrequencyCiderScorer(CiderScorer):
    """pycocoevalcap's scorer with document frequencies from another corpus, as self-critical.pytorch's CiderD.

    `compute_cider` overwrites `ref_len` with log(number of evaluated images); the property ignores that write so
    the reference code runs unmodified with `ref_len = log(number of images in the df corpus)`.
    """

    ref_len = property(lambda self: self._fixed_ref_len, lambda self, value: None)

    def __init__(self, document_frequency: dict, num_documents: int):
        super().__init__(n=4, sigma=6.0)
        self.document_frequency.update(document_frequency)
        self._fixed_ref_len = np.log(float(num_documents))


def reference_document_frequencies(corpus: list[list[str]]) -> dict:
    """Document frequencies counted by pycocoevalcap's own code."""
    scorer = CiderScorer(n=4)
    for references in corpus:
        scorer += (None, references)
    scorer.compute_doc_freq()
    return dict(scorer.document_frequency)


def reference_fixed_df_scores(
    predictions: dict, references: dict, df_corpus: list[list[str]]
) -> tuple[float, np.ndarray]:
    scorer = FixedDocumentFrequencyCiderScorer(reference_document_frequencies(df_corpus), len(df_corpus))
    for key in predictions:
        scorer += (predictions[key], references[key])
    scores = np.array(scorer.compute_cider())
    return float(scores.mean()), scores


@pytest.fixture(scope="module")
def fakecap():
    """The toolkit's example, tokenized with our PTB-equivalent tokenizer: (predictions, references)."""
    predictions, references = load_fakecap()
    return (
        {key: normalize_caption(caption) for key, caption in predictions.items()},
        {key: [normalize_caption(caption) for caption in captions] for key, captions in references.items()},
    )


def test_fakecap_reproduces_published_cider_and_pycocoevalcap(fakecap):
    predictions, references = fakecap
    corpus, per_image = compute_cider_d(predictions, references)
    assert round(corpus, 3) == 0.600  # cocoEvalCapDemo.ipynb
    reference_corpus, reference_scores = Cider().compute_score(
        references, {key: [caption] for key, caption in predictions.items()}
    )
    assert abs(corpus - reference_corpus) <= 1e-6
    reference_per_image = dict(zip(references, reference_scores, strict=True))
    assert max(abs(per_image[key] - reference_per_image[key]) for key in references) <= 1e-6


def test_training_corpus_document_frequencies_match_reference(fakecap):
    predictions, references = fakecap
    keys = list(references)
    # document frequencies from 600 images; 200 of the evaluated images are outside that corpus, so their
    # reference n-grams include some with df = 0
    df_corpus = [references[key] for key in keys[:600]]
    evaluated = keys[400:800]
    document_frequencies = DocumentFrequencies.from_references(df_corpus)
    corpus, per_image = compute_cider_d(
        {key: predictions[key] for key in evaluated}, {key: references[key] for key in evaluated}, document_frequencies
    )
    reference_corpus, reference_scores = reference_fixed_df_scores(
        {key: predictions[key] for key in evaluated}, references, df_corpus
    )
    assert abs(corpus - reference_corpus) <= 1e-6
    assert np.abs(np.array([per_image[key] for key in evaluated]) - reference_scores).max() <= 1e-6
    # the evaluated references' own document frequencies give other scores: the comparison above is not vacuous
    own_corpus, _ = compute_cider_d(
        {key: predictions[key] for key in evaluated}, {key: references[key] for key in evaluated}
    )
    assert abs(corpus - own_corpus) > 1e-3


@pytest.mark.parametrize("images_per_chunk", [20_000, 7])
def test_document_frequencies_equal_reference_counts(fakecap, images_per_chunk):
    _, references = fakecap
    corpus = list(references.values())[:300] + [[""], ["a b a b"]]
    ours = DocumentFrequencies.from_references(corpus, images_per_chunk=images_per_chunk)
    theirs = reference_document_frequencies(corpus)
    assert len(ours) == len(theirs)
    assert all(ours[ngram] == count for ngram, count in theirs.items())
    assert ours.num_documents == 302


def test_hand_computed_score():
    # two images; candidate "a b" of image A: n-grams a, b, "a b" each in 1 of 2 images, idf = log 2 for all;
    # orders 1 and 2 have cosine 1, orders 3 and 4 have no n-grams (0); no length difference:
    # 10 * mean(1, 1, 0, 0) / 1 reference = 5.0
    corpus, per_image = compute_cider_d({"A": "a b", "B": "x"}, {"A": ["a b"], "B": ["c d"]})
    assert per_image["A"] == pytest.approx(5.0, abs=1e-12)
    assert per_image["B"] == 0.0
    assert corpus == pytest.approx(2.5, abs=1e-12)
    # Gaussian penalty on the bigram-count difference: "a b c" has 2 bigrams against 1 in the reference
    document_frequencies = DocumentFrequencies.from_references([["a b"], ["c d"]])
    _, per_image = compute_cider_d({"A": "a b a"}, {"A": ["a b"]}, document_frequencies)
    weight_a, weight_b = 2 * math.log(2), math.log(2)  # "a" occurs twice in the candidate
    unigram_cosine = (min(weight_a, math.log(2)) * math.log(2) + weight_b * weight_b) / (
        math.hypot(weight_a, weight_b) * math.hypot(math.log(2), math.log(2))
    )
    # bigrams of the candidate: "a b" (df 1), "b a" (df 0, idf log 2); of the reference: "a b"
    bigram_cosine = math.log(2) ** 2 / (math.hypot(math.log(2), math.log(2)) * math.log(2))
    expected = 10 * (unigram_cosine + bigram_cosine) / 4 * math.exp(-1 / 72)
    assert per_image["A"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_document_frequencies_save_load_round_trip(tmp_path, suffix, fakecap):
    _, references = fakecap
    document_frequencies = DocumentFrequencies.from_references(list(references.values())[:50])
    path = tmp_path / f"df{suffix}"
    document_frequencies.save(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the temporary file was renamed, not left behind
    loaded = DocumentFrequencies.load(path)
    assert loaded.num_documents == 50 and loaded.max_n == 4
    assert dict(zip(loaded.index, loaded.counts.tolist(), strict=True)) == dict(
        zip(document_frequencies.index, document_frequencies.counts.tolist(), strict=True)
    )
    if suffix.endswith(".gz"):
        json.loads(gzip.decompress(path.read_bytes()))


def test_document_frequencies_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="from_references"):
        DocumentFrequencies.load(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a document-frequency file"):
        DocumentFrequencies.load(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="directory"):
        DocumentFrequencies.from_references([["a b"]]).save(tmp_path / "no" / "such" / "dir.json")
    with pytest.raises(ValueError, match="exceeds num_documents"):
        DocumentFrequencies({("a",): 3}, num_documents=2)
    with pytest.raises(ValueError, match="list of reference captions"):
        DocumentFrequencies.from_references(["a single caption"])


def test_cache_gives_identical_scores_and_detects_changed_references(fakecap):
    predictions, references = fakecap
    keys = list(references)[:100]
    scorer = CiderD(DocumentFrequencies.from_references(list(references.values())))
    candidates = [predictions[key] for key in keys]
    reference_lists = [references[key] for key in keys]
    first = scorer.score(candidates, reference_lists, keys=keys)
    assert scorer.num_cached_images == 100
    again = scorer.score(candidates[::-1], reference_lists[::-1], keys=keys[::-1])
    np.testing.assert_array_equal(first, again[::-1])
    # the same key with other references must not reuse the stale vectors
    changed = scorer.score([candidates[0]], [reference_lists[1]], keys=[keys[0]])
    fresh = CiderD(scorer.document_frequencies).score([candidates[0]], [reference_lists[1]])
    np.testing.assert_allclose(changed, fresh, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="appears twice"):
        scorer.score(candidates[:2], reference_lists[:2], keys=[keys[0], keys[0]])


def test_batches_of_new_images_match_reference(fakecap):
    """Scoring batch after batch adds the references' unseen n-grams to the vocabulary (past the point where they
    are merged into the sorted tables); every batch must still equal the reference code."""
    predictions, references = fakecap
    keys = list(references)
    df_corpus = [references[key] for key in keys[:20]]
    scorer = CiderD(DocumentFrequencies.from_references(df_corpus))
    _, expected = reference_fixed_df_scores(predictions, references, df_corpus)
    ours = np.concatenate(
        [
            scorer.score([predictions[k] for k in batch], [references[k] for k in batch], keys=batch)
            for batch in (keys[start : start + 100] for start in range(0, len(keys), 100))
        ]
    )
    assert np.abs(ours - expected).max() <= 1e-6
    corpus_fourgrams = sum(len(ngram) == 4 for ngram in scorer.document_frequencies.index)
    assert len(scorer._vocabulary.sorted_pair_keys[4]) > corpus_fourgrams  # the merge really happened


def test_document_frequencies_without_prefixes_are_rejected():
    with pytest.raises(ValueError, match="Rebuild them"):
        CiderD(DocumentFrequencies({("a",): 1, ("a", "b"): 1}, num_documents=1))


def test_cache_bound():
    scorer = CiderD(DocumentFrequencies.from_references([["a b"], ["c d"]]), max_cached_images=2)
    scorer.score(["a", "b", "c"], [["a b"], ["c d"], ["e f"]], keys=[1, 2, 3])
    assert scorer.num_cached_images == 2
    scorer.clear_cache()
    assert scorer.num_cached_images == 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="'img7'"):
        compute_cider_d({"img7": "a dog"}, {"img7": []})
    with pytest.raises(ValueError, match="same keys"):
        compute_cider_d({1: "a dog"}, {2: ["a dog"]})
    scorer = CiderD(DocumentFrequencies.from_references([["a b"]]))
    with pytest.raises(ValueError, match="2 candidates but 1 reference"):
        scorer.score(["a", "b"], [["a b"]])
    with pytest.raises(ValueError, match="caption string"):
        scorer.score([None], [["a b"]])


def test_degenerate_captions_have_defined_scores():
    references = {
        1: ["a dog on a couch", "a brown dog lying on a sofa"],
        2: ["a cat", ""],
        3: ["ein hund über dem sofa"],
    }
    predictions = {1: "", 2: " ".join(["cat"] * 1000), 3: "ein hund über dem sofa"}
    _, per_image = compute_cider_d(predictions, references)
    reference = Cider().compute_score(references, {key: [caption] for key, caption in predictions.items()})[1]
    np.testing.assert_allclose([per_image[key] for key in references], reference, rtol=0, atol=1e-9)
    assert per_image[1] == 0.0 and all(math.isfinite(score) for score in per_image.values())


words = st.sampled_from(["a", "dog", "cat", "on", "the", "red", "sofa", "two", "man", "riding"])
captions = st.lists(words, min_size=0, max_size=12).map(" ".join)
corpora = st.lists(st.tuples(captions, st.lists(captions, min_size=1, max_size=5)), min_size=1, max_size=6).map(
    lambda rows: ({k: row[0] for k, row in enumerate(rows)}, {k: row[1] for k, row in enumerate(rows)})
)


@settings(max_examples=60, deadline=None)
@given(corpora)
def test_property_equal_to_pycocoevalcap(corpus):
    predictions, references = corpus
    # the COCO code crashes (max() of an empty sequence) when no reference has any word
    assume(any(reference for refs in references.values() for reference in refs))
    ours, per_image = compute_cider_d(predictions, references)
    theirs, their_scores = Cider().compute_score(references, {k: [c] for k, c in predictions.items()})
    assert ours == pytest.approx(theirs, abs=1e-9)
    np.testing.assert_allclose([per_image[k] for k in references], their_scores, rtol=0, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(corpora, st.randoms(use_true_random=False))
def test_property_non_negative_and_invariant_to_reference_order(corpus, random):
    predictions, references = corpus
    corpus_score, per_image = compute_cider_d(predictions, references)
    assert corpus_score >= 0 and all(score >= 0 for score in per_image.values())
    shuffled = {key: random.sample(refs, len(refs)) for key, refs in references.items()}
    shuffled_score, shuffled_per_image = compute_cider_d(predictions, shuffled)
    assert shuffled_score == pytest.approx(corpus_score, abs=1e-12)
    assert all(shuffled_per_image[key] == pytest.approx(per_image[key], abs=1e-12) for key in per_image)


def coco_scores(candidates: list[str], references: list[list[str]]) -> np.ndarray:
    """pycocoevalcap's `Cider` per row, every row one document."""
    return np.array(
        Cider().compute_score(dict(enumerate(references)), {row: [c] for row, c in enumerate(candidates)})[1]
    )


def test_rows_sharing_references_equal_pycocoevalcap_on_every_row():
    # rows 0 and 1 share a reference list, row 2 has its own: the shared list is counted once for 2 documents
    shared = ["a dog on a sofa", "a brown dog lying on a couch"]
    other = ["a cat on a mat", "a dog and a cat"]
    candidates = ["a dog on a couch", "a brown dog", "a cat on a sofa"]
    per_row = [shared, list(shared), other]
    expected = coco_scores(candidates, per_row)
    together = compute_cider_d_rows(candidates, [shared, other], [0, 0, 1])
    row_by_row = compute_cider_d_rows(candidates, per_row, [0, 1, 2])  # every row its own list, as before
    np.testing.assert_allclose(together, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(row_by_row, expected, rtol=0, atol=1e-12)
    assert np.all(expected > 0)
    # the weight matters: the same rows with the shared list counted as one document score otherwise
    _, once = compute_cider_d({0: candidates[0], 2: candidates[2]}, {0: shared, 2: other})
    assert abs(once[2] - expected[2]) > 1e-3
    _, per_key = compute_cider_d(dict(enumerate(candidates)), dict(enumerate(per_row)))
    np.testing.assert_allclose([per_key[row] for row in range(3)], expected, rtol=0, atol=1e-12)


def test_documents_per_list_counts_rows_that_are_not_scored():
    shared = ["a dog on a sofa", "a brown dog lying on a couch"]
    other = ["a cat on a mat", "a dog and a cat"]
    candidates = ["a dog on a couch", "a cat on a sofa"]
    # pycocoevalcap on 4 rows, two of them with an empty candidate (still documents): 3 rows share `shared`
    expected = coco_scores([candidates[0], "", "", candidates[1]], [shared, shared, shared, other])
    ours = compute_cider_d_rows(candidates, [shared, other], [0, 1], documents_per_list=[3, 1])
    np.testing.assert_allclose(ours, expected[[0, 3]], rtol=0, atol=1e-12)
    assert expected[1] == expected[2] == 0.0
    with pytest.raises(ValueError, match="at least as many documents"):
        compute_cider_d_rows(candidates, [shared, other], [0, 0], documents_per_list=[1, 1])
    with pytest.raises(ValueError, match="must index the 2 reference lists"):
        compute_cider_d_rows(candidates, [shared, other], [0, 2])
    with pytest.raises(ValueError, match="2 candidates but 1 reference-list"):
        compute_cider_d_rows(candidates, [shared, other], [0])
    assert compute_cider_d_rows([], [shared], []).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(captions, min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.tuples(captions, st.integers(0, 2)), min_size=1, max_size=8),
)
def test_property_shared_reference_lists_equal_pycocoevalcap(reference_lists, rows):
    candidates = [caption for caption, _ in rows]
    list_of_row = [index % len(reference_lists) for _, index in rows]
    per_row = [reference_lists[index] for index in list_of_row]
    # the COCO code crashes (max() of an empty sequence) when no reference has any word
    assume(any(reference for refs in per_row for reference in refs))
    ours = compute_cider_d_rows(candidates, reference_lists, list_of_row)
    np.testing.assert_allclose(ours, coco_scores(candidates, per_row), rtol=0, atol=1e-9)


def test_cache_mixing_cached_and_new_images_matches_a_fresh_scorer(fakecap):
    predictions, references = fakecap
    keys = list(references)[:60]
    scorer = CiderD(DocumentFrequencies.from_references(list(references.values())[:300]))
    scorer.score([predictions[key] for key in keys[:30]], [references[key] for key in keys[:30]], keys=keys[:30])
    # half of the images cached, half new, every image with two rows
    rows = keys[15:45] * 2
    mixed = scorer.score([predictions[key] for key in rows], [references[key] for key in rows], keys=rows)
    fresh = CiderD(scorer.document_frequencies).score(
        [predictions[key] for key in rows], [references[key] for key in rows]
    )
    np.testing.assert_allclose(mixed, fresh, rtol=0, atol=1e-12)
    assert scorer.num_cached_images == 45


def ngram_counter(words: list[str], max_n: int = 4) -> Counter:
    return Counter(tuple(words[i : i + n]) for n in range(1, max_n + 1) for i in range(len(words) - n + 1))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(words, max_size=9), min_size=1, max_size=5),
    st.lists(st.lists(words, max_size=9), max_size=4),
    st.lists(st.lists(words, max_size=9), max_size=6),
)
def test_property_ngram_counts_equal_counting_tuples(corpus, added, batch):
    """Counts against a vocabulary with n-grams in its sorted tables (from document frequencies) and in its recent
    arrays (added later), for n-grams it knows and for new ones."""
    document_frequencies = DocumentFrequencies.from_references([[" ".join(words)] for words in corpus])
    vocabulary = NgramVocabulary.from_ngrams(document_frequencies.index, max_n=4)
    vocabulary.count_batch(added, assign=True)
    size = vocabulary.size
    assigning = copy.deepcopy(vocabulary)
    rows, orders, ids, counts = vocabulary.count_batch(batch)
    assert vocabulary.size == size  # without assign, new n-grams get ids for this batch only
    assigned = assigning.count_batch(batch, assign=True)
    for ours, theirs in zip((rows, orders, ids, counts), assigned, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    ngrams = assigning.ngrams()
    found = [Counter() for _ in batch]
    for row, order, ngram_id, count in zip(rows.tolist(), orders.tolist(), ids.tolist(), counts.tolist(), strict=True):
        assert len(ngrams[ngram_id]) == order + 1
        found[row][ngrams[ngram_id]] = count
    assert found == [ngram_counter(words) for words in batch]
    keys = np.stack([rows, orders, ids], axis=1).tolist()
    assert keys == sorted(keys) and len(set(map(tuple, keys))) == len(keys)
