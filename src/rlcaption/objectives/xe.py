"""Teacher forcing with cross-entropy ("XE"/"MLE"): the warm start of every RL method (SPEC.md, common ground)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..decoding import caption_logits, image_inputs_of
from .base import CaptionObjective, register_objective

__all__ = ["XEObjective"]


@register_objective
class XEObjective(CaptionObjective):
    """
    Cross-entropy of the reference captions, averaged over their tokens, with optional label smoothing
    (`label_smoothing_factor`). Each image is paired with all its references or `xe_captions_per_image` of them.
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
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            targets.reshape(-1),
            ignore_index=-100,
            label_smoothing=self.args.label_smoothing_factor,
        )
        self.trainer.record_metric("num_caption_tokens", float((targets != -100).sum()))
        return loss
