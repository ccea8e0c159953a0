"""
What rlcaption needs to know about each family of captioning models, in one place.

Objectives need three things from a captioner: the tokens that start and end its captions, captions decoded by
`generate()` with the trainer's settings, and the log-probabilities of given captions under teacher forcing. Each
family provides them its own way:

- `ShowTellRL`: bos and eos; `model(input_ids, pixel_values | image_features)`, each image encoded once for all
  its captions.
- `SpeakerListener` (Vered et al. 2019): the same through its speaker, a `ShowTellRL`, whose generation config is the
  model's.
- `PolicyValueCaptioner` (Ren et al. 2017): the same through its policy network, a `ShowTellRL`.
- `VisionEncoderDecoderModel` (GPT-2, BERT, ... decoder): decoder_start_token_id and eos;
  `model(pixel_values, decoder_input_ids)`.
- `BlipForConditionalGeneration`: the text decoder's bos and sep tokens (what its `generate` uses);
  `model(pixel_values, input_ids)`.
- `GitForCausalLM`: bos and eos; `model(pixel_values, input_ids)`, whose logits cover the image positions first and
  then the caption's.

The start and end tokens are the model's (its generation config's, or for BLIP the ones its `generate` hard-codes),
never guessed from the tokenizer: a BERT tokenizer has no bos or eos token, and BLIP starts captions with a token
its tokenizer does not add. [`captioner_for`] picks a model's family and refuses a model it cannot caption with,
naming the missing capability.
"""

from __future__ import annotations

import copy
import functools
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import (
    BlipForConditionalGeneration,
    GenerationConfig,
    GitForCausalLM,
    VisionEncoderDecoderModel,
)
from transformers.modeling_outputs import BaseModelOutput

from ..models.captions import soft_word_embeddings
from .blip_decoding import blip_caption_logits, decode_blip
from .recurrent_decoding import decode_recurrent
from .step_decoding import decodes_plainly

__all__ = [
    "BlipCaptioner",
    "CaptionTokens",
    "Captioner",
    "GitCaptioner",
    "PolicyNetworkCaptioner",
    "ShowTellRLCaptioner",
    "SpeakerListenerCaptioner",
    "VisionEncoderDecoderCaptioner",
    "captioner_for",
    "forward_through",
    "is_peft_model",
    "register_captioner",
]


@dataclass(frozen=True)
class CaptionTokens:
    """
    The special tokens that frame a model's captions. `generate()` starts every sequence with `start_token_id` and
    stops at `end_token_id`; references are tokenized as `start w_1 ... w_n end pad ...`, so teacher forcing and
    sampling see sequences of the same form.

    Args:
        start_token_id (`int`): the first token of every caption sequence.
        end_token_id (`int`): the token that ends a caption.
        pad_token_id (`int`): the token after the end (the end token for models without a pad token, as GPT-2).
    """

    start_token_id: int
    end_token_id: int
    pad_token_id: int


