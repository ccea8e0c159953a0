"""BLIP's teacher-forced scoring of several captions per image, side by side in one run: each image's cross-attention
keys and values projected once for its captions (`rlcaption.generation.blip_decoding.blip_caption_logits`, what RL
training runs) against the text decoder's forward on the image features repeated per caption.

    python benchmarks/bench_blip_scoring.py [--device cuda] [--bf16] [--images 4 16] [--captions-per-image 6]

A BLIP-base-size captioner with random weights (see `gpu_check.py`); the vision model's output is random too, since
both ways share it. One forward and backward of the log-likelihood of `--images` x `--captions-per-image` captions
of 20 tokens; medians of `--repeats` after one, and the largest difference of the logits.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from gpu_check import make_blip, synchronize

from rlcaption.generation.blip_decoding import blip_caption_logits


def repeated_logits(model, image_embeds, input_ids, captions_per_image: int) -> torch.Tensor:
    """The text decoder's own forward, the image features repeated for each caption."""
    encoder_hidden_states = image_embeds.repeat_interleave(captions_per_image, dim=0)
    return model.text_decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states).logits


def time_scoring(score, model, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    times = []
    for repeat in range(1 + repeats):
        model.zero_grad(set_to_none=True)
        synchronize(device)
        start = time.perf_counter()
        logits = score()
        logits.float().log_softmax(dim=-1).mean().backward()
        synchronize(device)
        if repeat:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), logits.detach().float()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="Under bf16 autocast, as `--bf16` training runs.")
    parser.add_argument("--images", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--captions-per-image", type=int, default=6, help="5 samples and the greedy caption.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model, _ = make_blip(["a red circle", "two blue squares"], "base", 384)
    model.to(device).eval()  # scored without dropout, as the samples were drawn
    generator = torch.Generator().manual_seed(0)
    print(
        "| images x captions | keys once per image ms | repeated per caption ms | speed-up | max logit difference |"
        f"  ({device}{', bf16' if args.bf16 else ''})"
    )
    print("|---|---|---|---|---|")
    for num_images in args.images:
        num_captions = num_images * args.captions_per_image
        image_embeds = torch.randn(num_images, 577, 768, generator=generator).to(device)
        input_ids = torch.randint(10, 1000, (num_captions, 20), generator=generator).to(device)
        input_ids[:, 0] = model.config.text_config.bos_token_id
        scorings = {
            "once": functools.partial(blip_caption_logits, model, image_embeds, input_ids),
            "repeated": functools.partial(repeated_logits, model, image_embeds, input_ids, args.captions_per_image),
        }
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            (once_ms, once), (repeated_ms, repeated) = (
                time_scoring(score, model, device, args.repeats) for score in scorings.values()
            )
        print(
            f"| {num_images} x {args.captions_per_image} | {once_ms:.1f} | {repeated_ms:.1f} | "
            f"{repeated_ms / once_ms:.2f}x | {(once - repeated).abs().max():.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
