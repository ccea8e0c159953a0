"""The decoding loops of rlcaption (`rlcaption.generation.step_decoding`) against `generate()`, side by side in one
run.

    python benchmarks/bench_decoding_loops.py [--device cuda] [--images 32 128 512] [--repeats 10]
    python benchmarks/bench_decoding_loops.py --captioner blip --blip-size base --bf16 --device cuda --images 16 32

The captioner is the published XE warm start (`checkpoints/show-tell-rl-shapes-xe`, the default) or a BLIP with
random weights (`--captioner blip`; `base`: the size of Salesforce/blip-image-captioning-base), on shapes test
images. The two decodings RL training asks for — 5 samples per image (pure sampling) and the greedy caption — are
timed three ways from the same seed: the captioner's decoding loop captured as one CUDA graph (what training uses on
a GPU; on a CPU the loop again), the loop step by step, and `generate()`. The last column gives the share of captions
the graph and `generate()` drew as the loop did, token for token: all of them in float32; in bfloat16 on a GPU, where
`generate()`'s kernels round differently from the loop's, a sample can take another word where two are near tied.
Each includes the image encoding. Medians of `--repeats` decodings after 2 of warm-up; the device is synchronised
around each.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import torch
import transformers
from gpu_check import make_blip, share_of_same_rows, synchronize
from transformers import GenerationConfig

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes
from rlcaption.generation.captioners import Captioner, captioner_for
from rlcaption.generation.decoding import evaluation_mode

WARM_START = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
DECODINGS = {
    "5 samples": GenerationConfig(
        do_sample=True, num_beams=1, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=5, max_new_tokens=20
    ),
    "greedy": GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=20),
}


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
    parser.add_argument("--captioner", choices=["show_tell", "blip"], default="show_tell")
    parser.add_argument("--blip-size", choices=["base", "tiny"], default="tiny")
    parser.add_argument("--bf16", action="store_true", help="Decode under bf16 autocast, as `--bf16` training does.")
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as cache_dir:
        shapes = load_shapes(
            num_train=4, num_validation=4, num_test=max(args.images), image_size=48, cache_dir=cache_dir
        )
    if args.captioner == "show_tell":
        model, processor = ShowTellRL.from_pretrained(WARM_START), CaptionProcessor.from_pretrained(WARM_START)
    else:
        image_size = 384 if args.blip_size == "base" else 16
        captions = [caption for row in shapes["train"]["captions"] for caption in row]
        model, processor = make_blip(captions, args.blip_size, image_size)
    model.to(device)
    pixel_values = processor(images=list(shapes["test"]["image"]), return_tensors="pt")["pixel_values"].to(device)
    captioner = captioner_for(model)
    print(
        f"| decoding | images | CUDA graph ms | loop ms | generate() ms | loop / graph | generate() / graph "
        "| same captions as the loop (graph / generate()) "
        f"|  ({type(model).__name__}, {device}{', bf16' if args.bf16 else ''})"
    )
    print("|---|---|---|---|---|---|---|---|")
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.bf16)
    with evaluation_mode(model), autocast:
        for name, config in DECODINGS.items():
            for count in args.images:
                times, (graph_same, generate_same) = compare(
                    captioner, {"pixel_values": pixel_values[:count]}, config, args
                )
                graph_ms, loop_ms, generate_ms = times
                print(
                    f"| {name} | {count} | {graph_ms:.1f} | {loop_ms:.1f} | {generate_ms:.1f} | "
                    f"{loop_ms / graph_ms:.1f}x | {generate_ms / graph_ms:.1f}x | "
                    f"{graph_same:.1%} / {generate_same:.1%} |",
                    flush=True,
                )


def compare(captioner: Captioner, inputs, config: GenerationConfig, args) -> tuple[list[float], tuple[float, float]]:
    """Milliseconds of the loop as one CUDA graph (on a GPU; the loop itself elsewhere), of the loop step by step and
    of `generate()`, and the shares of the graph's and of `generate()`'s captions that the loop drew too."""
    device = torch.device(args.device)
    complete = captioner.complete_generation_config(config)
    graphs, step_by_step = copy.deepcopy(config), copy.deepcopy(config)
    graphs.cuda_graphs, step_by_step.cuda_graphs = True, False
    decodings = [
        lambda: captioner.generate(inputs, graphs),
        lambda: captioner.generate(inputs, step_by_step),
        lambda: captioner.generate(inputs, complete, decoding_loop=False),
    ]
    timings = [time_decoding(decode, device, args.repeats) for decode in decodings]
    graph, loop, generated = (sequences for _, sequences in timings)
    same = tuple(share_of_same_rows(loop, other, complete.pad_token_id) for other in (graph, generated))
    return [ms for ms, _ in timings], same


if __name__ == "__main__":
    main()
