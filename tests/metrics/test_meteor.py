import threading

import pytest

from metric_fixtures import java_problem, load_fakecap
from rlcaption.metrics import meteor as meteor_module
from rlcaption.metrics.meteor import (
    MeteorScorer,
    compute_meteor,
    sanitize_meteor_hypothesis,
    sanitize_meteor_reference,
)
from rlcaption.metrics.tokenization import normalize_caption

requires_java = pytest.mark.skipif(java_problem() is not None, reason=f"METEOR 1.5 needs Java >= 8: {java_problem()}")

# A few tokenized COCO-style captions (lower-cased, punctuation removed), with one reference list of varied size.
PREDICTIONS = {
    1: "a man riding a horse on a beach",
    2: "a plate of food with broccoli and meat",
    "kitchen": "a kitchen with a stove and a refrigerator",
    4: "two dogs",
    5: "",
    6: "un café près de la gare",
}
REFERENCES = {
    1: ["a person rides a brown horse along the shore", "a man on a horse at the beach", "horse and rider on sand"],
    2: ["a white plate topped with broccoli and beef", "a meal of meat and vegetables on a plate"],
    "kitchen": ["a small kitchen with white appliances", "a stove next to a refrigerator in a kitchen"],
    4: ["two dogs playing in the grass", "a pair of dogs run across a lawn", "dogs outside", "two brown dogs"],
    5: ["a cat sleeping on a couch"],
    6: ["a small cafe near the train station", "le café de la gare"],
}


@pytest.fixture(scope="module")
def reference_meteor():
    """`pycocoevalcap`'s Meteor (its own JVM), the reference implementation."""
    pytest.importorskip("pycocoevalcap", reason='pycocoevalcap is an optional extra: pip install "rlcaption[java]"')
    from pycocoevalcap.meteor.meteor import Meteor

    return Meteor()


def pycocoevalcap_meteor(reference_meteor, predictions, references) -> tuple[float, dict]:
    keys = list(predictions)
    score, scores = reference_meteor.compute_score(
        {key: list(references[key]) for key in keys}, {key: [predictions[key]] for key in keys}
    )
    return score, dict(zip(keys, scores, strict=True))