def _first_set(*candidates: Any) -> int | None:
    """The first candidate that is set; the first id of a list (a generation config may list several eos ids)."""
    for value in candidates:
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def _is_fully_sharded(module: nn.Module) -> bool:
    """Whether `module` was sharded by FSDP2's `fully_shard` (torch builds without distributed support have none)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


# The methods of rlcaption's recurrent captioners that objectives call besides `forward` and `generate`: Monte-Carlo
# rollouts and word passing step the LSTM from prefix states.
RECURRENT_METHODS = ("initial_state", "step", "prefix_states")


def gather_parameters_in_methods(module: nn.Module, method_names: Sequence[str] = RECURRENT_METHODS) -> None:
    """
    Lets `module`, when FSDP2 shards it, gather its parameters in `method_names` as in its `forward`: FSDP2 gathers
    them only in the methods registered for it, and a method called otherwise would compute on shards. Does nothing
    for a module that is not sharded, or for methods registered already or that it lacks.
    """
    if not _is_fully_sharded(module):
        return
    from torch.distributed.fsdp import register_fsdp_forward_method

    registered = module.__dict__.setdefault("_methods_gathering_parameters", set())
    for name in method_names:
        if name not in registered and callable(getattr(module, name, None)):
            register_fsdp_forward_method(module, name)
            registered.add(name)
    # word passing multiplies soft words by the word-embedding matrix, which FSDP shards as a unit of its own
    embeddings = getattr(module, "get_input_embeddings", lambda: None)()
    if _is_fully_sharded(embeddings) and "soft_words" not in embeddings.__dict__:
        embeddings.soft_words = types.MethodType(_soft_words, embeddings)
        register_fsdp_forward_method(embeddings, "soft_words")


def _soft_words(embedding: nn.Embedding, words: torch.Tensor) -> torch.Tensor:
    return soft_word_embeddings(words, embedding.weight)


def forward_through(wrapped: nn.Module, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """
    Calls `method` of the network inside `wrapped` (a DDP or accelerate wrapper) through the wrapper's `forward`: a
    method name, or a function whose first argument is the network (`forward_through(model, decode_with_word_passing,
    ...)` calls `decode_with_word_passing(network, ...)`).

    DDP synchronises the gradients of what runs inside its `forward` only; a method called on the unwrapped network
    (differentiable decoding, a value estimate) would leave each process with its own gradients. FSDP2 (`fully_shard`)
    turns the network into its own wrapper: its parameters are gathered for its `forward` alone, and the gradients
    of that forward are reduced to the shards. Without a wrapper (one process) this is the plain method call.
    """
    module = getattr(wrapped, "module", wrapped)
    target = getattr(module, method) if isinstance(method, str) else functools.partial(method, module)
    if module is wrapped and not _is_fully_sharded(wrapped):
        return target(*args, **kwargs)
    instance_forward = module.__dict__.get("forward")  # accelerate's mixed-precision forward, when there is one

    def restore_forward() -> None:
        if instance_forward is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = instance_forward

    def forward_once(*call_args: Any, **call_kwargs: Any) -> Any:
        restore_forward()  # the method may call the module's own forward
        return target(*call_args, **call_kwargs)

    module.forward = forward_once
    try:
        return wrapped(*args, **kwargs)
    finally:
        restore_forward()


class Captioner:
    """
    Adapter from one family of captioning models to what objectives need; get one with [`captioner_for`].

    Subclasses say which models they handle, where their special tokens live, and how to get the logits of given
    captions; this class implements decoding with an explicit generation config and the selection of image rows.

    Args:
        model (`nn.Module`): the unwrapped model (not a DDP wrapper).
    """

    family: ClassVar[str]
    # The batch keys of image inputs the family's forward and generate take.
    image_input_names: ClassVar[tuple[str, ...]] = ("pixel_values",)
    # The generation-config field that holds the start token.
    start_token_field: ClassVar[str] = "bos_token_id"

    def __init__(self, model: nn.Module):
        self.model = model
        self.tokens = self._caption_tokens()

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        """Whether `model` belongs to this family."""
        raise NotImplementedError

    def _declared_tokens(self) -> tuple[int | None, int | None, int | None]:
        """The model's `(start, end, pad)` token ids, `None` where it declares none."""
        generation, config = self.model.generation_config, self.model.config
        return (
            _first_set(generation.bos_token_id, config.bos_token_id),
            _first_set(generation.eos_token_id, config.eos_token_id),
            _first_set(generation.pad_token_id, config.pad_token_id),
        )

    def _caption_tokens(self) -> CaptionTokens:
        start, end, pad = self._declared_tokens()
        name = type(self.model).__name__
        if start is None:
            raise ValueError(
                f"{name} declares no start token (generation_config.{self.start_token_field} is None): set "
                f"`model.generation_config.{self.start_token_field}` to the token its captions start with (for a "
                "BERT tokenizer, `tokenizer.cls_token_id`)."
            )
        if end is None:
            raise ValueError(
                f"{name} declares no end token (generation_config.eos_token_id is None), so its captions would never "
                "end and references would be tokenized without an end token: set "
                "`model.generation_config.eos_token_id` (for a BERT tokenizer, `tokenizer.sep_token_id`)."
            )
        return CaptionTokens(start_token_id=start, end_token_id=end, pad_token_id=end if pad is None else pad)

    # ---------------------------------------------------------------- decoding
    @property
    def generation_module(self) -> nn.Module:
        """The module whose `generate()` runs the decoding loop and reads `generation_config`."""
        return self.model

    def complete_generation_config(self, generation_config: GenerationConfig) -> GenerationConfig:
        """A copy of `generation_config` with the model's special token ids (see [`CaptionTokens`]), and the model's
        own `generation_config.cuda_graphs` where `generation_config` sets none (see
        [`rlcaption.generation.step_decoding.uses_cuda_graphs`])."""
        config = copy.deepcopy(generation_config)
        setattr(config, self.start_token_field, self.tokens.start_token_id)
        config.eos_token_id = self.tokens.end_token_id
        config.pad_token_id = self.tokens.pad_token_id
        # how the decoding loop runs, not what it decodes: the model's setting carries over, as generate() carries a
        # model's own entries into a config that lacks them
        own_config = self.model.generation_config
        if not hasattr(config, "cuda_graphs") and hasattr(own_config, "cuda_graphs"):
            config.cuda_graphs = own_config.cuda_graphs
        return config

    def generate(
        self,
        image_inputs: Mapping[str, torch.Tensor],
        generation_config: GenerationConfig,
        decoding_loop: bool = True,
    ) -> Any:
        """
        `model.generate(**image_inputs)` with exactly `generation_config` and the model's special token ids.

        `generate()` fills every setting a given config leaves unset from the model's own generation config, so a
        checkpoint's repetition penalty, n-gram blocking, length limits, forced or banned tokens would still apply.
        The model's generation config is therefore replaced by the completed one for the call: the settings of
        `generation_config` (and the library defaults for what it leaves unset) win, the checkpoint keeps only its
        special token ids (and its `cuda_graphs`, see [`complete_generation_config`]).

        A family with a decoding loop of its own (ours, BLIP) decodes a config that [`decodes_plainly`] in that loop:
        the same captions for the same seed, without `generate()`'s overhead per token, as a CUDA graph on a GPU
        unless the completed config's `cuda_graphs` is False. `decoding_loop=False` asks for `generate()` itself.

        Returns:
            what `generate()` returns: the sequences `(num_captions, length)`, starting with the start token, or a
            `GenerateOutput` when the config asks for one.
        """
        config = self.complete_generation_config(generation_config)
        image_inputs = self._image_inputs(image_inputs)
        if decoding_loop and self._decodes_in_loop(config):
            return self._decode_in_loop(self._encode_for_loop(image_inputs), config)
        module = self.generation_module
        own_config = module.generation_config
        module.generation_config = config
        try:
            return self._model_generate(image_inputs, config)
        finally:
            module.generation_config = own_config

    def _model_generate(self, image_inputs: dict[str, torch.Tensor], config: GenerationConfig) -> Any:
        return self.model.generate(**image_inputs, generation_config=config)

    # Whether the family has a decoding loop of its own (`rlcaption.generation.step_decoding`) for what RL decodes
    # with: generate()'s captions without its per-token overhead.
    has_decoding_loop: ClassVar[bool] = False

    def _decodes_in_loop(self, config: GenerationConfig) -> bool:
        # not under FSDP2, which gathers a sharded model's parameters in the methods registered for it (forward,
        # generate) only
        return self.has_decoding_loop and decodes_plainly(config) and not _is_fully_sharded(self.model)

    def _encode_for_loop(self, image_inputs: dict[str, torch.Tensor]) -> Any:
        """What the decoding loop starts from, computed from the images once for every decoding of them."""
        raise NotImplementedError

    def _decode_in_loop(self, encoding: Any, config: GenerationConfig, trim: bool = True) -> torch.LongTensor:
        raise NotImplementedError

    def generate_several(
        self,
        image_inputs: Mapping[str, torch.Tensor],
        generation_configs: Sequence[GenerationConfig],
        trim: bool = True,
    ) -> list[Any]:
        """[`generate`] with each of `generation_configs` in turn, on the same images; a family with a decoding loop
        encodes the images once for all of them (RL decodes samples, then a greedy baseline, of the same images).

        With `trim=False`, a decoding loop returns its sequences `max_new_tokens + 1` wide rather than cut after the
        longest caption, which waits for the device (see [`rlcaption.generation.step_decoding.decode_steps`]);
        `generate()` always trims."""
        configs = [self.complete_generation_config(config) for config in generation_configs]
        if not all(self._decodes_in_loop(config) for config in configs):
            return [self.generate(image_inputs, config) for config in generation_configs]
        encoding = self._encode_for_loop(self._image_inputs(image_inputs))
        return [self._decode_in_loop(encoding, config, trim) for config in configs]

    # ---------------------------------------------------------------- scoring
    def caption_logits(
        self,
        model: nn.Module,
        image_inputs: Mapping[str, torch.Tensor],
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        image_index: torch.LongTensor | None = None,
    ) -> torch.FloatTensor:
        """
        Next-token logits of given captions under teacher forcing, over the caption's positions only:
        `logits[:, t]` scores token `t + 1`.

        Args:
            model: the model to call, possibly wrapped for DDP (its forward synchronises the gradients).
            image_inputs: image tensors, one row per caption, or one row per image with `image_index`.
            input_ids (`torch.LongTensor` of shape `(N, T)`): captions starting with the start token.
            attention_mask (`torch.Tensor` of shape `(N, T)`, *optional*): 0 at padding.
            image_index (`torch.LongTensor` of shape `(N,)`, *optional*): the row of each caption's image.

        Returns:
            `torch.FloatTensor` of shape `(N, T - 1, vocab_size)`.
        """
        image_inputs = self._image_inputs(image_inputs)
        if image_index is None:
            return self._logits(model, image_inputs, input_ids, attention_mask)[:, :-1]  # (N, T-1, V)
        if self.encodes_images_once:
            # through the wrapper's forward, so that DDP synchronises the image encoder's gradients too
            logits = forward_through(
                model, self._logits_encoding_images_once, image_inputs, image_index, input_ids, attention_mask
            )
            return logits[:, :-1]
        return self._logits(model, self._rows(image_inputs, image_index), input_ids, attention_mask)[:, :-1]

    def _rows(self, image_inputs: dict[str, torch.Tensor], image_index: torch.LongTensor) -> dict[str, torch.Tensor]:
        """The image inputs of the images `image_index` names, one row per caption (a family whose image tensors are
        not one row per image selects its own way)."""
        return {name: tensor.index_select(0, image_index) for name, tensor in image_inputs.items()}

    def _logits(
        self,
        model: nn.Module,
        image_inputs: dict[str, torch.Tensor],
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None,
    ) -> torch.FloatTensor:
        """Logits at every caption position, `(N, T, vocab_size)`."""
        raise NotImplementedError

    # Whether the family runs its image encoder once per image for several captions ([`_logits_encoding_images_once`]).
    encodes_images_once: ClassVar[bool] = False

    def _logits_encoding_images_once(
        self,
        network: nn.Module,
        image_inputs: dict[str, torch.Tensor],
        image_index: torch.LongTensor,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None,
    ) -> torch.FloatTensor:
        """[`_logits`] of the unwrapped `network` with each image encoded once and its encoding repeated for each of
        its captions (the row `image_index[n]` for caption n), instead of the image encoded once per caption: k times
        less vision work and memory for k captions per image, the same logits."""
        raise NotImplementedError

    def prompt_text(self, processor: Any, prompt: str | None = None) -> str | None:
        """
        The text the processor reads beside each image, for a family conditioned on a prompt (see
        [`rlcaption.generation.prompted_captioners`]); `None` for the others, which are refused a `prompt`.
        """
        if prompt is not None:
            raise ValueError(
                f"{type(self.model).__name__} captions from the image alone and takes no prompt, got prompt="
                f"{prompt!r}: leave `prompt` unset (the prompted families are Florence-2, BLIP-2, PaliGemma, "
                "SmolVLM/Idefics3, Qwen2-VL and LLaVA)."
            )
        return None

    def _image_inputs(self, image_inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        selected = {name: image_inputs[name] for name in self.image_input_names if image_inputs.get(name) is not None}
        if not selected:
            raise ValueError(
                f"{type(self.model).__name__} takes {' or '.join(self.image_input_names)}, but the batch has "
                f"{sorted(image_inputs)}: give it images (an `image` or `pixel_values` column), not precomputed "
                "features."
            )
        return selected


class ShowTellRLCaptioner(Captioner):
    """rlcaption's ShowTellRL (also when loaded as remote code): encodes each image once for several captions."""

    family = "ShowTellRL"
    # the padding mask of region features goes with them, through `image_index` and every decoding
    image_input_names = ("pixel_values", "image_features", "image_feature_mask")

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) == "show_tell_rl"

    @property
    def recurrent_network(self) -> nn.Module:
        """The ShowTellRL that decodes: the model itself here, the policy or the speaker of the models around one."""
        return self.model

    has_decoding_loop = True

    def _encode_for_loop(self, image_inputs):
        return self.recurrent_network.initial_state(**image_inputs)

    def _decode_in_loop(self, encoding, config, trim=True):
        return decode_recurrent(self.recurrent_network, {}, config, initial_state=encoding, trim=trim)

    def caption_logits(self, model, image_inputs, input_ids, attention_mask=None, image_index=None):
        image_inputs = self._image_inputs(image_inputs)
        if image_index is not None:
            image_inputs["image_index"] = image_index  # shares each image's encoding among its captions
        return self._logits(model, image_inputs, input_ids, attention_mask)[:, :-1]  # (N, T-1, V)

    def _logits(self, model, image_inputs, input_ids, attention_mask):
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **image_inputs).logits


