r"""
Tiny image-text-to-text captioners with random weights for fast tests: Florence-2, BLIP-2 (OPT), PaliGemma, SmolVLM
(Idefics3) and Qwen2-VL, each with its real processor class and a tokenizer trained here on shapes captions, built
offline ([`make_tiny_vlm`]). Each has under 100,000 parameters: widths of 16 to 32, one layer per tower, 32-pixel
images, so that a forward pass takes milliseconds.

Every model has dropout (and drop-path) 0, so that a forward pass in training mode is deterministic, and a generation
config with its tokenizer's bos, eos and pad ids, so that `generate()` stops at the end of a caption. Its weights are
drawn with a large std, so that greedy captions differ from image to image.

The prompt conventions of each family, as its published checkpoints have them:

- `florence2` (encoder-decoder): task prompt `"<CAPTION>"`, which the processor rewrites to "What does the image
  describe?". The encoder reads `<image>` x 17, then `<s>` prompt `</s>`. Labels are the caption as the tokenizer
  encodes it, `<s>` caption `</s>`; the decoder starts with `</s>`, and `generate()` returns that start and the new
  tokens, without the prompt.
- `blip2` (OPT): no prompt, the caption follows the image (a prompt, if given, comes before the caption). The
  processor writes `<image>` x 4 (one per query token), then the text with OPT's bos `</s>` first; it puts the image
  tokens before any padding, so a left-padded row starts `<image>` x 4 `<pad>` ... `</s>`. A caption ends with a
  newline, the generation config's eos (the tokenizer's eos stays `</s>`).
- `paligemma`: prompt `"<image>caption en"`. The processor writes `<image>` x 16, `<bos>`, the prompt and a newline
  (and inserts `<image>` itself, with a warning, when the prompt has none). Its `suffix=` appends caption `<eos>` and
  returns `labels` with -100 over the prompt; it returns all-(-100) `labels` without a suffix, and `token_type_ids`
  (0 for the prompt, which the model attends to bidirectionally, 1 for the caption).
- `smolvlm` (Idefics3): a user turn of the chat template, `[{"type": "image"}, {"type": "text", "text": ...}]`, with
  `add_generation_prompt=True`: `<|im_start|>User:<image>Describe the image.<end_of_utterance>\nAssistant:`. The
  processor takes images as one list per prompt (`[[image] for image in images]`) and expands each `<image>` to
  `<fake_token_around_image><global-img>` `<image>` x 4 `<fake_token_around_image>` (image splitting is off). A caption
  ends with `<end_of_utterance>`.
- `qwen2_vl`: a user turn of the chat template, as SmolVLM's, with `add_generation_prompt=True`: a default system turn,
  then `<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>\n` and
  `<|im_start|>assistant\n`. The processor resizes each image, keeping its aspect ratio, to at most 32 x 32 pixels in
  4-pixel patches and writes one `<|image_pad|>` per 2 x 2 patches (16 for a square image), with `image_grid_thw`; the
  model also takes `mm_token_type_ids`. A caption ends with `<|im_end|>`.

Decoder-only families return the prompt and the new tokens from `generate()`, and need their prompts padded on the
left: set `processor.tokenizer.padding_side = "left"`, as these tokenizers keep their class's default (left for
PaliGemma's, right for the others).

transformers 5.25 needs torchvision for the video processors of Qwen2-VL and SmolVLM, which captioning images does not
use: their processors here have none (SmolVLM's a stand-in with its frame-sampling defaults), so they cannot be saved
with `save_pretrained`; build them again with `make_tiny_vlm`.
"""

import contextlib
import json
import random
from collections.abc import Sequence
from types import SimpleNamespace
from unittest import mock

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    Blip2Config,
    Blip2ForConditionalGeneration,
    Blip2Processor,
    BlipImageProcessorPil,
    CLIPImageProcessorPil,
    Florence2Config,
    Florence2ForConditionalGeneration,
    Florence2Processor,
    GemmaTokenizer,
    GPT2Tokenizer,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PaliGemmaProcessor,
    ProcessorMixin,
    Qwen2Tokenizer,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    RobertaTokenizer,
    SiglipImageProcessorPil,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
    SmolVLMProcessor,
)
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE as SMOLVLM_CHAT_TEMPLATE

from rlcaption.shapes import SceneObject, describe_scene
from rlcaption.shapes.dataset import COLORS, SHAPES, SIZES

__all__ = ["TINY_VLM_FAMILIES", "TINY_VLM_IMAGE_SIZE", "make_tiny_vlm"]

