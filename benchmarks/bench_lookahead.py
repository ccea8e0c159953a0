"""Cost of Ren et al.'s lookahead beam search when the value network scores every word of the vocabulary against the
policy's top candidates only (`lookahead_candidates`, 50 by default), at COCO's vocabulary size.

    python benchmarks/bench_lookahead.py [--vocab-size 9487] [--hidden-size 512] [--images 2] [--num-beams 3]
                                         [--max-caption-length 12] [--candidates 10 50] [--repeats 3]

The PolicyValueCaptioner has random weights and reads precomputed image features, so that only decoding is timed:
the policy and the value network have the sizes of Ren et al. (512), the vocabulary that of COCO's Karpathy
training split at a word count of at least 5 (9,487 words). A random policy rarely ends its captions, so every
search runs to `--max-caption-length`, the most expensive case. Reported times are the median of `--repeats` runs
after one warm-up run; the last column says whether the captions equal those of the full search (random weights
make the full search choose words far down the policy's ranking, which a trained policy rarely does).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from rlcaption.models import PolicyValueCaptioner, PolicyValueConfig, ShowTellRLConfig
from rlcaption.models.policy_value.modeling_policy_value import DEFAULT_LOOKAHEAD_CANDIDATES

FEATURE_SIZE = 2048


def _median_time(function, repeats: int) -> tuple[float, torch.Tensor]:
    output = function()  # warm-up
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        output = function()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings), output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-size", type=int, default=9487)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument("--max-caption-length", type=int, default=12)
    parser.add_argument("--candidates", type=int, nargs="+", default=[10, DEFAULT_LOOKAHEAD_CANDIDATES])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    size = args.hidden_size
    policy_config = ShowTellRLConfig(
        vocab_size=args.vocab_size, hidden_size=size, word_embedding_size=size, encoder_type="features",
        image_feature_size=FEATURE_SIZE, image_attention=False, max_caption_length=args.max_caption_length,
    )  # fmt: skip
    config = PolicyValueConfig(
        policy_config=policy_config, value_word_embedding_size=size, value_hidden_size=size, value_mlp_hidden_size=size
    )
    model = PolicyValueCaptioner(config).eval().to(args.device)
    features = torch.randn(args.images, FEATURE_SIZE, device=args.device)
    settings = dict(
        image_features=features, num_beams=args.num_beams, lookahead_lambda=0.4,
        max_length=args.max_caption_length + 1, min_length=args.max_caption_length + 1,
    )  # fmt: skip

    def search(candidates: int):
        def run() -> torch.Tensor:
            with torch.no_grad():
                return model.generate(**settings, lookahead_candidates=candidates)

        return run

    print(
        f"lookahead beam search, {args.images} images x {args.num_beams} beams, {args.max_caption_length} tokens, "
        f"vocabulary {args.vocab_size}, sizes {size}, on {args.device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads), median of {args.repeats}"
    )
    full_time, full_captions = _median_time(search(args.vocab_size), args.repeats)
    header = f"{'candidates per beam':>20} | {'seconds per search':>18} | {'speed-up':>8} | {'same captions':>13}"
    print(header)
    print("-" * len(header))
    print(f"{f'all {args.vocab_size}':>20} | {full_time:18.3f} | {1.0:7.1f}x | {'-':>13}")
    for candidates in args.candidates:
        seconds, captions = _median_time(search(candidates), args.repeats)
        same = "yes" if torch.equal(captions, full_captions) else "no"
        print(f"{candidates:>20} | {seconds:18.3f} | {full_time / seconds:7.1f}x | {same:>13}")


if __name__ == "__main__":
    main()
