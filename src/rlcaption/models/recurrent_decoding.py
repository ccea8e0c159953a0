"""
Sampling and greedy decoding of rlcaption's recurrent captioners in one tight loop over their RL interface
(`initial_state`, `step`), for the plain settings RL training decodes with.

`generate()` is general: at every token it prepares model inputs, runs its logits processors and stopping criteria
and asks the device whether every caption has ended. A step of a small LSTM captioner costs a GPU much less than
that bookkeeping costs the host, and each question stalls the host until the device has caught up, so on a GPU
`generate()` leaves the device idle most of the time. This loop computes the same thing — the same network calls,
the same logits warpers in the same order, the same draw from torch's generator, so the same sequences for the same
seed — and asks whether all captions have ended only every few tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

__all__ = ["decode_recurrent", "decodes_plainly", "logits_warpers"]

# The settings this loop honours; any other setting a config changes from the library defaults is left to generate().
PLAIN_SETTINGS = frozenset(
    {
        "do_sample", "num_beams", "temperature", "top_k", "top_p", "max_new_tokens", "num_return_sequences",
        "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "_from_model_config",
    }
)  # fmt: skip
# Tokens decoded between two checks of whether every caption has ended: each check waits for the device, and a few
# steps past the end of the last caption cost less than a wait per token.
STEPS_BETWEEN_END_CHECKS = 4


def decodes_plainly(config: GenerationConfig) -> bool:
    """Whether [`decode_recurrent`] decodes `config` exactly as `generate()` would: one beam, greedy or sampled with
    temperature, top-k and top-p given explicitly, a token budget, and nothing else."""
    if config.num_beams not in (None, 1) or config.max_new_tokens is None:
        return False
    if config.do_sample and None in (config.temperature, config.top_k, config.top_p):
        return False  # generate() would fill these from its own defaults
    return set(config.to_diff_dict()) <= PLAIN_SETTINGS


def logits_warpers(config: GenerationConfig) -> LogitsProcessorList:
    """The warpers `generate()` applies when sampling with `config`, in its order: temperature, top-k, top-p. They
    read the scores only, never the tokens so far."""
    warpers = LogitsProcessorList()
    if not config.do_sample:
        return warpers
    if config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    return warpers


@torch.no_grad()
def decode_recurrent(
    model: nn.Module, image_inputs: Mapping[str, torch.Tensor], config: GenerationConfig
) -> torch.LongTensor:
    """
    Decodes `config.num_return_sequences` captions per image with a recurrent captioner (a [`ShowTellRL`]: anything
    with `initial_state(**image_inputs)` and `step(token_ids, state)`), as `model.generate(**image_inputs,
    generation_config=config)` does for a config that [`decodes_plainly`]. Call it in the mode to decode in.

    Returns:
        `torch.LongTensor` of shape `(num_images * num_return_sequences, length)`: the start token, then the caption,
        padded after its end token; `length` is that of the longest caption, as `generate()` returns it.
    """
    if not decodes_plainly(config):
        raise ValueError(f"decode_recurrent decodes greedily or samples, with nothing else set; got {config}.")
    start, end, pad = config.bos_token_id, config.eos_token_id, config.pad_token_id
    state = model.initial_state(**image_inputs)
    captions_per_image = config.num_return_sequences or 1
    if captions_per_image > 1:
        state = state.repeat_interleave(captions_per_image)
    num_captions, device = state.hidden.shape[1], state.hidden.device
    sequences = torch.full((num_captions, config.max_new_tokens + 1), pad, dtype=torch.long, device=device)
    sequences[:, 0] = start
    tokens = sequences[:, 0].clone()
    unfinished = torch.ones(num_captions, dtype=torch.bool, device=device)
    # where each caption ends; generate() stops at the end of the last one, which sets the returned length
    end_position = torch.full((num_captions,), sequences.shape[1] - 1, device=device)
    warpers = logits_warpers(config)
    for position in range(1, sequences.shape[1]):
        logits, _, state = model.step(tokens, state)
        scores = warpers(sequences[:, :position], logits.float())
        if config.do_sample:
            tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            tokens = scores.argmax(dim=-1)
        tokens = tokens.masked_fill(~unfinished, pad)
        sequences[:, position] = tokens
        ending = unfinished & (tokens == end)
        end_position.masked_fill_(ending, position)
        unfinished &= ~ending
        if position % STEPS_BETWEEN_END_CHECKS == 0 and not bool(unfinished.any()):
            break
    return sequences[:, : int(end_position.max()) + 1]
