"""
Captioners conditioned on a prompt as well as an image: the image-text-to-text models people caption with today.

A prompt is conditioning, like the image. [`rlcaption.data.CaptionCollator`] asks the model's own processor for the
prompt's tokens together with the image (`processor(images=..., text=prompts)`), and the batch carries them under
names that cannot clash with the captions': `prompt_input_ids`, `prompt_attention_mask` (and `prompt_token_type_ids`,
`prompt_mm_token_type_ids` where the processor gives them), beside the family's image tensors (`pixel_values`,
`image_grid_thw`, `pixel_attention_mask`, ...). Prompt and image tokens never enter a loss, a log-probability, a
reward or a decoded caption:

- encoder–decoder (Florence-2): the prompt and the image go to the encoder, the caption is the decoder's input, and
  `generate()` returns the decoder's sequence, which starts with the decoder start token as a caption does;
- decoder-only (BLIP-2, PaliGemma, SmolVLM/Idefics3, Qwen2-VL/2.5-VL, LLaVA): the model reads `prompt + caption`, the
  prompt left-padded, and only the logits at the caption's positions are kept (as `GitCaptioner` keeps the last `T`);
  `generate()`'s output has the prompt cut off. The start token of such a caption is a placeholder the model never
  reads: the last prompt token predicts the first word, so `logits[:, t]` still scores token `t + 1`.

For k captions of each image (`image_index`), the image goes through the vision tower once: Florence-2's encoder
output, or a decoder-only model's `get_image_features`, is repeated for each caption (`encodes_images_once`).

Each family's default prompt is the library's ([`PromptedCaptioner.default_prompt`]); `RLCaptionConfig.prompt`
(`--prompt`) overrides it. Chat models get the instruction as one user turn with the image, through the processor's
chat template with `add_generation_prompt=True`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import (
    Blip2ForConditionalGeneration,
    Florence2ForConditionalGeneration,
    GenerationConfig,
    Idefics3ForConditionalGeneration,
    LlavaForConditionalGeneration,
    PaliGemmaForConditionalGeneration,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    SmolVLMForConditionalGeneration,
)
from transformers.modeling_outputs import BaseModelOutput

from .captioners import Captioner, _first_set, _without_peft_wrapper, register_captioner

__all__ = [
    "CONDITIONING_INPUT_NAMES",
    "PROMPT_INPUT_PREFIX",
    "PROMPTED_CAPTIONERS",
    "Blip2Captioner",
    "Florence2Captioner",
    "PaliGemmaCaptioner",
    "PromptedCaptioner",
    "PromptedDecoderCaptioner",
    "Qwen2VLCaptioner",
    "prompt_inputs",
]

# The processor's text outputs are renamed with this prefix in a batch, so that they never clash with the captions'.
PROMPT_INPUT_PREFIX = "prompt_"
# The processor outputs that belong to the prompt's tokens (renamed with PROMPT_INPUT_PREFIX); all others are images.
PROMPT_TOKEN_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
# Every batch entry a prompted family may be conditioned on besides `pixel_values`: what `image_inputs_of` passes on.
CONDITIONING_INPUT_NAMES = (
    *(PROMPT_INPUT_PREFIX + name for name in PROMPT_TOKEN_OUTPUTS),
    "image_grid_thw",
    "pixel_attention_mask",
    "image_sizes",
)
# The instruction chat models get by default, as one user turn with the image.
CHAT_CAPTION_INSTRUCTION = "Describe this image in one sentence."


def prompt_inputs(processor_outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The processor's outputs for prompts and images as batch entries: its token outputs (`input_ids`, ...) renamed
    `prompt_input_ids`, ..., its image outputs under their own names."""
    return {
        (PROMPT_INPUT_PREFIX + name if name in PROMPT_TOKEN_OUTPUTS else name): value
        for name, value in processor_outputs.items()
        if name != "labels"  # PaliGemma's processor labels the prompt itself; references are the labels here
    }


