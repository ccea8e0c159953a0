"""Token ids to caption texts, side by side in one run: `CaptionProcessor.batch_decode` (one call into the Rust
tokenizer for the batch) against the tokenizer's `decode` called once per caption, as it was done before.

    python benchmarks/bench_caption_decoding.py [--model checkpoints/show-tell-rl-shapes-xe] [--captions 768 3840]

768 captions are what an SCST step decodes at 128 images (5 samples and the greedy caption per image); 3,840 about
what `spider_pg`'s rollouts decode (M = 1, K = 3). The ids are drawn from the vocabulary, 20 tokens after `<bos>`,
each caption cut at a random end token as sampled captions are. Medians of `--repeats` after one call, and whether the
texts are the same.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from rlcaption import CaptionProcessor

WARM_START = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"


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
    args = parser.parse_args(argv)
    processor = CaptionProcessor.from_pretrained(args.model)
    tokenizer = processor.tokenizer
    generator = torch.Generator().manual_seed(0)
    print("| captions | per caption ms | batch ms | speed-up | same texts |")
    print("|---|---|---|---|---|")
    for count in args.captions:
        ids = torch.randint(len(processor.tokenizer.all_special_ids), len(tokenizer), (count, 21), generator=generator)
        ids[:, 0] = tokenizer.bos_token_id
        ids[torch.arange(count), torch.randint(5, 21, (count,), generator=generator)] = tokenizer.eos_token_id

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
    cut = [row[: row.index(tokenizer.eos_token_id, 1) + 1] for row in ids.tolist()]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in cut]


if __name__ == "__main__":
    main()
