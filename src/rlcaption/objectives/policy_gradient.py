"""
What the policy-gradient objectives share: the REINFORCE loss, sampling captions with their rewards, the
self-critical baseline (Rennie et al., CVPR 2017), and the KL penalty to the starting policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..generation.decoding import GeneratedCaptions, caption_token_mask, image_inputs_of
from ..rewards.processes import Pending
from .base import TrainerInterface

__all__ = [
    "completion_token_ids",
    "k3_kl_divergence",
    "kl_penalty",
    "policy_gradient_loss",
    "sample_captions_to_score",
    "start_greedy_rewards",
    "start_sample_rewards",
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


def k3_kl_divergence(
    log_probs: torch.Tensor, reference_log_probs: torch.Tensor, token_mask: torch.Tensor, normalization: str
) -> torch.Tensor:
    """
    KL(π‖π_ref) of the policy π to a reference π_ref, estimated on tokens sampled from π with Schulman's k3
    estimator (http://joschu.net/blog/kl-approx.html), `exp(r) − r − 1` with `r = log π_ref(g_t) − log π(g_t)`:
    unbiased, never negative, 0 where the two agree; TRL's GRPO penalty. Averaged as [`policy_gradient_loss`] is.

    Args:
        log_probs (`torch.FloatTensor` of shape `(N, T)`): log-probabilities of the sampled tokens under the policy
            (with gradient).
        reference_log_probs (`torch.FloatTensor` of shape `(N, T)`): the same under the reference (no gradient).
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the caption's tokens (end token included).
        normalization: `token` divides the sum by the number of tokens in the batch, `sequence` by the number of
            captions.
    """
    # masked before the difference: after the end token both log-probabilities may be -inf, and -inf - -inf = NaN
    padding = token_mask == 0
    log_ratio = reference_log_probs.detach().masked_fill(padding, 0.0) - log_probs.masked_fill(padding, 0.0)  # (N, T)
    per_token = torch.exp(log_ratio) - log_ratio - 1.0  # (N, T), 0 at padding
    if normalization == "token":
        return per_token.sum() / token_mask.sum().clamp(min=1.0)
    return per_token.sum() / log_probs.size(0)


def kl_penalty(
    trainer: TrainerInterface,
    image_inputs: dict[str, torch.Tensor],
    sequences: torch.LongTensor,
    log_probs: torch.Tensor,
    token_mask: torch.Tensor,
    image_index: torch.LongTensor | None = None,
) -> torch.Tensor:
    """
    `beta · KL(π‖π_ref)` of captions the policy decoded ([`k3_kl_divergence`] with the trainer's
    `loss_normalization`), the reference's log-probabilities from `trainer.reference_token_log_probs`; the KL is
    recorded as `kl`. Add it to the loss when `trainer.args.beta > 0`.

    Args:
        image_inputs: the batch's image tensors; `image_index` as in
            [`rlcaption.generation.decoding.sample_token_log_probs`].
        sequences (`torch.LongTensor` of shape `(N, T + 1)`): the captions, starting with the start token.
        log_probs, token_mask (`torch.FloatTensor` of shape `(N, T)`): their tokens' log-probabilities under the
            policy, with gradient, and their mask.
    """
    reference_log_probs = trainer.reference_token_log_probs(image_inputs, sequences, image_index=image_index)
    kl = k3_kl_divergence(log_probs, reference_log_probs, token_mask, trainer.args.loss_normalization)
    trainer.record_metric("kl", kl)
    return trainer.args.beta * kl


def sample_captions_to_score(
    trainer: TrainerInterface, inputs: dict[str, Any], num_samples: int, greedy_baseline: bool = False
) -> tuple[GeneratedCaptions, torch.LongTensor, GeneratedCaptions | None]:
    """
    Samples `num_samples` captions per image of the batch from the current policy (evaluation mode, the trainer's
    sampling settings) and, with `greedy_baseline`, decodes every image's greedy caption (the self-critical baseline),
    each image encoded once for both where the captioner can.

    A decoding that a GPU replays as a CUDA graph comes back while the device still runs it, `max_caption_length + 1`
    tokens wide: queue the pass that scores the samples, which needs their token ids only, before reading their
    texts (to reward them), and the host queues it while the device samples rather than waiting idle.

    Returns:
        `tuple`: the samples ([`GeneratedCaptions`], `batch_size * num_samples` rows, grouped by image), the batch row
        of each sample's image (`torch.LongTensor` of shape `(batch_size * num_samples,)`, on the samples' device),
        and the greedy captions (`batch_size` rows), or None without `greedy_baseline`.
    """
    image_inputs = image_inputs_of(inputs)
    if greedy_baseline:
        samples, greedy = trainer.sample_and_greedy_captions(image_inputs, num_samples, trim=False)
    else:
        samples, greedy = trainer.sample_captions(image_inputs, num_samples, trim=False), None
    return samples, _sample_index(inputs, samples, num_samples), greedy


def start_sample_rewards(
    trainer: TrainerInterface, inputs: dict[str, Any], samples: GeneratedCaptions, num_samples: int
) -> Pending[np.ndarray]:
    """Starts scoring the samples of [`sample_captions_to_score`] with the trainer's rewards, logged under `reward`:
    those computed in worker processes run on until `result()`. Reads the samples' texts."""
    row_index = [row for row in range(len(inputs["references"])) for _ in range(num_samples)]
    texts = samples.texts
    completion_ids = completion_token_ids(samples, trainer.eos_token_id)
    return trainer.start_rewards(texts, inputs, row_index=row_index, completion_ids=completion_ids)


def start_greedy_rewards(
    trainer: TrainerInterface, inputs: dict[str, Any], greedy: GeneratedCaptions
) -> Pending[np.ndarray]:
    """Starts scoring every image's greedy caption, the self-critical baseline, logged under `greedy`."""
    texts = greedy.texts
    return trainer.start_rewards(
        texts,
        inputs,
        row_index=list(range(len(inputs["references"]))),
        log_prefix="greedy",
        completion_ids=completion_token_ids(greedy, trainer.eos_token_id),
    )


def completion_token_ids(captions: GeneratedCaptions, end_token_id: int) -> list[list[int]]:
    """Each caption's token ids after its start token, up to its end token included, without padding: TRL's
    `completion_ids`. Read after the captions' texts, which wait for the decoding already."""
    sequences = captions.sequences[:, 1:]  # (N, T)
    lengths = caption_token_mask(captions.sequences, end_token_id).sum(dim=1)  # (N,)
    return [row[:length] for row, length in zip(sequences.tolist(), lengths.long().tolist(), strict=True)]


def _sample_index(inputs: dict[str, Any], samples: GeneratedCaptions, num_samples: int) -> torch.LongTensor:
    batch_size = len(inputs["references"])
    return torch.arange(batch_size, device=samples.sequences.device).repeat_interleave(num_samples)