TINY_VLM_FAMILIES = ("florence2", "blip2", "paligemma", "smolvlm", "qwen2_vl")
# Side of the square images every tiny captioner's image processor resizes to.
TINY_VLM_IMAGE_SIZE = 32
# Published checkpoints initialise with std 0.02. At that scale a one-layer network with tied embeddings passes its
# input embedding through nearly unchanged, and predicts the token it was given: Florence-2 would end every caption at
# once (its decoder starts with its eos) and the decoder-only models would repeat the prompt's last token whatever the
# image. A larger std makes greedy captions differ between images, as the tests of rewards and baselines need.
_INITIALIZER_RANGE = 0.5
_TEXT_WIDTH = 32
_MAX_POSITIONS = 128
_BLIP2_NUM_QUERY_TOKENS = 4
# Words of the prompts, beside those of the shapes captions, so that the tokenizers merge them as real ones would.
_PROMPT_TEXT = (
    "What does the image describe?",
    "caption en",
    "Describe the image.",
    "User:",
    "Assistant:",
    "system\nYou are a helpful assistant.",
    "user\n",
    "assistant\n",
)


def _training_corpus() -> list[str]:
    """Shapes captions of one- and two-object scenes covering every shape, colour and size, and the prompts."""
    rng = random.Random(0)
    objects = [(shape, color, size) for shape in SHAPES for color in COLORS for size in SIZES]
    scenes = []
    for attributes, partner in zip(objects, reversed(objects), strict=True):
        first_cell, second_cell = rng.sample(range(9), 2)
        first = SceneObject(*attributes, *divmod(first_cell, 3))
        scenes += [(first,), (first, SceneObject(*partner, *divmod(second_cell, 3)))]
    return [*(caption for scene in scenes for caption in describe_scene(scene, rng)), *_PROMPT_TEXT]


