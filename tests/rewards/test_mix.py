"""RewardMix: weighted totals, per-reward logging names, user callables, non-finite values."""

import functools
import math

import numpy as np
import pytest

from rlcaption.rewards import RewardMix, get_reward, reward_name

REFERENCES = [["a dog on a sofa", "a brown dog lying on a couch"], ["a cat on a mat", "a grey cat"]]
COMPLETIONS = ["a dog on a couch", "a cat"]


def caption_length(*, completions, references, **columns):
    return [float(len(completion.split())) for completion in completions]


def test_weighted_total_and_components():
    bleu = get_reward("bleu")
    mix = RewardMix(["rouge_l", bleu, caption_length], weights=[1.0, 2.0, -0.5])
    total, components = mix.score(completions=COMPLETIONS, references=REFERENCES, image_id=[1, 2])
    assert list(components) == ["rouge_l", "bleu_4", "caption_length"]
    rouge_values = get_reward("rouge_l")(completions=COMPLETIONS, references=REFERENCES)
    np.testing.assert_allclose(components["rouge_l"], rouge_values)
    np.testing.assert_allclose(components["caption_length"], [5.0, 2.0])
    expected = components["rouge_l"] + 2.0 * components["bleu_4"] - 0.5 * components["caption_length"]
    np.testing.assert_allclose(total, expected, rtol=0, atol=1e-12)
    assert mix(completions=COMPLETIONS, references=REFERENCES) == pytest.approx(expected.tolist())


def test_default_weights_and_duplicate_names():
    mix = RewardMix([caption_length, caption_length])
    assert mix.names == ["caption_length", "caption_length_2"]
    total, _ = mix.score(completions=COMPLETIONS, references=REFERENCES)
    np.testing.assert_allclose(total, [10.0, 4.0])


# None is not among them: a reward returns it for a completion it cannot score, as in TRL (tests/rewards/
# test_trl_rewards.py)
@pytest.mark.parametrize("bad_value", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_is_named(bad_value):
    def flaky(*, completions, references, **columns):
        return [1.0, bad_value]

    with pytest.raises(ValueError, match="'flaky'"):
        RewardMix([caption_length, flaky]).score(completions=COMPLETIONS, references=REFERENCES)


def test_wrong_number_of_values_and_bad_configuration():
    with pytest.raises(ValueError, match="'short' returned 1 values for 2"):

        def short(*, completions, references, **columns):
            return [1.0]

        RewardMix([short]).score(completions=COMPLETIONS, references=REFERENCES)
    with pytest.raises(ValueError, match="2 weights for 1"):
        RewardMix([caption_length], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="at least one"):
        RewardMix([])
    with pytest.raises(ValueError, match="Unknown reward"):
        RewardMix(["nope"])


def test_reward_names():
    assert reward_name(caption_length) == "caption_length"
    assert reward_name(functools.partial(caption_length)) == "caption_length"
    assert reward_name(get_reward("cider")) == "cider"

    class Scorer:
        def __call__(self, *, completions, references, **columns):
            return [0.0] * len(completions)

    assert reward_name(Scorer()) == "Scorer"


class RecordingReward:
    """A reward of each caption on its own (its length plus its image's first reference's), recording the rows of
    every call."""

    def __init__(self, independent):
        self.scores_captions_independently = independent
        self.calls = []

    def __call__(self, *, completions, references, image_id, **columns):
        self.calls.append(list(zip(image_id, completions, strict=True)))
        pairs = zip(completions, references, strict=True)
        return [len(completion) + 0.01 * len(captions[0]) for completion, captions in pairs]


def test_a_reward_of_each_caption_on_its_own_is_computed_once_per_distinct_image_and_caption():
    # a trained policy's samples repeat themselves; the same caption of another image is another pair
    completions = [["a red circle", "a circle", "a red circle", "a red circle"], ["a red circle", "a blue star"]]
    references = [["a red circle on white"], ["a blue star and a red circle"]]
    independent, dependent = RecordingReward(True), RecordingReward(False)
    mix = RewardMix([independent, dependent], weights=[1.0, 2.0])
    total, components = mix.score_groups(completions=completions, references=references, image_id=["x", "y"])
    distinct = [("x", "a red circle"), ("x", "a circle"), ("y", "a red circle"), ("y", "a blue star")]
    assert independent.calls == [distinct]
    assert len(dependent.calls[0]) == 6  # a reward that may read the other rows of the call gets every row
    expected = [12.21, 8.21, 12.21, 12.21, 12.28, 11.28]
    np.testing.assert_allclose(components[reward_name(independent)], expected)
    np.testing.assert_allclose(components[reward_name(dependent) + "_2"], expected)
    np.testing.assert_allclose(total, 3 * np.array(expected))


def test_a_non_finite_reward_of_a_repeated_caption_names_its_image_and_caption():
    def bad_for_circles(*, completions, references, **columns):
        return [math.nan if "circle" in completion else 1.0 for completion in completions]

    bad_for_circles.scores_captions_independently = True
    with pytest.raises(ValueError, match=r"group 1 completion 0 \('a circle'\)"):
        RewardMix([bad_for_circles]).score_groups(
            completions=[["a star", "a star"], ["a circle", "a circle"]], references=[["a star"], ["a circle"]]
        )
