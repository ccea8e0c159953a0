"""
Sequence-level exploration (Chen & Jin 2020, eqs. 8 and 13-16): policy gradient on
`α E[Δ(y)] + (1 − α) E_{y,y'}[d(y, y')]`, the precision of sampled captions (a reward, CIDEr-D by default) plus the
distance between two independent samples of the same image, so that the policy explores captions that are right and
differ from each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..generation.decoding import caption_token_mask, image_inputs_of, sample_token_log_probs
from ..metrics.diversity import PAIRWISE_DISTANCES, pairwise_caption_distances
from ..rl_config import RLCaptionConfig
from .base import CaptionObjective, register_objective, reward_tensor
from .policy_gradient import (
    kl_penalty,
    policy_gradient_loss,
    sample_captions_to_score,
    start_greedy_rewards,
    start_sample_rewards,
)

__all__ = ["SLEConfig", "SLEObjective", "sequence_level_exploration_advantages", "sequence_level_exploration_loss"]


def sequence_level_exploration_advantages(
    rewards: torch.Tensor, greedy_rewards: torch.Tensor, distances: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    The multiplier of `−log p(ỹ_j)` in Chen & Jin's surrogate loss (eq. 16), `α · precision + (1 − α) · diversity`,
    and its two terms, each with its baseline:

    - Precision: `Δ(ỹ_j) − b_p`, with `b_p = Δ(greedy caption)`.
    - Diversity: `(1 / s) Σ_{k≠j} (d(ỹ_j, ỹ_k) + d(ỹ_k, ỹ_j) − 2 b_d)`, with `b_d` the mean of the distances of
      the `s (s − 1)` ordered pairs of distinct samples; for a symmetric d with `d(y, y) = 0` it is eq. 16's
      `(2 / s) Σ_k (d(ỹ_j, ỹ_k) − b_d)` exactly.

    Args:
        rewards (`torch.FloatTensor` of shape `(B * s,)`): the reward Δ of every sample, the `s` samples of an
            image in consecutive rows.
        greedy_rewards (`torch.FloatTensor` of shape `(B,)`): the reward of every image's greedy caption.
        distances (`torch.FloatTensor` of shape `(B, s, s)`): `distances[i, j, k] = d(ỹ_j, ỹ_k)` among the samples
            of image i; the diagonal is ignored.
        alpha (`float`): weight of precision against diversity, in [0, 1]; 1 is SCST with the greedy baseline.

    Returns:
        `tuple[torch.FloatTensor, torch.FloatTensor, torch.FloatTensor]`: the advantages, their precision term and
        their diversity term, each of shape `(B * s,)`.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    if distances.dim() != 3 or distances.size(1) < 2 or distances.size(1) != distances.size(2):
        raise ValueError(
            f"distances must have shape (batch_size, s, s) with s >= 2 samples per image, got "
            f"{tuple(distances.shape)}."
        )
    batch_size, num_samples, _ = distances.shape
    if rewards.shape != (batch_size * num_samples,) or greedy_rewards.shape != (batch_size,):
        raise ValueError(
            f"Expected rewards of shape ({batch_size * num_samples},) and greedy_rewards of shape ({batch_size},) "
            f"for {batch_size} images of {num_samples} samples, got {tuple(rewards.shape)} and "
            f"{tuple(greedy_rewards.shape)}."
        )
    # Chen & Jin 2020, eq. 16: precision term with the greedy caption's reward as baseline
    precision = rewards - greedy_rewards.repeat_interleave(num_samples)  # (B*s,)
    # NaN where no reward scored the sample or its greedy caption (every reward returned None): no precision signal
    precision = torch.nan_to_num(precision, nan=0.0)

    # Chen & Jin 2020, eqs. 13-16: diversity term over the ordered pairs of distinct samples, mean-distance baseline.
    # Why not eq. 16's `(2 / s) Σ_k` over every k: the diversity term E_{y,y'}[d(y, y')] depends on θ through both
    # captions, so its gradient is E[(d(y, y') + d(y', y)) ∇log p(y)] (eq. 13); eq. 14 writes it 2 E[d(y, y')
    # ∇log p(y)], which assumes a symmetric d, but the BLEU distance is not symmetric (brevity penalty): hence both
    # directions. Eq. 14 estimates the expectation over two independent captions with all s² pairs of samples, but a
    # sample paired with itself is no such pair (and the BLEU distance of a caption of fewer than 4 words to itself is
    # not even 0). The sum runs over the pairs of distinct samples, with b_d their mean, so an image's diversity
    # advantages sum to 0; the scale stays eq. 16's 1 / s (per direction), so that for a symmetric d with d(y, y) = 0
    # the term is the paper's exactly and `sle_alpha` weighs precision against diversity as the paper's α does. As in
    # the paper, b_d includes each sample's own pairs, a slight dependence on the sample that a baseline should not
    # have.
    off_diagonal = 1.0 - torch.eye(num_samples, dtype=distances.dtype, device=distances.device)  # (s, s)
    pair_distances = distances * off_diagonal  # (B, s, s)
    mean_distance = pair_distances.sum(dim=(1, 2)) / (num_samples * (num_samples - 1))  # b_d, (B,)
    both_directions = pair_distances.sum(dim=2) + pair_distances.sum(dim=1)  # Σ_{k≠j} d_jk + d_kj, (B, s)
    diversity = ((both_directions - 2 * (num_samples - 1) * mean_distance[:, None]) / num_samples).reshape(-1)
    return alpha * precision + (1.0 - alpha) * diversity, precision, diversity


def sequence_level_exploration_loss(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    greedy_rewards: torch.Tensor,
    distances: torch.Tensor,
    alpha: float,
    normalization: str,
) -> torch.Tensor:
    """
    Chen & Jin's surrogate loss (eqs. 15-16) of a batch of images with `s` samples each:
    `(1/s) Σ_j −[α (Δ(ỹ_j) − b_p) + (1 − α) A_d(ỹ_j)] log p(ỹ_j)`, the diversity advantage `A_d` of
    [`sequence_level_exploration_advantages`], averaged over images (`normalization="sequence"`) or over tokens.

    Args:
        log_probs (`torch.FloatTensor` of shape `(B * s, T)`): log-probabilities of the samples' tokens.
        mask (`torch.FloatTensor` of shape `(B * s, T)`): 1 on the samples' tokens (end token included).
        rewards, greedy_rewards, distances: as in [`sequence_level_exploration_advantages`].
        alpha (`float`): as in [`sequence_level_exploration_advantages`].
        normalization (`str`): `sequence` or `token`, as in [`policy_gradient_loss`].

    Returns:
        `torch.FloatTensor`: the scalar loss.
    """
    advantages, _, _ = sequence_level_exploration_advantages(rewards, greedy_rewards, distances, alpha)
    return policy_gradient_loss(log_probs, mask, advantages.to(log_probs.dtype), normalization)


@dataclass
class SLEConfig(RLCaptionConfig):
    """
    Configuration of `objective="sle"` (Chen & Jin 2020): the weight of precision against diversity and the distance
    between two samples, besides the shared fields of [`RLCaptionConfig`]. The paper's baselines SLL and SLL-ME are
    `scst` runs, configured by [`SCSTConfig`].
    """

    objective: str = field(default="sle", metadata={"help": "Training objective: `sle`."})
    sle_alpha: float = field(
        default=0.75,
        metadata={
            "help": "Weight α of precision (the rewards) against diversity (the distances between an image's "
            "`num_samples_per_image` samples) in the `sle` loss, Chen & Jin's eqs. 15-16: 1 is SCST with the greedy "
            "baseline, 0 trains for diversity alone. The paper uses 0.75."
        },
    )
    sle_distance: str = field(
        default="bleu",
        metadata={
            "help": "Distance d between two samples of an image in `sle`: `bleu`, 1 - (BLEU-3 + BLEU-4) / 2 of one "
            "caption against the other as its single reference (the paper's), or `edit`, the word-level edit "
            "distance divided by the longer caption's length."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.sle_alpha <= 1.0:
            raise ValueError(f"sle_alpha must be in [0, 1] (1 is precision only), got {self.sle_alpha}.")
        if self.sle_distance not in PAIRWISE_DISTANCES:
            raise ValueError(f"sle_distance={self.sle_distance!r} is not one of {PAIRWISE_DISTANCES}.")
        if self.num_samples_per_image < 2:
            raise ValueError(
                f"objective='sle' compares the samples of each image with each other: it needs "
                f"num_samples_per_image >= 2, got {self.num_samples_per_image} (the paper uses 5)."
            )


@register_objective
class SLEObjective(CaptionObjective):
    """
    Sequence-level exploration (Chen & Jin 2020): samples `num_samples_per_image` captions per image (s, 5 in the
    paper), scores their precision with the trainer's rewards against the greedy caption's reward, and their diversity
    with the `sle_distance` between every two samples of the image against the mean distance, weighted by `sle_alpha`
    (see [`sequence_level_exploration_loss`]).

    Samples are drawn and scored in evaluation mode, as [`SCSTObjective`] does. Besides the rewards (`reward`,
    `greedy`), it logs the mean distance between two samples of an image (`pairwise_distance`) and the standard
    deviations of the precision, diversity and combined advantages.
    """

    name = "sle"
    config_class = SLEConfig
    # a sample that no reward scores gets precision advantage 0 (see RLCaptionTrainer.start_rewards)
    masks_unscored_captions = True

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args, trainer = self.args, self.trainer
        num_samples = args.num_samples_per_image
        batch_size = len(inputs["references"])

        # 1. s captions per image from the current policy, and the greedy baseline; on a GPU the device may still be
        # sampling when this returns
        samples, sample_index, greedy = sample_captions_to_score(trainer, inputs, num_samples, greedy_baseline=True)

        # 2. the samples' log-probabilities under the distribution that sampled them, queued before their texts are
        # read (which waits for the samples); then their precision rewards and the distances between the samples of
        # each image, on the tokens the rewards see
        device = samples.sequences.device
        image_inputs = image_inputs_of(inputs)
        log_probs = sample_token_log_probs(model, image_inputs, samples.sequences, image_index=sample_index)
        pending_rewards = start_sample_rewards(trainer, inputs, samples, num_samples)
        pending_greedy = start_greedy_rewards(trainer, inputs, greedy)
        distances = np.stack(
            [
                pairwise_caption_distances(
                    samples.texts[image * num_samples : (image + 1) * num_samples], args.sle_distance, normalize=True
                )
                for image in range(batch_size)
            ]
        )  # (B, s, s)

        # 3. the surrogate loss
        distances_tensor = reward_tensor(distances, device)  # copied without waiting for the scoring pass
        rewards = pending_rewards.result()  # (B*s,)
        rewards_tensor = reward_tensor(rewards, device)
        greedy_tensor = reward_tensor(pending_greedy.result(), device)  # (B,)
        mask = caption_token_mask(samples.sequences, trainer.eos_token_id)
        loss = sequence_level_exploration_loss(
            log_probs, mask, rewards_tensor, greedy_tensor, distances_tensor, args.sle_alpha, args.loss_normalization
        )

        advantages, precision, diversity = sequence_level_exploration_advantages(
            rewards_tensor, greedy_tensor, distances_tensor, args.sle_alpha
        )
        off_diagonal = ~np.eye(num_samples, dtype=bool)
        trainer.record_metric("pairwise_distance", float(distances[:, off_diagonal].mean()))
        # at least 2 samples per image (s >= 2): the standard deviations are defined
        trainer.record_metric("precision_advantage_std", precision.std())
        trainer.record_metric("diversity_advantage_std", diversity.std())
        trainer.record_metric("advantage_std", advantages.std())
        trainer.record_metric("sample_length", mask.sum(dim=1).mean())
        if args.beta > 0:
            # 4. KL penalty to the starting policy, on the same samples
            loss = loss + kl_penalty(trainer, image_inputs, samples.sequences, log_probs, mask, sample_index)
        return loss
