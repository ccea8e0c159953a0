"""Teacher forcing with cross-entropy ("XE"/"MLE"): the warm start of every RL method."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..generation.decoding import caption_logits, image_inputs_of
from .base import CaptionObjective, register_objective

__all__ = ["XEObjective", "label_smoothed_cross_entropy"]


def label_smoothed_cross_entropy(
    logits: torch.Tensor, targets: torch.LongTensor, smoothing: float = 0.0, ignore_index: int = -100
) -> torch.Tensor:
    """
    Cross-entropy with label smoothing spread over the tokens the model can predict, averaged over scored tokens.

    A model may rule tokens out by giving them the lowest score of the logits' dtype (ShowTellRL does so for `<pad>`
    and `<bos>`) or `-inf`. PyTorch's `label_smoothing` and transformers' `LabelSmoother` spread the smoothing mass
    over the whole vocabulary, so they add `-log p(t)` for tokens whose probability the model fixed at 0 by design:
    about 3.4e38 per such token in float32 and bfloat16 (two of them overflow to an infinite loss), about 65504 in
    float16 (a finite loss dominated by them). Here the uniform part of the target covers only the tokens scored
    above that minimum at each position, so the loss is the usual smoothed cross-entropy over the tokens the model
    can actually emit:

        `(1 - smoothing) * -log p(target) + smoothing * mean over predictable tokens t of -log p(t)`

    With `smoothing = 0` this is `F.cross_entropy(logits, targets, ignore_index=ignore_index)`; when no token is
    ruled out it equals `F.cross_entropy(..., label_smoothing=smoothing)` and `LabelSmoother(smoothing)`.

    Args:
        logits (`torch.Tensor` of shape `(..., vocab_size)`): next-token scores, in any float dtype (computed in
            float32).
        targets (`torch.LongTensor` of shape `(...)`): target token ids, `ignore_index` where nothing is scored.
        smoothing (`float`, *optional*, defaults to 0.0): the label smoothing factor, in [0, 1).
        ignore_index (`int`, *optional*, defaults to -100): target value of unscored positions.

    Returns:
        `torch.Tensor`: the float32 scalar mean over scored positions.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)
    scored = targets != ignore_index
    negative_log_likelihood = -log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    if smoothing:
        # Compared in the logits' own dtype: the minimum of float16 or bfloat16 is not float32's.
        ruled_out = logits <= torch.finfo(logits.dtype).min
        uniform = -log_probs.masked_fill(ruled_out, 0.0).sum(-1) / (~ruled_out).sum(-1)
        negative_log_likelihood = (1.0 - smoothing) * negative_log_likelihood + smoothing * uniform
    # masked rather than selected (`[scored]`), which would wait for the device to count the scored tokens
    return negative_log_likelihood.masked_fill(~scored, 0.0).sum() / scored.sum()


@register_objective
class XEObjective(CaptionObjective):
    """
    Cross-entropy of the reference captions, averaged over their tokens, with optional label smoothing
    (`label_smoothing_factor`) over the tokens the model can predict (see [`label_smoothed_cross_entropy`]). Each
    image is paired with all its references or `xe_captions_per_image` of them.
    """

    name = "xe"
    uses_rewards = False

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        input_ids = inputs["caption_input_ids"]  # (N, T)
        attention_mask = inputs["caption_attention_mask"]  # (N, T)
        logits = caption_logits(
            model, image_inputs_of(inputs), input_ids, attention_mask, image_index=inputs["caption_image_index"]
        )  # (N, T-1, V)
        targets = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, -100)  # (N, T-1)
        loss = label_smoothed_cross_entropy(logits, targets, smoothing=self.args.label_smoothing_factor)
        self.trainer.record_metric("num_caption_tokens", (targets != -100).sum())
        return loss