@pytest.mark.java
@requires_java
class TestMeteorAgainstPycocoevalcap:
    def test_corpus_and_per_key_scores_equal_pycocoevalcap(self, reference_meteor):
        expected_corpus, expected_per_key = pycocoevalcap_meteor(reference_meteor, PREDICTIONS, REFERENCES)
        corpus, per_key = compute_meteor(PREDICTIONS, REFERENCES)
        assert corpus == pytest.approx(expected_corpus, abs=1e-6)
        assert per_key.keys() == expected_per_key.keys()
        for key, expected in expected_per_key.items():
            assert per_key[key] == pytest.approx(expected, abs=1e-6), key
        # sanity of the reference itself: an empty candidate scores 0, a good paraphrase scores well
        assert per_key[5] == 0.0
        assert 0.2 < per_key[1] < 1.0

    def test_fakecap_reproduces_published_meteor_and_pycocoevalcap(self, reference_meteor):
        raw_predictions, raw_references = load_fakecap()
        predictions = {key: normalize_caption(caption) for key, caption in raw_predictions.items()}
        references = {key: [normalize_caption(c) for c in captions] for key, captions in raw_references.items()}
        corpus, per_key = compute_meteor(predictions, references)
        assert round(corpus, 3) == 0.195  # cocoEvalCapDemo.ipynb
        expected_corpus, expected_per_key = pycocoevalcap_meteor(reference_meteor, predictions, references)
        assert abs(corpus - expected_corpus) <= 1e-6
        assert max(abs(per_key[key] - expected_per_key[key]) for key in predictions) <= 1e-6

    def test_repeated_calls_reuse_one_process_and_agree(self):
        first = compute_meteor(PREDICTIONS, REFERENCES)
        process = meteor_module._get_shared_scorer().process
        second = compute_meteor({1: PREDICTIONS[1]}, {1: REFERENCES[1]})
        assert meteor_module._get_shared_scorer().process is process
        assert second[1][1] == first[1][1]
        # the corpus METEOR of one caption is that caption's METEOR
        assert second[0] == pytest.approx(second[1][1], abs=1e-12)

    def test_identical_candidate_and_reference_score_one(self):
        captions = {"long": "a large brown dog running across a grassy field", "short": "dog"}
        corpus, per_key = compute_meteor(captions, {key: [caption] for key, caption in captions.items()})
        assert per_key == {"long": 1.0, "short": 1.0}
        assert corpus == 1.0

    def test_protocol_breaking_hypothesis_matches_pycocoevalcap(self, reference_meteor):
        # pycocoevalcap strips '|||' from hypotheses and collapses double spaces once; we do the same
        predictions = {0: "a man ||| riding a horse", 1: "a man  riding a horse"}
        references = {0: REFERENCES[1], 1: REFERENCES[1]}
        expected_corpus, expected = pycocoevalcap_meteor(reference_meteor, predictions, references)
        corpus, per_key = compute_meteor(predictions, references)
        assert per_key == pytest.approx(expected, abs=1e-6)
        assert corpus == pytest.approx(expected_corpus, abs=1e-6)

    def test_line_breaks_and_separators_are_sanitized(self):
        clean_corpus, clean = compute_meteor({0: "a man riding a horse"}, {0: ["a man on a horse", "a rider"]})
        # a newline would end the SCORE line early; a '|||' in a reference would split it into two references
        dirty_corpus, dirty = compute_meteor({0: "a man\nriding a\r\nhorse"}, {0: ["a man on a\nhorse", "a\r\nrider"]})
        assert dirty[0] == clean[0]
        _, separated = compute_meteor({0: "a man riding a horse"}, {0: ["a man on a |||horse", "a rider"]})
        assert separated[0] == clean[0]
        assert dirty_corpus == clean_corpus

    def test_scorer_is_safe_to_share_between_threads(self):
        expected = compute_meteor(PREDICTIONS, REFERENCES)
        results: list = [None] * 4
        errors: list[BaseException] = []

        def score(slot: int) -> None:
            try:
                results[slot] = compute_meteor(PREDICTIONS, REFERENCES)
            except BaseException as error:  # surfaced in the main thread below
                errors.append(error)

        threads = [threading.Thread(target=score, args=(slot,)) for slot in range(len(results))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert all(result == expected for result in results)


@pytest.mark.java
@requires_java
def test_killed_process_is_restarted_on_next_call():
    expected = compute_meteor(PREDICTIONS, REFERENCES)
    scorer = meteor_module._get_shared_scorer()
    dead = scorer.process
    dead.kill()
    dead.wait()
    assert compute_meteor(PREDICTIONS, REFERENCES) == expected
    assert scorer.process is not dead and scorer.process.poll() is None
    running = scorer.process
    scorer.close()
    assert scorer.process is None and running.poll() is not None


def test_scorer_starts_lazily_and_closing_an_unstarted_scorer_is_a_no_op():
    scorer = MeteorScorer()
    assert scorer.process is None
    with pytest.raises(ValueError):
        scorer.score({}, {})  # rejected before any process starts
    assert scorer.process is None
    scorer.close()
    assert scorer.process is None


def test_sanitizers_match_pycocoevalcap_on_hypotheses_and_keep_references_whole():
    # hypotheses: exactly pycocoevalcap's `.replace('|||', '').replace('  ', ' ')` after joining lines
    assert sanitize_meteor_hypothesis("a dog ||| runs") == "a dog runs"
    assert sanitize_meteor_hypothesis("a  dog   runs") == "a dog  runs"
    assert sanitize_meteor_hypothesis("a dog\nruns\r\nfast\rnow") == "a dog runs fast now"
    assert sanitize_meteor_hypothesis("a dog runs") == "a dog runs"
    assert sanitize_meteor_reference("a dog |||runs") == "a dog runs"
    assert sanitize_meteor_reference("two\nlines") == "two lines"
    assert sanitize_meteor_reference("a  dog") == "a  dog"


@pytest.mark.parametrize(
    "predictions, references, message",
    [
        ({}, {}, "METEOR got no predictions"),
        ({1: "a dog"}, {2: ["a dog"]}, "prediction key 1 has no entry in references"),
        ({1: "a dog", 2: "a cat"}, {1: ["a dog"]}, "prediction key 2 has no entry"),
        ({1: "a dog"}, {1: []}, "references for key 1 are an empty list"),
        ({1: "a dog"}, {1: "a dog"}, "references for key 1 are a single string"),
        ({1: ["a dog"]}, {1: ["a dog"]}, "prediction for key 1 is a list"),
    ],
)
def test_bad_inputs_are_rejected_before_java_runs(predictions, references, message):
    with pytest.raises(ValueError, match=message):
        MeteorScorer().score(predictions, references)
