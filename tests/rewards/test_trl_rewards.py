"""
Reward functions written for TRL run unchanged: they get `prompts`, `completions`, `completion_ids`, `trainer_state`
and the dataset columns as `trl.GRPOTrainer` gives them, and a `None` reward is masked out as TRL masks it.
"""

import math

import numpy as np
import pytest
from transformers import TrainerState
from trl.rewards import get_soft_overlong_punishment

from rlcaption.data import load_shapes
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import RewardMix
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

IMAGE_SIZE = 48


@pytest.fixture(scope="module")
def shapes_and_processor(tmp_path_factory):
    shapes = load_shapes(
        num_train=8, num_validation=2, num_test=2, image_size=IMAGE_SIZE, seed=3,
        cache_dir=tmp_path_factory.mktemp("shapes"),
    )  # fmt: skip
    captions = [caption for row in shapes["train"]["captions"] for caption in row]
    return shapes, CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)


def train_scst(shapes_and_processor, tmp_path, reward_funcs, objective="scst", max_steps=1, **overrides):
    shapes, processor = shapes_and_processor
    args = RLCaptionConfig(
        output_dir=str(tmp_path), use_cpu=True, objective=objective, per_device_train_batch_size=4,
        max_steps=max_steps, learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True,
        max_caption_length=8, num_samples_per_image=2, seed=0, log_completions=False, **overrides,
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_show_tell(processor, IMAGE_SIZE), args=args, processing_class=processor,
        train_dataset=shapes["train"], reward_funcs=reward_funcs,
    )  # fmt: skip
    if max_steps:
        trainer.train()
    return trainer


def test_a_reward_of_trl_s_signature_gets_what_grpo_gives_it(shapes_and_processor, tmp_path):
    calls = []

    def trl_reward(prompts, completions, completion_ids, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs})
        return [float(len(ids)) for ids in completion_ids]

    trainer = train_scst(shapes_and_processor, tmp_path, ["cider", trl_reward])
    _, processor = shapes_and_processor
    samples, greedy = calls  # the samples (4 images x 2), then the greedy baseline
    assert len(samples["completions"]) == 8 and len(greedy["completions"]) == 4
    for call in calls:
        assert call["prompts"] == [""] * len(call["completions"])
        assert isinstance(call["trainer_state"], TrainerState)
        # the dataset columns, one row per completion, and today's keyword arguments
        assert len(call["image_id"]) == len(call["references"]) == len(call["completions"])
        # TRL's completion_ids: the tokens after the start token, the end token included, no padding
        assert processor.batch_decode(call["completion_ids"], skip_special_tokens=True) == call["completions"]
        for ids in call["completion_ids"]:
            assert trainer.eos_token_id not in ids[:-1]
            assert ids[-1] == trainer.eos_token_id or len(ids) == 8
    logged = next(entry for entry in trainer.state.log_history if "reward/trl_reward/mean" in entry)
    assert logged["reward/trl_reward/mean"] == pytest.approx(np.mean([len(ids) for ids in samples["completion_ids"]]))


def test_trl_s_own_reward_runs_unchanged(shapes_and_processor, tmp_path):
    lengths = []

    def completion_length(completion_ids, **kwargs):
        lengths.extend(len(ids) for ids in completion_ids)
        return [0.0] * len(completion_ids)

    overlong = get_soft_overlong_punishment(max_completion_len=6, soft_punish_cache=3)
    trainer = train_scst(shapes_and_processor, tmp_path, [overlong, completion_length])
    sample_lengths = lengths[:8]

    def punishment(length):  # DAPO's eq. 13, written out
        return 0.0 if length <= 3 else -1.0 if length > 6 else (3 - length) / 3

    logged = next(
        entry for entry in trainer.state.log_history if "reward/soft_overlong_punishment_reward/mean" in entry
    )
    expected = np.mean([punishment(length) for length in sample_lengths])
    assert logged["reward/soft_overlong_punishment_reward/mean"] == pytest.approx(expected)


