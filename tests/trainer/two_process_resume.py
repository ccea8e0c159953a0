"""
Run by test_two_processes.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU): the critic
objective (an auxiliary network with a pretraining phase, a set-level reward), a checkpoint every step, optionally
killed with SIGKILL at the end of a step; a later launch resumes from the newest complete checkpoint.
"""

import json
import sys
from pathlib import Path

import torch
from critic_objective import GroupNovelty
from kill_at_step import KillAtStep
from tiny_training import leave_process_group, make_tiny_model, two_process_shapes

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint

MAX_STEPS = 4


def flat(tensors) -> list[float]:
    return [float(value) for tensor in tensors for value in tensor.detach().double().flatten()]


def main(output_dir: str, cache_dir: str, kill_at_step: int) -> None:
    shapes, processor = two_process_shapes(cache_dir)
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective="test_critic", per_device_train_batch_size=2,
        max_steps=MAX_STEPS, learning_rate=1e-2, save_strategy="steps", save_steps=1, logging_steps=1,
        disable_tqdm=True, max_caption_length=8, seed=0,
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_tiny_model(processor, seed=0), args=args, processing_class=processor,
        train_dataset=shapes["train"], reward_funcs=[GroupNovelty()],
    )  # fmt: skip
    if kill_at_step:
        trainer.add_callback(KillAtStep(kill_at_step))
    resume = last_complete_checkpoint(output_dir) is not None
    trainer.train(resume_from_checkpoint=True if resume else None)
    optimizer_state = trainer.optimizer.state_dict()["state"]
    report = {
        "world_size": trainer.accelerator.num_processes,
        "resumed": resume,
        "captioner": flat(trainer.model.parameters()),
        "critic": flat(trainer.objective.critic.parameters()),
        "optimizer": flat(
            value for state in optimizer_state.values() for value in state.values() if torch.is_tensor(value)
        ),
        "group_sizes": trainer.reward_mix.funcs[0].calls[:1],
    }
    Path(output_dir, f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))
    leave_process_group(trainer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