class SpeakerListenerCaptioner(ShowTellRLCaptioner):
    """
    rlcaption's SpeakerListener (Vered et al. 2019): captions with its speaker, a ShowTellRL. Its `forward` and
    `generate` are the speaker's, and its `generation_config` is the speaker's own, so it is captioned as a ShowTellRL
    is.
    """

    family = "SpeakerListener"

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) == "speaker_listener"

    def _caption_tokens(self) -> CaptionTokens:
        return ShowTellRLCaptioner(self.model.speaker).tokens  # the special tokens are the speaker's

    @property
    def recurrent_network(self) -> nn.Module:
        return self.model.speaker


class PolicyNetworkCaptioner(ShowTellRLCaptioner):
    """
    rlcaption's PolicyValueCaptioner (Ren et al. 2017): captions with its policy network, a ShowTellRL. Its `forward`
    and `generate` are the policy's (without `lookahead_lambda`, `generate` is the policy's alone, as RL sampling
    needs), and its `generation_config` is the policy's own, so it is captioned as a ShowTellRL is.
    """

    family = "PolicyValueCaptioner"

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) == "policy_value"

    def _caption_tokens(self) -> CaptionTokens:
        return ShowTellRLCaptioner(self.model.policy).tokens  # the special tokens are the policy's

    @property
    def recurrent_network(self) -> nn.Module:
        return self.model.policy