def none_for_short(completions, **kwargs):
    return [None if len(completion.split()) < 3 else 1.0 for completion in completions]


def test_a_none_reward_is_left_out_of_the_total():
    def two(completions, **kwargs):
        return [2.0] * len(completions)

    def never(completions, **kwargs):
        return [None] * len(completions)

    completions = ["a red", "a red circle", "a big red circle"]
    total, components = RewardMix([none_for_short, two], weights=[3.0, 0.5]).score(completions=completions)
    assert np.isnan(components["none_for_short"][0]) and components["none_for_short"][1:].tolist() == [1.0, 1.0]
    assert total.tolist() == [1.0, 4.0, 4.0]  # TRL's nansum of the weighted rewards
    total, _ = RewardMix([never, none_for_short]).score(completions=completions)
    assert np.isnan(total[0]) and total[1:].tolist() == [1.0, 1.0]  # no reward scored the first: NaN, to mask
    assert RewardMix([never, none_for_short])(completions=completions) == [None, 1.0, 1.0]
    with pytest.raises(ValueError, match="non-finite values"):
        RewardMix([lambda completions, **kwargs: [math.nan] * len(completions)]).score(completions=completions)


def test_scst_masks_captions_no_reward_scored(shapes_and_processor, tmp_path):
    def unscorable(completions, **kwargs):
        return [None] * len(completions)

    trainer = train_scst(shapes_and_processor, tmp_path, [unscorable], max_steps=0)
    losses = []
    compute_loss = trainer.objective.compute_loss
    trainer.objective.compute_loss = lambda model, inputs: losses.append(compute_loss(model, inputs)) or losses[-1]
    trainer.train()
    # every advantage is 0, as TRL zeroes an unscorable completion's: the loss carries no signal
    assert losses[0].item() == 0.0
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert "reward" not in logged  # a mean of nothing is left out of the log


def test_mean_of_others_baseline_skips_unscored_samples():
    from rlcaption.objectives.scst import mean_of_other_samples

    rewards = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, 2.0]])
    expected = np.array([[3.0, 2.0, 1.0], [2.0, 2.0, np.nan]])
    np.testing.assert_array_equal(mean_of_other_samples(rewards), expected)
    finite = np.array([[1.0, 2.0, 4.0]])
    np.testing.assert_array_equal(mean_of_other_samples(finite), (finite.sum() - finite) / 2)


def test_an_objective_that_cannot_mask_refuses_unscored_captions(shapes_and_processor, tmp_path):
    trainer = train_scst(shapes_and_processor, tmp_path, [none_for_short], objective="spider_pg", max_steps=0)
    inputs = {"references": [["a red circle"]], "image_id": [7]}
    pending = trainer.start_rewards(["a red", "a big red circle"], inputs, row_index=[0, 0])
    with pytest.raises(ValueError, match="No reward scored 1 caption.*'a red'.*'spider_pg' objective cannot"):
        pending.result()


def test_a_config_names_rewards_and_sends_functions_to_the_trainer(tmp_path):
    def my_function(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(
        ValueError, match=r"Pass reward functions to the trainer.*RLCaptionTrainer\(\.\.\., reward_funcs="
    ):
        RLCaptionConfig(output_dir=str(tmp_path), objective="scst", reward_funcs=["cider", my_function])


def test_completion_ids_are_grouped_as_the_completions():
    def ids_length(completion_ids, **kwargs):
        return [float(len(ids)) for ids in completion_ids]

    mix = RewardMix([ids_length])
    total, _ = mix.score_groups(
        completions=[["a b", "c"], ["d e f"]], completion_columns={"completion_ids": [[[1, 2], [3]], [[4, 5, 6]]]}
    )
    assert total.tolist() == [2.0, 1.0, 3.0]
    with pytest.raises(ValueError, match="'completion_ids' is not grouped as the completions"):
        mix.score_groups(completions=[["a b", "c"], ["d"]], completion_columns={"completion_ids": [[[1]], [[2], [3]]]})
