"""The RL step budget: where the time of a training step goes, against four targets, measured in one run on one batch.

    OMP_NUM_THREADS=1 python benchmarks/rl_step_budget.py [--model checkpoints/show-tell-rl-shapes-xe]
        [--batch-size 16] [--repeats 10] [--cache-dir runs/benchmarks/shapes]
        [--output runs/benchmarks/rl_step_budget.json] [--profile 30]

Targets:

1. the reward calls of an SCST step take <= 10% of the step;
2. the `cider` reward is >= 20x faster than pycocoevalcap's `Cider` on the same captions, references and document
   frequencies, with equal values (max |difference| <= 1e-9);
3. an SCST step takes <= 2x an XE step;
4. a `spider_pg` step (M = 1 path per image, K = 3 rollouts) takes <= 6x an SCST step.

Setup: the embedded shapes dataset (`--num-train` training images at 48 px, cached under `--cache-dir`) and the demo's
captioner (CNN encoder (32, 64, 64, 64) kept fixed as in the demo, attention over its grid, a 256-unit LSTM) with
random weights, or the checkpoint given by `--model`. Random weights sample captions that mostly run to the maximum
length (20 tokens), the most expensive case for sampling and rollouts; a trained checkpoint (e.g. the published XE
warm start) gives realistic lengths. Every objective trains its own copy of the same model with the real
`RLCaptionTrainer` on the same collated batch of `--batch-size` images: a step is `trainer.training_step` (loss,
forward, backward) plus what the Trainer does after it (gradient clipping, optimizer step, optimizer-step callbacks,
scheduler step, zero_grad). XE teacher-forces all five references of each image; SCST samples
`--scst-samples` captions per image with the greedy baseline; `spider_pg` rolls out from every prefix of its sampled
caption. Both RL objectives use the `cider` reward with document frequencies of the training references (the trainer's
default). Before every step the weights are restored (so each repeat samples from the same policy), the random seed is
set to `--seed + repeat` (the same draws for every objective) and the tokenizer's memo of recent captions is cleared;
the reward's cache of reference vectors stays warm after the warm-up step, as from the second epoch of training on.
The objectives' steps are interleaved repeat by repeat, so load on the machine hits them alike. Times are medians of
`--repeats` steps after `--warmup` steps. The reward time of a step is the wall time of the trainer's reward calls
inside it (`start_rewards` wrapped on the trainer instance, and the wait for each call's result).

The `cider` comparison replays the reward calls of the last measured SCST step and of the last `spider_pg` step
(its sampled captions and their rollouts) on the same captions and references, normalized once with
`normalize_caption` and handed to both implementations (the reward normalizes them again inside the call, its own
cost). "df from the call": `get_reward("cider")` without document frequencies against pycocoevalcap's
`Cider().compute_score`, both computing them from the call's references (one document per row). "precomputed df":
`get_reward("cider", document_frequencies=...)` against pycocoevalcap's `CiderScorer` given the same counts as a dict
built once (its `ref_len` fixed to log(number of training images), as self-critical.pytorch's CiderD does), once with
the reward's reference vectors rebuilt in the call ("cold") and once cached ("warm"). pycocoevalcap 1.2 has no
separate CIDEr-D class: its `Cider` computes CIDEr-D.

`--profile N` prints the N most expensive functions (cProfile, cumulative time) of one more step of each objective.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from bench_metrics import FixedDocumentFrequencyCiderScorer  # run as a script: benchmarks/ is on the path
from gpu_check import Stopwatch
from pycocoevalcap.cider.cider import Cider

from rlcaption.data import load_shapes
from rlcaption.metrics import tokenization
from rlcaption.metrics.cider import DocumentFrequencies
from rlcaption.metrics.tokenization import normalize_caption
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import get_reward
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

OBJECTIVES = ("xe", "scst", "spider_pg")
LEARNING_RATES = {"xe": 2e-3, "scst": 5e-4, "spider_pg": 5e-4}  # the demo's and the recipes'
AGREEMENT_TOLERANCE = 1e-9


@dataclass
class RewardCall:
    """The inputs of one `compute_rewards` call, normalized once for both CIDEr-D implementations."""

    completions: list[str]
    references: list[list[str]]
    image_ids: list[Any]


class RewardClock:
    """Adds up the wall time of a trainer's reward calls and keeps the inputs of the last step's calls.

    `start_rewards` is wrapped on the trainer instance, so the objective's `trainer.start_rewards(...)` and
    `trainer.compute_rewards(...)` go through it; a call is timed when it starts and again when its result is waited
    for (`gpu_check.Stopwatch`). Inputs are kept by reference (no copy inside the timed step).
    """

    def __init__(self, trainer: RLCaptionTrainer):
        self.calls: list[tuple[Any, ...]] = []
        original = trainer.start_rewards

        def start_rewards(completions, inputs, row_index, *args, **kwargs):
            self.calls.append((completions, inputs, row_index))
            return original(completions, inputs, row_index, *args, **kwargs)

        trainer.start_rewards = start_rewards
        self.watch = Stopwatch(trainer, "start_rewards", trainer.args.device)

    @property
    def seconds(self) -> float:
        return self.watch.seconds

    def reset(self) -> None:
        self.watch.seconds = 0.0
        self.calls = []

    def recorded_calls(self) -> list[RewardCall]:
        calls = []
        for completions, inputs, row_index in self.calls:
            references = [inputs["references"][row] for row in row_index]
            image_ids = inputs["image_id"]
            image_ids = image_ids.tolist() if hasattr(image_ids, "tolist") else list(image_ids)
            calls.append(
                RewardCall(
                    completions=[normalize_caption(text) for text in completions],
                    references=[[normalize_caption(reference) for reference in refs] for refs in references],
                    image_ids=[image_ids[row] for row in row_index],
                )
            )
        return calls


def clear_tokenizer_memo() -> None:
    """Forget the tokenizer's memo of recent captions, so that a repeat does not find its captions tokenized."""
    memo = getattr(tokenization, "_tokenize_cached", None)
    if memo is not None:
        memo.cache_clear()


