import itertools
import math
import random

import numpy as np
import pytest

from rlcaption.metrics.bleu import compute_bleu
from rlcaption.metrics.diversity import (
    copy_rate,
    div_n,
    mbleu,
    pairwise_caption_distances,
    self_bleu,
    set_diversity,
    vocabulary_size,
)

# BLEU-4 of "a b c d e" against "a b c d f" (and back), by hand: clipped precisions 4/5, 3/4, 2/3, 1/2, equal lengths.
BLEU4_ONE_WORD_CHANGED = (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** (1 / 4)


def test_div_n_by_hand():
    captions = ["a dog runs", "a dog sits"]
    assert div_n(captions, 1) == pytest.approx(4 / 6)  # {a, dog, runs, sits} over 6 words
    assert div_n(captions, 2) == pytest.approx(3 / 6)  # {a dog, dog runs, dog sits} over 6 words
    # n-grams never span two captions: "runs a" is not a bigram here
    assert div_n(["a b", "a b"], 2) == pytest.approx(1 / 4)
    assert div_n(["", ""], 1) == 0.0
    assert div_n(["A dog.", "a dog"], 1, normalize=True) == pytest.approx(2 / 4)


def test_mbleu_by_hand():
    assert mbleu(["a b c d e", "a b c d f"]) == pytest.approx(BLEU4_ONE_WORD_CHANGED, abs=1e-9)
    # a third caption sharing nothing scores ~0 against the others and adds nothing to theirs
    assert mbleu(["a b c d e", "a b c d f", "v w x y z"]) == pytest.approx(2 * BLEU4_ONE_WORD_CHANGED / 3, abs=1e-6)
    assert mbleu(["a man rides a horse"] * 5) == pytest.approx(1.0, abs=1e-6)


def test_mbleu_equals_pycocoevalcap_leave_one_out():
    bleu_module = pytest.importorskip("pycocoevalcap.bleu.bleu", reason="pycocoevalcap is the reference BLEU")
    captions = ["a man riding a horse", "a person on a horse on the beach", "a horse and a rider", "a man on a horse"]
    predictions = {index: [caption] for index, caption in enumerate(captions)}
    references = {index: captions[:index] + captions[index + 1 :] for index in range(len(captions))}
    _, per_caption = bleu_module.Bleu(4).compute_score(references, predictions, verbose=0)
    assert mbleu(captions) == pytest.approx(sum(per_caption[3]) / len(captions), abs=1e-12)


def test_set_diversity_means_and_per_image_values():
    means, per_image = set_diversity({"x": ["a b c d e", "a b c d f"], "y": ["a a", "a a"]})
    assert per_image["x"] == pytest.approx(
        {"Div-1": 6 / 10, "Div-2": 5 / 10, "mBLEU-4": BLEU4_ONE_WORD_CHANGED}, abs=1e-9
    )
    assert per_image["y"]["Div-1"] == pytest.approx(1 / 4)
    assert per_image["y"]["Div-2"] == pytest.approx(1 / 4)
    for name in ("Div-1", "Div-2", "mBLEU-4"):
        assert means[name] == pytest.approx((per_image["x"][name] + per_image["y"][name]) / 2)


@pytest.mark.parametrize(
    "bad, message", [({}, "at least one image"), ({1: ["only one"]}, "Image 1 needs"), ({1: "a b"}, "Image 1 needs")]
)
def test_set_diversity_rejects_bad_input(bad, message):
    with pytest.raises(ValueError, match=message):
        set_diversity(bad)


def test_self_bleu_by_hand_with_brevity_penalty_and_length_ties():
    # X (5 words) has two other lengths at distance 1 (6 and 4): COCO's "closest" picks the shorter, so no penalty.
    # Y (6 words) matches 5/6, 4/5, 3/4, 2/3 against X; closest other length 5 < 6: no penalty.
    # Z (4 words) matches everything; closest other length 5 > 4: penalty exp(1 - 5/4).
    captions = ["a b c d e", "a b c d e f", "a b c d"]
    expected = (1.0 + (1 / 3) ** (1 / 4) + math.exp(1 - 5 / 4)) / 3
    assert self_bleu(captions) == pytest.approx(expected, abs=1e-6)


def test_self_bleu_of_one_set_is_its_mbleu():
    captions = ["a b c d e", "a b c d f", "v w x y z", "a b c x y"]
    assert self_bleu(captions) == pytest.approx(mbleu(captions), abs=1e-12)


def _leave_one_out_bleu4(captions: list[str]) -> list[float]:
    predictions = dict(enumerate(captions))
    references = {index: captions[:index] + captions[index + 1 :] for index in range(len(captions))}
    _, per_caption = compute_bleu(predictions, references)
    return [per_caption[index][3] for index in range(len(captions))]


def test_self_bleu_equals_leave_one_out_compute_bleu_on_a_random_corpus():
    rng = random.Random(0)
    words = "a the dog cat man woman on in red blue sits runs with of near".split()
    captions = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(80)]
    captions += captions[:5]  # exact duplicates: BLEU 1 against their twin
    captions += ["a dog sits on the red mat", "a dog sits on the red mat", "a dog sits on the red mat near"]
    expected = _leave_one_out_bleu4(captions)
    assert self_bleu(captions) == pytest.approx(sum(expected) / len(expected), abs=1e-12)


