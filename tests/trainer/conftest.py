import pytest
from tiny_training import IMAGE_SIZE, make_tiny_model

from rlcaption.data import load_shapes
from rlcaption.models import VisualSemanticEmbedding
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell
from tiny_clips import save_reward_clip


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


@pytest.fixture
def tiny_model(tiny_processor):
    return make_tiny_model(tiny_processor)


@pytest.fixture(scope="session")
def reward_clip(tmp_path_factory, tiny_shapes):
    """A tiny random shapes CLIP saved as a folder with its own processor, as `reward_clip` names one."""
    captions = [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]
    return save_reward_clip(tmp_path_factory.mktemp("reward-clip"), captions)


@pytest.fixture(scope="session")
def embedding_model(tmp_path_factory, tiny_processor):
    """A random visual-semantic embedding (a GRU over the words) saved as a folder, as the `embedding` reward loads."""
    folder = tmp_path_factory.mktemp("embedding")
    captioner = make_show_tell(tiny_processor, IMAGE_SIZE, seed=2)
    VisualSemanticEmbedding.from_captioner(captioner, joint_embedding_size=8).save_pretrained(folder)
    tiny_processor.save_pretrained(folder)
    return str(folder)