def image_placeholder_token_ids(config: Any) -> list[int]:
    """The ids of the tokens a multimodal config reserves for images and videos (`image_token_id`,
    `image_token_index`, `video_token_id`, Qwen2-VL's `vision_start_token_id`, ...), which its forward finds in the
    input ids to place the vision features."""
    return sorted(
        value
        for name, value in vars(config).items()
        if isinstance(value, int)
        and any(kind in name for kind in ("image", "video", "vision"))
        and name.endswith(("_token_id", "_token_index"))
    )


class PromptedCaptioner(Captioner):
    """
    What every prompted family shares: the batch entries it is conditioned on, its default prompt and how a prompt
    becomes the text its processor reads.
    """

    model_classes: ClassVar[tuple[type[nn.Module], ...]] = ()
    # the images' entries of the batch besides the prompt's tokens
    image_tensor_names: ClassVar[tuple[str, ...]] = ("pixel_values",)
    # The prompt when `RLCaptionConfig.prompt` is None; for chat models, the instruction of the user turn.
    default_prompt: ClassVar[str] = ""
    # Whether the prompt is an instruction put through the processor's chat template.
    uses_chat_template: ClassVar[bool] = False

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return isinstance(model, cls.model_classes)

    @property
    def image_input_names(self) -> tuple[str, ...]:
        prompt_names = tuple(PROMPT_INPUT_PREFIX + name for name in PROMPT_TOKEN_OUTPUTS)
        return (*prompt_names, *self.image_tensor_names)

    def prompt_text(self, processor: Any, prompt: str | None = None) -> str:
        """
        The text the processor reads beside each image: `prompt` (the default prompt when `None`), through the
        processor's chat template as one user turn with the image for chat models.
        """
        instruction = self.default_prompt if prompt is None else prompt
        if not self.uses_chat_template:
            return instruction
        if getattr(processor, "chat_template", None) is None:
            raise ValueError(
                f"{type(self.model).__name__} is prompted through a chat template, but {type(processor).__name__} "
                "has none: load the processor of the model's checkpoint (`AutoProcessor.from_pretrained`), which "
                "carries it."
            )
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
        return processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)

    def _model_inputs(self, conditioning: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch's conditioning entries under the names of the model's arguments (`prompt_input_ids` ->
        `input_ids`, ...)."""
        return {name.removeprefix(PROMPT_INPUT_PREFIX): tensor for name, tensor in conditioning.items()}

    def _image_inputs(self, image_inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        selected = super()._image_inputs(image_inputs)
        if PROMPT_INPUT_PREFIX + "input_ids" not in selected:
            raise ValueError(
                f"{type(self.model).__name__} is conditioned on a prompt, but the batch has no `prompt_input_ids` "
                f"(keys {sorted(image_inputs)}): collate images with `CaptionCollator(processor, prompt=...)` "
                "(RLCaptionTrainer does), which asks the processor for the prompt's tokens with each image."
            )
        return selected


class Florence2Captioner(PromptedCaptioner):
    """
    `Florence2ForConditionalGeneration`, an encoder–decoder: the task prompt (`<CAPTION>` by default) and the image
    go to the encoder, the caption is the decoder's input and starts with the decoder start token.

    Published checkpoints start the decoder with `</s>` and force `<s>` as the first generated token
    (`forced_bos_token_id` in their generation config), as they were trained on `</s> <s> words </s>`. That forced
    token is the caption prefix ([`caption_prefix_ids`]): the decoder reads it after the start token whenever it
    scores or decodes a caption, but the sequences objectives see (references, samples) go without it, so it is never
    rewarded, decoded into text or trained on (its probability is 1 by construction in `generate()`).
    """

    family = "Florence2ForConditionalGeneration"
    model_classes = (Florence2ForConditionalGeneration,)
    default_prompt = "<CAPTION>"
    start_token_field = "decoder_start_token_id"

    def __init__(self, model: nn.Module):
        super().__init__(model)
        # read here: while `generate` runs, the model's generation config is replaced by one without the forced token
        self.caption_prefix_ids = self._forced_caption_prefix()

    def _declared_tokens(self):
        generation, config = self.model.generation_config, self.model.config
        text_config = config.get_text_config()
        return (
            _first_set(generation.decoder_start_token_id, getattr(text_config, "decoder_start_token_id", None)),
            _first_set(generation.eos_token_id, text_config.eos_token_id),
            _first_set(generation.pad_token_id, text_config.pad_token_id),
        )

    def _forced_caption_prefix(self) -> tuple[int, ...]:
        """The tokens the model's generation config forces after the decoder start token: `(forced_bos_token_id,)`,
        or none."""
        text_config = self.model.config.get_text_config()
        forced = _first_set(
            self.model.generation_config.forced_bos_token_id, getattr(text_config, "forced_bos_token_id", None)
        )
        return () if forced is None else (forced,)

    def _with_caption_prefix(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """The decoder's input for captions `start w_1 ...`: `start prefix w_1 ...` (and its attention mask)."""
        if not self.caption_prefix_ids:
            return input_ids, attention_mask
        prefix = input_ids.new_tensor(self.caption_prefix_ids).expand(input_ids.size(0), -1)  # (N, M)
        decoder_ids = torch.cat([input_ids[:, :1], prefix, input_ids[:, 1:]], dim=1)  # (N, T + M)
        if attention_mask is None:
            return decoder_ids, None
        prefix_mask = torch.ones_like(prefix, dtype=attention_mask.dtype)
        return decoder_ids, torch.cat([attention_mask[:, :1], prefix_mask, attention_mask[:, 1:]], dim=1)

    def _model_generate(self, image_inputs, config):
        inputs = self._model_inputs(image_inputs)
        if not self.caption_prefix_ids:
            return self.model.generate(**inputs, generation_config=config)
        # the prefix given as the decoder's first tokens, as the forced token would have been decoded
        first_tokens = [self.tokens.start_token_id, *self.caption_prefix_ids]
        batch_size = inputs["input_ids"].size(0)
        inputs["decoder_input_ids"] = inputs["input_ids"].new_tensor(first_tokens).expand(batch_size, -1)
        generated = self.model.generate(**inputs, generation_config=config)
        sequences = generated if isinstance(generated, torch.Tensor) else generated.sequences
        without_prefix = torch.cat([sequences[:, :1], sequences[:, len(first_tokens) :]], dim=1)  # (N, 1 + new)
        if isinstance(generated, torch.Tensor):
            return without_prefix
        generated.sequences = without_prefix  # one score per new token: they stay aligned with the caption's words
        return generated

    def _logits(self, model, image_inputs, input_ids, attention_mask):
        decoder_ids, decoder_mask = self._with_caption_prefix(input_ids, attention_mask)
        logits = model(
            **self._model_inputs(image_inputs), decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask,
            use_cache=False,
        ).logits  # fmt: skip
        return logits[:, len(self.caption_prefix_ids) :]  # (N, T, V): from the last prefix token, scoring w_1

    encodes_images_once = True

    def _logits_encoding_images_once(self, network, image_inputs, image_index, input_ids, attention_mask):
        # Florence2Model.forward's encoder pass, once per (prompt, image): image features at the prompt's image tokens
        florence = _without_peft_wrapper(network)
        prompt_ids = image_inputs[PROMPT_INPUT_PREFIX + "input_ids"]
        prompt_mask = image_inputs.get(PROMPT_INPUT_PREFIX + "attention_mask")
        prompt_embeds = florence.get_input_embeddings()(prompt_ids)  # (B, P, D)
        image_features = florence.get_image_features(image_inputs["pixel_values"]).pooler_output
        image_features = image_features.to(prompt_embeds.device, prompt_embeds.dtype)
        image_positions = florence.get_placeholder_mask(prompt_ids, prompt_embeds, image_features)
        prompt_embeds = prompt_embeds.masked_scatter(image_positions, image_features)
        encoded = florence.model.language_model.encoder(attention_mask=prompt_mask, inputs_embeds=prompt_embeds)
        # then Florence2ForConditionalGeneration.forward's decoder pass, each encoding repeated for its captions
        encoder_outputs = BaseModelOutput(last_hidden_state=encoded.last_hidden_state.index_select(0, image_index))
        decoder_ids, decoder_mask = self._with_caption_prefix(input_ids, attention_mask)
        logits = network(
            encoder_outputs=encoder_outputs,
            attention_mask=None if prompt_mask is None else prompt_mask.index_select(0, image_index),
            decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask, use_cache=False,
        ).logits  # fmt: skip
        return logits[:, len(self.caption_prefix_ids) :]  # (N, T, V)


class PromptedDecoderCaptioner(PromptedCaptioner):
    """
    A decoder-only model with image tokens in its prompt. It reads `prompt + caption[1:]`: the caption's start token
    is a placeholder (the model's bos, else its pad or end token) that is never fed, since the last prompt token
    predicts the first word. Logits are kept over the caption's positions; `generate()` has the prompt cut off and
    the start token put back in front, so that samples have the form of references.

    Position ids are the ones `generate()` gives the prompt (`model._prepare_position_ids_for_generation`, from the
    attention mask of the left-padded prompt), extended over the caption, so that teacher forcing scores a sample
    under the distribution that decoded it.
    """

    family = "image-text-to-text (chat template): SmolVLM, Idefics3, LLaVA"
    model_classes = (SmolVLMForConditionalGeneration, Idefics3ForConditionalGeneration, LlavaForConditionalGeneration)
    image_tensor_names = ("pixel_values", "pixel_attention_mask", "image_sizes")
    default_prompt = CHAT_CAPTION_INSTRUCTION
    uses_chat_template = True
    # what the token-type entries of the caption's positions are: PaliGemma marks the suffix it predicts with 1
    caption_token_types: ClassVar[dict[str, int]] = {"token_type_ids": 0, "mm_token_type_ids": 0}

    def _declared_tokens(self):
        generation, config = self.model.generation_config, self.model.config
        text_config = config.get_text_config()
        # a composite config (BLIP-2's) may declare the special tokens in its text config only
        end = _first_set(generation.eos_token_id, getattr(config, "eos_token_id", None), text_config.eos_token_id)
        pad = _first_set(generation.pad_token_id, getattr(config, "pad_token_id", None), text_config.pad_token_id)
        # never read by the model (see the class docstring): any special token the decoded texts skip
        start = _first_set(
            generation.bos_token_id, getattr(config, "bos_token_id", None), text_config.bos_token_id, pad, end
        )
        return start, end, pad

    @property
    def generation_module(self) -> nn.Module:
        return self.model

    def complete_generation_config(self, generation_config: GenerationConfig) -> GenerationConfig:
        """[`Captioner.complete_generation_config`], with the model's image placeholder tokens never generated: the
        model's forward counts them in its whole input to place the image features, so a caption holding one could
        not be scored (and a token that stands for pixels is no word of a caption)."""
        config = super().complete_generation_config(generation_config)
        suppressed = set(config.suppress_tokens or []) | set(image_placeholder_token_ids(self.model.config))
        config.suppress_tokens = sorted(suppressed) or None
        return config

    def _model_generate(self, image_inputs, config):
        inputs = self._model_inputs(image_inputs)
        sequences = self._generated_sequences(inputs, config)
        if not isinstance(sequences, torch.Tensor):
            sequences = sequences.sequences
        captions = sequences[:, inputs["input_ids"].size(1) :]  # the prompt cut off
        start = captions.new_full((captions.size(0), 1), self.tokens.start_token_id)
        return torch.cat([start, captions], dim=1)  # (N, 1 + new tokens)

    def _generated_sequences(self, inputs: dict[str, torch.Tensor], config: GenerationConfig) -> Any:
        return self.model.generate(**inputs, generation_config=config)

    def _logits(self, model, image_inputs, input_ids, attention_mask):
        return self._prompt_and_caption_logits(model, self._model_inputs(image_inputs), input_ids, attention_mask)

    def _prompt_and_caption_logits(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None,
        image_outputs: Any = None,
    ) -> torch.FloatTensor:
        """
        Logits over the caption's positions of `prompt + caption[1:]`.

        Args:
            inputs: the model's conditioning inputs (`input_ids`, `attention_mask` of the prompts, image tensors),
                one row per caption.
            image_outputs (*optional*): the output of the model's `get_image_features` with one entry per caption,
                given to the model as `mm_encoder_outputs` in place of the image tensors.
        """
        prompt_ids, prompt_mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
        caption_ids = input_ids[:, 1:]  # (N, T-1): the start token is the prompt's last token's stand-in
        caption_mask = torch.ones_like(caption_ids) if attention_mask is None else attention_mask[:, 1:]
        full_ids = torch.cat([prompt_ids, caption_ids], dim=1)  # (N, P + T - 1)
        full_mask = torch.cat([prompt_mask, caption_mask.to(prompt_mask.dtype)], dim=1)
        for name, caption_type in self.caption_token_types.items():
            if name in inputs:
                inputs[name] = torch.cat([inputs[name], torch.full_like(caption_ids, caption_type)], dim=1)
        network = _without_peft_wrapper(getattr(model, "module", model))
        parameters = inspect.signature(network.forward).parameters
        if "position_ids" in parameters:
            inputs["position_ids"] = self._position_ids(network, full_ids, full_mask, inputs)
        # positions P-1 ... P+T-2: the last prompt token and the caption's, each scoring the next caption token
        num_kept = input_ids.size(1)
        if "logits_to_keep" in parameters:
            inputs["logits_to_keep"] = num_kept
        if image_outputs is not None:
            # BLIP-2's forward requires the `pixel_values` argument, even as None
            inputs.update(mm_encoder_outputs={"image": image_outputs}, pixel_values=None)
        logits = model(input_ids=full_ids, attention_mask=full_mask, use_cache=False, **inputs).logits
        return logits[:, -num_kept:]  # (N, T, V)

    @property
    def encodes_images_once(self) -> bool:
        # through transformers' pre-encoded images (`mm_encoder_outputs`), which every family here takes; a model
        # without them reads its image once per caption
        network = _without_peft_wrapper(self.model)
        takes_encoded_images = "mm_encoder_outputs" in inspect.signature(network.forward).parameters
        return takes_encoded_images and callable(getattr(network, "get_image_features", None))

    def _logits_encoding_images_once(self, network, image_inputs, image_index, input_ids, attention_mask):
        # the model's forward with its `mm_encoder_outputs` (transformers' pre-encoded images) in place of the pixels:
        # it puts the given features at each row's image tokens as it would have put those of its own pixels
        inputs = self._model_inputs(image_inputs)
        features_model = _without_peft_wrapper(network)
        feature_parameters = inspect.signature(features_model.get_image_features).parameters
        image_tensors = {name: inputs[name] for name in self.image_tensor_names if name in feature_parameters}
        image_outputs = features_model.get_image_features(**image_tensors, return_dict=True)
        num_prompts = inputs["input_ids"].size(0)
        image_outputs.pooler_output = self._features_per_caption(image_outputs.pooler_output, image_index, num_prompts)
        # what else conditions the language model (the prompt; Qwen2-VL's `image_grid_thw`, which places its 3D rope
        # positions) is repeated for each caption
        per_caption = {
            name: tensor.index_select(0, image_index)
            for name, tensor in inputs.items()
            if name not in ("pixel_values", "pixel_attention_mask", "image_sizes")
        }
        return self._prompt_and_caption_logits(network, per_caption, input_ids, attention_mask, image_outputs)

    def _features_per_caption(self, features: Any, image_index: torch.LongTensor, num_prompts: int) -> Any:
        """
        The image features of `get_image_features` repeated for each caption: a tensor with one row per prompt
        (PaliGemma, BLIP-2), or a list with one entry per prompt (the flattened tokens of its image, or of all its
        image's tiles: SmolVLM, Qwen2-VL, LLaVA), as the model's forward reads it.
        """
        if len(features) != num_prompts:
            raise ValueError(
                f"{type(self.model).__name__}'s image features have {len(features)} entries for {num_prompts} "
                "prompts: a prompted captioner reads one image per prompt; collate one image per row with "
                "`CaptionCollator`."
            )
        if isinstance(features, torch.Tensor):
            return features.index_select(0, image_index)  # (N, image tokens, D)
        return type(features)(features[row] for row in image_index.tolist())

    def _position_ids(
        self, network: nn.Module, input_ids: torch.LongTensor, attention_mask: torch.Tensor, inputs: dict
    ) -> torch.LongTensor:
        """The position ids `generate()` gives a left-padded sequence of these tokens (3D ones for Qwen2-VL)."""
        model_kwargs = {**inputs, "input_ids": input_ids, "attention_mask": attention_mask}
        return network._prepare_position_ids_for_generation(input_ids, model_kwargs)


class PaliGemmaCaptioner(PromptedDecoderCaptioner):
    """
    `PaliGemmaForConditionalGeneration`: prompted with `caption en` (its processor adds the image tokens, bos and the
    newline); the prompt is a prefix attended bidirectionally (token type 0), the caption a causal suffix (token type
    1), and its positions count from 1.
    """

    family = "PaliGemmaForConditionalGeneration"
    model_classes = (PaliGemmaForConditionalGeneration,)
    image_tensor_names = ("pixel_values",)
    default_prompt = "caption en"
    uses_chat_template = False
    caption_token_types = {"token_type_ids": 1}

    def prompt_text(self, processor, prompt=None):
        text = super().prompt_text(processor, prompt)
        # with its image token written, the processor expands it to the image's tokens instead of warning that it
        # has to infer them
        image_token = getattr(processor, "image_token", None)
        return text if image_token is None or image_token in text else image_token + text

    def _position_ids(self, network, input_ids, attention_mask, inputs):
        # PaliGemma's prepare_inputs_for_generation shifts the positions by one: they start at 1
        return super()._position_ids(network, input_ids, attention_mask, inputs) + 1


class Blip2Captioner(PromptedDecoderCaptioner):
    """
    `Blip2ForConditionalGeneration` with a decoder-only language model (OPT): no prompt by default (its processor
    still puts the query tokens' `<image>` placeholders and bos before the caption). Its `generate()` runs the language
    model's, whose generation config is the one to replace.
    """

    family = "Blip2ForConditionalGeneration"
    model_classes = (Blip2ForConditionalGeneration,)
    image_tensor_names = ("pixel_values",)
    default_prompt = ""
    uses_chat_template = False

    @classmethod
    def handles(cls, model: nn.Module) -> bool:
        return super().handles(model) and not model.config.get_text_config().is_encoder_decoder

    @property
    def generation_module(self) -> nn.Module:
        return self.model.language_model


class Qwen2VLCaptioner(PromptedDecoderCaptioner):
    """
    `Qwen2VLForConditionalGeneration` and `Qwen2_5_VLForConditionalGeneration`: chat-prompted, with images of any
    size as flattened patches, `pixel_values` `(total_patches, patch_dim)` and `image_grid_thw` `(num_images, 3)`
    (each image's `t * h * w` patches). Selecting the images of captions therefore selects each image's block of
    patches, not rows of `pixel_values`.
    """

    family = "Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration"
    model_classes = (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration)
    image_tensor_names = ("pixel_values", "image_grid_thw")

    def _rows(self, image_inputs, image_index):
        patches, grids = image_inputs["pixel_values"], image_inputs["image_grid_thw"]
        blocks = patches.split(grids.prod(dim=-1).tolist())  # one (t*h*w, patch_dim) block per image
        selected = {
            name: tensor.index_select(0, image_index)
            for name, tensor in image_inputs.items()
            if name != "pixel_values"
        }
        selected["pixel_values"] = torch.cat([blocks[row] for row in image_index.tolist()])
        return selected


PROMPTED_CAPTIONERS: tuple[type[Captioner], ...] = (
    Florence2Captioner,
    PaliGemmaCaptioner,
    Blip2Captioner,
    Qwen2VLCaptioner,
    PromptedDecoderCaptioner,
)
for _family in PROMPTED_CAPTIONERS:
    register_captioner(_family)