def byte_level_bpe(
    special_tokens: list[str], vocab_size: int = 600, corpus: Sequence[str] | None = None
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """
    A byte-level BPE (GPT-2, RoBERTa/BART, OPT, Qwen2, SmolLM2) trained on `corpus` and the prompts' words (the
    shapes corpus when `None`); `special_tokens` take the first ids, in order.

    Returns:
        `(vocab, merges)` for a transformers tokenizer's `vocab=` and `merges=` arguments.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(_training_corpus(), trainer)
    return _vocab_and_merges(backend)


def _vocab_and_merges(backend: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    # `tokenizers` exposes a trained BPE's merges only through its serialisation.
    merges = json.loads(backend.to_str())["model"]["merges"]
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in merges]
    return backend.get_vocab(with_added_tokens=True), merges


def _gemma_bpe(special_tokens: list[str], vocab_size: int = 700) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """
    A SentencePiece-style BPE as Gemma's: spaces become `▁`, and characters outside the vocabulary fall back to the
    byte tokens `<0x00>` ... `<0xFF>`, which follow `special_tokens`.
    """
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="▁", behavior="merged_with_next")
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[*special_tokens, *byte_tokens])
    backend.train_from_iterator(_training_corpus(), trainer)
    return _vocab_and_merges(backend)


@contextlib.contextmanager
def no_video_processor():
    """
    Lets Qwen2-VL's and SmolVLM's processors be built without a video processor. transformers 5.25 checks every
    sub-processor against its base class, even one left out, and the video processors' base class needs torchvision,
    which captioning images does not. Only that check is skipped, and only for an absent video processor.
    """
    check_class = ProcessorMixin.check_argument_for_proper_class

    def check_present_arguments(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return check_class(self, argument_name, argument)

    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", check_present_arguments):
        yield


def _florence2(seed: int):
    tokenizer = RobertaTokenizer(
        *byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<image>"]),
        extra_special_tokens={"image_token": "<image>"},
    )
    # Two stages of DaViT (strides 4 and 2) leave a 4 x 4 grid of 32-wide features: 16 spatial tokens and the
    # temporal one.
    image_processor = CLIPImageProcessorPil(
        size={"height": TINY_VLM_IMAGE_SIZE, "width": TINY_VLM_IMAGE_SIZE},
        do_center_crop=False,
        image_seq_length=(TINY_VLM_IMAGE_SIZE // 8) ** 2 + 1,
    )
    processor = Florence2Processor(image_processor=image_processor, tokenizer=tokenizer)
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    text_config = dict(
        model_type="bart", vocab_size=len(tokenizer), d_model=_TEXT_WIDTH, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=_MAX_POSITIONS, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        decoder_start_token_id=tokenizer.eos_token_id, init_std=_INITIALIZER_RANGE,
        forced_eos_token_id=None,  # a caption cut at `max_new_tokens` stays cut, as the decoder-only families' do
        **special_ids,
    )  # fmt: skip
    vision_config = dict(
        depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1], patch_prenorm=[False, True],
        embed_dim=[16, _TEXT_WIDTH], num_heads=[1, 2], num_groups=[1, 2], window_size=2, drop_path_rate=0.0,
        projection_dim=_TEXT_WIDTH, max_position_embeddings=TINY_VLM_IMAGE_SIZE // 8,
        initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    config = Florence2Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=tokenizer.image_token_id,
        initializer_range=_INITIALIZER_RANGE,
    )
    torch.manual_seed(seed)
    model = Florence2ForConditionalGeneration(config)
    model.generation_config.update(decoder_start_token_id=tokenizer.eos_token_id, **special_ids)
    return model, processor


def _blip2(seed: int):
    # OPT's tokenizer: GPT-2's byte-level BPE with BART's special tokens, and `</s>` as bos and eos, prepended to
    # every text.
    tokenizer = GPT2Tokenizer(
        *byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>"]),
        bos_token="</s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
    )
    image_processor = BlipImageProcessorPil(size={"height": TINY_VLM_IMAGE_SIZE, "width": TINY_VLM_IMAGE_SIZE})
    # The processor adds `<image>` to the tokenizer and writes it once per query token before the text.
    processor = Blip2Processor(
        image_processor=image_processor, tokenizer=tokenizer, num_query_tokens=_BLIP2_NUM_QUERY_TOKENS
    )
    # BLIP-2 OPT was trained with captions ending in a newline, its eos for generation (as in its published config).
    (newline_id,) = tokenizer("\n", add_special_tokens=False).input_ids
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=newline_id, pad_token_id=tokenizer.pad_token_id
    )
    vision_config = dict(
        image_size=TINY_VLM_IMAGE_SIZE, patch_size=8, hidden_size=_TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    qformer_config = dict(
        hidden_size=_TEXT_WIDTH, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        cross_attention_frequency=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    text_config = dict(
        model_type="opt", vocab_size=len(tokenizer), hidden_size=_TEXT_WIDTH, word_embed_proj_dim=_TEXT_WIDTH,
        ffn_dim=64, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=_MAX_POSITIONS, dropout=0.0,
        attention_dropout=0.0, init_std=_INITIALIZER_RANGE, **special_ids,
    )  # fmt: skip
    config = Blip2Config(
        vision_config=vision_config,
        qformer_config=qformer_config,
        text_config=text_config,
        num_query_tokens=_BLIP2_NUM_QUERY_TOKENS,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        initializer_range=_INITIALIZER_RANGE,
    )
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(config)
    # `_init_weights` starts the query tokens at zero, so that the queries are all alike and the captions of different
    # images nearly so; drawn as the other weights, they read different parts of the image.
    with torch.no_grad():
        model.query_tokens.normal_(std=_INITIALIZER_RANGE)
    model.generation_config.update(**special_ids)
    return model, processor


def _paligemma(seed: int):
    tokenizer = GemmaTokenizer(*_gemma_bpe(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<image>"]))
    tokenizer.add_special_tokens({"extra_special_tokens": ["<image>"]})
    # SigLIP with 8-pixel patches: 16 image tokens.
    image_processor = SiglipImageProcessorPil(
        size={"height": TINY_VLM_IMAGE_SIZE, "width": TINY_VLM_IMAGE_SIZE},
        image_seq_length=(TINY_VLM_IMAGE_SIZE // 8) ** 2,
    )
    # The processor adds the 1,152 location and segmentation tokens of the published tokenizer.
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    tokenizer = processor.tokenizer
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    vision_config = dict(
        image_size=TINY_VLM_IMAGE_SIZE, patch_size=8, hidden_size=_TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=_TEXT_WIDTH, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=_MAX_POSITIONS,
        attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE, **special_ids,
    )  # fmt: skip
    config = PaliGemmaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=processor.image_token_id,
        vocab_size=len(tokenizer),
        projection_dim=_TEXT_WIDTH,
        hidden_size=_TEXT_WIDTH,
        initializer_range=_INITIALIZER_RANGE,
        **special_ids,
    )
    torch.manual_seed(seed)
    model = PaliGemmaForConditionalGeneration(config)
    model.generation_config.update(**special_ids)
    return model, processor


# Qwen2-VL-Instruct's chat template: a default system turn, then ChatML turns in which each image is
# `<|vision_start|><|image_pad|><|vision_end|>`; the processor repeats `<|image_pad|>` once per merged patch.
_QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_QWEN2_VL_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
]  # fmt: skip


def _qwen2_vl(seed: int):
    tokenizer = Qwen2Tokenizer(
        *byte_level_bpe(_QWEN2_VL_SPECIAL_TOKENS),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=_QWEN2_VL_SPECIAL_TOKENS[1:],
    )
    # Dynamic resolution: each image is resized, keeping its aspect ratio, to a multiple of 8 pixels (4-pixel patches,
    # merged 2 x 2) of at most 32 x 32 pixels: a square shapes image gives an 8 x 8 patch grid and 16 image tokens.
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 16 * 16, "longest_edge": TINY_VLM_IMAGE_SIZE**2},
        patch_size=4,
        temporal_patch_size=2,
        merge_size=2,
    )
    with no_video_processor():
        processor = Qwen2VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=_QWEN2_VL_CHAT_TEMPLATE,
        )
    # Qwen2-VL-Instruct ends an answer with `<|im_end|>` and a document with `<|endoftext|>`, its bos and pad.
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    special_ids = dict(
        bos_token_id=end_of_text, eos_token_id=[tokenizer.eos_token_id, end_of_text], pad_token_id=end_of_text
    )
    vision_config = dict(
        depth=1, embed_dim=16, hidden_size=_TEXT_WIDTH, num_heads=2, mlp_ratio=2, patch_size=4, spatial_merge_size=2,
        temporal_patch_size=2, initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    # Multimodal RoPE splits each head's 8 frequency pairs between time, height and width.
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=_TEXT_WIDTH, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=_MAX_POSITIONS,
        attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}, **special_ids,
    )  # fmt: skip
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=processor.image_token_id,
        video_token_id=processor.video_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        initializer_range=_INITIALIZER_RANGE,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.update(**special_ids)
    return model, processor


# SmolLM2's special tokens, then those SmolVLM adds for images and the end of a chat turn.
_SMOLVLM_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>",
    "<global-img>",
]  # fmt: skip


def _smolvlm(seed: int):
    tokenizer = GPT2Tokenizer(
        *byte_level_bpe(_SMOLVLM_SPECIAL_TOKENS),
        unk_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        extra_special_tokens=_SMOLVLM_SPECIAL_TOKENS[3:],
    )
    # Without image splitting an image is resized to one 32-pixel square: 16 patches of 8 pixels, which the
    # connector's pixel shuffle (scale factor 2) turns into 4 image tokens.
    image_processor = SmolVLMImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": TINY_VLM_IMAGE_SIZE},
        max_image_size={"longest_edge": TINY_VLM_IMAGE_SIZE},
    )
    with no_video_processor():
        processor = SmolVLMProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            image_seq_len=(TINY_VLM_IMAGE_SIZE // 8) ** 2 // 2**2,
            chat_template=SMOLVLM_CHAT_TEMPLATE,
        )
    # `apply_chat_template` reads the video processor's frame sampling (SmolVLM's defaults: 64 frames, 1 per second)
    # even for a conversation without video.
    processor.video_processor = SimpleNamespace(num_frames=64, fps=1)
    # SmolVLM-Instruct ends an answer with `<end_of_utterance>`.
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    vision_config = dict(
        image_size=TINY_VLM_IMAGE_SIZE, patch_size=8, hidden_size=_TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    text_config = dict(
        model_type="llama", vocab_size=len(tokenizer), hidden_size=_TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=_MAX_POSITIONS, attention_dropout=0.0, initializer_range=_INITIALIZER_RANGE,
        **special_ids,
    )  # fmt: skip
    config = SmolVLMConfig(
        vision_config=vision_config,
        text_config=text_config,
        scale_factor=2,
        image_token_id=processor.image_token_id,
        initializer_range=_INITIALIZER_RANGE,
        **special_ids,
    )
    torch.manual_seed(seed)
    model = SmolVLMForConditionalGeneration(config)
    model.generation_config.update(**special_ids)
    return model, processor


_BUILDERS = {
    "florence2": _florence2,
    "blip2": _blip2,
    "paligemma": _paligemma,
    "smolvlm": _smolvlm,
    "qwen2_vl": _qwen2_vl,
}


def make_tiny_vlm(family: str, seed: int = 0):
    """
    A tiny captioner of `family` (one of `TINY_VLM_FAMILIES`) with random weights drawn from `seed`, and its own
    processor.

    Returns:
        `(model, processor)`: the model in training mode, as `from_config` leaves it.
    """
    if family not in _BUILDERS:
        raise ValueError(f"Unknown captioner family {family!r}; expected one of {TINY_VLM_FAMILIES}.")
    return _BUILDERS[family](seed)
