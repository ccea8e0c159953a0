"""ROUGE-L: parity with pycocoevalcap 1.2, the published fakecap figure, the bit-parallel LCS, properties."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metric_fixtures import load_fakecap
from rlcaption.metrics.rouge import compute_rouge_l, longest_common_subsequence, rouge_l_score
from rlcaption.metrics.tokenization import tokenize_corpus

pycocoevalcap_rouge = pytest.importorskip("pycocoevalcap.rouge.rouge")

WORDS = st.sampled_from("a an the cat dog sits on mat red big two runs".split())
CAPTIONS = st.lists(WORDS, min_size=1, max_size=12).map(" ".join)


@pytest.fixture(scope="module")
def fakecap():
    """Tokenized (predictions, references) of the COCO toolkit's example, keyed by image id."""
    predictions, references = load_fakecap()
    tokenized = tokenize_corpus({key: [caption] for key, caption in predictions.items()})
    return {key: captions[0] for key, captions in tokenized.items()}, tokenize_corpus(references)


def reference_rouge(predictions, references):
    keys = list(predictions)
    corpus, per_image = pycocoevalcap_rouge.Rouge().compute_score(
        {key: references[key] for key in keys}, {key: [predictions[key]] for key in keys}
    )
    return corpus, dict(zip(keys, per_image.tolist(), strict=True))


def test_fakecap_reproduces_published_score_and_pycocoevalcap(fakecap):
    predictions, references = fakecap
    corpus, per_image = compute_rouge_l(predictions, references)
    assert round(corpus, 3) == 0.396  # cocoEvalCapDemo.ipynb: ROUGE_L 0.396
    expected_corpus, expected_per_image = reference_rouge(predictions, references)
    assert corpus == pytest.approx(expected_corpus, abs=1e-12)
    for key, score in per_image.items():
        assert score == pytest.approx(expected_per_image[key], abs=1e-12)


def test_hand_computed_f_measure():
    # LCS("a cat on a mat", "a cat on the mat") = 4: precision 4/5, recall 4/5, F_beta = 0.8 for any beta
    assert rouge_l_score("a cat on a mat", ["a cat on the mat"]) == pytest.approx(0.8)
    # precision and recall maximised over references independently: P = 2/2 (ref 1), R = 2/2 (ref 2)
    assert rouge_l_score("a b", ["a b c d", "a b"]) == pytest.approx(1.0)
    # P = 2/3, R = 2/4 -> (1 + 1.44) P R / (R + 1.44 P)
    precision, recall = 2 / 3, 2 / 4
    expected = 2.44 * precision * recall / (recall + 1.44 * precision)
    assert rouge_l_score("a x b", ["a y z b"]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("candidate", "references"),
    [("", ["a cat"]), ("a cat", [""]), ("", [""]), ("zzz", ["a cat"]), (" ".join(["cat"] * 1000), ["a cat", "the"])],
)
def test_degenerate_captions_match_pycocoevalcap(candidate, references):
    expected_corpus, _ = reference_rouge({0: candidate}, {0: references})
    corpus, per_image = compute_rouge_l({0: candidate}, {0: references})
    assert corpus == pytest.approx(expected_corpus, abs=1e-12)
    assert 0.0 <= per_image[0] <= 1.0


def test_empty_candidate_scores_zero():
    assert compute_rouge_l({"k": ""}, {"k": ["a cat on a mat"]})[0] == 0.0


@pytest.mark.parametrize(
    ("predictions", "references", "message"),
    [({1: "a"}, {2: ["a"]}, "key 1"), ({5: "a"}, {5: []}, "key 5"), ({5: None}, {5: ["a"]}, "key 5")],
)
def test_bad_input_raises_value_error_naming_the_key(predictions, references, message):
    with pytest.raises(ValueError, match=message):
        compute_rouge_l(predictions, references)


@settings(max_examples=200, deadline=None)
@given(first=st.lists(st.sampled_from("abcde"), max_size=40), second=st.lists(st.sampled_from("abcde"), max_size=40))
def test_bit_parallel_lcs_equals_dynamic_programming(first, second):
    assert longest_common_subsequence(first, second) == pycocoevalcap_rouge.my_lcs(first, second)


def test_lcs_of_long_sequences_equals_dynamic_programming():
    rng = random.Random(1)
    first = [rng.choice("abcdefgh") for _ in range(300)]
    second = [rng.choice("abcdefgh") for _ in range(250)]
    assert longest_common_subsequence(first, second) == pycocoevalcap_rouge.my_lcs(first, second)


@settings(max_examples=60, deadline=None)
@given(candidate=CAPTIONS, references=st.lists(CAPTIONS, min_size=1, max_size=5), seed=st.integers(0, 100))
def test_property_in_range_order_invariant_and_equal_to_pycocoevalcap(candidate, references, seed):
    score = rouge_l_score(candidate, references)
    shuffled = list(references)
    random.Random(seed).shuffle(shuffled)
    assert 0.0 <= score <= 1.0
    assert rouge_l_score(candidate, shuffled) == pytest.approx(score, abs=1e-12)
    assert score == pytest.approx(pycocoevalcap_rouge.Rouge().calc_score([candidate], references), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(caption=CAPTIONS)
def test_property_candidate_equal_to_its_reference_scores_one(caption):
    assert rouge_l_score(caption, [caption]) == pytest.approx(1.0)
