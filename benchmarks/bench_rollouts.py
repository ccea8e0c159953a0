"""Cost of Liu et al.'s Monte-Carlo rollouts: one `spider_pg` training step against one `scst` step, and the batched
rollout decoder against the plain one-prefix-at-a-time loop, on the same model and batch.

    python benchmarks/bench_rollouts.py [--model checkpoints/show-tell-rl-shapes-spider-pg-cider] [--batch-size 32]
                                        [--num-rollouts 3] [--repeats 5] [--device cuda] [--output bench_rollouts.json]

Without `--model`, a ShowTellRL of the demo's size with random weights is used: its sampled captions run to the
maximum length, the most expensive case for rollouts. A trained model (e.g. the published shapes checkpoint) gives
realistic caption lengths. A training step is the trainer's `compute_loss` and its backward pass (sampling, rewards,
rollouts and the policy-gradient loss; the optimizer step, the same for both objectives, is left out).
Reported times are the median of `--repeats` runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time

import datasets
import torch
from gpu_check import share_of_same_rows, synchronize

from rlcaption.data import load_shapes
from rlcaption.generation.decoding import caption_token_mask, image_inputs_of
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.objectives.spider_pg import Rollouts, rollout_prefixes, sample_rollouts, sample_rollouts_per_prefix
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


def _synchronized(function, device: torch.device):
    """`function`, returning once `device` has finished what it queued."""

    def run():
        function()
        synchronize(device)

    return run


def _median_time(function, repeats: int, device: torch.device) -> float:
    function = _synchronized(function, device)
    function()  # warm-up
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def _model_and_processor(args, shapes) -> tuple[ShowTellRL, CaptionProcessor]:
    if args.model is not None:
        return ShowTellRL.from_pretrained(args.model), CaptionProcessor.from_pretrained(args.model)
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(captions, min_count=1, image_size=args.image_size)
    tokenizer = processor.tokenizer
    torch.manual_seed(0)
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        word_embedding_size=128,
        image_size=args.image_size,
        cnn_channels=[16, 32, 32, 32],
        dropout=0.2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShowTellRL(config), processor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="A ShowTellRL folder with its processor (random if unset).")
    parser.add_argument("--batch-size", type=int, default=32, help="Images per training batch.")
    parser.add_argument("--num-rollouts", type=int, default=3, help="K rollouts per prefix.")
    parser.add_argument("--scst-samples", type=int, default=5, help="Samples per image of scst (greedy baseline).")
    parser.add_argument("--max-caption-length", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=48, help="Image side of the random model and the data.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="`cpu`, or `cuda` for one GPU.")
    parser.add_argument("--output", default=None, help="Optional JSON file for the results.")
    args = parser.parse_args()
    device = torch.device(args.device)
    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory() as cache_dir:
        image_size = args.image_size
        if args.model is not None:
            image_size = ShowTellRLConfig.from_pretrained(args.model).image_size
        shapes = load_shapes(
            num_train=max(args.batch_size, 64), num_validation=8, num_test=8, image_size=image_size, seed=11,
            cache_dir=cache_dir,
        )  # fmt: skip
        model, processor = _model_and_processor(args, shapes)

        def make_trainer(objective: str) -> RLCaptionTrainer:
            config = RLCaptionConfig(
                output_dir=os.path.join(cache_dir, objective), use_cpu=args.device == "cpu", objective=objective,
                per_device_train_batch_size=args.batch_size, max_caption_length=args.max_caption_length,
                num_samples_per_image=args.scst_samples, reward_funcs=["cider"], save_strategy="no", disable_tqdm=True,
                seed=0, **({"num_rollouts": args.num_rollouts} if objective == "spider_pg" else {}),
            )  # fmt: skip
            return RLCaptionTrainer(
                model=model, args=config, processing_class=processor, train_dataset=shapes["train"]
            )

        # 1. one training step of each objective on the same batch
        trainers = {objective: make_trainer(objective) for objective in ("scst", "spider_pg")}
        batch = trainers["scst"]._prepare_inputs(next(iter(trainers["scst"].get_train_dataloader())))

        def training_step(trainer: RLCaptionTrainer) -> None:
            model.train()
            trainer.compute_loss(model, batch).backward()
            model.zero_grad(set_to_none=True)

        step_seconds = {
            objective: _median_time(lambda trainer=trainer: training_step(trainer), args.repeats, device)
            for objective, trainer in trainers.items()
        }

        # 2. rollouts of the same sampled captions, batched and one prefix at a time, with the same uniform draws
        torch.manual_seed(1)
        samples = trainers["spider_pg"].sample_captions(image_inputs_of(batch), num_return_sequences=1)
        eos, pad = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
        mask = caption_token_mask(samples.sequences, eos)
        num_rows = rollout_prefixes(mask, args.num_rollouts)[0].numel()
        uniforms = torch.rand(num_rows, args.max_caption_length, generator=torch.Generator().manual_seed(2))
        uniforms = uniforms.to(samples.sequences.device)
        rollout_args = (model, image_inputs_of(batch), samples.sequences, mask, args.num_rollouts)
        rollout_kwargs = dict(
            max_length=args.max_caption_length, eos_token_id=eos, pad_token_id=pad, uniforms=uniforms
        )  # fmt: skip
        batched = sample_rollouts(*rollout_args, **rollout_kwargs)
        looped = sample_rollouts_per_prefix(*rollout_args, **rollout_kwargs)
        # the loop a GPU runs: finished rows stepped along, no wait for the device at every step; there, also
        # captured as a CUDA graph (at its second call) and replayed, unless the policy's generation config says
        # otherwise, as it does for a copy of the same weights
        step_by_step = copy.deepcopy(model)
        step_by_step.generation_config.cuda_graphs = False

        def kept(cuda_graphs: bool) -> Rollouts:
            policy = model if cuda_graphs else step_by_step
            return sample_rollouts(policy, *rollout_args[1:], drop_finished_rows=False, **rollout_kwargs)

        kept_rollouts = [kept(False), kept(True), kept(True)]
        # the share of rollouts that the batched loops (dropping and keeping finished rows, the latter step by step
        # and as a graph) drew as the per-prefix loop did: all of them on a CPU; on a GPU, products of other batch
        # sizes round differently
        same_captions = [
            share_of_same_rows(looped.sequences, other.sequences, pad) for other in (batched, *kept_rollouts[::2])
        ]
        rollout_seconds = {
            "batched": _median_time(lambda: sample_rollouts(*rollout_args, **rollout_kwargs), args.repeats, device),
            "batched_keeping_finished_rows": _median_time(lambda: kept(False), args.repeats, device),
            "per_prefix": _median_time(lambda: sample_rollouts_per_prefix(*rollout_args, **rollout_kwargs), 1, device),
        }
        if args.device == "cuda":
            rollout_seconds["graph"] = _median_time(lambda: kept(True), args.repeats, device)

    mean_length = float(mask.sum(dim=1).mean())
    rows = [
        (f"training step, scst (k={args.scst_samples}, greedy baseline)", step_seconds["scst"], 1.0),
        (
            f"training step, spider_pg (M=1, K={args.num_rollouts})",
            step_seconds["spider_pg"],
            step_seconds["spider_pg"] / step_seconds["scst"],
        ),
        (f"rollouts, per-prefix loop ({num_rows} rows)", rollout_seconds["per_prefix"], 1.0),
        (
            f"rollouts, batched ({num_rows} rows)",
            rollout_seconds["batched"],
            rollout_seconds["batched"] / rollout_seconds["per_prefix"],
        ),
        (
            "rollouts, batched, finished rows kept (GPU)",
            rollout_seconds["batched_keeping_finished_rows"],
            rollout_seconds["batched_keeping_finished_rows"] / rollout_seconds["per_prefix"],
        ),
    ]
    if args.device == "cuda":
        rows.append(
            (
                "rollouts, finished rows kept, CUDA graph",
                rollout_seconds["graph"],
                rollout_seconds["graph"] / rollout_seconds["per_prefix"],
            )
        )
    print(
        f"\nbatch of {args.batch_size} images, sampled captions of {mean_length:.1f} tokens on average, "
        f"model {'random (demo size)' if args.model is None else args.model}, {args.device}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"| {'measurement':<48} | {'seconds':>8} | {'ratio':>6} |")
    print(f"|{'-' * 50}|{'-' * 10}|{'-' * 8}|")
    for name, seconds, ratio in rows:
        print(f"| {name:<48} | {seconds:8.3f} | {ratio:6.3f} |")
    speedup = rollout_seconds["per_prefix"] / rollout_seconds["batched"]
    print(
        f"batched rollouts are {speedup:.1f}x faster; rollouts drawn as the per-prefix loop drew them, from the same "
        f"uniforms: {same_captions[0]:.1%} dropping and {same_captions[1]:.1%} keeping finished rows"
        + (f", {same_captions[2]:.1%} as a CUDA graph" if args.device == "cuda" else "")
    )

    if args.output:
        results = {
            "batch_size": args.batch_size,
            "num_rollouts": args.num_rollouts,
            "scst_samples_per_image": args.scst_samples,
            "model": args.model or "random demo-size ShowTellRL",
            "mean_sampled_length": mean_length,
            "rollout_rows": num_rows,
            "training_step_seconds": step_seconds,
            "rollout_seconds": rollout_seconds,
            "batched_rollout_speedup": speedup,
            "same_rollouts_as_per_prefix": dict(zip(("dropping", "keeping", "graph"), same_captions, strict=True)),
            "threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        }
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
