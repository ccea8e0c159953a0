"""
Kill drill: training with an auxiliary network, killed at random moments and resumed each time, must end with the same
weights and optimizer state as an uninterrupted run.

    python benchmarks/kill_drill.py --kills 50
    python benchmarks/kill_drill.py --kills 10 --num-processes 2     # accelerate launch --multi_gpu, gloo on CPU

The training is `spider_pg` on shapes, whose baseline is an auxiliary network of the objective, with a baseline
pretraining phase (the policy fixed) before joint training, a checkpoint every `--save-steps` steps and
`save_total_limit=2` (so kills also land in checkpoint rotation). Each life of the training process is killed with
SIGKILL (the whole process group), either after a random delay once training has started, or, for a share of the
kills, as soon as a new checkpoint folder appears and before it is complete (a kill during a save). Every restart
resumes from the newest complete checkpoint (`resume_from_checkpoint=True`). After `--kills` kills the run is let
finish, and its final checkpoint is compared, tensor by tensor, with that of an uninterrupted run of the same seed:
the captioner's weights, the auxiliary network's weights, and the optimizer state.

Prints a table (kills, of which during saves / in the baseline pretraining phase / in joint training, the largest
differences) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
STARTED_MARKER = "training-started"


# ---------------------------------------------------------------- the training process
def train(output_dir: str, cache_dir: str, max_steps: int, pretraining_steps: int, save_steps: int) -> None:
    """One life of the training process: resumes from the newest complete checkpoint when there is one."""
    import torch
    from transformers import TrainerCallback

    from rlcaption.data import load_shapes
    from rlcaption.models import ShowTellRL, ShowTellRLConfig
    from rlcaption.processing import CaptionProcessor
    from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint

    torch.set_num_threads(1)
    shapes = load_shapes(num_train=64, num_validation=4, num_test=4, image_size=48, seed=11, cache_dir=cache_dir)
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(captions, image_size=48)
    tokenizer = processor.tokenizer
    torch.manual_seed(0)
    model = ShowTellRL(
        ShowTellRLConfig(
            vocab_size=len(tokenizer), hidden_size=32, word_embedding_size=32, image_size=48,
            cnn_channels=[8, 8, 16, 16], dropout=0.0, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
    )  # fmt: skip
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective="spider_pg", reward_funcs=["cider"],
        per_device_train_batch_size=4, max_steps=max_steps, learning_rate=5e-3, baseline_learning_rate=2e-2,
        baseline_hidden_size=16, baseline_pretraining_steps=pretraining_steps, num_rollouts=2,
        max_caption_length=10, save_strategy="steps", save_steps=save_steps, save_total_limit=2,
        logging_steps=1000, disable_tqdm=True, seed=7, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])

    class MarkStart(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                Path(output_dir, STARTED_MARKER).touch()

    trainer.add_callback(MarkStart())
    resume = last_complete_checkpoint(output_dir) is not None
    trainer.train(resume_from_checkpoint=True if resume else None)


# ---------------------------------------------------------------- the drill
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(args: argparse.Namespace, output_dir: Path) -> list[str]:
    worker = [
        str(HERE), "--worker", str(output_dir), "--cache-dir", str(args.cache_dir), "--max-steps",
        str(args.max_steps), "--pretraining-steps", str(args.pretraining_steps), "--save-steps", str(args.save_steps),
    ]  # fmt: skip
    if args.num_processes == 1:
        return [sys.executable, *worker]
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    return [
        accelerate, "launch", "--multi_gpu", "--num_processes", str(args.num_processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()), *worker,
    ]  # fmt: skip


def _environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}


def _checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    folders = [path for path in output_dir.glob("checkpoint-*") if path.name.split("-")[-1].isdigit()]
    return sorted((int(path.name.split("-")[-1]), path) for path in folders)


def _newest_complete_step(output_dir: Path) -> int:
    complete = [step for step, path in _checkpoints(output_dir) if (path / "trainer_state.json").is_file()]
    return max(complete, default=0)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`: the launcher's workers need not share its process group."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL to the launcher and every process it started, all at once, as a machine failure would."""
    for pid in [process.pid, *_descendants(process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _one_life(args: argparse.Namespace, output_dir: Path, during_save: bool, rng: random.Random) -> str | None:
    """Runs the training until it is killed (returns the kill's kind) or ends (returns None)."""
    marker = output_dir / STARTED_MARKER
    marker.unlink(missing_ok=True)
    known = {path.name for _, path in _checkpoints(output_dir)}
    process = subprocess.Popen(
        _command(args, output_dir), env=_environment(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=open(output_dir / "drill-stderr.log", "a"),
    )  # fmt: skip
    while not marker.exists():
        if process.poll() is not None:
            return None
        time.sleep(0.01)
    if during_save:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            fresh = [path for _, path in _checkpoints(output_dir) if path.name not in known]
            if fresh and not (fresh[-1] / "trainer_state.json").is_file():
                break
            known |= {path.name for path in fresh}
        if process.poll() is not None:
            return None
        _kill(process)
    else:
        time.sleep(rng.uniform(0.0, args.max_delay))
        if process.poll() is not None:
            return None
        _kill(process)
    newest = _checkpoints(output_dir)
    left_incomplete = bool(newest) and not (newest[-1][1] / "trainer_state.json").is_file()
    return "save" if left_incomplete else "step"


def _final_state(output_dir: Path, max_steps: int) -> dict:
    import torch
    from safetensors.torch import load_file

    folder = output_dir / f"checkpoint-{max_steps}"
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    optimizer_tensors = {
        f"optimizer.{index}.{key}": value
        for index, state in optimizer["state"].items()
        for key, value in state.items()
        if torch.is_tensor(value)
    }
    return {
        "model": load_file(str(folder / "model.safetensors")),
        "auxiliary": load_file(str(folder / "auxiliary_networks.safetensors")),
        "optimizer": optimizer_tensors,
    }


def _max_difference(reference: dict, drilled: dict) -> float:
    if set(reference) != set(drilled):
        raise RuntimeError(f"Different tensors: {sorted(set(reference) ^ set(drilled))[:5]}")
    return max(float((reference[key].double() - drilled[key].double()).abs().max()) for key in reference)


def drill(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    reference_dir, drilled_dir = args.output_dir / "uninterrupted", args.output_dir / "killed"
    for folder in (reference_dir, drilled_dir):
        if folder.exists():
            raise FileExistsError(f"{folder} exists; pass a fresh --output-dir.")
        folder.mkdir(parents=True)
    start = time.monotonic()
    subprocess.run(_command(args, reference_dir), env=_environment(), check=True, stdout=subprocess.DEVNULL)
    uninterrupted_seconds = time.monotonic() - start

    kills = {"step": 0, "save": 0}
    phase_kills = {"baseline_pretraining": 0, "policy_gradient": 0}
    lives = 0
    while sum(kills.values()) < args.kills and _newest_complete_step(drilled_dir) < args.max_steps:
        during_save = rng.random() < args.save_kill_share
        step_before = _newest_complete_step(drilled_dir)
        kind = _one_life(args, drilled_dir, during_save, rng)
        lives += 1
        if kind is None:
            break  # the training ended before this kill: no more steps to kill
        kills[kind] += 1
        # the phase the run was in when killed: that of the step after the newest complete checkpoint
        phase = "baseline_pretraining" if step_before < args.pretraining_steps else "policy_gradient"
        phase_kills[phase] += 1
        print(f"kill {sum(kills.values())}: {kind}, newest complete checkpoint {step_before}", flush=True)
    while _newest_complete_step(drilled_dir) < args.max_steps:
        lives += 1
        subprocess.run(_command(args, drilled_dir), env=_environment(), check=True, stdout=subprocess.DEVNULL)

    reference, drilled = _final_state(reference_dir, args.max_steps), _final_state(drilled_dir, args.max_steps)
    return {
        "num_processes": args.num_processes,
        "max_steps": args.max_steps,
        "baseline_pretraining_steps": args.pretraining_steps,
        "kills": sum(kills.values()),
        "kills_during_saves": kills["save"],
        "kills_in_baseline_pretraining": phase_kills["baseline_pretraining"],
        "kills_in_joint_training": phase_kills["policy_gradient"],
        "process_starts": lives,
        "uninterrupted_seconds": round(uninterrupted_seconds, 1),
        "drill_seconds": round(time.monotonic() - start - uninterrupted_seconds, 1),
        "max_difference_captioner": _max_difference(reference["model"], drilled["model"]),
        "max_difference_auxiliary": _max_difference(reference["auxiliary"], drilled["auxiliary"]),
        "max_difference_optimizer": _max_difference(reference["optimizer"], drilled["optimizer"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--pretraining-steps", type=int, default=100)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--max-delay", type=float, default=0.5, help="Longest wait after training starts, seconds.")
    parser.add_argument("--save-kill-share", type=float, default=0.3, help="Share of kills aimed at a save.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/benchmarks/kill_drill_cache"))
    parser.add_argument("--output-dir", type=Path, default=None)
    parser.add_argument("--output", type=Path, default=None, help="JSON report (default: <output-dir>/report.json).")
    args = parser.parse_args()
    if args.worker:
        train(args.worker, str(args.cache_dir), args.max_steps, args.pretraining_steps, args.save_steps)
        return
    if args.output_dir is None:
        args.output_dir = Path("runs/benchmarks") / f"kill_drill_{args.num_processes}p_{int(time.time())}"
    report = drill(args)
    print("\n| measure | value |\n|---|---|")
    for key, value in report.items():
        print(f"| {key} | {value} |")
    output = args.output or args.output_dir / "report.json"
    output.write_text(json.dumps(report, indent=2))
    print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
