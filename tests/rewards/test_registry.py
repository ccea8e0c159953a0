"""Reward registry: built-in names, unknown names, user registrations."""

import pytest

from rlcaption.rewards import available_rewards, get_reward, register_reward
from rlcaption.rewards import registry as registry_module


def test_built_in_rewards_are_registered():
    assert {"cider", "bleu", "rouge_l", "meteor", "spice", "spider"} <= set(available_rewards())
    assert available_rewards() == sorted(available_rewards())
    assert get_reward("bleu", n=3).__name__ == "bleu_3"


def test_unknown_name_lists_available_rewards():
    with pytest.raises(ValueError, match=r"Unknown reward 'cidr'.*bleu, cider"):
        get_reward("cidr")
    with pytest.raises(TypeError, match="reward name"):
        get_reward(len)


def test_register_user_reward(monkeypatch):
    monkeypatch.setattr(registry_module, "_REWARD_FACTORIES", dict(registry_module._REWARD_FACTORIES))

    @register_reward("caption_length")
    def build_length_reward(scale: float = 1.0):
        def caption_length(*, completions, references, **columns):
            return [scale * len(completion.split()) for completion in completions]

        return caption_length

    reward = get_reward("caption_length", scale=0.5)
    assert reward(completions=["a b c d"], references=[["x"]]) == [2.0]
    assert "caption_length" in available_rewards()
    with pytest.raises(ValueError, match="already registered"):
        register_reward("caption_length")(lambda: None)
    with pytest.raises(ValueError, match="non-empty string"):
        register_reward("")
