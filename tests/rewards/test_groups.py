"""Group-aware scoring: RewardMix.score_groups, set-level rewards, image columns once per image, validation."""

import math

import numpy as np
import pytest
import torch

from rlcaption.rewards import (
    CiderReward,
    GroupRewardFunc,
    RewardMix,
    get_reward,
    group_sizes,
    is_group_reward,
    prepare_reward,
)

GROUPS = [
    ["a dog on a couch", "a brown dog on a sofa", "a cat"],
    ["a red bus on a street"],
    ["a man riding a horse", "a horse in a field"],
]
REFERENCES = [
    ["a dog lying on a sofa", "a brown dog resting on a couch"],
    ["a red double decker bus", "a bus driving down a city street"],
    ["a man rides a brown horse", "a person on a horse in a field"],
]
IMAGE_IDS = [7, 8, 9]
SIZES = [3, 1, 2]
IMAGE_OF = [0, 0, 0, 1, 2, 2]  # the group of every flattened completion


def flat(groups):
    return [completion for group in groups for completion in group]


def caption_length(*, completions, references, **columns):
    return [float(len(completion.split())) for completion in completions]


class PairwiseDistance:
    """Set-level reward: a caption's mean Jaccard distance between word sets to the other captions of its image."""

    __name__ = "pairwise_distance"

    def __init__(self):
        self.calls = []

    def score_groups(self, *, completions, references, **image_columns):
        self.calls.append({"sizes": [len(group) for group in completions], **image_columns})
        rewards = []
        for group in completions:
            words = [set(caption.split()) for caption in group]
            rewards.append(
                [
                    float(np.mean([1 - len(own & other) / len(own | other) for other in words[:i] + words[i + 1 :]]))
                    if len(words) > 1
                    else 0.0
                    for i, own in enumerate(words)
                ]
            )
        return rewards


def constant_groups(values):
    """A group reward returning `values` whatever it is given, named `fixed`."""

    class Fixed:
        __name__ = "fixed"

        def score_groups(self, *, completions, references, **image_columns):
            return values

    return Fixed()


def test_score_groups_equals_score_on_flattened_and_repeated_inputs():
    cider = CiderReward(document_frequencies=REFERENCES + [["a cat on a mat"], ["a plate of food"]])
    mix = RewardMix([cider, "bleu", caption_length], weights=[1.0, 0.5, -0.1])
    total, components = mix.score_groups(completions=GROUPS, references=REFERENCES, image_id=IMAGE_IDS)
    expected_total, expected = mix.score(
        completions=flat(GROUPS),
        references=[REFERENCES[image] for image in IMAGE_OF],
        image_id=[IMAGE_IDS[image] for image in IMAGE_OF],
    )
    assert list(components) == ["cider", "bleu_4", "caption_length"]
    for name in components:
        np.testing.assert_array_equal(components[name], expected[name])
    np.testing.assert_array_equal(total, expected_total)
    assert total.shape == (6,) and len(set(components["cider"].tolist())) > 2  # real, distinct scores


def test_a_set_level_reward_gets_the_groups_and_every_image_column_once():
    reward = PairwiseDistance()
    pixel_values = torch.randn(3, 3, 4, 4)
    mix = RewardMix([reward, caption_length], weights=[2.0, 1.0])
    total, components = mix.score_groups(
        completions=GROUPS, references=REFERENCES, image_id=IMAGE_IDS, pixel_values=pixel_values, scene=["x", "y", "z"]
    )
    (call,) = reward.calls
    assert call["sizes"] == SIZES
    assert call["pixel_values"] is pixel_values  # one row per image, not copied
    assert call["image_id"] == IMAGE_IDS and call["scene"] == ["x", "y", "z"]
    # {a, dog, on, couch} vs {a, brown, dog, on, sofa}: 3 words shared of 6; vs {a, cat}: 1 shared of 5
    assert components["pairwise_distance"][0] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 5)) / 2)
    assert components["pairwise_distance"][3] == 0.0  # alone in its group
    np.testing.assert_allclose(total, 2.0 * components["pairwise_distance"] + components["caption_length"])


def test_only_functions_naming_an_array_column_get_it_per_completion():
    seen = {}

    def through_kwargs(*, completions, references, **columns):
        seen["kwargs"] = columns
        return [0.0] * len(completions)

    def naming_pixels(*, completions, references, pixel_values, **columns):
        seen["named"] = pixel_values
        return pixel_values.mean(dim=(1, 2, 3)).tolist()

    pixel_values = torch.randn(3, 3, 4, 4)
    features = np.arange(6.0).reshape(3, 2)
    mix = RewardMix([through_kwargs, naming_pixels, get_reward("bleu")])
    _, components = mix.score_groups(
        completions=GROUPS,
        references=REFERENCES,
        image_id=IMAGE_IDS,
        pixel_values=pixel_values,
        image_features=features,
    )
    assert "pixel_values" not in seen["kwargs"] and "image_features" not in seen["kwargs"]
    assert seen["kwargs"]["image_id"] == [7, 7, 7, 8, 9, 9]  # lists are repeated per completion
    assert seen["named"].shape == (6, 3, 4, 4)
    for row, image in enumerate(IMAGE_OF):
        torch.testing.assert_close(seen["named"][row], pixel_values[image], rtol=0, atol=0)
    np.testing.assert_allclose(components["naming_pixels"], pixel_values.mean(dim=(1, 2, 3))[IMAGE_OF].numpy())


