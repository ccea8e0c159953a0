"""
Tiny captioners with random weights for fast tests: ours, and transformers captioners rlcaption did not write, each
with its own processor built locally (no download): ViT + GPT-2 and ViT + BERT (`TrOCRProcessor`), BLIP
(`BlipProcessor`) and GIT (`GitProcessor`).

The foreign captioners have no dropout, so that a forward pass in training mode is deterministic and the tests can
compare the log-probabilities an objective uses with a teacher-forced forward pass of their own.
"""

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertTokenizerFast,
    BlipConfig,
    BlipForConditionalGeneration,
    BlipImageProcessorPil,
    BlipProcessor,
    CLIPImageProcessorPil,
    GenerationConfig,
    GitConfig,
    GitForCausalLM,
    GitProcessor,
    GPT2Config,
    GPT2TokenizerFast,
    TrOCRProcessor,
    VisionEncoderDecoderConfig,
    VisionEncoderDecoderModel,
    ViTConfig,
    ViTImageProcessorPil,
)

from rlcaption.models.show_tell_rl import ShowTellRL, ShowTellRLConfig
from rlcaption.recipes import new_show_tell_rl

__all__ = [
    "DECODING_SETTINGS",
    "FOREIGN_CAPTIONERS",
    "make_bert_tokenizer",
    "make_blip",
    "make_foreign_captioner",
    "make_gpt2_tokenizer",
    "make_show_tell",
    "make_vision_encoder_decoder",
    "regions_show_tell",
]

# The transformers captioners of the foreign-captioner tests, each built with its own processor.
FOREIGN_CAPTIONERS = ("vit_gpt2", "vit_bert", "blip", "git")
# Width of every tiny transformer (ViT, GPT-2, BERT, BLIP, GIT).
_WIDTH = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_MAX_POSITIONS = 40
_BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# BLIP's text decoder starts captions with its own bos token, `[DEC]` in the published checkpoints.
_BLIP_BOS = "[DEC]"


def make_show_tell(
    processor,
    image_size: int,
    seed: int = 0,
    dropout: float = 0.0,
    hidden_size: int = 32,
    image_attention: bool = False,
):
    torch.manual_seed(seed)
    return new_show_tell_rl(
        processor, image_size, [8, 8, 16, 16], hidden_size, image_attention=image_attention, dropout=dropout
    )


