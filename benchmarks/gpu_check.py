"""A GPU check anyone can run: every recipe for a few steps in fp32 and bf16, then the RL step budget on the device.

    python benchmarks/gpu_check.py [--output runs/benchmarks/gpu_check.json]     # one GPU, about 5 minutes
    python benchmarks/gpu_check.py --device cpu                                  # the same, tiny, on the CPU

Nothing is downloaded: the recipes start from the checkpoints in `checkpoints/`, and the BLIP-base-size captioner has
random weights and a `BlipProcessor` built here.

1. Recipes. Each of `examples/train_*.py` runs `--max_steps 2` on a few shapes images (pretraining phases 1 step),
   once in float32 and once with `--bf16`, `--jobs` at a time; the table says ok or the error's last line.
2. Step budget. One optimizer step of `xe`, `scst` (5 samples per image, greedy baseline, CIDEr-D) and `spider_pg`
   (M = 1, K = 3) through `RLCaptionTrainer`, for the published XE warm start `ShowTellRL` and for a BLIP-base-size
   captioner in bf16: median milliseconds of `--repeats` steps after `--warmup`, each from the same weights and seed,
   and the shares of the step spent sampling (every `generate` call the objective makes, rollouts included) and in
   the reward calls. The device is synchronised around each timed part, so shares are of wall time. Each objective
   trains its own copy of the model and their steps are interleaved, so that load on the machine hits them alike. On
   a GPU the `ShowTellRL` rows are measured twice in the same loop: decoding as CUDA graphs (the default) and step by
   step (the copy's `generation_config.cuda_graphs = False`); with `--reward-processes N` once more, with the CIDEr-D
   reward computed in N worker processes.
3. Throughput. Images per second of the `ShowTellRL` SCST step as the batch grows: close to linear until the device
   is busy, flat once it is. Here only XE and SCST (CUDA graphs, rewards in process) are interleaved, so their ratio
   is also read away from the other variants' steps.

Targets (ratios from this one run): ShowTellRL SCST <= 1.5x XE at 128 x 5, spider_pg <= 2x SCST; BLIP-base-size bf16
SCST <= 2.5x XE at 32 x 5. They are printed beside the measurements, not enforced.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from transformers import (
    BertTokenizerFast,
    BlipConfig,
    BlipForConditionalGeneration,
    BlipImageProcessorPil,
    BlipProcessor,
)

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes
from rlcaption.objectives import spider_pg as spider_pg_module
from rlcaption.rewards import Pending
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

REPOSITORY = Path(__file__).resolve().parent.parent
EXAMPLES = REPOSITORY / "examples"
CHECKPOINTS = REPOSITORY / "checkpoints"
WARM_START = CHECKPOINTS / "show-tell-rl-shapes-xe"
LEARNING_RATES = {"xe": 2e-3, "scst": 5e-4, "spider_pg": 5e-4}
# the trainer's decodings for RL (none calls another)
SAMPLING_METHODS = ("sample_captions", "greedy_captions", "sample_and_greedy_captions")
TARGETS = {"scst_over_xe": 1.5, "spider_over_scst": 2.0, "blip_scst_over_xe": 2.5}
# the per-process sizes of the run: a GPU's, and the CPU's tiny ones that the test suite runs
SIZES = {
    "cuda": {"show_tell": (32, 128), "blip": (16, 32), "blip_size": "base", "curve": (32, 64, 128, 256, 512, 1024)},
    "cpu": {"show_tell": (2, 4), "blip": (2,), "blip_size": "tiny", "curve": (2, 4)},
}
_SMALL_RUN = [
    "--num_train_images", "32", "--num_validation_images", "4", "--num_test_images", "8",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_caption_length", "8",
    "--save_strategy", "no", "--eval_strategy", "no", "--max_steps", "2",
]  # fmt: skip
_FROM_WARM_START = ["--model_name_or_path", str(WARM_START), "--num_samples_per_image", "2"]
RECIPES = {
    "train_xe.py": ["--hidden_size", "16", "--scene_pretraining_steps", "2", *_SMALL_RUN],
    "train_scst.py": [*_FROM_WARM_START, *_SMALL_RUN],
    # CIDEr-D and no METEOR: the recipe's default SPIDEr and its METEOR score need Java and SPICE's CoreNLP jars,
    # which a fresh GPU machine lacks
    "train_spider.py": [
        *_FROM_WARM_START,
        "--reward_funcs",
        "cider",
        "--eval_metrics",
        "cider",
        "bleu",
        "rouge_l",
        "--num_rollouts",
        "2",
        "--baseline_pretraining_steps",
        "1",
        *_SMALL_RUN,
    ],  # fmt: skip
    "train_sle.py": [*_FROM_WARM_START, "--eval_caption_set_size", "2", *_SMALL_RUN],
    "train_wtf.py": [
        *_FROM_WARM_START,
        "--discriminator_pretraining_steps",
        "1",
        "--wtf_num_beams",
        "2",
        "--reward_clip",
        str(CHECKPOINTS / "shapes-clip-reward"),
        "--eval_clip",
        str(CHECKPOINTS / "shapes-clip-evaluator"),
        *_SMALL_RUN,
    ],  # fmt: skip
    "train_psst.py": [
        *_FROM_WARM_START,
        "--listener_pretraining_steps",
        "1",
        "--listener_hidden_size",
        "16",
        "--joint_embedding_size",
        "16",
        *_SMALL_RUN,
    ],  # fmt: skip
    "train_actor_critic.py": [
        *_FROM_WARM_START,
        "--value_pretraining_steps",
        "1",
        "--value_hidden_size",
        "16",
        "--embedding_model",
        str(CHECKPOINTS / "visual-semantic-embedding-shapes"),
        *_SMALL_RUN,
    ],  # fmt: skip
    "train_clip.py": [
        "--num_train_images",
        "32",
        "--num_validation_images",
        "8",
        "--num_test_images",
        "8",
        "--per_device_train_batch_size",
        "8",
        "--max_steps",
        "2",
        "--word_embedding_size",
        "16",
        "--text_hidden_size",
        "16",
        "--projection_dim",
        "16",
    ],  # fmt: skip
}


# ---------------------------------------------------------------- 1. recipes


def run_recipe(script: str, precision: str, device: str, scratch: Path) -> dict[str, Any]:
    output_dir = scratch / f"{Path(script).stem}-{precision}"
    command = [sys.executable, str(EXAMPLES / script), "--output_dir", str(output_dir), *RECIPES[script]]
    command += ["--bf16"] if precision == "bf16" else []
    command += ["--use_cpu"] if device == "cpu" else []
    environment = {**os.environ, "HF_DATASETS_CACHE": str(scratch / "datasets"), "HF_HUB_OFFLINE": "1"}
    environment["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    error = ""
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        error = lines[-1][:160] if lines else f"exit status {result.returncode}"
    return {"recipe": script, "precision": precision, "ok": result.returncode == 0, "seconds": seconds, "error": error}


def run_recipes(recipes, precisions, device: str, jobs: int, scratch: Path) -> list[dict[str, Any]]:
    runs = [(script, precision) for script in recipes for precision in precisions]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_recipe, script, precision, device, scratch) for script, precision in runs]
        return [future.result() for future in futures]


# ---------------------------------------------------------------- 2. step budget


class Stopwatch:
    """Adds up the wall time of calls to a method or function, synchronising the device around each call. A call
    that returns a [`Pending`] result (rewards still computed in worker processes) is timed again when its result is
    waited for: the time the processes' work was not hidden behind the step's other work. The synchronisations keep
    the host from queueing work ahead of the device, as a step does past its sampling: steps timed as a whole run
    with the watch off (`active = False`)."""

    def __init__(self, owner: Any, name: str, device: torch.device):
        self.seconds = 0.0
        self.active = True
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.active:
                return original(*args, **kwargs)
            synchronize(device)
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
                if isinstance(result, Pending):
                    result = Pending(timed_call(result.result))
                return result
            finally:
                synchronize(device)
                self.seconds += time.perf_counter() - start

        def timed_call(function):
            def call():
                start = time.perf_counter()
                try:
                    return function()
                finally:
                    self.seconds += time.perf_counter() - start

            return call

        setattr(owner, name, timed)
        self.restore = lambda: setattr(owner, name, original)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def share_of_same_rows(first: torch.Tensor, second: torch.Tensor, pad_token_id: int) -> float:
    """The share of rows (captions) that two decodings drew token for token. Each decoding is trimmed after its own
    last end token, so the shorter is padded to the longer's length first."""
    width = max(first.shape[1], second.shape[1])
    first, second = (
        torch.nn.functional.pad(rows, (0, width - rows.shape[1]), value=pad_token_id) for rows in (first, second)
    )
    return (first == second).all(dim=1).float().mean().item()


