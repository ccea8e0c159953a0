"""Chen & Jin's pairwise BLEU distance among the s captions of an image: the batched computation of `sle` against a
plain loop over pycocoevalcap's `BleuScorer`, one call per ordered pair.

    python benchmarks/bench_pairwise_distance.py [--num-images 200] [--repeats 3] [--output bench_pairwise.json]

The captions are the shapes dataset's (`rlcaption.data.load_shapes`), tokenized once with `normalize_caption`: for
s = 5 each image's 5 references, for s = 10 those and the next image's 5 (as s samples of a policy, they are similar
but not equal). The distance is d(y, y') = 1 - (BLEU-3 + BLEU-4) / 2 of y against y' as its single reference, for all
s * s ordered pairs of every image. Each row gives the time of both over all images (median of `--repeats` runs),
their ratio, and the largest |difference| between the two distance matrices.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import datasets
import numpy as np
from pycocoevalcap.bleu.bleu_scorer import BleuScorer

from rlcaption.data import load_shapes
from rlcaption.metrics.diversity import pairwise_caption_distances
from rlcaption.metrics.tokenization import normalize_caption


def loop_distances(captions: list[str]) -> np.ndarray:
    """The reference: one `BleuScorer` per ordered pair (candidate j, single reference k)."""
    distances = np.empty((len(captions), len(captions)))
    for j, candidate in enumerate(captions):
        for k, reference in enumerate(captions):
            scorer = BleuScorer(n=4)
            scorer += (candidate, [reference])
            _, per_sentence = scorer.compute_score(option="closest")
            distances[j, k] = 1.0 - (per_sentence[2][0] + per_sentence[3][0]) / 2
    return distances


def _median_time(distances, groups: list[list[str]], repeats: int) -> tuple[float, list[np.ndarray]]:
    """The median time of `distances` over every group, and its matrices."""
    timings, matrices = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        matrices = [distances(group) for group in groups]
        timings.append(time.perf_counter() - start)
    return statistics.median(timings), matrices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=200, help="Images, each with s captions.")
    parser.add_argument(
        "--repeats", type=int, default=3, help="Timed runs of each implementation; the median is kept."
    )
    parser.add_argument("--output", default=None, help="Optional JSON file for the results.")
    args = parser.parse_args()
    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory() as cache_dir:
        shapes = load_shapes(num_train=args.num_images + 1, num_validation=1, num_test=1, image_size=36, seed=0,
                             cache_dir=cache_dir)  # fmt: skip
        references = [[normalize_caption(caption) for caption in captions] for captions in shapes["train"]["captions"]]

    rows = []
    for num_samples in (5, 10):
        # s captions per image: its own references, then the next image's
        groups = [(references[image] + references[image + 1])[:num_samples] for image in range(args.num_images)]
        batched_time, batched = _median_time(pairwise_caption_distances, groups, args.repeats)
        loop_time, looped = _median_time(loop_distances, groups, args.repeats)
        difference = max(float(np.abs(ours - theirs).max()) for ours, theirs in zip(batched, looped, strict=True))
        rows.append(
            {
                "s": num_samples,
                "images": args.num_images,
                "pairs": args.num_images * num_samples**2,
                "batched_s": batched_time,
                "pycocoevalcap_loop_s": loop_time,
                "speedup": loop_time / batched_time,
                "max_abs_difference": difference,
            }
        )

    print(f"Pairwise BLEU distance, {args.num_images} shapes images ({platform.processor() or platform.machine()})")
    print("|  s | pairs | batched (ms) | BleuScorer loop (ms) | loop / batched | max abs difference |")
    print("|---:|------:|-------------:|---------------------:|---------------:|-------------------:|")
    for row in rows:
        print(
            f"| {row['s']:>2} | {row['pairs']:>5} | {1e3 * row['batched_s']:>12.1f} | "
            f"{1e3 * row['pycocoevalcap_loop_s']:>20.1f} | {row['speedup']:>13.1f}x | "
            f"{row['max_abs_difference']:>18.1e} |"
        )
    if args.output:
        with open(args.output, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()
