"""
Self-critical sequence training (Rennie et al., CVPR 2017; SPEC.md, common ground):
REINFORCE on sampled captions with a baseline that does not depend on the sample,
`grad ≈ −(R(g) − b) grad log p(g | x)`, optionally with a maximum-entropy bonus (seed 002's "SLL-ME" baseline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..decoding import (
    GeneratedCaptions,
    caption_token_mask,
    image_inputs_of,
    sample_token_log_probs,
    sample_token_log_probs_and_entropies,
)
from .base import CaptionObjective, register_objective

if TYPE_CHECKING:
    from ..trainer.rl_trainer import RLCaptionTrainer

__all__ = [
    "SCSTObjective",
    "greedy_caption_rewards",
    "mean_token_entropy",
    "policy_gradient_loss",
    "sample_and_reward",
]


def policy_gradient_loss(
    token_log_probs: torch.Tensor, token_mask: torch.Tensor, advantages: torch.Tensor, normalization: str
) -> torch.Tensor:
    """
    REINFORCE loss `−Σ_t A · log p(g_t | g_<t, x)` of a batch of sampled captions.

    Args:
        token_log_probs (`torch.FloatTensor` of shape `(N, T)`): log-probabilities of the sampled tokens.
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the caption's tokens (end token included).
        advantages (`torch.FloatTensor` of shape `(N,)` or `(N, T)`): reward minus baseline, per caption or token.
        normalization: `token` divides the sum by the number of tokens in the batch, `sequence` by the number of
            captions.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N, 1), broadcast over tokens
    # masked_fill, not a product: the log-probability of padding after the end token may be -inf, and 0 * -inf = NaN
    masked_log_probs = token_log_probs.masked_fill(token_mask == 0, 0.0)
    weighted = -(advantages.detach() * masked_log_probs)  # (N, T)
    if normalization == "token":
        return weighted.sum() / token_mask.sum().clamp(min=1.0)
    return weighted.sum() / token_log_probs.size(0)


def mean_token_entropy(token_entropies: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """
    The mean entropy of the policy's next-token distributions over the tokens of a batch of captions.

    Args:
        token_entropies (`torch.FloatTensor` of shape `(N, T)`): entropy of the distribution each token was drawn
            from (see [`rlcaption.decoding.sample_token_log_probs_and_entropies`]).
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the caption's tokens (end token included).
    """
    return token_entropies.masked_fill(token_mask == 0, 0.0).sum() / token_mask.sum().clamp(min=1.0)


def sample_and_reward(
    trainer: RLCaptionTrainer, inputs: dict[str, Any], num_samples: int
) -> tuple[GeneratedCaptions, torch.LongTensor, np.ndarray]:
    """
    Samples `num_samples` captions per image of the batch from the current policy (evaluation mode, the trainer's
    sampling settings) and scores them with the trainer's rewards, logged under `reward`.

    Returns:
        `tuple`: the [`GeneratedCaptions`] (`batch_size * num_samples` rows, grouped by image), the batch row of each
        caption's image (`torch.LongTensor` of shape `(batch_size * num_samples,)`) and their rewards (`np.ndarray`
        of the same shape).
    """
    batch_size = len(inputs["references"])
    samples = trainer.sample_captions(image_inputs_of(inputs), num_return_sequences=num_samples)
    sample_index = torch.arange(batch_size, device=samples.sequences.device).repeat_interleave(num_samples)
    rewards = trainer.compute_rewards(samples.texts, inputs, row_index=sample_index.tolist())
    return samples, sample_index, rewards


def greedy_caption_rewards(trainer: RLCaptionTrainer, inputs: dict[str, Any]) -> np.ndarray:
    """
    The self-critical baseline: the reward of every image's greedy caption, logged under `greedy`.

    Returns:
        `np.ndarray` of shape `(batch_size,)`.
    """
    greedy = trainer.greedy_captions(image_inputs_of(inputs))
    return trainer.compute_rewards(
        greedy.texts, inputs, row_index=list(range(len(inputs["references"]))), log_prefix="greedy"
    )


@register_objective
class SCSTObjective(CaptionObjective):
    """
    Samples `num_samples_per_image` captions per image, scores them with the trainer's rewards, and applies
    REINFORCE with the `baseline` of the config: the greedy caption's reward (self-critical), the mean reward of the
    image's other samples ("new self-critical"), or none. With `entropy_bonus_weight` w > 0, the loss also gets
    `−w · H`, H the mean entropy of the policy's next-token distributions at the samples' prefixes: seed 002's
    "SLL-ME" baseline (maximum-entropy regularisation of the policy, w = 1e-2); without it, SCST is its "SLL".

    Sampling and scoring both run in evaluation mode (no dropout), so that at `temperature=1` without `top_k` or
    `top_p` the log-probabilities are exactly those of the distribution that drew the samples; dropout then does not
    regularise SCST steps. The scored distribution is always the model's own: `temperature`, `top_k` and `top_p`
    change which captions are explored, not what is scored.
    """

    name = "scst"

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args, trainer = self.args, self.trainer
        num_samples = args.num_samples_per_image
        batch_size = len(inputs["references"])

        # 1. sample k captions per image from the current policy
        samples, sample_index, rewards = sample_and_reward(trainer, inputs, num_samples)  # rewards: (B*k,)

        # 2. baseline, independent of the sample it is subtracted from
        if args.baseline == "greedy":
            baselines = np.repeat(greedy_caption_rewards(trainer, inputs), num_samples)
        elif args.baseline == "mean_of_others":
            per_image = rewards.reshape(batch_size, num_samples)
            baselines = ((per_image.sum(axis=1, keepdims=True) - per_image) / (num_samples - 1)).reshape(-1)
        else:
            baselines = np.zeros_like(rewards)
        advantages = torch.as_tensor(rewards - baselines, dtype=torch.float32, device=samples.sequences.device)

        # 3. policy gradient on the samples' log-probabilities under the distribution that sampled them (evaluation
        # mode, no dropout: see rlcaption.decoding), with gradient, through the wrapped model
        image_inputs = image_inputs_of(inputs)
        mask = caption_token_mask(samples.sequences, trainer.eos_token_id)
        trainer.record_metric("advantage_std", float(advantages.std()) if advantages.numel() > 1 else 0.0)
        trainer.record_metric("sample_length", float(mask.sum(dim=1).mean()))
        if args.entropy_bonus_weight == 0:
            log_probs = sample_token_log_probs(model, image_inputs, samples.sequences, image_index=sample_index)
            return policy_gradient_loss(log_probs, mask, advantages, args.loss_normalization)

        # 4. maximum-entropy bonus (SLL-ME), its entropies from the forward pass that scores the samples
        log_probs, entropies = sample_token_log_probs_and_entropies(
            model, image_inputs, samples.sequences, image_index=sample_index
        )
        entropy = mean_token_entropy(entropies, mask)
        trainer.record_metric("entropy", float(entropy.detach()))
        loss = policy_gradient_loss(log_probs, mask, advantages, args.loss_normalization)
        return loss - args.entropy_bonus_weight * entropy
