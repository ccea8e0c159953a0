"""
Decoding and scoring of captions: the one place where objectives, evaluation and scripts call `generate()` and
compute log-probabilities of given captions ([`selective_log_softmax`] for logits already computed).

Works with every captioner family of [`rlcaption.generation.captioners`] (ShowTellRL, `VisionEncoderDecoderModel`,
BLIP, GIT), which knows each family's special tokens, generation call and logits layout.

Sampling and scoring use the same network state. A policy gradient `(R(g) - b) grad log p(g | x)` is unbiased only
when `p` is the distribution `g` was drawn from. [`generate_captions`] decodes in evaluation mode, and RL objectives
score their samples with [`sample_token_log_probs`], also in evaluation mode. self-critical.pytorch samples and
scores in training mode instead, but its two passes draw different dropout masks, so the scored distribution is not
the sampling one either; reusing the sampling pass's masks in the teacher-forced pass is not possible through
`generate()`. Dropout off for both is exact; the price is that dropout does not regularise RL steps
(cross-entropy steps keep it). [`evaluation_mode`] turns it off without putting recurrent modules in evaluation mode,
whose forward cuDNN cannot differentiate.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from ..models.captions import caption_token_mask
from .captioners import captioner_for, forward_through
from .prompted_captioners import CONDITIONING_INPUT_NAMES

__all__ = [
    "IMAGE_INPUT_NAMES",
    "GeneratedCaptions",
    "caption_logits",
    "caption_token_mask",
    "checkpointing_in_evaluation_mode",
    "evaluation_mode",
    "forward_through",
    "generate_caption_sets",
    "generate_captions",
    "image_inputs_of",
    "repeat_image_inputs",
    "sample_token_log_probs",
    "sample_token_log_probs_and_entropies",
    "selective_log_softmax",
    "token_log_probs",
]

# The batch keys that carry the image, in the names of the models' forward() arguments; the padding mask of region
# features travels with them, so that selecting or repeating image rows keeps each image's mask. A prompted model's
# prompt tokens and image tensors of other names are conditioning as the image is, and travel alike.
IMAGE_INPUT_NAMES = ("pixel_values", "image_features", "image_feature_mask", *CONDITIONING_INPUT_NAMES)
# Modules that cuDNN differentiates only after a training-mode forward.
RECURRENT_MODULES = (nn.RNNBase, nn.RNNCellBase)


class GeneratedCaptions:
    """
    Captions produced by [`generate_captions`]: their token ids, and their texts, decoded from the ids when first read.

    On a GPU, decoding may return while the device still computes the token ids: a copy of them to host memory is
    queued at once on their device's current stream, and reading `texts` waits for that copy only, not for the work
    queued after it. An RL step can so queue the pass that scores its samples before it reads their texts to reward
    them. Sequences computed on another stream must be waited for on the current one before they are wrapped.

    Args:
        sequences (`torch.LongTensor` of shape `(num_captions, length)`):
            Token ids, starting with the start token, padded after the end token.
        processor: anything with `batch_decode(sequences, skip_special_tokens=True)`; `texts` are decoded with it.
        texts (`list[str]`, *optional*): the decoded captions, where they are known already (then no `processor`).
    """

    def __init__(self, sequences: torch.LongTensor, processor: Any = None, texts: list[str] | None = None):
        if processor is None and texts is None:
            raise ValueError("GeneratedCaptions needs the processor that decodes its sequences, or their texts.")
        self.sequences = sequences
        self._processor = processor
        self._texts = texts
        self._host_sequences = sequences
        self._copied: torch.cuda.Event | None = None
        if texts is None and sequences.device.type == "cuda":
            self._host_sequences = torch.empty(sequences.shape, dtype=sequences.dtype, pin_memory=True)
            # the copy goes on the current stream of the sequences' device, which need not be the current device
            stream = torch.cuda.current_stream(sequences.device)
            with torch.cuda.stream(stream):
                self._host_sequences.copy_(sequences, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record(stream)

    @property
    def texts(self) -> list[str]:
        """The decoded captions (special tokens removed, stripped), one per row of `sequences`."""
        if self._texts is None:
            if self._copied is not None:
                self._copied.synchronize()
            decoded = self._processor.batch_decode(self._host_sequences, skip_special_tokens=True)
            self._texts = [text.strip() for text in decoded]
            self._processor = self._host_sequences = self._copied = None
        return self._texts


def image_inputs_of(batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Returns the image tensors of a collated batch (`pixel_values` and/or `image_features`, with
    `image_feature_mask` for padded grids and regions)."""
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


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """
    Runs the block with every dropout of `model` off, as evaluation mode does, then restores its mode.

    Recurrent modules (`nn.LSTM`, `nn.GRU`, their cells) stay in training mode, with their dropout between layers set
    to 0 for the block: cuDNN computes an RNN's backward only after a training-mode forward, and without dropout a
    training-mode forward computes the evaluation-mode function. Log-probabilities scored here can so be
    differentiated on every device.
    """
    was_training = model.training
    model.eval()
    recurrent = [module for module in model.modules() if isinstance(module, RECURRENT_MODULES)]
    layer_dropouts = {module: module.dropout for module in recurrent if isinstance(module, nn.RNNBase)}  # cells: none
    for module in recurrent:
        module.train()
    for module in layer_dropouts:
        module.dropout = 0.0
    try:
        yield
    finally:
        for module, dropout in layer_dropouts.items():
            module.dropout = dropout
        model.train(was_training)


