"""
Sampling and greedy decoding of rlcaption's recurrent captioners over their RL interface (`initial_state`, `step`):
generate()'s captions for the plain settings RL training decodes with, without its per-token overhead, one CUDA graph
per batch shape on a GPU (see [`decode_steps`]).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig

from .step_decoding import check_decodes_plainly, decode_steps

__all__ = ["decode_recurrent"]


def _step_logits(model: nn.Module, token_ids: torch.LongTensor, state: Any) -> tuple[torch.FloatTensor, Any]:
    logits, _, next_state = model.step(token_ids, state)
    return logits, next_state


@torch.no_grad()
def decode_recurrent(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    config: GenerationConfig,
    initial_state: Any = None,
    trim: bool = True,
) -> torch.LongTensor:
    """
    Decodes `config.num_return_sequences` captions per image with a recurrent captioner (a [`ShowTellRL`]: anything
    with `initial_state(**image_inputs)` and `step(token_ids, state)`), as `model.generate(**image_inputs,
    generation_config=config)` does for a config that [`decodes_plainly`]. Call it in the mode to decode in.

    On a CUDA device, unless `config.cuda_graphs` is False, the decoding after the image encoding is one CUDA graph,
    captured at the second call for each batch shape (a few are kept per model); it draws the same captions as
    step-by-step decoding. `initial_state`, the model's `initial_state(**image_inputs)` when
    computed already, saves encoding the same images again for another decoding of them. `trim=False` lets a
    graph's decoding be returned `max_new_tokens + 1` wide, without waiting for the device (see [`decode_steps`]).

    Returns:
        `torch.LongTensor` of shape `(num_images * num_return_sequences, length)`: the start token, then the caption,
        padded after its end token; `length` is that of the longest caption, as `generate()` returns it, or
        `max_new_tokens + 1` for a graph's decoding without `trim`.
    """
    check_decodes_plainly(config)
    state = model.initial_state(**image_inputs) if initial_state is None else initial_state
    captions_per_image = config.num_return_sequences or 1
    if captions_per_image > 1:
        state = state.repeat_interleave(captions_per_image)
    step = functools.partial(_step_logits, model)
    return decode_steps(model, step, state, state.hidden.shape[1], config, trim)
