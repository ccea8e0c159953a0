"""
Self-critical sequence training (Rennie et al., CVPR 2017): REINFORCE on sampled captions with a baseline that does
not depend on the sample, `grad ≈ −(R(g) − b) grad log p(g | x)`, optionally with a maximum-entropy bonus (the
"SLL-ME" baseline of Chen & Jin 2020's sequence-level exploration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..generation.decoding import (
    caption_token_mask,
    image_inputs_of,
    sample_token_log_probs,
    sample_token_log_probs_and_entropies,
)
from ..rl_config import RLCaptionConfig
from .base import CaptionObjective, TrainerInterface, register_objective, reward_tensor
from .policy_gradient import (
    kl_penalty,
    policy_gradient_loss,
    sample_captions_to_score,
    start_greedy_rewards,
    start_sample_rewards,
)

__all__ = [
    "BASELINES",
    "SCSTConfig",
    "SCSTObjective",
    "check_self_critical_baseline",
    "mean_of_other_samples",
    "mean_token_entropy",
    "self_critical_loss",
]

# What the reward of a sample is compared with: the greedy caption's reward (self-critical, Rennie et al. 2017), the
# mean reward of the image's other samples, or nothing.
BASELINES = ("greedy", "mean_of_others", "none")


def check_self_critical_baseline(baseline: str, num_samples_per_image: int) -> None:
    """Raises for a `baseline` that is not one of [`BASELINES`], or one that the samples per image cannot give."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is not one of {BASELINES}.")
    if baseline == "mean_of_others" and num_samples_per_image < 2:
        raise ValueError(
            f"baseline='mean_of_others' needs num_samples_per_image >= 2, got {num_samples_per_image}: an image's "
            "sample needs other samples to be compared with."
        )


@dataclass
class SCSTConfig(RLCaptionConfig):
    """
    Configuration of `objective="scst"`: the reward baseline and the entropy bonus, besides the shared fields of
    [`RLCaptionConfig`] (samples per image, rewards, sampling).
    """

    objective: str = field(default="scst", metadata={"help": "Training objective: `scst`."})
    baseline: str = field(
        default="greedy",
        metadata={
            "help": "Reward baseline of `scst`: `greedy` (reward of the greedy caption, Rennie et al. 2017), "
            "`mean_of_others` (mean reward of the other samples of the same image) or `none`."
        },
    )
    entropy_bonus_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight w of a maximum-entropy bonus in `scst`: the loss gets -w * H, H the mean entropy of the "
            "policy's next-word distributions at the prefixes of the sampled captions. 1e-2 gives the SLL-ME "
            "baseline of Chen & Jin 2020; 0 disables it."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_self_critical_baseline(self.baseline, self.num_samples_per_image)
        if self.entropy_bonus_weight < 0:
            raise ValueError(f"entropy_bonus_weight must be >= 0 (0 disables it), got {self.entropy_bonus_weight}.")


def mean_of_other_samples(rewards: np.ndarray) -> np.ndarray:
    """
    For every sample, the mean reward of the other samples of its image (the "new self-critical" baseline), over the
    samples some reward scored (NaN marks one that none did); NaN when no other sample was scored.

    Args:
        rewards (`np.ndarray` of shape `(batch_size, num_samples)`): the rewards of each image's samples.

    Returns:
        `np.ndarray` of shape `(batch_size, num_samples)`.
    """
    scored = ~np.isnan(rewards)
    values = np.where(scored, rewards, 0.0)
    others = values.sum(axis=1, keepdims=True) - values
    with np.errstate(invalid="ignore", divide="ignore"):
        return others / (scored.sum(axis=1, keepdims=True) - scored)