@torch.no_grad()
def generate_captions(
    model: nn.Module,
    processor: Any,
    image_inputs: Mapping[str, torch.Tensor],
    generation_config: GenerationConfig | None = None,
    **generation_kwargs: Any,
) -> GeneratedCaptions:
    """
    Decodes captions in evaluation mode (no dropout), restoring the model's previous mode.

    Two ways to set the decoding:
    - `generation_config`: exactly these settings. The model's own generation config (a Hub checkpoint's repetition
      penalty, n-gram blocking, length limits, forced or banned tokens, ...) is ignored except for its special token
      ids, see [`rlcaption.generation.captioners.Captioner.generate`]. The trainer decodes this way.
    - `generation_kwargs`: `model.generate(**image_inputs, **generation_kwargs)`, on top of the model's own
      generation config, as for any transformers model (scripts and the command line caption this way).

    Args:
        model: an unwrapped captioning model (not a DDP wrapper: `generate` needs the model itself).
        processor: anything with `batch_decode(sequences, skip_special_tokens=True)`.
        image_inputs: image tensors of shape `(batch_size, ...)`.
        generation_config (`GenerationConfig`, *optional*): the complete decoding settings.
        generation_kwargs: passed to `generate` when no `generation_config` is given, e.g. `num_beams=3`.

    Returns:
        [`GeneratedCaptions`] with `batch_size * num_return_sequences` rows, grouped by image.
    """
    if generation_config is not None and generation_kwargs:
        raise ValueError(
            f"Got both a generation_config and generation keyword arguments {sorted(generation_kwargs)}; put those "
            "settings in the generation_config."
        )
    with evaluation_mode(model):
        if generation_config is not None:
            output = captioner_for(model).generate(image_inputs, generation_config)
        else:
            output = model.generate(**image_inputs, **generation_kwargs)
    return _decoded(output, processor)


@torch.no_grad()
def generate_caption_sets(
    model: nn.Module,
    processor: Any,
    image_inputs: Mapping[str, torch.Tensor],
    generation_configs: Sequence[GenerationConfig],
    trim: bool = True,
) -> list[GeneratedCaptions]:
    """
    [`generate_captions`] with each of `generation_configs` in turn (the same captions, the same random draws in
    the same order), encoding the images once for all of them where the captioner can (rlcaption's recurrent
    captioners): what an RL step that samples and decodes a greedy baseline of the same images asks for.

    With `trim=False`, captioners with a decoding loop of their own return the sequences `max_new_tokens + 1` wide,
    without waiting for the device to finish them (see [`rlcaption.generation.step_decoding.decode_steps`]).
    """
    with evaluation_mode(model):
        outputs = captioner_for(model).generate_several(image_inputs, generation_configs, trim)
    return [_decoded(output, processor) for output in outputs]


def _decoded(output: Any, processor: Any) -> GeneratedCaptions:
    return GeneratedCaptions(output.sequences if hasattr(output, "sequences") else output, processor)