def build_model_and_processor(args, shapes) -> tuple[ShowTellRL, CaptionProcessor]:
    if args.model is not None:
        return ShowTellRL.from_pretrained(args.model), CaptionProcessor.from_pretrained(args.model)
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(captions, min_count=1, image_size=args.image_size)
    tokenizer = processor.tokenizer
    torch.manual_seed(args.seed)
    config = ShowTellRLConfig(  # examples/train_xe.py's defaults, the demo's captioner
        vocab_size=len(tokenizer),
        hidden_size=256,
        word_embedding_size=256,
        encoder_type="cnn",
        image_size=args.image_size,
        cnn_channels=[32, 64, 64, 64],
        image_attention=True,
        dropout=0.2,
        max_caption_length=args.max_caption_length + 1,  # + <bos>
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = ShowTellRL(config)
    model.freeze_image_encoder(not args.train_image_encoder)
    return model, processor


def make_trainer(objective: str, model: ShowTellRL, processor, shapes, args, output_dir: Path) -> RLCaptionTrainer:
    config = RLCaptionConfig(
        output_dir=str(output_dir / objective), use_cpu=True, objective=objective,
        per_device_train_batch_size=args.batch_size, learning_rate=LEARNING_RATES[objective],
        max_caption_length=args.max_caption_length, reward_funcs=["cider"],
        num_samples_per_image=args.scst_samples,
        save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0,
        **({"baseline": "greedy"} if objective == "scst" else {}),
        **({"num_paths_per_image": args.num_paths, "num_rollouts": args.num_rollouts}
           if objective == "spider_pg" else {}),
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=config, processing_class=processor, train_dataset=shapes["train"])
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's training loop, which is not run here
    return trainer


def training_step(trainer: RLCaptionTrainer, batch: dict[str, Any]) -> None:
    """One full optimizer step, as the Trainer's inner loop does it."""
    model = trainer.model
    trainer.training_step(model, batch)
    if trainer.args.max_grad_norm > 0:
        trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
    trainer.callback_handler.on_pre_optimizer_step(trainer.args, trainer.state, trainer.control)
    trainer.optimizer.step()
    trainer.callback_handler.on_optimizer_step(trainer.args, trainer.state, trainer.control)
    trainer.lr_scheduler.step()
    model.zero_grad()
    trainer.state.global_step += 1


class StepBench:
    """A trainer, its clock of reward calls, and the weights every step starts from."""

    def __init__(self, trainer: RLCaptionTrainer):
        self.trainer = trainer
        self.clock = RewardClock(trainer) if trainer.reward_mix is not None else None
        modules = [trainer.model] + [network.module for network in trainer._auxiliary_networks.values()]
        self.modules = modules
        self.initial_states = [copy.deepcopy(module.state_dict()) for module in modules]
        self.step_seconds: list[float] = []
        self.reward_seconds: list[float] = []

    def step(self, batch: dict[str, Any], seed: int, record: bool = True) -> None:
        for module, state in zip(self.modules, self.initial_states, strict=True):
            module.load_state_dict(state)
        clear_tokenizer_memo()
        torch.manual_seed(seed)
        if self.clock is not None:
            self.clock.reset()
        start = time.perf_counter()
        training_step(self.trainer, batch)
        seconds = time.perf_counter() - start
        if record:
            self.step_seconds.append(seconds)
            self.reward_seconds.append(self.clock.seconds if self.clock is not None else 0.0)


def compare_cider(calls: list[RewardCall], document_frequencies: DocumentFrequencies, repeats: int) -> dict:
    """Times the `cider` reward and pycocoevalcap on the same reward calls, and the largest |difference|."""
    uncached_reward = get_reward("cider")
    cached_reward = get_reward("cider", document_frequencies=document_frequencies)
    reference_df = defaultdict(  # built once, as the reward's document frequencies are
        float, {ngram: float(document_frequencies[ngram]) for ngram in document_frequencies.index}
    )
    coco_inputs = [
        ({row: refs for row, refs in enumerate(call.references)}, {row: [c] for row, c in enumerate(call.completions)})
        for call in calls
    ]

    def ours(reward) -> list[np.ndarray]:
        return [
            np.asarray(reward(completions=call.completions, references=call.references, image_id=call.image_ids))
            for call in calls
        ]

    def theirs_uncached() -> list[np.ndarray]:
        return [np.asarray(Cider().compute_score(gts, res)[1]) for gts, res in coco_inputs]

    def theirs_cached() -> list[np.ndarray]:
        values = []
        for call in calls:
            scorer = FixedDocumentFrequencyCiderScorer(reference_df, document_frequencies.num_documents)
            for candidate, references in zip(call.completions, call.references, strict=True):
                scorer += (candidate, references)
            values.append(np.asarray(scorer.compute_cider()))
        return values

    def max_difference(first: list[np.ndarray], second: list[np.ndarray]) -> float:
        return max(float(np.abs(a - b).max()) if len(a) else 0.0 for a, b in zip(first, second, strict=True))

    clear_tokenizer_memo()
    difference_uncached = max_difference(ours(uncached_reward), theirs_uncached())
    clear_tokenizer_memo()
    cached_reward.scorer.clear_cache()
    difference_cached = max_difference(ours(cached_reward), theirs_cached())

    def cold() -> None:
        clear_tokenizer_memo()
        cached_reward.scorer.clear_cache()

    measurements = {  # name: (function, untimed preparation before every call)
        "pycocoevalcap_df_from_call": (theirs_uncached, None),
        "reward_df_from_call": (lambda: ours(uncached_reward), clear_tokenizer_memo),
        "pycocoevalcap_precomputed_df": (theirs_cached, None),
        "reward_precomputed_df_cold": (lambda: ours(cached_reward), cold),
        "reward_precomputed_df_warm": (lambda: ours(cached_reward), clear_tokenizer_memo),
    }
    timings = {name: [] for name in measurements}
    for repeat in range(repeats + 1):  # interleaved, so that load on the machine hits every scorer alike
        for name, (function, before) in measurements.items():
            if before is not None:
                before()
            start = time.perf_counter()
            function()
            if repeat > 0:  # the first round is a warm-up
                timings[name].append(time.perf_counter() - start)
    return {
        "num_calls": len(calls),
        "num_captions": sum(len(call.completions) for call in calls),
        "seconds": {name: statistics.median(values) for name, values in timings.items()},
        "seconds_all": timings,
        "max_abs_difference": {"df_from_call": difference_uncached, "precomputed_df": difference_cached},
    }


def profile_step(bench: StepBench, batch: dict[str, Any], seed: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    bench.step(batch, seed, record=False)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(top)
    return stream.getvalue()


def format_table(rows: list[dict]) -> str:
    headers = ("measurement", "time (ms)", "ratio", "target", "pass/fail")
    cells = [
        (
            row["measurement"],
            "" if row["ms"] is None else f"{row['ms']:.2f}",
            row["ratio_text"],
            row["target"],
            "" if row["passed"] is None else ("pass" if row["passed"] else "FAIL"),
        )
        for row in rows
    ]
    widths = [max(len(header), *(len(cell[column]) for cell in cells)) for column, header in enumerate(headers)]
    aligned = ("<", ">", ">", "<", "<")
    lines = ["| " + " | ".join(f"{h:<{w}}" for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append(
        "|"
        + "|".join(("-" * (w + 1) + ":" if a == ">" else "-" * (w + 2)) for w, a in zip(widths, aligned, strict=True))
        + "|"
    )
    for cell in cells:
        lines.append("| " + " | ".join(f"{c:{a}{w}}" for c, a, w in zip(cell, aligned, widths, strict=True)) + " |")
    return "\n".join(lines)


def row(measurement: str, seconds: float | None, ratio_text: str = "", target: str = "", passed=None) -> dict:
    return {
        "measurement": measurement,
        "ms": None if seconds is None else seconds * 1000.0,
        "ratio_text": ratio_text,
        "target": target,
        "passed": None if passed is None else bool(passed),
    }


def cider_rows(label: str, comparison: dict, min_speedup: float) -> list[dict]:
    seconds = comparison["seconds"]
    rows = []
    for reference_key, ours_keys, df_label in (
        ("pycocoevalcap_df_from_call", ("reward_df_from_call",), "df from the call's references"),
        (
            "pycocoevalcap_precomputed_df",
            ("reward_precomputed_df_cold", "reward_precomputed_df_warm"),
            "precomputed df",
        ),
    ):
        reference = seconds[reference_key]
        name = "Cider" if reference_key.endswith("call") else "CiderScorer"
        rows.append(row(f"{label}: pycocoevalcap {name}, {df_label}", reference, "1.00x"))
        for key in ours_keys:
            cache = {"cold": ", reference vectors rebuilt", "warm": ", reference vectors cached"}.get(key[-4:], "")
            speedup = reference / seconds[key]
            rows.append(
                row(
                    f"{label}: cider reward, {df_label}{cache}",
                    seconds[key],
                    f"{speedup:.1f}x faster",
                    f">= {min_speedup:g}x faster",
                    speedup >= min_speedup,
                )
            )
    for key, df_label in (("df_from_call", "df from the call"), ("precomputed_df", "precomputed df")):
        difference = comparison["max_abs_difference"][key]
        rows.append(
            row(
                f"{label}: max |reward - pycocoevalcap|, {df_label}",
                None,
                f"{difference:.1e}",
                f"<= {AGREEMENT_TOLERANCE:g}",
                difference <= AGREEMENT_TOLERANCE,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=None, help="A ShowTellRL folder with its processor (demo-size random model if unset)."
    )
    parser.add_argument("--batch-size", type=int, default=16, help="Images per training batch.")
    parser.add_argument("--scst-samples", type=int, default=5, help="Samples per image of scst (greedy baseline).")
    parser.add_argument("--num-paths", type=int, default=1, help="Sampled captions per image of spider_pg (M).")
    parser.add_argument("--num-rollouts", type=int, default=3, help="Rollouts per prefix of spider_pg (K).")
    parser.add_argument("--max-caption-length", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=48, help="Image side of the data and the random model.")
    parser.add_argument("--num-train", type=int, default=300, help="Training images (document frequencies).")
    parser.add_argument("--train-image-encoder", action="store_true", help="Train the CNN (the demo keeps it fixed).")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed steps of each objective first.")
    parser.add_argument("--repeats", type=int, default=10, help="Timed steps of each objective (median).")
    parser.add_argument("--cider-repeats", type=int, default=15, help="Timed repeats of each CIDEr-D scorer (median).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the budget is for 1).")
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/benchmarks/shapes"), help="Shapes dataset cache.")
    parser.add_argument("--output", type=Path, default=Path("runs/benchmarks/rl_step_budget.json"))
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="Print the N top cProfile entries of a step."
    )
    parser.add_argument("--max-reward-share", type=float, default=0.10)
    parser.add_argument("--min-cider-speedup", type=float, default=20.0)
    parser.add_argument("--max-scst-over-xe", type=float, default=2.0)
    parser.add_argument("--max-spider-over-scst", type=float, default=6.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    started = time.perf_counter()

    image_size = args.image_size
    if args.model is not None:
        image_size = ShowTellRLConfig.from_pretrained(args.model).image_size
    shapes = load_shapes(
        num_train=args.num_train, num_validation=8, num_test=8, image_size=image_size, seed=11,
        cache_dir=args.cache_dir,
    )  # fmt: skip
    model, processor = build_model_and_processor(args, shapes)
    output_dir = Path(tempfile.mkdtemp(prefix="rl_step_budget_"))  # the trainers write nothing with these settings
    benches = {
        objective: StepBench(make_trainer(objective, copy.deepcopy(model), processor, shapes, args, output_dir))
        for objective in OBJECTIVES
    }
    trainer = benches["xe"].trainer
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))

    # warm-up, then the timed steps, interleaved objective by objective
    for repeat in range(args.warmup):
        for bench in benches.values():
            bench.step(batch, args.seed - 1 - repeat, record=False)
    for repeat in range(args.repeats):
        for bench in benches.values():
            bench.step(batch, args.seed + repeat)
    step_seconds = {objective: statistics.median(bench.step_seconds) for objective, bench in benches.items()}
    reward_seconds = {objective: statistics.median(bench.reward_seconds) for objective, bench in benches.items()}
    reward_share = {
        objective: statistics.median(r / s for r, s in zip(bench.reward_seconds, bench.step_seconds, strict=True))
        for objective, bench in benches.items()
        if objective != "xe"
    }

    # the cider reward against pycocoevalcap, on the reward calls of the last measured steps
    document_frequencies = benches["scst"].trainer.reward_mix.funcs[0].document_frequencies
    scst_calls = benches["scst"].clock.recorded_calls()
    spider_calls = benches["spider_pg"].clock.recorded_calls()
    comparisons = {
        "scst": compare_cider(scst_calls, document_frequencies, args.cider_repeats),
        "spider_pg": compare_cider(spider_calls, document_frequencies, args.cider_repeats),
    }
    sample_lengths = [
        np.mean([len(caption.split()) for call in calls[:1] for caption in call.completions])
        for calls in (scst_calls, spider_calls)
    ]

    share = reward_share["scst"]
    scst_over_xe = step_seconds["scst"] / step_seconds["xe"]
    spider_over_scst = step_seconds["spider_pg"] / step_seconds["scst"]
    rows = [
        row(f"xe step ({args.batch_size} images x 5 references, teacher forcing)", step_seconds["xe"], "1.00x"),
        row(
            f"scst step (k={args.scst_samples}, greedy baseline)",
            step_seconds["scst"],
            f"{scst_over_xe:.2f}x xe",
            f"<= {args.max_scst_over_xe:g}x xe",
            scst_over_xe <= args.max_scst_over_xe,
        ),
        row(
            "  reward calls inside the scst step",
            reward_seconds["scst"],
            f"{share:.1%} of step",
            f"<= {args.max_reward_share:.0%} of step",
            share <= args.max_reward_share,
        ),
        row(
            f"spider_pg step (M={args.num_paths}, K={args.num_rollouts})",
            step_seconds["spider_pg"],
            f"{spider_over_scst:.2f}x scst",
            f"<= {args.max_spider_over_scst:g}x scst",
            spider_over_scst <= args.max_spider_over_scst,
        ),
        row(
            "  reward calls inside the spider_pg step",
            reward_seconds["spider_pg"],
            f"{reward_share['spider_pg']:.1%} of step",
        ),
    ]
    for objective, label in (("scst", "scst calls"), ("spider_pg", "spider_pg calls")):
        comparison = comparisons[objective]
        label = f"{label} ({comparison['num_captions']} captions)"
        rows += cider_rows(label, comparison, args.min_cider_speedup)

    model_name = args.model or "demo-size ShowTellRL, random weights"
    print(
        f"\nRL step budget: batch of {args.batch_size} shapes images ({image_size} px), {model_name}, "
        f"{torch.get_num_threads()} torch thread(s); median of {args.repeats} steps after {args.warmup} warm-up; "
        f"sampled captions of {sample_lengths[0]:.1f} (scst) and {sample_lengths[1]:.1f} (spider_pg) words on average"
    )
    print(format_table(rows))
    targets = [r for r in rows if r["passed"] is not None]
    failed = [r["measurement"].strip() for r in targets if not r["passed"]]
    print(f"{len(targets) - len(failed)}/{len(targets)} targets met" + (f"; failed: {failed}" if failed else ""))
    print(f"total run time {time.perf_counter() - started:.0f} s")

    profiles = {}
    if args.profile:
        for objective, bench in benches.items():
            profiles[objective] = profile_step(bench, batch, args.seed, args.profile)
            print(f"\n=== cProfile of one {objective} step (cumulative) ===\n{profiles[objective]}")

    shutil.rmtree(output_dir, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "rows": rows,
        "failed": failed,
        "step_seconds": step_seconds,
        "step_seconds_all": {objective: bench.step_seconds for objective, bench in benches.items()},
        "reward_seconds": reward_seconds,
        "reward_share": reward_share,
        "cider_comparison": comparisons,
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "model": model_name,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    args.output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
