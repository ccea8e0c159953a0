"""Token ids to caption texts, side by side in one run: `CaptionProcessor.batch_decode` (one call into the Rust
tokenizer for the batch) against the tokenizer's `decode` called once per caption, as it was done before.

    python benchmarks/bench_caption_decoding.py [--model checkpoints/show-tell-rl-shapes-xe] [--captions 768 3840]

768 captions are what an SCST step decodes at 128 images (5 samples and the greedy caption per image); 3,840 about
what `spider_pg`'s rollouts decode (M = 1, K = 3). The ids are drawn from the vocabulary, 20 tokens after `<bos>`,
each caption cut at a random end token as sampled captions are: all different. A last row decodes real rollouts, those
of the published `spider_pg` checkpoint for `--rollout-images` training images, which repeat themselves (each distinct
caption is decoded once). Medians of `--repeats` after one call, and whether the texts are the same.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import torch
import transformers
from bench_reward_repeats import rollouts_of

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes

WARM_START = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
SPIDER_PG = WARM_START.parent / "show-tell-rl-shapes-spider-pg-cider"


def median_ms(function, repeats: int) -> tuple[float, list[str]]:
    texts = function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        texts = function()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), texts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=WARM_START, help="A folder with a CaptionProcessor.")
    parser.add_argument("--captions", type=int, nargs="+", default=[768, 3840])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rollout-images", type=int, default=128, help="0: no row of real rollouts.")
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    processor = CaptionProcessor.from_pretrained(args.model)
    tokenizer = processor.tokenizer
    generator = torch.Generator().manual_seed(0)
    cases = []
    for count in args.captions:
        ids = torch.randint(len(processor.tokenizer.all_special_ids), len(tokenizer), (count, 21), generator=generator)
        ids[:, 0] = tokenizer.bos_token_id
        ids[torch.arange(count), torch.randint(5, 21, (count,), generator=generator)] = tokenizer.eos_token_id
        cases.append((str(count), ids))
    if args.rollout_images:
        ids = spider_pg_rollouts(args.rollout_images)
        cases.append((f"{len(ids)} rollouts ({len(set(decode_each(tokenizer, ids)))} distinct)", ids))
    print("| captions | per caption ms | batch ms | speed-up | same texts |")
    print("|---|---|---|---|---|")
    for count, ids in cases:
        per_caption_ms, expected = median_ms(lambda ids=ids: decode_each(tokenizer, ids), args.repeats)
        batch_ms, texts = median_ms(
            lambda ids=ids: processor.batch_decode(ids, skip_special_tokens=True), args.repeats
        )
        speed_up = per_caption_ms / batch_ms
        print(
            f"| {count} | {per_caption_ms:.2f} | {batch_ms:.2f} | {speed_up:.1f}x | {texts == expected} |", flush=True
        )


def decode_each(tokenizer, ids: torch.Tensor) -> list[str]:
    """The tokenizer's `decode` once per caption, each cut after its first end token."""
    end = tokenizer.eos_token_id
    cut = [row[: row.index(end, 1) + 1] if end in row[1:] else row for row in ids.tolist()]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in cut]


def spider_pg_rollouts(num_images: int) -> torch.Tensor:
    """The rollouts (M = 1, K = 3, 20 tokens) of the published `spider_pg` checkpoint for shapes training images."""
    processor = CaptionProcessor.from_pretrained(SPIDER_PG)
    with tempfile.TemporaryDirectory() as cache_dir:
        images = load_shapes(num_train=num_images, num_validation=4, num_test=4, image_size=48, cache_dir=cache_dir)
        pixel_values = processor(images=images["train"]["image"], return_tensors="pt")["pixel_values"]
    return rollouts_of(ShowTellRL.from_pretrained(SPIDER_PG), processor, pixel_values).sequences


if __name__ == "__main__":
    main()
