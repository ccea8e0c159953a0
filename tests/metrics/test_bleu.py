"""BLEU: parity with pycocoevalcap 1.2, the published fakecap figures, hand-computed values, properties."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metric_fixtures import load_fakecap
from rlcaption.metrics.bleu import compute_bleu, corpus_bleu_statistics
from rlcaption.metrics.tokenization import tokenize_corpus

pycocoevalcap_bleu = pytest.importorskip("pycocoevalcap.bleu.bleu")

WORDS = st.sampled_from("a an the cat dog sits on mat red big two runs".split())
CAPTIONS = st.lists(WORDS, min_size=0, max_size=12).map(" ".join)


@pytest.fixture(scope="module")
def fakecap():
    """Tokenized (predictions, references) of the COCO toolkit's example, keyed by image id."""
    predictions, references = load_fakecap()
    tokenized = tokenize_corpus({key: [caption] for key, caption in predictions.items()})
    return {key: captions[0] for key, captions in tokenized.items()}, tokenize_corpus(references)


def reference_bleu(predictions, references):
    """pycocoevalcap's corpus and per-image BLEU (per image as {key: [b1..b4]})."""
    keys = list(predictions)
    corpus, per_order = pycocoevalcap_bleu.Bleu(4).compute_score(
        {key: references[key] for key in keys}, {key: [predictions[key]] for key in keys}, verbose=0
    )
    return corpus, {key: [per_order[order][index] for order in range(4)] for index, key in enumerate(keys)}


def test_fakecap_reproduces_published_scores_and_statistics(fakecap):
    predictions, references = fakecap
    corpus, _ = compute_bleu(predictions, references)
    # cocoEvalCapDemo.ipynb prints 0.579 / 0.404 / 0.279 / 0.191 and these pooled counts
    assert [round(score, 3) for score in corpus] == [0.579, 0.404, 0.279, 0.191]
    assert corpus_bleu_statistics(predictions, references) == {
        "testlen": 9893,
        "reflen": 9855,
        "guess": [9893, 8893, 7893, 6893],
        "correct": [5732, 2510, 1043, 423],
    }


def test_fakecap_equals_pycocoevalcap_corpus_and_per_image(fakecap):
    predictions, references = fakecap
    corpus, per_image = compute_bleu(predictions, references)
    expected_corpus, expected_per_image = reference_bleu(predictions, references)
    assert corpus == pytest.approx(expected_corpus, abs=1e-12)
    assert per_image.keys() == expected_per_image.keys()
    for key, scores in per_image.items():
        assert scores == pytest.approx(expected_per_image[key], abs=1e-12)


def test_random_corpus_with_length_ties_and_short_candidates_equals_pycocoevalcap():
    rng = random.Random(0)
    vocabulary = "a b c d e f".split()

    def caption(low, high):
        return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(low, high)))

    predictions = {index: caption(0, 9) for index in range(300)}
    references = {index: [caption(1, 12) for _ in range(rng.randint(1, 6))] for index in range(300)}
    corpus, per_image = compute_bleu(predictions, references)
    expected_corpus, expected_per_image = reference_bleu(predictions, references)
    assert corpus == pytest.approx(expected_corpus, abs=1e-12)
    for key in predictions:
        assert per_image[key] == pytest.approx(expected_per_image[key], abs=1e-12)


def test_hand_computed_brevity_penalty_and_precisions():
    # candidate of 4 words against references of 6 and 3 words: closest is 3 (|4-3| < |4-6|), no penalty;
    # matches: unigrams "the cat sat" 3/4, bigrams "the cat","cat sat" 2/3, trigram "the cat sat" 1/2, 4-gram 0/1
    corpus, per_image = compute_bleu({0: "the cat sat down"}, {0: ["the cat sat on the mat", "the cat sat"]})
    assert corpus[0] == pytest.approx(3 / 4)
    assert corpus[1] == pytest.approx(math.sqrt(3 / 4 * 2 / 3))
    assert corpus[2] == pytest.approx((3 / 4 * 2 / 3 * 1 / 2) ** (1 / 3))
    assert corpus[3] == pytest.approx(0.0, abs=1e-3)
    assert per_image[0] == pytest.approx(corpus)


