"""
Run by test_fsdp.py under `accelerate launch --config_file examples/accelerate/fsdp.yaml --num_processes 2` on CPU
(gloo, see fsdp_on_cpu.py), or under `--multi_gpu` (DDP) to compare with: `objective` trains a tiny ShowTellRL (in the
model its objective trains) fully sharded by FSDP2 for 3 steps with a checkpoint every `save_steps` steps (1 unless
given), optionally killed with SIGKILL at the end of step `kill_at_step`; a later launch resumes from the newest
complete checkpoint.
"""

import json
import math
import os
import sys
from pathlib import Path

import critic_objective  # noqa: F401  (registers test_critic, an objective with an auxiliary network)
from fsdp_on_cpu import shard_cpu_processes_with_fsdp
from kill_at_step import KillAtStep
from tiny_training import leave_process_group, make_tiny_model, two_process_shapes
from torch.distributed.tensor import DTensor

from rlcaption.models import PolicyValueCaptioner, SpeakerListener
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint

MAX_STEPS = 3
# a pretraining step of each objective's auxiliary network, then the joint steps
OBJECTIVE_FIELDS = {
    "spider_pg": {"num_rollouts": 2, "baseline_pretraining_steps": 1},
    "actor_critic": {"value_pretraining_steps": 1},
    "psst": {"listener_pretraining_steps": 1},
    "wtf": {
        "discriminator_pretraining_steps": 1,
        "wtf_num_beams": 2,
        "reward_clip": str(Path(__file__).parents[2] / "checkpoints" / "shapes-clip-reward"),
    },
}


def flat(tensors) -> list[float]:
    return [float(value) for tensor in tensors for value in tensor.detach().double().flatten()]


def whole(parameter):
    """The whole tensor of a parameter, gathered from the processes' shards under FSDP (a replica under DDP)."""
    return parameter.full_tensor() if isinstance(parameter, DTensor) else parameter


def local(parameter):
    return parameter.to_local() if isinstance(parameter, DTensor) else parameter


def model_class_networks(trainer):
    """The networks an objective took out of its model, by the name the model gives them."""
    model = trainer.unwrap_model(trainer.model)
    if not getattr(model, "network_is_detached", False):
        return []
    return [(model.detachable_network_name, getattr(model, model.detachable_network_name))]


def main(output_dir: str, cache_dir: str, objective: str, kill_at_step: int, save_steps: int) -> None:
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":  # else DDP, to compare with
        shard_cpu_processes_with_fsdp()
    shapes, processor = two_process_shapes(cache_dir)
    model = make_tiny_model(processor, seed=0)
    if objective == "actor_critic":
        model = PolicyValueCaptioner.from_policy(
            model, value_word_embedding_size=4, value_hidden_size=4, value_mlp_hidden_size=4
        )
    elif objective == "psst":
        model = SpeakerListener.from_speaker(model, listener_hidden_size=4, joint_embedding_size=4)
    initial = flat(model.parameters())
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective=objective, per_device_train_batch_size=2,
        max_steps=MAX_STEPS, learning_rate=1e-2, save_strategy="steps", save_steps=save_steps, logging_steps=1,
        disable_tqdm=True, max_caption_length=8, num_samples_per_image=2, seed=0,
        **({"reward_funcs": ["cider"]} if objective in ("scst", "spider_pg", "actor_critic", "psst") else {}),
        **OBJECTIVE_FIELDS.get(objective, {}),
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=model, args=args, processing_class=processor, train_dataset=shapes["train"]
    )  # fmt: skip
    initial_auxiliary = {
        name: flat(network.module.parameters()) for name, network in trainer._auxiliary_networks.items()
    }
    if kill_at_step:
        trainer.add_callback(KillAtStep(kill_at_step))
    resume = last_complete_checkpoint(output_dir) is not None
    trainer.train(resume_from_checkpoint=True if resume else None)

    parameters = list(trainer.model.parameters())
    # gathered on every process from the shards: equal on both processes if the steps kept the shards consistent
    full = [whole(parameter) for parameter in parameters]
    saved = type(model).from_pretrained(os.path.join(output_dir, f"checkpoint-{MAX_STEPS}")).state_dict()
    trained = {name: whole(parameter) for name, parameter in trainer.model.named_parameters()}
    # a network the objective took out of the model (value network, listener) is saved in it, trained
    trained.update({
        f"{network_name}.{name}": parameter
        for network_name, network in (model_class_networks(trainer))
        for name, parameter in network.named_parameters()
    })  # fmt: skip
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    report = {
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "resumed": resume,
        "sharded": all(isinstance(parameter, DTensor) for parameter in parameters),
        "local_numel": sum(local(parameter).numel() for parameter in parameters),
        "full_numel": sum(tensor.numel() for tensor in full),
        "captioner": flat(full),
        "changed": flat(full) != initial,
        "losses": losses,
        "losses_finite": all(math.isfinite(loss) for loss in losses),
        "saved_model_is_the_trained_one": all(
            flat([saved[name]]) == flat([tensor]) for name, tensor in trained.items()
        ),
        "final_step": trainer.state.global_step,
        # an objective's auxiliary networks stay whole on every process, trained by their own optimizer
        "auxiliary": {
            name: {
                "weights": flat(network.module.parameters()),
                "changed": flat(network.module.parameters()) != before,
            }
            for name, network in trainer._auxiliary_networks.items()
            for before in [initial_auxiliary[name]]
        },
        "auxiliary_optimizer_steps": [int(state["step"]) for state in trainer._auxiliary_optimizer.state.values()]
        if trainer._auxiliary_optimizer is not None
        else [],
    }
    Path(output_dir, f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))
    leave_process_group(trainer)


if __name__ == "__main__":
    arguments = [int(value) for value in sys.argv[4:]] + [0, 1][len(sys.argv[4:]) :]
    main(sys.argv[1], sys.argv[2], sys.argv[3], *arguments[:2])