def test_self_bleu_sample_is_a_seeded_subset_mean():
    captions = ["a b c d e", "a b c d e f", "a b c d", "x y z w a b"]
    per_caption = _leave_one_out_bleu4(captions)
    subset_means = {
        round(sum(per_caption[i] for i in subset) / 2, 12) for subset in itertools.combinations(range(4), 2)
    }
    sampled = self_bleu(captions, sample_size=2, seed=7)
    assert round(sampled, 12) in subset_means
    assert self_bleu(captions, sample_size=2, seed=7) == sampled  # reproducible
    assert self_bleu(captions, sample_size=10) == self_bleu(captions)  # a sample of everything is everything


def test_self_bleu_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 captions"):
        self_bleu(["alone"])
    with pytest.raises(ValueError, match="sample_size=0"):
        self_bleu(["a", "b"], sample_size=0)
    with pytest.raises(ValueError, match="must be strings"):
        self_bleu(["a", None])


def test_vocabulary_size():
    assert vocabulary_size(["a dog", "a dog runs", ""]) == 3
    assert vocabulary_size(["a dog", "A dog runs."]) == 4  # tokens as given: "A", "runs." are distinct
    assert vocabulary_size(["a dog", "A dog runs."], normalize=True) == 3


def test_copy_rate():
    generated = ["a dog runs", "A dog  runs.", "a cat", "a dog runs"]
    training = ["A dog runs", "a bird"]
    assert copy_rate(generated, training, normalize=True) == pytest.approx(3 / 4)
    # without normalization only whitespace differences are forgiven
    assert copy_rate(["a dog  runs", "A dog runs"], ["a dog runs"]) == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="at least one generated caption"):
        copy_rate([], training)


def test_pairwise_bleu_distance_by_hand_on_two_captions():
    distances = pairwise_caption_distances(["a b c d", "a b c d e"], kind="bleu")
    # "a b c d" against "a b c d e": every n-gram matches, brevity penalty exp(1 - 5/4)
    shorter_against_longer = 1 - math.exp(1 - 5 / 4)
    # "a b c d e" against "a b c d": precisions 4/5, 3/4, 2/3, 1/2, no penalty
    longer_against_shorter = 1 - ((4 / 5 * 3 / 4 * 2 / 3) ** (1 / 3) + (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** (1 / 4)) / 2
    expected = [[0.0, shorter_against_longer], [longer_against_shorter, 0.0]]
    assert distances.shape == (2, 2)
    assert distances == pytest.approx(np.array(expected), abs=1e-6)


@pytest.mark.parametrize(
    "captions",
    [
        ["a man riding a horse", "a man on a horse on the beach", "a horse and a rider", "a man on a horse"],
        ["a a a a", "a a", "a", ""],  # clipping of repeated words, captions without 3- or 4-grams, an empty one
        ["red square left of blue circle", "red square left of blue circle", "a b c d e f g h i j k l"],
    ],
)
def test_pairwise_bleu_distance_equals_a_loop_over_pycocoevalcap(captions):
    bleu_scorer = pytest.importorskip("pycocoevalcap.bleu.bleu_scorer", reason="pycocoevalcap is the reference BLEU")
    expected = np.empty((len(captions), len(captions)))
    for j, candidate in enumerate(captions):
        for k, reference in enumerate(captions):
            scorer = bleu_scorer.BleuScorer(n=4)
            scorer += (candidate, [reference])
            _, per_sentence = scorer.compute_score(option="closest")
            expected[j, k] = 1 - (per_sentence[2][0] + per_sentence[3][0]) / 2
    assert pairwise_caption_distances(captions, kind="bleu") == pytest.approx(expected, abs=1e-12)


def _word_edit_distance(first: list[str], second: list[str]) -> int:
    previous = list(range(len(second) + 1))
    for i, word in enumerate(first, start=1):
        current = [i]
        for j, other in enumerate(second, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def test_pairwise_edit_distance_by_hand():
    distances = pairwise_caption_distances(["a dog runs", "a big dog", "", ""], kind="edit")
    # "a dog runs" -> "a big dog": insert "big", delete "runs"; 2 edits over 3 words
    assert distances[0, 1] == distances[1, 0] == pytest.approx(2 / 3)
    assert distances[0, 2] == distances[2, 1] == 1.0  # everything against nothing
    assert distances[2, 3] == 0.0  # two empty captions
    assert np.diag(distances).tolist() == [0.0] * 4


def test_pairwise_edit_distance_equals_a_plain_loop_on_random_captions():
    rng = random.Random(0)
    words = "a the dog cat on red sits".split()
    for _ in range(20):
        captions = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 9))) for _ in range(rng.randint(1, 6))]
        tokenized = [caption.split() for caption in captions]
        expected = [[_word_edit_distance(a, b) / max(len(a), len(b), 1) for b in tokenized] for a in tokenized]
        assert pairwise_caption_distances(captions, kind="edit") == pytest.approx(np.array(expected), abs=1e-12)


def test_pairwise_caption_distances_normalize_and_reject_bad_input():
    assert pairwise_caption_distances(["A dog.", "a dog"], kind="edit", normalize=True)[0, 1] == 0.0
    with pytest.raises(ValueError, match="Unknown caption distance kind='cosine'"):
        pairwise_caption_distances(["a", "b"], kind="cosine")
    with pytest.raises(ValueError, match="at least one caption"):
        pairwise_caption_distances([])