def test_closest_reference_length_ties_go_to_the_shorter_reference():
    # candidate length 4, references of lengths 3 and 5 are equally close: the COCO rule takes 3 (no penalty),
    # "shortest-of-equals" matters because a reflen of 5 would give a brevity penalty exp(1 - 5/4)
    statistics = corpus_bleu_statistics({0: "a b c d"}, {0: ["a b c d e", "a b c"]})
    assert statistics["reflen"] == 3
    corpus, _ = compute_bleu({0: "a b c d"}, {0: ["a b c d e", "a b c"]})
    assert corpus[0] == pytest.approx(1.0)


def test_corpus_brevity_penalty_is_pooled_over_images():
    predictions = {0: "a b", 1: "c d e f"}
    references = {0: ["a b c d"], 1: ["c d e f"]}
    corpus, per_image = compute_bleu(predictions, references)
    assert corpus[0] == pytest.approx(math.exp(1 - 8 / 6))
    assert per_image[0][0] == pytest.approx(math.exp(1 - 4 / 2))
    assert per_image[1][0] == pytest.approx(1.0)


@pytest.mark.parametrize("candidate", ["", "zzz", "zzz yyy xxx www vvv"])
def test_candidate_sharing_nothing_with_references_scores_zero(candidate):
    corpus, per_image = compute_bleu({"k": candidate}, {"k": ["a cat on a mat"]})
    assert corpus == pytest.approx([0.0] * 4, abs=1e-5)
    assert per_image["k"] == pytest.approx([0.0] * 4, abs=1e-5)


def test_thousand_word_candidate_is_defined_and_equals_pycocoevalcap():
    predictions = {"long": " ".join(["cat"] * 1000)}
    references = {"long": ["a cat on a mat", "the cat"]}
    corpus, per_image = compute_bleu(predictions, references)
    expected_corpus, expected_per_image = reference_bleu(predictions, references)
    assert corpus == pytest.approx(expected_corpus, abs=1e-12)
    assert per_image["long"] == pytest.approx(expected_per_image["long"], abs=1e-12)
    assert all(0 <= score < 0.01 for score in corpus)


@pytest.mark.parametrize(
    ("predictions", "references", "message"),
    [
        ({1: "a cat"}, {2: ["a cat"]}, "key 1"),
        ({1: "a cat", 2: "a dog"}, {1: ["a cat"]}, "key 2"),
        ({1: "a cat"}, {1: ["a cat"], 3: ["x"]}, "key 3"),
        ({7: "a cat"}, {7: []}, "key 7"),
        ({7: "a cat"}, {7: "a cat"}, "key 7"),
        ({7: ["a cat"]}, {7: ["a cat"]}, "key 7"),
        ({}, {}, "no predictions"),
    ],
)
def test_bad_input_raises_value_error_naming_the_key(predictions, references, message):
    with pytest.raises(ValueError, match=message):
        compute_bleu(predictions, references)


@settings(max_examples=60, deadline=None)
@given(candidate=CAPTIONS, references=st.lists(CAPTIONS, min_size=1, max_size=5), seed=st.integers(0, 100))
def test_property_scores_in_range_and_invariant_to_reference_order(candidate, references, seed):
    corpus, per_image = compute_bleu({0: candidate}, {0: references})
    shuffled = list(references)
    random.Random(seed).shuffle(shuffled)
    corpus_shuffled, _ = compute_bleu({0: candidate}, {0: shuffled})
    assert all(0.0 <= score <= 1.0 + 1e-9 for score in corpus + per_image[0])
    assert corpus == pytest.approx(corpus_shuffled, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(words=st.lists(WORDS, min_size=4, max_size=20))
def test_property_candidate_equal_to_its_single_reference_scores_one(words):
    caption = " ".join(words)
    corpus, per_image = compute_bleu({0: caption}, {0: [caption]})
    assert corpus[3] == pytest.approx(1.0, abs=1e-9)
    assert per_image[0] == pytest.approx([1.0] * 4, abs=1e-9)
