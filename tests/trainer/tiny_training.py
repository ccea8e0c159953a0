"""What the trainer's tests and their multi-process scripts share: the tiny images' size, a tiny captioner, and the
shapes splits of the two-process runs. A module of its own, not `conftest.py`, so that another folder's `conftest`
imported first cannot shadow it."""

from rlcaption.data import load_shapes
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell

IMAGE_SIZE = 48  # small, and divisible by the 16x reduction of the tiny CNN


def two_process_shapes(cache_dir: str, num_validation: int = 4):
    """The tiny shapes splits the two-process scripts train on, and a processor over their training captions."""
    shapes = load_shapes(
        num_train=16, num_validation=num_validation, num_test=4, image_size=IMAGE_SIZE, seed=3, cache_dir=cache_dir
    )
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    return shapes, CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)


def make_tiny_model(processor, seed: int = 0, dropout: float = 0.0):
    return make_show_tell(processor, IMAGE_SIZE, seed=seed, dropout=dropout)


def leave_process_group(trainer) -> None:
    """Every process waits for the others, then leaves the process group, as the recipes end: a process that exits
    still in a gloo group may be aborted as the interpreter shuts down ("terminate called without an active
    exception")."""
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
