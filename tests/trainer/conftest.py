import pytest

from rlcaption.data import load_shapes
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell

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


def make_tiny_model(processor, seed: int = 0, dropout: float = 0.0):
    return make_show_tell(processor, IMAGE_SIZE, seed=seed, dropout=dropout)


@pytest.fixture
def tiny_model(tiny_processor):
    return make_tiny_model(tiny_processor)