def make_gpt2_tokenizer(captions: list[str]) -> GPT2TokenizerFast:
    """A byte-level BPE tokenizer trained on `captions`, GPT-2 style: `<|endoftext|>` is bos, eos and unk, no pad."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(captions, trainer)
    special = "<|endoftext|>"
    return GPT2TokenizerFast(tokenizer_object=backend, bos_token=special, eos_token=special, unk_token=special)


def make_bert_tokenizer(captions: list[str], bos_token: str | None = None) -> BertTokenizerFast:
    """
    A word-piece tokenizer over the words of `captions`, BERT style: `[CLS] caption [SEP]`, no bos nor eos token
    unless `bos_token` names one (added to the vocabulary, as BLIP's `[DEC]`).
    """
    words = sorted({word for caption in captions for word in caption.lower().replace(".", " ").split()})
    special = [*_BERT_SPECIAL_TOKENS, *([bos_token] if bos_token else [])]
    vocab = {token: index for index, token in enumerate([*special, *words])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece()
    extra = {"bos_token": bos_token} if bos_token else {}
    return BertTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        **extra,
    )


def _vit_config(image_size: int) -> ViTConfig:
    return ViTConfig(image_size=image_size, patch_size=image_size // 4, **_WIDTH, **_NO_DROPOUT)


def make_vision_encoder_decoder(
    processor, image_size: int, seed: int = 0, decoder: str = "gpt2"
) -> VisionEncoderDecoderModel:
    """
    ViT + GPT-2 (`decoder="gpt2"`) or ViT + BERT (`decoder="bert"`) over the processor's tokenizer, with the special
    tokens a user sets: GPT-2 starts and ends captions with the tokenizer's bos and eos; BERT, whose tokenizer has
    neither, with `[CLS]` and `[SEP]`, declared in the generation config.
    """
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    if decoder == "gpt2":
        start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
        decoder_config = GPT2Config(
            vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=_MAX_POSITIONS,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=start, eos_token_id=end, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    elif decoder == "bert":
        start, end = tokenizer.cls_token_id, tokenizer.sep_token_id
        decoder_config = BertConfig(
            vocab_size=len(tokenizer), max_position_embeddings=_MAX_POSITIONS, pad_token_id=tokenizer.pad_token_id,
            **_WIDTH, **_NO_DROPOUT,
        )  # fmt: skip
    else:
        raise ValueError(f"decoder must be 'gpt2' or 'bert', got {decoder!r}.")
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(_vit_config(image_size), decoder_config)
    config.decoder_start_token_id = start
    config.pad_token_id = tokenizer.pad_token_id
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = start
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _blip(tokenizer, image_size: int) -> BlipForConditionalGeneration:
    text_config = dict(
        vocab_size=len(tokenizer), encoder_hidden_size=_WIDTH["hidden_size"], max_position_embeddings=_MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, sep_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.sep_token_id, **_WIDTH, **_NO_DROPOUT,
    )  # fmt: skip
    vision_config = dict(image_size=image_size, patch_size=image_size // 4, attention_dropout=0.0, **_WIDTH)
    return BlipForConditionalGeneration(BlipConfig(text_config=text_config, vision_config=vision_config))


def _git(tokenizer, image_size: int) -> GitForCausalLM:
    vision_config = dict(image_size=image_size, patch_size=image_size // 4, attention_dropout=0.0, **_WIDTH)
    config = GitConfig(
        vision_config=vision_config, vocab_size=len(tokenizer), max_position_embeddings=_MAX_POSITIONS,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id, **_WIDTH, **_NO_DROPOUT,
    )  # fmt: skip
    return GitForCausalLM(config)


def make_foreign_captioner(kind: str, captions: list[str], image_size: int, seed: int = 0):
    """
    A tiny transformers captioner of `kind` (one of `FOREIGN_CAPTIONERS`) and its own processor, whose tokenizer is
    built from `captions`.

    Returns:
        `(model, processor)`.
    """
    if kind == "vit_gpt2":
        image_processor = ViTImageProcessorPil(size={"height": image_size, "width": image_size})
        processor = TrOCRProcessor(image_processor=image_processor, tokenizer=make_gpt2_tokenizer(captions))
        return make_vision_encoder_decoder(processor, image_size, seed=seed, decoder="gpt2"), processor
    if kind == "vit_bert":
        image_processor = ViTImageProcessorPil(size={"height": image_size, "width": image_size})
        processor = TrOCRProcessor(image_processor=image_processor, tokenizer=make_bert_tokenizer(captions))
        return make_vision_encoder_decoder(processor, image_size, seed=seed, decoder="bert"), processor
    torch.manual_seed(seed)
    if kind == "blip":
        image_processor = BlipImageProcessorPil(size={"height": image_size, "width": image_size})
        processor = BlipProcessor(image_processor=image_processor, tokenizer=make_bert_tokenizer(captions, _BLIP_BOS))
        return _blip(processor.tokenizer, image_size), processor
    if kind == "git":
        image_processor = CLIPImageProcessorPil(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
        processor = GitProcessor(image_processor=image_processor, tokenizer=make_bert_tokenizer(captions))
        return _git(processor.tokenizer, image_size), processor
    raise ValueError(f"Unknown captioner kind {kind!r}; expected one of {FOREIGN_CAPTIONERS}.")


# the tiny BLIP of the decoding-loop tests ([`make_blip`])
BLIP_VOCABULARY, BLIP_START, BLIP_END, BLIP_PAD = 30, 2, 3, 0
BLIP_IMAGE_SIZE = 16


def make_blip(seed: int = 0, favoured_end: float = 1.0) -> BlipForConditionalGeneration:
    """A BLIP without processor for the decoding-loop tests: two layers, a vision width other than the text width,
    dropout; the end token favoured by `favoured_end` in its logits, so that captions end at different lengths, as a
    trained captioner's do."""
    torch.manual_seed(seed)
    text_config = dict(
        vocab_size=BLIP_VOCABULARY, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        encoder_hidden_size=24, max_position_embeddings=32, bos_token_id=BLIP_START, sep_token_id=BLIP_END,
        eos_token_id=BLIP_END, pad_token_id=BLIP_PAD, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    )  # fmt: skip
    vision_config = dict(
        image_size=BLIP_IMAGE_SIZE, patch_size=4, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    model = BlipForConditionalGeneration(BlipConfig(text_config=text_config, vision_config=vision_config))
    with torch.no_grad():
        model.text_decoder.cls.predictions.bias[BLIP_END] += favoured_end
    return model.eval()


# the decodings RL asks of a recurrent captioner, by name
DECODING_SETTINGS = {
    "greedy": GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=20),
    "pure sampling": GenerationConfig(
        do_sample=True, num_beams=1, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=5, max_new_tokens=20
    ),
    "temperature, top-k, top-p": GenerationConfig(
        do_sample=True, num_beams=1, temperature=0.7, top_k=10, top_p=0.9, num_return_sequences=3, max_new_tokens=20
    ),
    "short budget": GenerationConfig(
        do_sample=True, num_beams=1, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=2, max_new_tokens=3
    ),
}


def regions_show_tell(image_attention: bool) -> ShowTellRL:
    """A tiny ShowTellRL of region features (6 wide), random weights from seed 0."""
    torch.manual_seed(0)
    return ShowTellRL(
        ShowTellRLConfig(
            vocab_size=30,
            hidden_size=16,
            word_embedding_size=8,
            max_caption_length=8,
            encoder_type="features",
            image_feature_size=6,
            image_feature_layout="grid",
            image_attention=image_attention,
        )  # fmt: skip
    )
