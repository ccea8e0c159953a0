"""Tiny captioners with random weights for fast tests: ours, and a transformers model rlcaption did not write."""

import torch
from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig

from rlcaption.models import ShowTellRL, ShowTellRLConfig


def make_show_tell(
    processor,
    image_size: int,
    seed: int = 0,
    dropout: float = 0.0,
    hidden_size: int = 32,
    image_attention: bool = False,
):
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        word_embedding_size=hidden_size,
        encoder_type="cnn",
        image_size=image_size,
        cnn_channels=[8, 8, 16, 16],
        image_attention=image_attention,
        dropout=dropout,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShowTellRL(config)


def make_vision_encoder_decoder(processor, image_size: int, seed: int = 0) -> VisionEncoderDecoderModel:
    """ViT + GPT-2 over the processor's word vocabulary."""
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    encoder = ViTConfig(
        image_size=image_size,
        patch_size=image_size // 4,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    decoder = GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=32, **special)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
