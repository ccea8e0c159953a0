"""
Decoding and scoring of captions: the one place where objectives, evaluation and scripts call `generate()` and
compute log-probabilities of given captions.

Works with any transformers captioner whose `generate()` takes image inputs and returns token sequences that start
with a start token: our models (`input_ids` + `pixel_values`/`image_features`) and encoder-decoder models such as
`VisionEncoderDecoderModel` (`pixel_values` + `decoder_input_ids`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "IMAGE_INPUT_NAMES",
    "GeneratedCaptions",
    "caption_logits",
    "caption_token_mask",
    "generate_captions",
    "image_inputs_of",
    "repeat_image_inputs",
    "token_log_probs",
]

# The batch keys that carry the image, in the names of the models' forward() arguments.
IMAGE_INPUT_NAMES = ("pixel_values", "image_features")


@dataclass
class GeneratedCaptions:
    """
    Captions produced by [`generate_captions`].

    Args:
        sequences (`torch.LongTensor` of shape `(num_captions, length)`):
            Token ids, starting with the start token, padded after the end token.
        texts (`list[str]`):
            The decoded captions (special tokens removed), one per row of `sequences`.
    """

    sequences: torch.LongTensor
    texts: list[str]


def image_inputs_of(batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Returns the image tensors of a collated batch (`pixel_values` and/or `image_features`)."""
    inputs = {name: batch[name] for name in IMAGE_INPUT_NAMES if batch.get(name) is not None}
    if not inputs:
        raise ValueError(
            f"The batch has no image input: expected one of {IMAGE_INPUT_NAMES}, got keys {sorted(batch)}. "
            "Use rlcaption.data.CaptionCollator or add `pixel_values` to your collator's output."
        )
    return inputs


def repeat_image_inputs(image_inputs: Mapping[str, torch.Tensor], index: torch.LongTensor) -> dict[str, torch.Tensor]:
    """Selects rows of every image tensor, e.g. `index = arange(B).repeat_interleave(k)` for k captions per image."""
    return {name: tensor.index_select(0, index) for name, tensor in image_inputs.items()}


def _is_encoder_decoder(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


@torch.no_grad()
def generate_captions(
    model: nn.Module,
    processor: Any,
    image_inputs: Mapping[str, torch.Tensor],
    **generation_kwargs: Any,
) -> GeneratedCaptions:
    """
    Decodes captions with `model.generate(**image_inputs, **generation_kwargs)` in evaluation mode (no dropout) and
    restores the model's previous mode.

    Args:
        model: an unwrapped captioning model (not a DDP wrapper: `generate` needs the model itself).
        processor: anything with `batch_decode(sequences, skip_special_tokens=True)`.
        image_inputs: image tensors of shape `(batch_size, ...)`.
        generation_kwargs: passed to `generate`, e.g. `do_sample=True, num_return_sequences=5`.

    Returns:
        [`GeneratedCaptions`] with `batch_size * num_return_sequences` rows, grouped by image.
    """
    was_training = model.training
    model.eval()
    try:
        output = model.generate(**image_inputs, **generation_kwargs)
    finally:
        model.train(was_training)
    sequences = output.sequences if hasattr(output, "sequences") else output
    texts = [text.strip() for text in processor.batch_decode(sequences, skip_special_tokens=True)]
    return GeneratedCaptions(sequences=sequences, texts=texts)


def caption_token_mask(sequences: torch.LongTensor, eos_token_id: int) -> torch.Tensor:
    """
    Marks the predicted tokens of generated sequences: every token after the start token up to and including the
    first end token (so that padding, even when it shares the end token's id, is excluded).

    Args:
        sequences (`torch.LongTensor` of shape `(N, T)`): generated ids, the start token first.

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1)`, aligned with [`token_log_probs`].
    """
    targets = sequences[:, 1:]  # (N, T-1)
    is_eos = (targets == eos_token_id).long()
    ends_before = is_eos.cumsum(dim=1) - is_eos  # number of end tokens strictly before each position
    return (ends_before == 0).float()


def _accepts_image_index(model: nn.Module) -> bool:
    return "image_index" in inspect.signature(model.forward).parameters


def caption_logits(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    image_index: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """
    Next-token logits of given captions under teacher forcing: `logits[:, t]` scores token `t + 1`.

    Args:
        model: the (possibly DDP-wrapped) captioning model; gradients flow.
        image_inputs: image tensors, one row per caption, or one row per image with `image_index`.
        input_ids (`torch.LongTensor` of shape `(N, T)`): captions starting with the start token.
        image_index (`torch.LongTensor` of shape `(N,)`, *optional*): the row of each caption's image. Models
            whose `forward` takes `image_index` encode each image once; others get the image rows repeated.

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1, vocab_size)`.
    """
    unwrapped = model.module if hasattr(model, "module") else model
    if image_index is not None:
        if _accepts_image_index(unwrapped):
            image_inputs = {**image_inputs, "image_index": image_index}
        else:
            image_inputs = repeat_image_inputs(image_inputs, image_index)
    if _is_encoder_decoder(unwrapped):
        outputs = model(**image_inputs, decoder_input_ids=input_ids, decoder_attention_mask=attention_mask)
    else:
        outputs = model(**image_inputs, input_ids=input_ids, attention_mask=attention_mask)
    return outputs.logits[:, :-1]  # (N, T-1, V)


def token_log_probs(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    image_index: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """
    Log-probability of each token of given captions (after the start token) under the model; arguments as in
    [`caption_logits`].

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1)`; mask it with [`caption_token_mask`].
    """
    logits = caption_logits(model, image_inputs, sequences, attention_mask, image_index)  # (N, T-1, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)  # (N, T-1)
