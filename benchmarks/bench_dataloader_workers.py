"""Batches per second of the training data loader with 0 and with N worker processes: decoding JPEG files and
turning them into pixel tensors (as on COCO), against the shapes dataset's small in-memory images.

    python benchmarks/bench_dataloader_workers.py [--images 800] [--workers 0 1 2] [--batch-size 16]
                                                  [--step-ms 0 60] [--epochs 3]

The JPEG dataset is a folder of `--images` generated 224-px photos-like images (smooth shapes and noise) with a
`metadata.jsonl`, loaded by `load_caption_dataset` as the recipes load a folder; the shapes dataset is that of the
recipes (48 px, in memory). Batches are collated by the trainer's `CaptionCollator` (decoding, resizing,
normalising, tokenizing the references). Each epoch starts its workers anew, as the Trainer's loader does by default
(`dataloader_persistent_workers=False`), so their start-up cost is counted. Each batch is followed by a stand-in for
a GPU training step, `--step-ms` during which the main process waits (0 and that, by default): what the workers
prepare meanwhile is what they save. Reported rates are the median over `--epochs` epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter
from torch.utils.data import DataLoader

from rlcaption.data import CaptionCollator, load_caption_dataset, load_shapes
from rlcaption.processing import CaptionProcessor

COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]
SHAPES = ["circle", "square"]


def write_jpeg_folder(folder: Path, num_images: int, size: int = 224, seed: int = 0) -> None:
    """`num_images` JPEGs of `size` px, each a few blurred shapes on a noisy background, with two captions each."""
    generator = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metadata.jsonl", "w", encoding="utf-8") as metadata:
        for index in range(num_images):
            background = generator.integers(90, 170, size=(size, size, 3), dtype=np.uint8)
            image = Image.fromarray(background).filter(ImageFilter.GaussianBlur(2))
            draw = ImageDraw.Draw(image)
            color, shape = COLORS[index % len(COLORS)], SHAPES[index % len(SHAPES)]
            for _ in range(3):
                left, top = generator.integers(0, size - 60, size=2)
                box = (int(left), int(top), int(left) + 60, int(top) + 60)
                (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=color)
            image.save(folder / f"{index:05d}.jpg", quality=90)
            captions = [f"a {color} {shape} on a grey background", f"three {color} {shape}s"]
            metadata.write(json.dumps({"file_name": f"{index:05d}.jpg", "captions": captions}) + "\n")


def training_step(milliseconds: float):
    """A stand-in for a GPU training step after each batch: the main process waits `milliseconds`, as it does while
    the GPU computes (0: the loader alone)."""
    return lambda: time.sleep(milliseconds / 1000)


def batches_per_second(split, collator, batch_size: int, workers: int, step, epochs: int) -> float:
    loader = DataLoader(split, batch_size=batch_size, shuffle=True, collate_fn=collator, num_workers=workers)
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        batches = 0
        for _batch in loader:
            step()
            batches += 1
        rates.append(batches / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=800)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-ms", type=float, nargs="+", default=[0.0, 60.0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    # the tokenizer runs in the workers too; its own threads would only compete with them
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    with tempfile.TemporaryDirectory() as folder:
        write_jpeg_folder(Path(folder), args.images)
        jpegs = load_caption_dataset(folder, verify_images=False)["train"]
        shapes = load_shapes(num_train=args.images, num_validation=1, num_test=1, image_size=48)["train"]
        datasets_and_sizes = {"224-px JPEG files": (jpegs, 224), "shapes, 48 px in memory": (shapes, 48)}
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(
            f"{args.images} images, batches of {args.batch_size}, median of {args.epochs} epochs (workers started "
            f"each epoch), {cores} CPU cores, {torch.get_num_threads()} torch threads"
        )
        header = f"{'dataset':>24} | {'GPU step ms':>11} | {'workers':>7} | {'batches/s':>9} | {'vs 0 workers':>12}"
        print(header)
        print("-" * len(header))
        for name, (split, image_size) in datasets_and_sizes.items():
            processor = CaptionProcessor.from_captions(split["captions"], image_size=image_size)
            collator = CaptionCollator(processor, max_length=21)
            for step_ms in args.step_ms:
                step = training_step(step_ms)
                baseline = None
                for workers in args.workers:
                    rate = batches_per_second(split, collator, args.batch_size, workers, step, args.epochs)
                    baseline = rate if baseline is None else baseline
                    print(f"{name:>24} | {step_ms:11g} | {workers:7d} | {rate:9.2f} | {rate / baseline:11.2f}x")


if __name__ == "__main__":
    main()