class VisionEncoderDecoderCaptioner(Captioner):
    """`VisionEncoderDecoderModel` with any decoder (GPT-2, BERT, ...): the caption is the decoder's input."""

    family = "VisionEncoderDecoderModel"
    start_token_field = "decoder_start_token_id"

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionEncoderDecoderModel)

    def _declared_tokens(self):
        generation, config = self.model.generation_config, self.model.config
        decoder = config.decoder
        return (
            _first_set(
                generation.decoder_start_token_id,
                getattr(config, "decoder_start_token_id", None),
                decoder.bos_token_id,
            ),
            _first_set(generation.eos_token_id, decoder.eos_token_id),
            _first_set(generation.pad_token_id, getattr(config, "pad_token_id", None), decoder.pad_token_id),
        )

    def _logits(self, model, image_inputs, input_ids, attention_mask):
        return model(
            **image_inputs, decoder_input_ids=input_ids, decoder_attention_mask=attention_mask, use_cache=False
        ).logits

    encodes_images_once = True

    def _logits_encoding_images_once(self, network, image_inputs, image_index, input_ids, attention_mask):
        encoded = network.encoder(**image_inputs).last_hidden_state
        encoder_outputs = BaseModelOutput(last_hidden_state=encoded.index_select(0, image_index))
        return network(
            encoder_outputs=encoder_outputs, decoder_input_ids=input_ids, decoder_attention_mask=attention_mask,
            use_cache=False,
        ).logits  # fmt: skip


