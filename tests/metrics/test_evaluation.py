"""evaluate_captions: COCO keys and published figures, metric selection, per-caption scores, Java errors, bad input."""

import logging
import math
import random
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metric_fixtures import load_fakecap
from rlcaption.metrics import corpus as corpus_metrics
from rlcaption.metrics.bleu import compute_bleu
from rlcaption.metrics.cider import DocumentFrequencies, compute_cider_d
from rlcaption.metrics.corpus import evaluate_captions, resolve_metric_names, tokenize_captions
from rlcaption.metrics.rouge import compute_rouge_l
from rlcaption.metrics.tokenization import normalize_caption

JAVA_FREE = ["bleu", "rouge_l", "cider"]
requires_java = pytest.mark.skipif(shutil.which("java") is None, reason="needs `java` on PATH for METEOR/PTBTokenizer")


@pytest.fixture(scope="module")
def fakecap():
    """Raw (predictions, references) of the COCO toolkit's example, keyed by image id."""
    return load_fakecap()


def test_fakecap_reproduces_published_scores_under_coco_keys(fakecap):
    predictions, references = fakecap
    scores = evaluate_captions(predictions, references, metrics=JAVA_FREE)
    assert list(scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    # cocoEvalCapDemo.ipynb
    published = {"Bleu_1": 0.579, "Bleu_2": 0.404, "Bleu_3": 0.279, "Bleu_4": 0.191, "ROUGE_L": 0.396, "CIDEr": 0.600}
    assert {key: round(value, 3) for key, value in scores.items()} == published


def test_per_caption_scores_equal_the_metric_functions_on_tokenized_captions(fakecap):
    predictions, references = fakecap
    corpus, per_caption = evaluate_captions(predictions, references, metrics=JAVA_FREE, per_caption=True)
    candidates = {key: normalize_caption(caption) for key, caption in predictions.items()}
    tokenized = {key: [normalize_caption(caption) for caption in captions] for key, captions in references.items()}
    bleu_corpus, bleu_per_image = compute_bleu(candidates, tokenized)
    assert [corpus[f"Bleu_{order}"] for order in range(1, 5)] == bleu_corpus
    assert per_caption["Bleu_4"] == {key: scores[3] for key, scores in bleu_per_image.items()}
    assert (corpus["ROUGE_L"], per_caption["ROUGE_L"]) == compute_rouge_l(candidates, tokenized)
    assert (corpus["CIDEr"], per_caption["CIDEr"]) == compute_cider_d(candidates, tokenized)
    assert set(per_caption) == set(corpus)
    assert all(scores.keys() == predictions.keys() for scores in per_caption.values())


def test_training_document_frequencies_are_passed_to_cider(fakecap):
    predictions, references = fakecap
    tokenized = {key: [normalize_caption(caption) for caption in captions] for key, captions in references.items()}
    same_as_evaluated = DocumentFrequencies.from_references(tokenized.values())
    default = evaluate_captions(predictions, references, metrics=["cider"])
    explicit = evaluate_captions(predictions, references, metrics=["cider"], document_frequencies=same_as_evaluated)
    assert explicit["CIDEr"] == pytest.approx(default["CIDEr"], abs=1e-9)
    half = dict(list(tokenized.items())[:500])
    other = evaluate_captions(
        predictions,
        references,
        metrics=["cider"],
        document_frequencies=DocumentFrequencies.from_references(half.values()),
    )
    assert other["CIDEr"] != pytest.approx(default["CIDEr"], abs=1e-3)


def test_metric_names_resolve_in_report_order_with_spider_requirements():
    assert resolve_metric_names(None) == ["bleu", "meteor", "rouge_l", "cider", "spice", "spider"]
    assert resolve_metric_names(["CIDEr_D", "rouge", "Bleu"]) == ["bleu", "rouge_l", "cider"]
    assert resolve_metric_names(["spider"]) == ["cider", "spice", "spider"]
    with pytest.raises(ValueError, match="'wer'"):
        resolve_metric_names(["wer"])
    with pytest.raises(ValueError, match="no metric"):
        resolve_metric_names([])


def test_java_metric_that_cannot_run_fails_before_any_scoring(monkeypatch):
    def spice_unavailable():
        raise RuntimeError("SPICE needs the Stanford CoreNLP 3.6.0 jars")

    def must_not_run(*args, **kwargs):
        raise AssertionError("scoring started although SPICE cannot run")

    monkeypatch.setattr(corpus_metrics, "check_spice", spice_unavailable)
    monkeypatch.setattr(corpus_metrics, "compute_bleu", must_not_run)
    with pytest.raises(RuntimeError, match="CoreNLP"):
        evaluate_captions({1: "a cat"}, {1: ["a cat"]}, metrics=["bleu", "spice"])
    with pytest.raises(RuntimeError, match="CoreNLP"):
        evaluate_captions({1: "a cat"}, {1: ["a cat"]}, metrics=["spider"])


def unavailable(message):
    def check(*args, **kwargs):
        raise RuntimeError(message)

    return check


def test_default_metrics_without_java_run_the_others_and_say_what_was_skipped(monkeypatch, caplog):
    monkeypatch.setattr(corpus_metrics, "check_java", unavailable("No Java runtime found"))
    monkeypatch.setattr(corpus_metrics, "check_spice", unavailable("No Java runtime found"))
    with caplog.at_level(logging.WARNING, logger="rlcaption.metrics.corpus"):
        scores = evaluate_captions({1: "a cat on a mat"}, {1: ["a cat on a mat", "a cat"]})
    assert list(scores) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    assert list(scores.skipped) == ["meteor", "spice", "spider"]
    assert "No Java runtime found" in scores.skipped["meteor"] and "SPICE" in scores.skipped["spider"]
    assert "Skipped meteor, spice, spider" in caplog.text and "No Java runtime found" in caplog.text
    corpus, per_caption = evaluate_captions({1: "a cat"}, {1: ["a cat"]}, per_caption=True)
    assert list(corpus.skipped) == ["meteor", "spice", "spider"] and set(per_caption) == set(corpus)


def test_default_metrics_with_java_but_without_the_spice_jars_still_run_meteor(monkeypatch):
    monkeypatch.setattr(corpus_metrics, "check_java", lambda minimum: minimum)
    monkeypatch.setattr(corpus_metrics, "check_spice", unavailable("SPICE needs the Stanford CoreNLP 3.6.0 jars"))
    monkeypatch.setattr(
        corpus_metrics, "compute_meteor", lambda predictions, references: (0.5, dict.fromkeys(predictions, 0.5))
    )
    scores = evaluate_captions({1: "a cat"}, {1: ["a cat"]})
    assert scores["METEOR"] == 0.5 and "SPICE" not in scores and "SPIDEr" not in scores
    assert list(scores.skipped) == ["spice", "spider"]
    assert evaluate_captions({1: "a cat"}, {1: ["a cat"]}, metrics=["bleu"]).skipped == {}


def test_requested_java_metrics_that_cannot_run_still_raise(monkeypatch):
    monkeypatch.setattr(corpus_metrics, "check_java", unavailable("No Java runtime found"))
    with pytest.raises(RuntimeError, match="No Java runtime found"):
        evaluate_captions({1: "a cat"}, {1: ["a cat"]}, metrics=["bleu", "meteor"])


def test_spider_is_the_mean_of_cider_and_spice_only_when_spice_ran(monkeypatch):
    fake_spice = {1: 0.25, 2: 0.75}
    monkeypatch.setattr(corpus_metrics, "check_spice", lambda: [])
    monkeypatch.setattr(corpus_metrics, "compute_spice", lambda predictions, references: (0.5, dict(fake_spice)))
    predictions = {1: "a cat on a mat", 2: "a dog in a park"}
    references = {1: ["a cat sits on a mat", "a cat"], 2: ["a dog runs in the park", "dogs"]}
    corpus, per_caption = evaluate_captions(predictions, references, metrics=["spider"], per_caption=True)
    assert list(corpus) == ["CIDEr", "SPICE", "SPIDEr"]
    assert corpus["SPIDEr"] == pytest.approx((corpus["CIDEr"] + 0.5) / 2)
    for key in predictions:
        assert per_caption["SPIDEr"][key] == pytest.approx((per_caption["CIDEr"][key] + fake_spice[key]) / 2)
    without_spice = evaluate_captions(predictions, references, metrics=["bleu", "cider"])
    assert "SPIDEr" not in without_spice and "SPICE" not in without_spice


@pytest.mark.parametrize("candidate", ["", "...", "?!,;", "一只猫坐在垫子上", "¿¡"])
def test_empty_punctuation_only_and_foreign_candidates_score_zero(candidate):
    scores = evaluate_captions({"img": candidate}, {"img": ["A cat on a mat.", "A small cat."]}, metrics=JAVA_FREE)
    assert scores == pytest.approx(dict.fromkeys(scores, 0.0), abs=1e-5)


def test_non_ascii_captions_are_scored_like_any_other():
    scores = evaluate_captions({"img": "Un café à Paris."}, {"img": ["un café à paris"]}, metrics=["bleu", "rouge_l"])
    assert scores["Bleu_4"] == pytest.approx(1.0)
    assert scores["ROUGE_L"] == pytest.approx(1.0)


def test_thousand_word_candidate_gets_finite_scores_in_range():
    candidate = " ".join(["a cat on a mat"] * 200)
    scores = evaluate_captions({"img": candidate}, {"img": ["a cat on a mat"]}, metrics=JAVA_FREE)
    assert all(math.isfinite(value) for value in scores.values())
    assert 0.0 <= scores["Bleu_4"] < 0.01 and 0.0 <= scores["ROUGE_L"] < 0.05 and 0.0 <= scores["CIDEr"] < 0.01


@pytest.mark.parametrize(
    ("predictions", "references", "message"),
    [
        ({1: "a cat", 2: "a dog"}, {1: ["a cat"], 3: ["a dog"]}, "key 2"),
        ({"img-9": "a cat"}, {"img-9": []}, "'img-9'"),
        ({"img-9": "a cat"}, {"img-9": "a cat"}, "'img-9'"),
    ],
)
def test_bad_keys_raise_value_error_naming_the_key(predictions, references, message):
    with pytest.raises(ValueError, match=message):
        evaluate_captions(predictions, references, metrics=JAVA_FREE)


def test_unknown_tokenizer_is_rejected():
    with pytest.raises(ValueError, match="'nltk'"):
        evaluate_captions({1: "a"}, {1: ["a"]}, metrics=["bleu"], tokenizer="nltk")


def test_tokenize_captions_keeps_reference_grouping():
    candidates, references = tokenize_captions({"b": "Two Cats.", "a": "A dog!"}, {"a": ["A dog."], "b": ["x", "Y."]})
    assert candidates == {"b": "two cats", "a": "a dog"}
    assert references == {"b": ["x", "y"], "a": ["a dog"]}


@pytest.mark.java
@requires_java
def test_ptb_tokenizer_gives_the_same_scores_on_fakecap(fakecap):
    pytest.importorskip("pycocoevalcap")
    predictions, references = fakecap
    fast = evaluate_captions(predictions, references, metrics=JAVA_FREE)
    assert evaluate_captions(predictions, references, metrics=JAVA_FREE, tokenizer="ptb") == fast


def test_meteor_gets_the_tokenized_captions(monkeypatch):
    received = {}

    def fake_meteor(predictions, references):
        received.update(predictions=predictions, references=references)
        return 0.3, dict.fromkeys(predictions, 0.3)

    monkeypatch.setattr(corpus_metrics, "check_java", lambda minimum: 17)
    monkeypatch.setattr(corpus_metrics, "compute_meteor", fake_meteor)
    scores = evaluate_captions({1: "A cat, on a mat."}, {1: ["A cat (sitting)."]}, metrics=["meteor"])
    assert scores == {"METEOR": 0.3}
    assert received == {"predictions": {1: "a cat on a mat"}, "references": {1: ["a cat -lrb- sitting -rrb-"]}}


@pytest.mark.slow
@pytest.mark.java
@requires_java
def test_meteor_runs_on_tokenized_captions():
    pycocoevalcap_meteor = pytest.importorskip("pycocoevalcap.meteor.meteor")
    predictions = {1: "A cat on a mat.", 2: "Two dogs, playing!"}
    references = {1: ["A cat sits on the mat.", "A cat."], 2: ["Two dogs play in a park.", "Dogs playing."]}
    corpus, per_caption = evaluate_captions(predictions, references, metrics=["meteor"], per_caption=True)
    candidates, tokenized = tokenize_captions(predictions, references)
    expected_corpus, expected_per_image = pycocoevalcap_meteor.Meteor().compute_score(
        tokenized, {key: [caption] for key, caption in candidates.items()}
    )
    assert corpus["METEOR"] == pytest.approx(expected_corpus, abs=1e-6)
    assert [per_caption["METEOR"][key] for key in predictions] == pytest.approx(expected_per_image, abs=1e-6)


RAW_WORDS = st.sampled_from(["A", "cat", "Dog,", "on", "the", "mat.", "red", "(big)", "it's", "two", "runs!", "café"])
RAW_CAPTIONS = st.lists(RAW_WORDS, min_size=0, max_size=15).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(
    predictions=st.lists(RAW_CAPTIONS, min_size=1, max_size=4),
    references=st.lists(st.lists(RAW_CAPTIONS, min_size=1, max_size=4), min_size=4, max_size=4),
    seed=st.integers(0, 100),
)
def test_property_raw_captions_score_in_range_and_independent_of_reference_order(predictions, references, seed):
    predictions = dict(enumerate(predictions))
    references = {key: references[key] for key in predictions}
    shuffled = {key: random.Random(seed + key).sample(captions, len(captions)) for key, captions in references.items()}
    scores = evaluate_captions(predictions, references, metrics=JAVA_FREE)
    assert all(0.0 <= scores[key] <= 1.0 + 1e-9 for key in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L"))
    assert 0.0 <= scores["CIDEr"] <= 10.0 + 1e-9
    assert evaluate_captions(predictions, shuffled, metrics=JAVA_FREE) == pytest.approx(scores, abs=1e-9)