def caption_logits(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    image_index: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """
    Next-token logits of given captions under teacher forcing, over the caption's positions only (GIT's image
    positions excluded): `logits[:, t]` scores token `t + 1`. The model runs in its current mode.

    Args:
        model: the (possibly DDP-wrapped) captioning model; gradients flow.
        image_inputs: image tensors, one row per caption, or one row per image with `image_index`.
        input_ids (`torch.LongTensor` of shape `(N, T)`): captions starting with the start token.
        attention_mask (`torch.Tensor` of shape `(N, T)`, *optional*): 0 at padding.
        image_index (`torch.LongTensor` of shape `(N,)`, *optional*): the row of each caption's image. ShowTellRL
            encodes each image once; other models get the image rows repeated.

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1, vocab_size)`.
    """
    return captioner_for(model).caption_logits(model, image_inputs, input_ids, attention_mask, image_index)


def selective_log_softmax(logits: torch.Tensor, token_ids: torch.LongTensor) -> torch.FloatTensor:
    """
    Log-probability of each given token under its logits, computed in float32 (half-precision log-softmax loses the
    small differences between log-probabilities that policy gradients weigh).

    Args:
        logits (`torch.Tensor` of shape `(..., vocab_size)`): next-token scores.
        token_ids (`torch.LongTensor` of shape `(...)`): the token scored at each position.

    Returns:
        `torch.FloatTensor` of shape `(...)`.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, token_ids.to(logits.device).unsqueeze(-1)).squeeze(-1)


def token_log_probs(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    image_index: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """
    Log-probability of each token of given captions (after the start token) under the model in its current mode;
    arguments as in [`caption_logits`].

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1)`; mask it with [`caption_token_mask`].
    """
    logits = caption_logits(model, image_inputs, sequences, attention_mask, image_index)  # (N, T-1, V)
    return selective_log_softmax(logits, sequences[:, 1:])  # (N, T-1)


def sample_token_log_probs(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    image_index: torch.LongTensor | None = None,
) -> torch.FloatTensor:
    """
    [`token_log_probs`] of captions sampled by [`generate_captions`], under the distribution that sampled them: in
    evaluation mode, as sampling (see the module docstring for why), with gradients. The model's mode is restored.

    Returns:
        `torch.FloatTensor` of shape `(N, T - 1)`; mask it with [`caption_token_mask`].
    """
    return _scored_samples(model, image_inputs, sequences, image_index, with_entropies=False)[0]


def sample_token_log_probs_and_entropies(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    image_index: torch.LongTensor | None = None,
) -> tuple[torch.FloatTensor, torch.FloatTensor]:
    """
    [`sample_token_log_probs`] and, from the same forward pass, the entropy of the model's whole next-token
    distribution at every prefix of the captions (for a maximum-entropy bonus), both in float32 with gradients.

    Returns:
        `tuple[torch.FloatTensor, torch.FloatTensor]`: the log-probabilities of the sampled tokens and the entropies
        `-sum_w p(w | prefix) log p(w | prefix)`, each of shape `(N, T - 1)`; mask them with [`caption_token_mask`].
    """
    return _scored_samples(model, image_inputs, sequences, image_index, with_entropies=True)


def _scored_samples(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    image_index: torch.LongTensor | None,
    with_entropies: bool,
) -> tuple[torch.FloatTensor, ...]:
    """The samples' log-probabilities (and entropies), in evaluation mode, with the gradient checkpointing of
    `--gradient_checkpointing` (see [`checkpointing_in_evaluation_mode`])."""
    with evaluation_mode(model), checkpointing_in_evaluation_mode(model):
        return _sample_scores(model, with_entropies, sequences, image_index, **image_inputs)


@contextmanager
def checkpointing_in_evaluation_mode(model: nn.Module) -> Iterator[None]:
    """
    Keeps the gradient checkpointing of a model's layers (`model.gradient_checkpointing_enable()`) in a block run in
    evaluation mode with gradients: the pass that scores RL samples, the largest of a step's activations.

    transformers checkpoints a layer only in training mode. In the block, every checkpointed layer is flagged as
    training (the flag alone, not its submodules), so that it checkpoints, and its checkpointed function runs the
    layer and its submodules in evaluation mode, in the forward pass and in its recomputation during the backward
    pass alike (which runs after the block, with the model back in its own mode): the same function, without
    dropout, as the unflagged evaluation-mode forward.
    """
    layers = [
        module
        for module in model.modules()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing and not module.training
    ]
    checkpoints = {layer: layer._gradient_checkpointing_func for layer in layers}
    for layer, checkpoint in checkpoints.items():
        layer.training = True
        layer._gradient_checkpointing_func = _checkpointing_in_evaluation_mode(layer, checkpoint)
    try:
        yield
    finally:
        for layer, checkpoint in checkpoints.items():
            layer.training = False
            layer._gradient_checkpointing_func = checkpoint


def _checkpointing_in_evaluation_mode(layer: nn.Module, checkpoint: Any) -> Any:
    def checkpoint_in_evaluation_mode(function, *args):
        def in_evaluation_mode(*inputs):
            modes = {module: module.training for module in layer.modules()}
            layer.eval()
            try:
                return function(*inputs)
            finally:
                for module, training in modes.items():
                    module.training = training

        return checkpoint(in_evaluation_mode, *args)

    return checkpoint_in_evaluation_mode


def _sample_scores(
    model: nn.Module,
    with_entropies: bool,
    sequences: torch.LongTensor,
    image_index: torch.LongTensor | None = None,
    **image_inputs: torch.Tensor,
) -> tuple[torch.FloatTensor, ...]:
    if not with_entropies:
        return (token_log_probs(model, image_inputs, sequences, image_index=image_index),)
    logits = caption_logits(model, image_inputs, sequences, image_index=image_index)  # (N, T-1, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, T-1, V)
    sampled = log_probs.gather(-1, sequences[:, 1:].to(logits.device).unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    # words of probability 0 (ruled out with logit -inf or the lowest finite one, or underflowing) add 0 to the
    # entropy and nothing to its gradient: without the masking, 0 * -inf would be NaN, and so would the backward pass
    # of 0 * (lowest float) once the gradient reaching it exceeds 1 in size
    probs = log_probs.exp()
    entropies = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)  # (N, T-1)
    return sampled, entropies
