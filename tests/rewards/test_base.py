"""Reward inputs: plain and conversational completions, per-row key columns, validation messages."""

from collections import UserList

import numpy as np
import pytest
import torch

from rlcaption.rewards import RewardFunc, check_reward_inputs, completion_texts, get_reward, row_keys


def test_completion_texts():
    conversation = [{"role": "user", "content": "describe"}, {"role": "assistant", "content": "a dog"}]
    assert completion_texts(["a cat", conversation]) == ["a cat", "a dog"]
    with pytest.raises(ValueError, match="Completion 0 is int"):
        completion_texts([3])
    with pytest.raises(ValueError, match="no string 'content'"):
        completion_texts([[{"role": "assistant"}]])


@pytest.mark.parametrize("ids", [[4, 5], np.array([4, 5]), torch.tensor([4, 5])])
def test_row_keys_accept_lists_arrays_and_tensors(ids):
    assert row_keys(ids, 2) == [4, 5]
    assert row_keys(None, 2) is None


def test_row_keys_errors():
    with pytest.raises(ValueError, match="3 values for 2"):
        row_keys([1, 2, 3], 2)
    with pytest.raises(ValueError, match="not hashable"):
        row_keys([[1], [2]], 2)
    with pytest.raises(ValueError, match="value \\{1\\} of row 1 is not hashable"):
        row_keys([7, {1}], 2)
    assert row_keys([(1, 2), "a"], 2) == [(1, 2), "a"]  # any hashable key, not only ints and strings


def test_check_reward_inputs_names_the_image():
    with pytest.raises(ValueError, match="image_id 'b' has no references"):
        check_reward_inputs(["x", "y"], [["r"], []], ["a", "b"])
    with pytest.raises(ValueError, match="row 0 are str"):
        check_reward_inputs(["x"], ["a single reference"])
    with pytest.raises(ValueError, match="References of image_id 7 are set"):
        check_reward_inputs(["x"], [{"a reference"}], [7])
    # any sequence of references, not only lists and tuples
    references = [("r",), UserList(["s"])]
    assert check_reward_inputs(["x", "y"], references)[1] == references
    for name in ("cider", "bleu"):
        with pytest.raises(ValueError, match="string"):
            get_reward(name)(completions=["x"], references=[["r", None]])


def test_built_in_rewards_follow_the_protocol():
    assert isinstance(get_reward("cider"), RewardFunc)
    assert isinstance(get_reward("rouge_l"), RewardFunc)