# None is not among them: it marks a completion the reward cannot score, as in TRL (tests/rewards/test_trl_rewards.py)
@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_a_non_finite_group_value_names_the_reward_the_image_and_the_completion(bad_value):
    reward = constant_groups([[1.0, 2.0, 3.0], [bad_value], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"'fixed' returned non-finite values \[\w+\] at image_id 8 \(group 1\) "):
        RewardMix([caption_length, reward]).score_groups(completions=GROUPS, references=REFERENCES, image_id=IMAGE_IDS)

    def per_completion_nan(*, completions, references, **columns):
        return [0.0] * 5 + [math.nan]

    with pytest.raises(ValueError, match=r"'per_completion_nan' .* at group 2 completion 1 \('a horse in a field'\);"):
        RewardMix([per_completion_nan]).score_groups(completions=GROUPS, references=REFERENCES)


def test_wrong_numbers_of_group_values_raise_naming_the_reward():
    def score(values):
        return RewardMix([constant_groups(values)]).score_groups(
            completions=GROUPS, references=REFERENCES, image_id=IMAGE_IDS
        )

    total, _ = score([[1.0, 2.0, 3.0], [0.0], [1.0, 2.0]])
    np.testing.assert_array_equal(total, [1.0, 2.0, 3.0, 0.0, 1.0, 2.0])  # flat, in group order
    with pytest.raises(ValueError, match=r"'fixed' returned 1 values for image_id 9 \(group 2\), which has 2"):
        score([[1.0, 2.0, 3.0], [0.0], [1.0]])
    with pytest.raises(ValueError, match="'fixed' returned 2 groups of values for 3 images"):
        score([[1.0, 2.0, 3.0], [0.0]])
    with pytest.raises(ValueError, match="'fixed' returned values that are not numbers"):
        score([[1.0, "high", 3.0], [0.0], [1.0, 2.0]])

    def short(*, completions, references, **columns):
        return [1.0] * 5

    with pytest.raises(ValueError, match="'short' returned 5 values for 6 completions"):
        RewardMix([short]).score_groups(completions=GROUPS, references=REFERENCES)


def test_grouped_inputs_of_the_wrong_shape_raise():
    mix = RewardMix([caption_length])
    with pytest.raises(ValueError, match="Group 0 of the completions is str"):
        mix.score_groups(completions=["a dog", "a cat"], references=REFERENCES[:2])
    with pytest.raises(ValueError, match="3 groups of completions but 2 reference lists"):
        mix.score_groups(completions=GROUPS, references=REFERENCES[:2])
    with pytest.raises(ValueError, match="Column 'pixel_values' has 6 rows for 3 images"):
        mix.score_groups(completions=GROUPS, references=REFERENCES, pixel_values=torch.zeros(6, 3, 2, 2))
    assert group_sizes(GROUPS) == SIZES


def test_group_only_rewards_and_nested_mixes():
    reward = PairwiseDistance()
    assert is_group_reward(reward) and isinstance(reward, GroupRewardFunc)
    assert not is_group_reward(caption_length) and not is_group_reward(get_reward("cider"))
    inner = RewardMix([reward, caption_length], weights=[1.0, 0.5])
    assert not is_group_reward(inner)  # its score_groups returns (total, components)
    with pytest.raises(ValueError, match="'pairwise_distance' only scores groups"):
        inner.score(completions=flat(GROUPS), references=[REFERENCES[image] for image in IMAGE_OF])
    outer = RewardMix([inner, "bleu"], weights=[2.0, 1.0])
    total, components = outer.score_groups(completions=GROUPS, references=REFERENCES)
    inner_total, _ = inner.score_groups(completions=GROUPS, references=REFERENCES)
    np.testing.assert_allclose(components["pairwise_distance+caption_length"], inner_total)
    np.testing.assert_allclose(total, 2.0 * inner_total + components["bleu_4"])


def test_prepare_reaches_every_reward_of_a_mix():
    class Recording:
        __name__ = "recording"

        def __init__(self):
            self.prepared_with = None

        def prepare(self, train_dataset, processor):
            self.prepared_with = (train_dataset, processor)

        def __call__(self, *, completions, references, **columns):
            return [0.0] * len(completions)

    import datasets

    train = datasets.Dataset.from_dict({"captions": REFERENCES, "image_id": IMAGE_IDS})
    recording, cider = Recording(), CiderReward()
    RewardMix([recording, cider, caption_length]).prepare(train, "processor")
    assert recording.prepared_with == (train, "processor")
    assert cider.document_frequencies.num_documents == 3
    prepare_reward(caption_length, train, None)  # a reward without `prepare` is left as it is