def make_blip(processor_captions: list[str], size: str, image_size: int):
    """A BLIP captioner with random weights (`base`: the size of Salesforce/blip-image-captioning-base, 224 M
    parameters) and its own `BlipProcessor`, whose word-piece vocabulary is built from the captions."""
    words = sorted({word for caption in processor_captions for word in caption.lower().replace(".", " ").split()})
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
    with tempfile.TemporaryDirectory() as folder:
        vocabulary = Path(folder) / "vocab.txt"
        vocabulary.write_text("\n".join([*special, *words]) + "\n")
        tokenizer = BertTokenizerFast(vocab_file=str(vocabulary), bos_token="[DEC]")
    processor = BlipProcessor(BlipImageProcessorPil(size={"height": image_size, "width": image_size}), tokenizer)
    text_config = {
        "bos_token_id": tokenizer.bos_token_id, "sep_token_id": tokenizer.sep_token_id,
        "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.sep_token_id,
    }  # fmt: skip
    vision_config = {"image_size": image_size}
    if size == "tiny":
        width = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
        text_config.update(width, vocab_size=len(tokenizer), encoder_hidden_size=16)
        vision_config.update(width, patch_size=image_size // 4)
    model = BlipForConditionalGeneration(BlipConfig(text_config=text_config, vision_config=vision_config))
    return model, processor


@dataclasses.dataclass(frozen=True)
class Variant:
    """How an RL step runs: decodings as CUDA graphs or step by step (the `cuda_graphs` of the model's generation
    config), rewards in worker processes or in process."""

    cuda_graphs: bool = True
    reward_processes: int = 0

    def describe(self) -> str:
        parts = [] if self.cuda_graphs else ["step-by-step decoding"]
        parts += [f"rewards in {self.reward_processes} processes"] if self.reward_processes else []
        return ", ".join(parts)


def make_trainer(
    objective, model, processor, dataset, batch_size, device, bf16, scratch, reward_processes: int = 0
) -> RLCaptionTrainer:
    config = RLCaptionConfig(
        output_dir=str(scratch / "budget" / objective), use_cpu=device.type == "cpu", bf16=bf16, objective=objective,
        per_device_train_batch_size=batch_size, learning_rate=LEARNING_RATES[objective], max_caption_length=20,
        reward_funcs=["cider"], num_samples_per_image=5, save_strategy="no", eval_strategy="no", report_to=[],
        disable_tqdm=True, seed=0, dataloader_num_workers=0, reward_processes=reward_processes,
        **({"baseline": "greedy"} if objective == "scst" else {}),
        **({"num_paths_per_image": 1, "num_rollouts": 3} if objective == "spider_pg" else {}),
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=config, processing_class=processor, train_dataset=dataset)
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's training loop, which is not run here
    return trainer


def optimizer_step(trainer: RLCaptionTrainer, batch: dict[str, Any]) -> None:
    """One full optimizer step, as the Trainer's inner loop does it."""
    trainer.training_step(trainer.model, batch)
    if trainer.args.max_grad_norm > 0:
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.model.zero_grad()


class StepTimer:
    """Times full optimizer steps of one trainer on one batch, each from the same weights and seed, with the shares
    of sampling and rewards. Each repeat runs two steps: one timed as a whole, and one whose sampling and reward calls
    are timed apart for their shares (their synchronisations would slow the whole). The steps run as `variant` says
    (its decodings are the model's, its reward processes the trainer's)."""

    def __init__(self, trainer: RLCaptionTrainer, variant: Variant):
        self.trainer, self.variant, self.device = trainer, variant, trainer.args.device
        self.batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        self.initial = copy.deepcopy(trainer.model.state_dict())
        self.sampling_watches = [Stopwatch(trainer, name, self.device) for name in SAMPLING_METHODS]
        # sampled captions decode their texts when the rewards first read them
        self.sampling_watches.append(Stopwatch(trainer.processing_class, "batch_decode", self.device))
        self.reward_watch = Stopwatch(trainer, "start_rewards", self.device)
        self.steps, self.sampling, self.rewards = [], [], []

    def step(self, seed: int, rollout_watch: Stopwatch, record: bool) -> None:
        """The repeat `seed`: a step timed as a whole, then one with its sampling and rewards timed."""
        watches = [*self.sampling_watches, rollout_watch, self.reward_watch]
        for watched in (False, True):
            for watch in watches:
                watch.seconds, watch.active = 0.0, watched
            seconds = self._timed_step(seed)
            if record and not watched:
                self.steps.append(seconds)
            elif record:
                self.sampling.append(sum(watch.seconds for watch in watches[:-1]) / seconds)
                self.rewards.append(self.reward_watch.seconds / seconds)

    def _timed_step(self, seed: int) -> float:
        self.trainer.model.load_state_dict(self.initial)
        torch.manual_seed(seed)
        synchronize(self.device)
        start = time.perf_counter()
        optimizer_step(self.trainer, self.batch)
        synchronize(self.device)
        return time.perf_counter() - start

    def summary(self, batch_size: int) -> dict[str, float]:
        for watch in (*self.sampling_watches, self.reward_watch):
            watch.restore()
        step = statistics.median(self.steps)
        return {
            "ms": 1000 * step,
            "sampling_share": statistics.median(self.sampling),
            "reward_share": statistics.median(self.rewards),
            "images_per_second": batch_size / step,
        }


def step_budget(model_name, build, objectives, batch_sizes, device, bf16, shapes, warmup, repeats, scratch, variants):
    """A row per batch size and [`Variant`] with the median step of each objective. Every objective and variant of a
    batch size trains its own copy of the model, and their steps are interleaved repeat by repeat, so that load on the
    machine hits them alike; XE decodes and rewards nothing and runs once."""
    rows = []
    for batch_size in batch_sizes:
        timers = {}
        for objective in objectives:
            for variant in variants if objective != "xe" else (Variant(),):
                model, processor = build()
                model.generation_config.cuda_graphs = variant.cuda_graphs
                trainer = make_trainer(
                    objective, model, processor, shapes["train"], batch_size, device, bf16, scratch,
                    variant.reward_processes,
                )  # fmt: skip
                timers[objective, variant] = StepTimer(trainer, variant)
                if trainer.reward_mix is not None:  # steps timed with every reward process started
                    trainer.reward_mix.wait_for_processes()
        rollout_watch = Stopwatch(spider_pg_module, "sample_rollouts", device)
        try:
            for repeat in range(warmup + repeats):
                for timer in timers.values():
                    timer.step(repeat, rollout_watch, record=repeat >= warmup)
        finally:
            rollout_watch.restore()
        summaries = {key: timer.summary(batch_size) for key, timer in timers.items()}
        for variant in variants:
            name = ", ".join(filter(None, [model_name, variant.describe()]))
            row = {"model": name, "images": batch_size, "precision": "bf16" if bf16 else "fp32"}
            for objective in objectives:
                row[objective] = summaries[objective, Variant() if objective == "xe" else variant]
            rows.append(row)
        for timer in timers.values():
            if timer.trainer.reward_mix is not None:
                timer.trainer.reward_mix.close()
        del timers
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def profile_step(trainer: RLCaptionTrainer) -> str:
    """The operators of one optimizer step by their own host time, and how often the host waited for the device."""
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    device = trainer.args.device
    for _ in range(2):
        optimizer_step(trainer, batch)
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    synchronize(device)
    with torch.profiler.profile(activities=activities) as profile:
        optimizer_step(trainer, batch)
        synchronize(device)
    events = profile.key_averages()
    waits = {
        event.key: event.count
        for event in events
        if event.key in ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaMemcpyAsync")
    }
    launches = sum(event.count for event in events if event.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    header = f"host waits and copies: {waits}; kernel launches: {launches}\n\n"
    return header + events.table(sort_by="self_cpu_time_total", row_limit=40)


# ---------------------------------------------------------------- tables


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def recipe_table(results: list[dict[str, Any]]) -> str:
    rows = [
        [run["recipe"], run["precision"], "ok" if run["ok"] else "FAILED", f"{run['seconds']:.0f}", run["error"]]
        for run in results
    ]
    return markdown_table(["recipe", "precision", "result", "seconds", "error"], rows)


def budget_table(rows: list[dict[str, Any]]) -> str:
    table = []
    for row in rows:
        xe, scst = row["xe"], row["scst"]
        cells = [
            row["model"], row["precision"], f"{row['images']} x 5", f"{xe['ms']:.1f}", f"{scst['ms']:.1f}",
            f"{scst['ms'] / xe['ms']:.2f}x", f"{scst['sampling_share']:.0%}", f"{scst['reward_share']:.0%}",
        ]  # fmt: skip
        spider = row.get("spider_pg")
        cells += [f"{spider['ms']:.1f}", f"{spider['ms'] / scst['ms']:.2f}x"] if spider else ["", ""]
        table.append(cells)
    headers = [
        "model", "precision", "images x samples", "XE ms", "SCST ms", "SCST / XE", "SCST sampling", "SCST reward",
        "spider_pg ms", "spider_pg / SCST",
    ]  # fmt: skip
    return markdown_table(headers, table)


def curve_table(rows: list[dict[str, Any]]) -> str:
    # each variant's scaling is measured from its own smallest batch
    first = {}
    for row in rows:
        first.setdefault(row["model"], row["scst"]["images_per_second"] / row["images"])
    table = [
        [
            row["model"],
            str(row["images"]),
            f"{row['xe']['ms']:.1f}",
            f"{row['scst']['ms']:.1f}",
            f"{row['scst']['ms'] / row['xe']['ms']:.2f}x",
            f"{row['scst']['images_per_second']:.0f}",
            f"{row['scst']['images_per_second'] / (first[row['model']] * row['images']):.2f}",
        ]  # fmt: skip
        for row in sorted(rows, key=lambda row: row["model"])
    ]
    headers = ["model", "images", "XE step ms", "SCST step ms", "SCST / XE", "SCST images / s", "of linear scaling"]
    return markdown_table(headers, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="`cuda` (one GPU) or `cpu` (tiny sizes, for the tests).")
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), help="Recipes to run (none: skip part 1).")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--jobs", type=int, default=4, help="Recipes run at once.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed steps first.")
    parser.add_argument("--repeats", type=int, default=10, help="Timed steps (median).")
    parser.add_argument(
        "--images", type=int, nargs="+", help="Batch sizes of the ShowTellRL step budget (default: 32 128 on a GPU)."
    )
    parser.add_argument(
        "--curve-images", type=int, nargs="*",
        help="Batch sizes of the SCST throughput curve (default: 32 to 1,024 on a GPU; none given: no curve).",
    )  # fmt: skip
    parser.add_argument("--skip-blip", action="store_true", help="No BLIP-base-size rows.")
    parser.add_argument("--skip-budget", action="store_true", help="Recipes only (part 1).")
    parser.add_argument(
        "--reward-processes", type=int, default=0,
        help="Also time the ShowTellRL steps with their rewards in this many worker processes.",
    )  # fmt: skip
    parser.add_argument(
        "--profile",
        type=Path,
        help="Profile one ShowTellRL XE and SCST step (and BLIP's SCST) to this file.",
    )
    parser.add_argument("--output", type=Path, default=Path("runs/benchmarks/gpu_check.json"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: run with --device cpu for the CPU form of the check.")
    sizes = SIZES[device.type] | ({"show_tell": tuple(args.images)} if args.images else {})
    sizes |= {"curve": tuple(args.curve_images)} if args.curve_images is not None else {}
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    versions = (
        f"torch {torch.__version__}, transformers {transformers.__version__}, CUDA {torch.version.cuda}, "
        f"cuDNN {torch.backends.cudnn.version()}"
    )
    print(f"## GPU check on {name} ({versions})\n", flush=True)
    results: dict[str, Any] = {"device": name, "versions": versions}

    def report(part: str, value: Any, table: str) -> None:
        # each part is printed and saved as soon as it is done, so that a run cut short keeps what it measured
        results[part] = value
        print(table + "\n", flush=True)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2))

    recipes = run_recipes(args.recipes, args.precisions, device.type, args.jobs, scratch)
    if recipes:
        report("recipes", recipes, recipe_table(recipes))
    if args.skip_budget:
        return 0 if all(run["ok"] for run in recipes) else 1

    shapes = load_shapes(num_train=1024, num_validation=8, num_test=8, image_size=48, cache_dir=scratch / "datasets")
    show_tell = lambda: (ShowTellRL.from_pretrained(WARM_START), CaptionProcessor.from_pretrained(WARM_START))  # noqa: E731
    # on a GPU, also with every decoding step by step (what the decoding graphs save)
    variants = [Variant()]
    if device.type == "cuda":
        variants.append(Variant(cuda_graphs=False))
    if args.reward_processes:
        variants.append(Variant(reward_processes=args.reward_processes))
    budget = step_budget(
        "ShowTellRL (XE warm start)", show_tell, ("xe", "scst", "spider_pg"), sizes["show_tell"], device, False,
        shapes, args.warmup, args.repeats, scratch, variants,
    )  # fmt: skip
    report("budget", budget, budget_table(budget))
    if not args.skip_blip:
        captions = [caption for row in shapes["train"]["captions"] for caption in row]
        image_size = 384 if sizes["blip_size"] == "base" else 16
        blip = lambda: make_blip(captions, sizes["blip_size"], image_size)  # noqa: E731
        budget += step_budget(
            f"BLIP-{sizes['blip_size']}-size (random weights)", blip, ("xe", "scst"), sizes["blip"], device, True,
            shapes, args.warmup, args.repeats, scratch, [Variant()],
        )  # fmt: skip
        report("budget", budget, budget_table(budget[-len(sizes["blip"]) :]))
    if sizes["curve"]:
        curve = step_budget(
            "ShowTellRL (XE warm start)", show_tell, ("xe", "scst"), sizes["curve"], device, False, shapes,
            args.warmup, args.repeats, scratch, [Variant()],
        )  # fmt: skip
        title = "ShowTellRL throughput, XE and SCST alone (5 samples per image):"
        report("curve", curve, f"{title}\n\n{curve_table(curve)}")
    if args.profile:
        # XE beside SCST: what an SCST step adds to the host's work, launch for launch
        profiled = [
            ("ShowTellRL", show_tell, max(sizes["show_tell"]), False, objective) for objective in ("xe", "scst")
        ]
        profiled += [] if args.skip_blip else [("BLIP", blip, max(sizes["blip"]), True, "scst")]
        sections = []
        for model_name, build, batch_size, bf16, objective in profiled:
            model, processor = build()
            trainer = make_trainer(objective, model, processor, shapes["train"], batch_size, device, bf16, scratch)
            title = f"# {model_name} {objective.upper()} step, {batch_size} images"
            sections.append(f"{title}\n\n{profile_step(trainer)}")
        args.profile.parent.mkdir(parents=True, exist_ok=True)
        args.profile.write_text("\n\n".join(sections))
        print(f"Profiles of one XE and SCST step: {args.profile}")
    print(f"Targets: {json.dumps(TARGETS)}; {time.perf_counter() - started:.0f} s in all")
    return 0 if all(run["ok"] for run in recipes) else 1


if __name__ == "__main__":
    sys.exit(main())
