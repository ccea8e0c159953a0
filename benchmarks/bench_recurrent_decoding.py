"""The decoding loop of rlcaption's recurrent captioners against `generate()`, side by side in one run.

    python benchmarks/bench_recurrent_decoding.py [--device cuda] [--images 32 128 512] [--repeats 10]

For the published XE warm start (`checkpoints/show-tell-rl-shapes-xe`) on shapes test images, the two decodings RL
training asks for — 5 samples per image (pure sampling) and the greedy caption — are timed three ways from the same
seed, which draw the same captions (checked here too): the loop of `rlcaption.models.recurrent_decoding` captured as
one CUDA graph (what training uses on a GPU; on a CPU the loop again), the loop step by step, and `generate()`.
Medians of `--repeats` decodings after 2 of warm-up; the device is
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
from rlcaption.models.recurrent_decoding import decode_recurrent

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
    print(
        "| decoding | images | CUDA graph ms | loop ms | generate() ms | loop / graph | generate() / graph "
        f"| same captions |  ({device})"
    )
    print("|---|---|---|---|---|---|---|---|")
    with evaluation_mode(model):
        for name, config in DECODINGS.items():
            for count in args.images:
                times, same = compare(captioner, {"pixel_values": pixel_values[:count]}, config, args)
                graph_ms, loop_ms, generate_ms = times
                print(
                    f"| {name} | {count} | {graph_ms:.1f} | {loop_ms:.1f} | {generate_ms:.1f} | "
                    f"{loop_ms / graph_ms:.1f}x | {generate_ms / graph_ms:.1f}x | {same} |",
                    flush=True,
                )


def compare(captioner: Captioner, inputs, config: GenerationConfig, args) -> tuple[list[float], bool]:
    """Milliseconds of the loop as one CUDA graph (on a GPU; the loop itself elsewhere), of the loop step by step and
    of `generate()`, and whether all three decoded the same captions."""
    device = torch.device(args.device)
    complete = captioner.complete_generation_config(config)
    decodings = [
        lambda: decode_recurrent(captioner.recurrent_network, inputs, complete, cuda_graphs=True),
        lambda: decode_recurrent(captioner.recurrent_network, inputs, complete, cuda_graphs=False),
        lambda: Captioner._call_generate(captioner, inputs, complete),
    ]
    timings = [time_decoding(decode, device, args.repeats) for decode in decodings]
    sequences = [sequences for _, sequences in timings]
    return [ms for ms, _ in timings], all(torch.equal(sequences[0], other) for other in sequences[1:])


if __name__ == "__main__":
    main()
