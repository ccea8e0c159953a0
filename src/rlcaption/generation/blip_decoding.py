"""
Sampling and greedy decoding of transformers' `BlipForConditionalGeneration` in one tight loop over its text
decoder's own layers: generate()'s captions for the plain settings RL training decodes with, one CUDA graph per batch
shape on a GPU (see [`decode_steps`]).

BLIP's text decoder keeps its attention cache in `EncoderDecoderCache`s of tensors that grow at every token and has
no static cache, so neither `cache_implementation="static"` nor a CUDA graph of its `generate()` is available, and at
every token `generate()` costs the host more than the decoder costs a GPU. This loop runs the same layers with the
same weights and dropout modules; two things differ in how, not in what, they compute:
- the keys and values of the image tokens are projected once per image, not once per caption: the captions of an
  image ask their cross-attention queries of the same keys together, as a `k`-token query;
- the self-attention keys and values of the tokens so far are kept as plain tensors, extended at every token.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
from torch import nn
from transformers import GenerationConfig

from .step_decoding import check_decodes_plainly, decode_steps

__all__ = ["BlipDecodingState", "blip_caption_logits", "decode_blip"]


class BlipDecodingState:
    """
    What BLIP's text decoder has read of a batch of captions.

    Args:
        image_embeds (`torch.FloatTensor` of shape `(num_images, num_image_tokens, vision_hidden_size)`): the vision
            model's output, once per image.
        captions_per_image (`int`): the captions decoded per image, each image's consecutive.
        position (`int`): the number of tokens read so far.
        image_keys_and_values (`tuple`, *optional*): per layer, the cross-attention keys and values of the image
            tokens, `(num_images, num_heads, num_image_tokens, head_size)` each; computed at the first token.
        token_keys_and_values (`tuple`, *optional*): per layer, the self-attention keys and values of the tokens read,
            `(num_captions, num_heads, position, head_size)` each.
    """

    def __init__(
        self,
        image_embeds: torch.FloatTensor,
        captions_per_image: int = 1,
        position: int = 0,
        image_keys_and_values: tuple | None = None,
        token_keys_and_values: tuple | None = None,
    ):
        self.image_embeds = image_embeds
        self.captions_per_image = captions_per_image
        self.position = position
        self.image_keys_and_values = image_keys_and_values
        self.token_keys_and_values = token_keys_and_values

    @property
    def num_captions(self) -> int:
        return self.image_embeds.shape[0] * self.captions_per_image


def _split_heads(attention: nn.Module, projected: torch.Tensor) -> torch.Tensor:
    """`(rows, tokens, hidden)` -> `(rows, heads, tokens, head_size)`."""
    return projected.view(*projected.shape[:2], attention.num_attention_heads, -1).transpose(1, 2)


def _attend(
    attention: nn.Module,
    hidden: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    additive_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`BlipTextSelfAttention`'s attention of the queries of `hidden` `(rows, tokens, hidden)` over given keys and
    values, with its scaling, additive mask, softmax and dropout: its context `(rows, tokens, hidden)`."""
    query = _split_heads(attention, attention.query(hidden))
    scores = torch.matmul(query, keys.transpose(-1, -2)) / math.sqrt(attention.attention_head_size)
    if additive_mask is not None:
        scores = scores + additive_mask
    probs = attention.dropout(torch.softmax(scores, dim=-1))
    context = torch.matmul(probs, values).transpose(1, 2)
    return context.reshape(*hidden.shape[:2], attention.all_head_size)