class BlipCaptioner(Captioner):
    """
    `BlipForConditionalGeneration`. Its `generate` starts captions with the text decoder's bos token (`[DEC]` in the
    published checkpoints, not the tokenizer's `[CLS]`), stops at the text decoder's sep token, and decodes with the
    text decoder's own `generate`, whose generation config is the one to replace.
    """

    family = "BlipForConditionalGeneration"

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return isinstance(model, BlipForConditionalGeneration)

    def _declared_tokens(self):
        text_config = self.model.config.text_config
        return text_config.bos_token_id, text_config.sep_token_id, text_config.pad_token_id

    @property
    def generation_module(self) -> nn.Module:
        return self.model.text_decoder

    def _model_generate(self, image_inputs, config):
        # BLIP passes its own eos and pad ids to the text decoder's generate; with a config passed as well,
        # generate would warn that both were given. The replaced generation config carries the settings instead.
        return self.model.generate(**image_inputs)

    has_decoding_loop = True

    def _decodes_in_loop(self, config):
        # the loop calls the text decoder's layers' parts directly, past the hooks that move a model dispatched over
        # several devices (`device_map`) from one device to the next
        devices = set(getattr(self.model, "hf_device_map", {}).values())
        return super()._decodes_in_loop(config) and len(devices) <= 1

    def _encode_for_loop(self, image_inputs):
        return self.model.vision_model(**image_inputs).last_hidden_state

    def _decode_in_loop(self, encoding, config, trim=True):
        return decode_blip(self.model, {}, config, image_embeds=encoding, trim=trim)

    def _logits(self, model, image_inputs, input_ids, attention_mask):
        return model(**image_inputs, input_ids=input_ids, attention_mask=attention_mask).logits

    encodes_images_once = True

    def _logits_encoding_images_once(self, network, image_inputs, image_index, input_ids, attention_mask):
        image_embeds = network.vision_model(**image_inputs).last_hidden_state
        num_images = image_embeds.shape[0]
        captions_per_image = image_index.numel() // num_images
        in_image_order = torch.arange(num_images, device=image_index.device).repeat_interleave(captions_per_image)
        # checkpointed layers, and FSDP2's sharded ones (gathered in their forward only), are called whole, by the
        # text decoder's forward
        calls_layers_whole = network.text_decoder.is_activation_checkpointing or _is_fully_sharded(network)
        if not calls_layers_whole and torch.equal(image_index, in_image_order):
            # each image's cross-attention keys and values projected once for its consecutive captions
            return blip_caption_logits(network, image_embeds, input_ids, attention_mask)
        # BlipForConditionalGeneration.forward, with the vision model's output repeated for each caption
        return network.text_decoder(
            input_ids=input_ids, attention_mask=attention_mask,
            encoder_hidden_states=image_embeds.index_select(0, image_index),
        ).logits  # fmt: skip


