"""The decoding loop of rlcaption's recurrent captioners against `generate()`, side by side in one run.

    python benchmarks/bench_recurrent_decoding.py [--device cuda] [--images 32 128 512] [--repeats 10]

For the published XE warm start (`checkpoints/show-tell-rl-shapes-xe`) on shapes test images, the two decodings RL
training asks for — 5 samples per image (pure sampling) and the greedy caption — are timed through the model's
`Captioner`, once with the loop (`rlcaption.models.recurrent_decoding`) and once with `generate()`, from the same seed,
which draw the same captions (checked here too). Medians of `--repeats` decodings after 2 of warm-up; the device is
synchronised around each.
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
from transformers import GenerationConfig

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.captioners import Captioner, captioner_for
from rlcaption.data import load_shapes
from rlcaption.decoding import evaluation_mode

WARM_START = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
DECODINGS = {
    "5 samples": GenerationConfig(
        do_sample=True, num_beams=1, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=5, max_new_tokens=20
    ),
    "greedy": GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=20),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decoding(decode, device: torch.device, repeats: int) -> tuple[float, torch.Tensor]:
    times = []
    for repeat in range(2 + repeats):
        torch.manual_seed(repeat)
        synchronize(device)
        start = time.perf_counter()
        sequences = decode()
        synchronize(device)
        if repeat >= 2:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), sequences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--images", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    device = torch.device(args.device)
    model = ShowTellRL.from_pretrained(WARM_START).to(device)
    processor = CaptionProcessor.from_pretrained(WARM_START)
    with tempfile.TemporaryDirectory() as cache_dir:
        images = load_shapes(
            num_train=4, num_validation=4, num_test=max(args.images), image_size=48, cache_dir=cache_dir
        )["test"]["image"]
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"].to(device)
    captioner = captioner_for(model)
    print(f"| decoding | images | loop ms | generate() ms | generate() / loop | same captions |  ({device})")
    print("|---|---|---|---|---|---|")
    with evaluation_mode(model):
        for name, config in DECODINGS.items():
            for count in args.images:
                loop_ms, generate_ms, same = compare(captioner, {"pixel_values": pixel_values[:count]}, config, args)
                ratio = generate_ms / loop_ms
                print(f"| {name} | {count} | {loop_ms:.1f} | {generate_ms:.1f} | {ratio:.1f}x | {same} |", flush=True)


def compare(captioner: Captioner, inputs, config: GenerationConfig, args) -> tuple[float, float, bool]:
    """Milliseconds of the loop and of `generate()`, and whether they decoded the same captions."""
    device = torch.device(args.device)

    def decode():
        return captioner.generate(inputs, config)

    loop_ms, loop_sequences = time_decoding(decode, device, args.repeats)
    generate_ms, generate_sequences = time_decoding(lambda: _through_generate(captioner, decode), device, args.repeats)
    return loop_ms, generate_ms, torch.equal(loop_sequences, generate_sequences)


def _through_generate(captioner: Captioner, decode):
    """Runs `decode` with the captioner's decoding sent to `generate()` instead of the loop."""
    captioner._call_generate = lambda inputs, config: Captioner._call_generate(captioner, inputs, config)
    try:
        return decode()
    finally:
        del captioner._call_generate


if __name__ == "__main__":
    main()
