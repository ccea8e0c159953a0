"""Reward functions for RL captioning: a TRL-compatible protocol, a registry, weighted mixes and metric rewards.

```python
>>> from rlcaption.rewards import get_reward, RewardMix
>>> cider = get_reward("cider", document_frequencies=train_references)  # one list of captions per image
>>> cider(completions=["a dog on a couch"], references=[["a dog lying on a sofa", ...]], image_id=[42])
>>> mix = RewardMix(["bleu", cider], weights=[0.5, 1.0])
>>> total, per_reward = mix.score(completions=..., references=..., image_id=...)
>>> # or grouped per image, each image column once per image (rewards with `score_groups` see the groups)
>>> total, per_reward = mix.score_groups(completions=[[...], [...]], references=[[...], [...]], image_id=[42, 43])
```

Rewards with a `prepare(train_dataset, processor)` method (e.g. `cider` without `document_frequencies`) are prepared
once before training with `prepare_reward(func, train_dataset, processor)` or `RewardMix.prepare`.
"""

from .base import (
    GroupRewardFunc,
    RewardFunc,
    check_reward_inputs,
    completion_texts,
    group_sizes,
    is_group_reward,
    prepare_reward,
    reward_name,
    row_keys,
)
from .clip_rewards import ClipScoreReward
from .contrastive import ContrastiveReward  # noqa: F401  (registers the `clip_contrastive` reward)
from .embedding import EmbeddingReward  # noqa: F401  (registers the `embedding` reward)
from .metric_rewards import (
    BleuReward,
    CiderReward,
    MeteorReward,
    MetricReward,
    RougeReward,
    SpiceReward,
    SpiderReward,
)
from .mix import RewardMix
from .processes import Pending, RewardProcesses, scores_captions_independently
from .registry import available_rewards, get_reward, register_reward, reward_parameters, reward_reads_images

__all__ = [
    "RewardFunc",
    "GroupRewardFunc",
    "is_group_reward",
    "prepare_reward",
    "reward_name",
    "completion_texts",
    "group_sizes",
    "check_reward_inputs",
    "row_keys",
    "register_reward",
    "reward_parameters",
    "reward_reads_images",
    "get_reward",
    "available_rewards",
    "RewardMix",
    "Pending",
    "RewardProcesses",
    "scores_captions_independently",
    "MetricReward",
    "CiderReward",
    "BleuReward",
    "RougeReward",
    "MeteorReward",
    "SpiceReward",
    "SpiderReward",
    "ClipScoreReward",
]
