"""Speed of the synthetic shapes dataset: generation from scratch, loading from the cache, and decoding.

    python benchmarks/bench_shapes.py [--num-train 8000 --num-validation 1000 --num-test 1000] [--repeats 3]
                                      [--output bench_shapes.json]

The target (DESIGN.md) is 10,000 images generated well under a minute on a 2-core machine. Each stage runs in a
fresh temporary cache directory; the table reports the best of `--repeats` runs and the ratio to the target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import datasets

from rlcaption.shapes.dataset import load_shapes

TARGET_GENERATION_SECONDS = 60.0


def _best_time(function, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-train", type=int, default=8000)
    parser.add_argument("--num-validation", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None, help="Optional JSON file for the results.")
    args = parser.parse_args()
    sizes = {"num_train": args.num_train, "num_validation": args.num_validation, "num_test": args.num_test}
    num_images = sum(sizes.values())
    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory() as root:
        runs = iter(range(10**6))

        def generate() -> datasets.DatasetDict:
            return load_shapes(**sizes, image_size=args.image_size, cache_dir=os.path.join(root, str(next(runs))))

        generation = _best_time(generate, args.repeats)
        cached_dir = os.path.join(root, "cached")
        load_shapes(**sizes, image_size=args.image_size, cache_dir=cached_dir)
        cached = _best_time(
            lambda: load_shapes(**sizes, image_size=args.image_size, cache_dir=cached_dir), args.repeats
        )
        train = load_shapes(**sizes, image_size=args.image_size, cache_dir=cached_dir)["train"]
        decode = _best_time(lambda: [row["image"].load() for row in train.select(range(min(2000, len(train))))], 1)
        decode_rate = min(2000, len(train)) / decode

    rows = [
        ("generate + cache (s)", generation, TARGET_GENERATION_SECONDS),
        ("load from cache (s)", cached, None),
    ]
    print(
        f"shapes: {num_images} images, {args.image_size}px, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"{'stage':<24}{'seconds':>10}{'target':>10}{'ratio':>8}")
    for name, seconds, target in rows:
        target_text = f"{target:>10.1f}{seconds / target:>8.3f}" if target else f"{'-':>10}{'-':>8}"
        print(f"{name:<24}{seconds:>10.2f}{target_text}")
    print(f"{'images per second':<24}{num_images / generation:>10.0f}")
    print(f"{'decoded images / second':<24}{decode_rate:>10.0f}")
    if args.output:
        results = {
            "num_images": num_images,
            "image_size": args.image_size,
            "cpus": os.cpu_count(),
            "generation_seconds": generation,
            "cached_load_seconds": cached,
            "target_generation_seconds": TARGET_GENERATION_SECONDS,
            "decoded_images_per_second": decode_rate,
        }
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
