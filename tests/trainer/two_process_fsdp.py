"""
Run by test_fsdp.py under `accelerate launch --config_file examples/accelerate/fsdp.yaml --num_processes 2` on CPU
(gloo, see fsdp_on_cpu.py): `objective` trains a tiny ShowTellRL fully sharded by FSDP2 for 3 steps with a checkpoint
every step, optionally killed with SIGKILL at the end of a step; a later launch resumes from the newest complete
checkpoint.
"""

import json
import math
import os
import sys
from pathlib import Path

import critic_objective  # noqa: F401  (registers test_critic, an objective with an auxiliary network)
from conftest import make_tiny_model, two_process_shapes
from fsdp_on_cpu import shard_cpu_processes_with_fsdp
from kill_at_step import KillAtStep
from torch.distributed.tensor import DTensor

from rlcaption.models import ShowTellRL
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint

MAX_STEPS = 3


def flat(tensors) -> list[float]:
    return [float(value) for tensor in tensors for value in tensor.detach().double().flatten()]


def main(output_dir: str, cache_dir: str, objective: str, kill_at_step: int) -> None:
    shard_cpu_processes_with_fsdp()
    shapes, processor = two_process_shapes(cache_dir)
    model = make_tiny_model(processor, seed=0)
    initial = flat(model.parameters())
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective=objective, per_device_train_batch_size=2,
        max_steps=MAX_STEPS, learning_rate=1e-2, save_strategy="steps", save_steps=1, logging_steps=1,
        disable_tqdm=True, max_caption_length=8, num_samples_per_image=2, seed=0,
        **({"reward_funcs": ["cider"]} if objective == "scst" else {}),
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=model, args=args, processing_class=processor, train_dataset=shapes["train"]
    )  # fmt: skip
    if kill_at_step:
        trainer.add_callback(KillAtStep(kill_at_step))
    resume = last_complete_checkpoint(output_dir) is not None
    trainer.train(resume_from_checkpoint=True if resume else None)

    parameters = list(trainer.model.parameters())
    # gathered on every process from the shards: equal on both processes if the steps kept the shards consistent
    full = [parameter.full_tensor() for parameter in parameters]
    saved = ShowTellRL.from_pretrained(os.path.join(output_dir, f"checkpoint-{MAX_STEPS}"))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    report = {
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "resumed": resume,
        "sharded": all(isinstance(parameter, DTensor) for parameter in parameters),
        "local_numel": sum(parameter.to_local().numel() for parameter in parameters),
        "full_numel": sum(tensor.numel() for tensor in full),
        "captioner": flat(full),
        "changed": flat(full) != initial,
        "losses": losses,
        "losses_finite": all(math.isfinite(loss) for loss in losses),
        "saved_model_is_the_trained_one": flat(saved.parameters()) == flat(full),
        "final_step": trainer.state.global_step,
    }
    Path(output_dir, f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)
