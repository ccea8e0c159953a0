"""
The learning-rate schedule counts captioner steps: a pretraining phase that keeps the captioner fixed holds the base
rates and the schedule runs over the captioner's steps after it, so a method with P pretraining steps and N captioner
steps gives its captioner the learning rates SCST gives over N steps; and the step decay of Ren et al. 2017.
"""

from __future__ import annotations

import pytest
import torch
from objective_steps import make_step_trainer
from tiny_training import make_tiny_model
from transformers import TrainerCallback

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from rlcaption.trainer.learning_rate_schedule import captioner_step_schedule

LEARNING_RATE = 1e-3
PRETRAINING_STEPS, CAPTIONER_STEPS = 2, 3


class CaptionerLearningRates(TrainerCallback):
    """The captioner's learning rate (its optimizer group, the first) at every optimizer step, as the step used it."""

    def __init__(self):
        self.rates = []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.rates.append(optimizer.param_groups[0]["lr"])


def scheduled_rates(trainer, num_steps):
    """The learning rates of every optimizer group at each of `num_steps` steps of the trainer's schedule."""
    trainer.create_optimizer_and_scheduler(num_training_steps=num_steps)
    rates = []
    for _ in range(num_steps):
        rates.append([group["lr"] for group in trainer.optimizer.param_groups])
        trainer.optimizer.step()  # no gradients: nothing moves, but the scheduler sees the step it expects
        trainer.lr_scheduler.step()
    return torch.tensor(rates)  # (num_steps, num_groups)


def test_actor_critic_gives_its_policy_the_learning_rates_scst_gives_over_its_policy_steps(
    tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    common = dict(
        processor=tiny_processor, shapes=tiny_shapes, reward_clip=reward_clip, embedding_model=embedding_model,
        learning_rate=LEARNING_RATE, lr_scheduler_type="linear",
    )  # fmt: skip
    actor_critic = make_step_trainer(
        "actor_critic", {"value_pretraining_steps": PRETRAINING_STEPS}, "policy_value", output_dir=tmp_path / "ac",
        max_steps=PRETRAINING_STEPS + CAPTIONER_STEPS, **common,
    )  # fmt: skip
    scst = make_step_trainer(
        "scst", {}, "show_tell", output_dir=tmp_path / "scst", max_steps=CAPTIONER_STEPS, **common
    )
    rates = {}
    for name, trainer in (("actor_critic", actor_critic), ("scst", scst)):
        recorder = CaptionerLearningRates()
        trainer.add_callback(recorder)
        trainer.train()
        rates[name] = recorder.rates
    pretraining, policy = rates["actor_critic"][:PRETRAINING_STEPS], rates["actor_critic"][PRETRAINING_STEPS:]
    assert pretraining == [LEARNING_RATE] * PRETRAINING_STEPS  # held at the start while the policy is fixed
    assert policy == pytest.approx(rates["scst"], rel=1e-12)
    assert sum(policy) == pytest.approx(sum(rates["scst"]), rel=1e-12)
    assert sum(rates["scst"]) < CAPTIONER_STEPS * LEARNING_RATE  # the linear decay ran: the check has teeth


@pytest.mark.parametrize(
    ("objective", "fields", "kind"),
    [
        ("actor_critic", {"value_pretraining_steps": PRETRAINING_STEPS}, "policy_value"),
        ("spider_pg", {"baseline_pretraining_steps": PRETRAINING_STEPS}, "show_tell"),
        ("wtf", {"discriminator_pretraining_steps": PRETRAINING_STEPS}, "show_tell"),
        ("psst", {"listener_pretraining_steps": PRETRAINING_STEPS}, "speaker_listener"),
    ],
)
def test_every_pretraining_phase_holds_the_base_rates_and_delays_the_schedule(
    objective, fields, kind, tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    num_steps = PRETRAINING_STEPS + CAPTIONER_STEPS
    settings = dict(learning_rate=LEARNING_RATE, lr_scheduler_type="linear", warmup_steps=1, max_steps=num_steps)
    trainer = make_step_trainer(
        objective, fields, kind, tiny_processor, tiny_shapes, tmp_path, reward_clip, embedding_model, **settings
    )
    rates = scheduled_rates(trainer, num_steps)
    base_rates = torch.tensor([group["initial_lr"] for group in trainer.optimizer.param_groups])
    # the captioner's groups and its auxiliary network's
    assert trainer.optimizer.param_groups[-1]["name"].startswith("auxiliary/")
    torch.testing.assert_close(rates[:PRETRAINING_STEPS], base_rates.expand(PRETRAINING_STEPS, -1))
    # then warmup over the first captioner step and linear decay over the others, for every group alike
    factors = torch.tensor([0.0, 1.0, 0.5], dtype=rates.dtype)
    torch.testing.assert_close(rates[PRETRAINING_STEPS:], factors[:, None] * base_rates)


def test_step_decay_multiplies_the_rates_every_few_epochs_of_captioner_training(
    tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    steps_per_epoch = len(tiny_shapes["train"]) // 4  # batch 4
    num_steps = PRETRAINING_STEPS + 3 * steps_per_epoch
    trainer = make_step_trainer(
        "actor_critic", {"value_pretraining_steps": PRETRAINING_STEPS}, "policy_value", tiny_processor, tiny_shapes,
        tmp_path, reward_clip, embedding_model, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        lr_decay_factor=0.9, lr_decay_epochs=1, max_steps=num_steps,
    )  # fmt: skip
    assert trainer.steps_per_epoch() == steps_per_epoch
    rates = scheduled_rates(trainer, num_steps)[:, 0]
    epochs = [0.9**epoch for epoch in range(3) for _ in range(steps_per_epoch)]
    expected = torch.tensor([1.0] * PRETRAINING_STEPS + epochs, dtype=rates.dtype) * LEARNING_RATE
    torch.testing.assert_close(rates, expected)


def test_a_schedule_without_pretraining_or_decay_is_the_trainers_own(tiny_processor, tiny_shapes, tmp_path):
    args = RLCaptionConfig(
        output_dir=str(tmp_path), use_cpu=True, objective="xe", max_steps=4, learning_rate=LEARNING_RATE,
        report_to="none",
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        make_tiny_model(tiny_processor), args, train_dataset=tiny_shapes["train"], processing_class=tiny_processor
    )
    rates = scheduled_rates(trainer, 4)[:, 0]
    torch.testing.assert_close(rates, torch.tensor([1.0, 0.75, 0.5, 0.25], dtype=rates.dtype) * LEARNING_RATE)


def test_a_schedule_that_is_not_per_step_is_refused_rather_than_left_undelayed():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    assert captioner_step_schedule(plateau, fixed_steps=0) is plateau
    with pytest.raises(ValueError, match="cannot be shifted past 3 pretraining steps"):
        captioner_step_schedule(plateau, fixed_steps=3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"lr_decay_factor": 0.0}, "lr_decay_factor must be in"), ({"lr_decay_epochs": 0}, "lr_decay_epochs must be")],
)
def test_config_validates_the_step_decay(fields, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, **fields)
