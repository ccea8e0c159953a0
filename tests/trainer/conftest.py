import pytest
import torch

from rlcaption.data import load_shapes
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor

IMAGE_SIZE = 48  # small, and divisible by the 16x reduction of the tiny CNN


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory):
    return load_shapes(
        num_train=24, num_validation=8, num_test=8, image_size=IMAGE_SIZE, seed=3,
        cache_dir=tmp_path_factory.mktemp("shapes_cache"),
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_processor(tiny_shapes):
    captions = [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]
    return CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)


def make_tiny_model(processor, seed: int = 0, dropout: float = 0.0) -> ShowTellRL:
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        word_embedding_size=32,
        encoder_type="cnn",
        image_size=IMAGE_SIZE,
        cnn_channels=[8, 8, 16, 16],
        baseline_hidden_size=16,
        dropout=dropout,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShowTellRL(config)


@pytest.fixture
def tiny_model(tiny_processor):
    return make_tiny_model(tiny_processor)
