"""The rewards of real RL steps' captions, computed for every row and once per distinct (image, caption) pair, side
by side in one run.

    python benchmarks/bench_reward_repeats.py [--images 128] [--repeats 5]

A trained policy repeats itself: among an SCST step's 5 samples of an image, and even more among `spider_pg`'s
rollouts, which continue the same prefix K times, many captions are the same. `RewardMix` computes a reward that
scores each caption on its own (`scores_captions_independently`: CIDEr-D with the training set's document
frequencies, BLEU, ROUGE-L) once per distinct pair. The captions here are drawn from the published checkpoints
(`checkpoints/`) for `--images` training images: 5 samples and the greedy caption of each image from the SCST warm
start and from the `spider_pg` checkpoint, and that checkpoint's rollouts (M = 1, K = 3). Each set is scored by
`RewardMix.score_groups` with the CIDEr-D reward, once as it is and once wrapped so that it does not declare itself
independent (every row scored); medians of `--repeats` calls after one, and whether the values are the same.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import datasets
import numpy as np
import torch
import transformers
from bench_reward_processes import time_scoring

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes
from rlcaption.generation.decoding import caption_token_mask, generate_captions
from rlcaption.objectives.spider_pg import Rollouts, sample_rollouts
from rlcaption.rewards import CiderReward, RewardMix

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


class EveryRow:
    """A reward computed for every row: the wrapped reward, without its `scores_captions_independently`."""

    def __init__(self, reward):
        self.reward, self.__name__ = reward, reward.__name__

    def __call__(self, **inputs):
        return self.reward(**inputs)


def rollouts_of(model: ShowTellRL, processor: CaptionProcessor, pixel_values: torch.Tensor) -> Rollouts:
    """One caption sampled per image (pure sampling, 20 tokens, seed 0) and its rollouts (K = 3)."""
    torch.manual_seed(0)
    inputs = {"pixel_values": pixel_values}
    sample = generate_captions(model, processor, inputs, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=20)
    mask = caption_token_mask(sample.sequences, model.config.eos_token_id)
    end, pad = model.config.eos_token_id, model.config.pad_token_id
    return sample_rollouts(model, inputs, sample.sequences, mask, 3, 20, end, pad)


def step_captions(checkpoint: str, pixel_values: torch.Tensor, rollouts: bool) -> list[list[str]]:
    """Per image: its 5 samples and its greedy caption, or (`rollouts`) the rollouts of one sample's prefixes."""
    model = ShowTellRL.from_pretrained(CHECKPOINTS / checkpoint)
    processor = CaptionProcessor.from_pretrained(CHECKPOINTS / checkpoint)
    num_images = len(pixel_values)
    if not rollouts:
        torch.manual_seed(0)
        inputs = {"pixel_values": pixel_values}
        sampling = dict(do_sample=True, top_k=0, top_p=1.0, max_new_tokens=20)
        samples = generate_captions(model, processor, inputs, num_return_sequences=5, **sampling)
        greedy = generate_captions(model, processor, inputs, do_sample=False, max_new_tokens=20)
        return [samples.texts[5 * image : 5 * image + 5] + [greedy.texts[image]] for image in range(num_images)]
    found = rollouts_of(model, processor, pixel_values)
    texts = [text.strip() for text in processor.batch_decode(found.sequences, skip_special_tokens=True)]
    groups = [[] for _ in range(num_images)]
    for image, text in zip(found.caption_index.tolist(), texts, strict=True):
        groups[image].append(text)
    return groups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as cache_dir:
        train = load_shapes(num_train=1024, num_validation=4, num_test=4, image_size=48, cache_dir=cache_dir)["train"]
    images = train.select(range(args.images))
    pixel_values = CaptionProcessor.from_pretrained(CHECKPOINTS / "show-tell-rl-shapes-xe")(
        images=images["image"], return_tensors="pt"
    )["pixel_values"]
    references, image_ids = train["captions"][: args.images], list(range(args.images))
    cider = CiderReward()
    once_per_pair, every_row = RewardMix([cider]), RewardMix([EveryRow(cider)])
    once_per_pair.prepare(train)  # the same CIDEr-D object, its document frequencies counted once for both
    steps = {
        "SCST, XE warm start": ("show-tell-rl-shapes-xe", False),
        "SCST, spider_pg checkpoint": ("show-tell-rl-shapes-spider-pg-cider", False),
        "spider_pg rollouts": ("show-tell-rl-shapes-spider-pg-cider", True),
    }
    print("| captions | rows | distinct pairs | every row ms | once per pair ms | speed-up | same rewards |")
    print("|---|---|---|---|---|---|---|")
    for name, (checkpoint, rollouts) in steps.items():
        completions = step_captions(checkpoint, pixel_values, rollouts)
        rows = sum(len(group) for group in completions)
        pairs = sum(len(set(group)) for group in completions)
        every_ms, every_total = time_scoring(every_row, completions, references, image_ids, args.repeats)
        once_ms, once_total = time_scoring(once_per_pair, completions, references, image_ids, args.repeats)
        print(
            f"| {name} | {rows} | {pairs} | {every_ms:.1f} | {once_ms:.1f} | {every_ms / once_ms:.2f}x | "
            f"{np.allclose(once_total, every_total, rtol=0, atol=1e-12)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