class GitCaptioner(Captioner):
    """
    `GitForCausalLM`: one sequence of image tokens followed by the caption, so its logits cover the image positions
    too; only the last `T` positions, the caption's, are kept.
    """

    family = "GitForCausalLM"

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return isinstance(model, GitForCausalLM)

    # its image tokens go through the same transformer as each caption's words: no encoding to share among captions
    def _logits(self, model, image_inputs, input_ids, attention_mask):
        logits = model(**image_inputs, input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return logits[:, -input_ids.size(1) :]  # (N, T, V): the caption's positions, after the image's


_CAPTIONERS: list[type[Captioner]] = [
    ShowTellRLCaptioner,
    SpeakerListenerCaptioner,
    PolicyNetworkCaptioner,
    VisionEncoderDecoderCaptioner,
    BlipCaptioner,
    GitCaptioner,
]


def register_captioner(family: type[Captioner]) -> type[Captioner]:
    """Adds `family` to the families [`captioner_for`] knows (the prompted ones of
    [`rlcaption.generation.prompted_captioners`] register themselves as the package is imported)."""
    if family not in _CAPTIONERS:
        _CAPTIONERS.append(family)
    return family


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model` is a peft `PeftModel`, adapters around a base model (duck-typed, so that peft is imported only
    by those who use it)."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def _without_peft_wrapper(model: nn.Module) -> nn.Module:
    """The model a peft `PeftModel` wraps; `model` itself otherwise. The wrapper's `forward(*args, **kwargs)` hides
    the image inputs of the model inside."""
    return model.get_base_model() if is_peft_model(model) else model


def _missing_capability(model: nn.Module) -> str:
    """Why rlcaption cannot train `model`, in words."""
    model = _without_peft_wrapper(model)
    if not callable(getattr(model, "generate", None)):
        return "it has no `generate()` to decode captions with (it is not a `GenerationMixin` model)"
    parameters = inspect.signature(model.forward).parameters
    if not any(name in parameters for name in ("pixel_values", "image_features")):
        return "it has no image input: its `forward()` takes neither `pixel_values` nor `image_features`"
    return (
        "rlcaption does not know where its logits of a given caption are (the teacher-forced log-probabilities "
        "policy gradients and cross-entropy need), nor which tokens frame its captions"
    )


def captioner_for(model: nn.Module) -> Captioner:
    """
    The [`Captioner`] of `model`'s family.

    Args:
        model: a captioning model, or a DDP wrapper of one (`.module` is used), or a peft `PeftModel` of one (its
            base model is used: LoRA layers are injected into it, so its forward and `generate()` run the adapters).

    Raises:
        `ValueError`: for a model of no supported family, naming the capability it lacks; or for a supported model
            that declares no start or end token, naming the setting to add.
    """
    module = _without_peft_wrapper(getattr(model, "module", model))
    for family in _CAPTIONERS:
        if family.handles(module):
            return family(module)
    supported = ", ".join(family.family for family in _CAPTIONERS)
    raise ValueError(
        f"Cannot train or decode captions with {type(module).__name__}: {_missing_capability(module)}. Supported "
        f"captioners: {supported}."
    )
