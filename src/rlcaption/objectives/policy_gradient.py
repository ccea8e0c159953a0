"""
What the policy-gradient objectives share: the REINFORCE loss, sampling captions with their rewards, and the
self-critical baseline (Rennie et al., CVPR 2017).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..decoding import GeneratedCaptions, image_inputs_of
from ..rewards.processes import Pending
from .base import TrainerInterface

__all__ = ["policy_gradient_loss", "sample_and_start_rewards", "sample_and_start_rewards_with_greedy"]


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


def sample_and_start_rewards(
    trainer: TrainerInterface, inputs: dict[str, Any], num_samples: int
) -> tuple[GeneratedCaptions, torch.LongTensor, Pending[np.ndarray]]:
    """
    Samples `num_samples` captions per image of the batch from the current policy (evaluation mode, the trainer's
    sampling settings) and starts scoring them with the trainer's rewards, logged under `reward`.

    Returns:
        `tuple`: the [`GeneratedCaptions`] (`batch_size * num_samples` rows, grouped by image), the batch row of each
        caption's image (`torch.LongTensor` of shape `(batch_size * num_samples,)`) and their rewards ([`Pending`]
        `np.ndarray` of the same shape: those computed in worker processes run on until `result()`).
    """
    samples = trainer.sample_captions(image_inputs_of(inputs), num_return_sequences=num_samples)
    return (samples, *_start_sample_rewards(trainer, inputs, samples, num_samples))


def sample_and_start_rewards_with_greedy(
    trainer: TrainerInterface, inputs: dict[str, Any], num_samples: int
) -> tuple[GeneratedCaptions, torch.LongTensor, Pending[np.ndarray], Pending[np.ndarray]]:
    """
    [`sample_and_start_rewards`], and the self-critical baseline: the reward of every image's greedy caption, logged
    under `greedy`. The images are encoded once for both decodings where the captioner can.

    Returns:
        `tuple`: what [`sample_and_start_rewards`] returns, then the greedy captions' rewards ([`Pending`]
        `np.ndarray` of shape `(batch_size,)`).
    """
    samples, greedy = trainer.sample_and_greedy_captions(image_inputs_of(inputs), num_return_sequences=num_samples)
    sample_index, rewards = _start_sample_rewards(trainer, inputs, samples, num_samples)
    greedy_rewards = trainer.start_rewards(
        greedy.texts, inputs, row_index=list(range(len(inputs["references"]))), log_prefix="greedy"
    )
    return samples, sample_index, rewards, greedy_rewards


def _start_sample_rewards(
    trainer: TrainerInterface, inputs: dict[str, Any], samples: GeneratedCaptions, num_samples: int
) -> tuple[torch.LongTensor, Pending[np.ndarray]]:
    batch_size = len(inputs["references"])
    sample_index = torch.arange(batch_size, device=samples.sequences.device).repeat_interleave(num_samples)
    return sample_index, trainer.start_rewards(samples.texts, inputs, row_index=sample_index.tolist())
