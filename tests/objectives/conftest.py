"""Tiny shapes data shared by the objectives' tests."""

import pytest

from rlcaption.data import load_shapes
from rlcaption.processing import CaptionProcessor

IMAGE_SIZE = 48  # small, and divisible by the 16x reduction of the tiny CNN


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    return load_shapes(
        num_train=16, num_validation=8, num_test=4, image_size=IMAGE_SIZE, seed=5,
        cache_dir=tmp_path_factory.mktemp("shapes_cache"),
    )  # fmt: skip


@pytest.fixture(scope="session")
def processor(shapes):
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    return CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)