def _keys_and_values(attention: nn.Module, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # contiguous in the heads layout: the products with the queries and the attention then read them in place instead
    # of copying them at every token
    keys, values = attention.key(states), attention.value(states)
    return _split_heads(attention, keys).contiguous(), _split_heads(attention, values).contiguous()


def _attend_to_images(
    layer: nn.Module, hidden: torch.Tensor, image_keys: torch.Tensor, image_values: torch.Tensor
) -> torch.Tensor:
    """A layer's cross-attention block over the image tokens, `hidden` `(N, T, H)` holding each image's captions
    consecutively: an image's captions ask their queries together, as one query of `k * T` tokens over its keys and
    values (cross-attention has no mask), which are projected once per image."""
    by_image = hidden.reshape(image_keys.shape[0], -1, hidden.shape[-1])
    context = _attend(layer.crossattention.self, by_image, image_keys, image_values)
    return layer.crossattention.output(context, by_image).view(hidden.shape)


def blip_step(
    model: nn.Module, token_ids: torch.LongTensor, state: BlipDecodingState
) -> tuple[torch.FloatTensor, BlipDecodingState]:
    """
    BLIP's text decoder reads one token per caption.

    Args:
        model (`BlipForConditionalGeneration`): the captioner.
        token_ids (`torch.LongTensor` of shape `(num_captions,)`): each caption's token at `state.position`.
        state ([`BlipDecodingState`]): what was read before (not modified).

    Returns:
        the next-token logits `(num_captions, vocab_size)` and the state after the token.
    """
    text = model.text_decoder.bert
    position = state.position
    hidden = text.embeddings(
        input_ids=token_ids[:, None], position_ids=text.embeddings.position_ids[:, position : position + 1]
    )  # (N, 1, H)
    image_keys_and_values = state.image_keys_and_values or tuple(
        _keys_and_values(layer.crossattention.self, state.image_embeds) for layer in text.encoder.layer
    )
    token_keys_and_values = []
    for index, layer in enumerate(text.encoder.layer):
        keys, values = _keys_and_values(layer.attention.self, hidden)
        if state.token_keys_and_values is not None:
            earlier_keys, earlier_values = state.token_keys_and_values[index]
            keys, values = torch.cat([earlier_keys, keys], dim=2), torch.cat([earlier_values, values], dim=2)
        token_keys_and_values.append((keys, values))
        hidden = layer.attention.output(_attend(layer.attention.self, hidden, keys, values), hidden)
        hidden = layer.feed_forward_chunk(_attend_to_images(layer, hidden, *image_keys_and_values[index]))
    logits = model.text_decoder.cls(hidden)[:, 0]
    next_state = BlipDecodingState(
        state.image_embeds, state.captions_per_image, position + 1, image_keys_and_values, tuple(token_keys_and_values)
    )
    return logits, next_state


def blip_caption_logits(
    model: nn.Module,
    image_embeds: torch.FloatTensor,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.FloatTensor:
    """
    The text decoder's teacher-forced logits of given captions, `N / num_images` consecutive captions per image, with
    each image's cross-attention keys and values projected once for all its captions.

    Projecting the image tokens' keys and values is most of the text decoder's work: some 577 image tokens against a
    caption's twenty, at every layer. `BlipForConditionalGeneration`'s forward does it once per caption; an RL step
    scores several captions of each image. The same layers, weights and dropout modules compute the same logits, as
    `model.text_decoder(input_ids, attention_mask, encoder_hidden_states=image_embeds repeated per caption)` does.

    Args:
        model (`BlipForConditionalGeneration`): the captioner.
        image_embeds (`torch.FloatTensor` of shape `(num_images, num_image_tokens, vision_hidden_size)`): the vision
            model's output, once per image.
        input_ids (`torch.LongTensor` of shape `(N, T)`): captions starting with the start token, image `i`'s at
            rows `i * k` to `i * k + k - 1` with `k = N / num_images`.
        attention_mask (`torch.Tensor` of shape `(N, T)`, *optional*): 0 at padding.

    Returns:
        `torch.FloatTensor` of shape `(N, T, vocab_size)`.
    """
    text = model.text_decoder.bert
    length = input_ids.shape[1]
    hidden = text.embeddings(input_ids=input_ids)  # (N, T, H)
    # causal, and no key at padding; the lowest finite score, as the text decoder's own mask, so that a padding query
    # that sees no key gets a uniform attention, not NaN
    allowed = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()[None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, :].bool()
    additive_mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
    additive_mask = additive_mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[:, None]  # (N or 1, 1, T, T)
    for layer in text.encoder.layer:
        keys, values = _keys_and_values(layer.attention.self, hidden)
        context = _attend(layer.attention.self, hidden, keys, values, additive_mask)
        hidden = layer.attention.output(context, hidden)
        image_keys_and_values = _keys_and_values(layer.crossattention.self, image_embeds)
        hidden = layer.feed_forward_chunk(_attend_to_images(layer, hidden, *image_keys_and_values))
    return model.text_decoder.cls(hidden)


@torch.no_grad()
def decode_blip(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    config: GenerationConfig,
    image_embeds: torch.FloatTensor | None = None,
    trim: bool = True,
) -> torch.LongTensor:
    """
    Decodes `config.num_return_sequences` captions per image with a `BlipForConditionalGeneration`, as
    `model.generate(**image_inputs)` does with `config` as its text decoder's generation config, for a config that
    [`decodes_plainly`]: the same captions for the same seed. Call it in the mode to decode in; in training mode with
    dropout the captions come from the same distribution but are other draws, since the cross-attention dropout masks
    are laid out by image.

    On a CUDA device, unless `config.cuda_graphs` is False, the decoding after the image encoding is one CUDA graph,
    captured at the second call for each batch shape. `image_embeds`, the vision model's
    output for `image_inputs` when computed already, saves encoding the same images again. `trim=False` lets a
    graph's decoding be returned `max_new_tokens + 1` wide, without waiting for the device (see [`decode_steps`]).

    Returns:
        `torch.LongTensor` of shape `(num_images * num_return_sequences, length)`: the start token, then the caption,
        padded after its end token, as `generate()` returns it, or `max_new_tokens + 1` wide for a graph's
        decoding without `trim`.
    """
    check_decodes_plainly(config)
    if image_embeds is None:
        image_embeds = model.vision_model(pixel_values=image_inputs["pixel_values"]).last_hidden_state
    state = BlipDecodingState(image_embeds, captions_per_image=config.num_return_sequences or 1)
    return decode_steps(model, functools.partial(blip_step, model), state, state.num_captions, config, trim)
