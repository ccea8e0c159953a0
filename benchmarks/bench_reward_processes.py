"""The CIDEr-D reward of one RL step scored in the training process and in worker processes, side by side in one run.

    python benchmarks/bench_reward_processes.py [--processes 2 4 8] [--images 128] [--repeats 5]

A process scores no fewer than `rlcaption.rewards.processes.MIN_ROWS_PER_SHARE` rows, so more processes than a
call has shares of that size change nothing.

A step's captions are built from shapes references (each image's own, another image's, one cut short, and an empty
one, repeated with a number added, so that every caption of an image differs: a caption repeated is scored once,
see `bench_reward_repeats.py`): `--images` x 6 captions, as an SCST step of 5 samples and a greedy caption per image
scores, and `--images` x 30, about what `spider_pg`'s rollouts (M = 1, K = 3, 10 tokens) score. Each is scored by
`RewardMix.score_groups` with the CIDEr-D reward (document frequencies of the training references) in process and
with `use_processes(N)`; medians of `--repeats` calls after one, and whether the values are the same.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import datasets
import numpy as np

from rlcaption.data import load_shapes
from rlcaption.rewards import RewardMix


def captions_of(references: list[list[str]], per_image: int, seed: int = 0) -> list[list[str]]:
    generator = np.random.default_rng(seed)
    pool = [caption for captions in references for caption in captions]
    pattern = lambda captions: [  # noqa: E731
        captions[0], pool[int(generator.integers(len(pool)))], " ".join(captions[1].split()[:3]), "",
        captions[2], pool[int(generator.integers(len(pool)))],
    ]  # fmt: skip
    # the pattern's k-th repetition carries the number k
    numbered = lambda caption, repetition: f"{caption} {repetition}".strip() if repetition else caption  # noqa: E731
    return [
        [numbered(caption, row // 6) for row, caption in enumerate(pattern(captions) * per_image)][:per_image]
        for captions in references
    ]


def time_scoring(mix: RewardMix, completions, references, image_ids, repeats: int) -> tuple[float, np.ndarray]:
    times = []
    for repeat in range(1 + repeats):
        start = time.perf_counter()
        total, _ = mix.score_groups(completions=completions, references=references, image_id=image_ids)
        if repeat:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as cache_dir:
        train = load_shapes(
            num_train=max(args.images, 64), num_validation=4, num_test=4, image_size=48, cache_dir=cache_dir
        )["train"]
    references, image_ids = train["captions"][: args.images], list(range(args.images))
    mix = RewardMix(["cider"])
    mix.prepare(train)
    steps = {"SCST (6 per image)": 6, "spider_pg rollouts (30 per image)": 30}
    print("| captions | in process ms | processes | start s | in processes ms | speed-up | same rewards |")
    print("|---|---|---|---|---|---|---|")
    for processes in args.processes:
        # in process again before each count of processes: the machine's state changes over a run
        in_process = {
            name: time_scoring(mix, captions_of(references, count), references, image_ids, args.repeats)
            for name, count in steps.items()
        }
        start = time.perf_counter()
        mix.use_processes(processes)
        mix.wait_for_processes()
        start_seconds = time.perf_counter() - start
        for name, count in steps.items():
            ms, total = time_scoring(mix, captions_of(references, count), references, image_ids, args.repeats)
            base_ms, base_total = in_process[name]
            print(
                f"| {args.images * count} ({name}) | {base_ms:.1f} | {processes} | {start_seconds:.1f} | {ms:.1f} | "
                f"{base_ms / ms:.2f}x | "
                f"{np.array_equal(total, base_total)} |",
                flush=True,
            )
        mix.close()


if __name__ == "__main__":
    main()