def mean_token_entropy(token_entropies: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """
    The mean entropy of the policy's next-token distributions over the tokens of a batch of captions.

    Args:
        token_entropies (`torch.FloatTensor` of shape `(N, T)`): entropy of the distribution each token was drawn
            from (see [`rlcaption.generation.decoding.sample_token_log_probs_and_entropies`]).
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the caption's tokens (end token included).
    """
    return token_entropies.masked_fill(token_mask == 0, 0.0).sum() / token_mask.sum().clamp(min=1.0)


def self_critical_loss(
    trainer: TrainerInterface,
    model: nn.Module,
    inputs: dict[str, Any],
    baseline: str,
    entropy_bonus_weight: float = 0.0,
    with_kl_penalty: bool = False,
) -> torch.Tensor:
    """
    The SCST loss of a batch: REINFORCE on `num_samples_per_image` captions sampled per image, scored by the
    trainer's rewards against `baseline` (one of [`BASELINES`]), with `−w · H` added for an `entropy_bonus_weight` w >
    0, and with `with_kl_penalty` the KL penalty `beta · KL(π‖π_ref)` of [`kl_penalty`] (`trainer.args.beta`).
    [`SCSTObjective`]'s loss, and the naturalness term of `psst` (without the penalty).
    """
    args = trainer.args
    num_samples = args.num_samples_per_image
    batch_size = len(inputs["references"])

    # 1. sample k captions per image from the current policy (and decode the greedy baseline of the same images); on
    # a GPU the device may still be sampling when this returns
    samples, sample_index, greedy = sample_captions_to_score(
        trainer, inputs, num_samples, greedy_baseline=baseline == "greedy"
    )

    # 2. the samples' log-probabilities under the distribution that sampled them (evaluation mode, no dropout: see
    # rlcaption.generation.decoding), with gradient, through the wrapped model; with the entropy bonus, also the
    # entropies of the same forward pass. Queued before the texts are read for the rewards, which waits for the
    # samples.
    image_inputs = image_inputs_of(inputs)
    mask = caption_token_mask(samples.sequences, trainer.eos_token_id)
    if entropy_bonus_weight == 0:
        log_probs = sample_token_log_probs(model, image_inputs, samples.sequences, image_index=sample_index)
    else:
        log_probs, entropies = sample_token_log_probs_and_entropies(
            model, image_inputs, samples.sequences, image_index=sample_index
        )
    pending_rewards = start_sample_rewards(trainer, inputs, samples, num_samples)
    pending_greedy = None if greedy is None else start_greedy_rewards(trainer, inputs, greedy)

    # 3. baseline, independent of the sample it is subtracted from
    rewards = pending_rewards.result()  # (B*k,)
    if baseline == "greedy":
        baselines = np.repeat(pending_greedy.result(), num_samples)
    elif baseline == "mean_of_others":
        baselines = mean_of_other_samples(rewards.reshape(batch_size, num_samples)).reshape(-1)
    else:
        baselines = np.zeros_like(rewards)
    # a sample no reward scored (NaN: every reward returned None), or one without a baseline, carries no learning
    # signal: advantage 0, as in TRL
    advantages = reward_tensor(np.nan_to_num(rewards - baselines, nan=0.0), samples.sequences.device)
    trainer.record_metric("advantage_std", advantages.std() if advantages.numel() > 1 else 0.0)
    trainer.record_metric("sample_length", mask.sum(dim=1).mean())
    loss = policy_gradient_loss(log_probs, mask, advantages, args.loss_normalization)
    if with_kl_penalty:
        # 4. KL penalty to the starting policy, on the same samples
        loss = loss + kl_penalty(trainer, image_inputs, samples.sequences, log_probs, mask, image_index=sample_index)
    if entropy_bonus_weight == 0:
        return loss

    # 5. maximum-entropy bonus (SLL-ME)
    entropy = mean_token_entropy(entropies, mask)
    trainer.record_metric("entropy", entropy)
    return loss - entropy_bonus_weight * entropy


@register_objective
class SCSTObjective(CaptionObjective):
    """
    Samples `num_samples_per_image` captions per image, scores them with the trainer's rewards, and applies
    REINFORCE with the `baseline` of the config: the greedy caption's reward (self-critical), the mean reward of the
    image's other samples ("new self-critical"), or none. With `entropy_bonus_weight` w > 0, the loss also gets
    `−w · H`, H the mean entropy of the policy's next-token distributions at the samples' prefixes: the "SLL-ME"
    baseline of Chen & Jin 2020 (maximum-entropy regularisation of the policy, w = 1e-2); without it, SCST is their
    "SLL".

    Sampling and scoring both run in evaluation mode (no dropout), so that at `temperature=1` without `top_k` or
    `top_p` the log-probabilities are exactly those of the distribution that drew the samples; dropout then does not
    regularise SCST steps. The scored distribution is always the model's own: `temperature`, `top_k` and `top_p`
    change which captions are explored, not what is scored.
    """

    name = "scst"
    config_class = SCSTConfig
    # a sample that no reward scores gets advantage 0 (see RLCaptionTrainer.start_rewards)
    masks_unscored_captions = True

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args = self.args
        return self_critical_loss(
            self.trainer, model, inputs, args.baseline, args.entropy_bonus_weight, with_kl_penalty=args.beta > 0
        )
