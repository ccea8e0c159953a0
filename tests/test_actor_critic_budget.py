"""examples/train_actor_critic.py: a budget in epochs gives the policy as many updates as train_scst.py's does."""

import importlib.util
from pathlib import Path

import pytest

from rlcaption.trainer import RLCaptionTrainer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _TrainingStarts(Exception):
    """Stops a recipe when its training would start, with the trainer it built."""


@pytest.fixture
def tiny_recipe_inputs():
    from rlcaption.data import load_shapes
    from rlcaption.processing import CaptionProcessor
    from rlcaption.recipes import new_show_tell_rl

    shapes = load_shapes(num_train=8, num_validation=2, num_test=2, image_size=48)
    captions = [caption for row in shapes["train"]["captions"] for caption in row]
    processor = CaptionProcessor.from_captions(captions, image_size=48)
    return new_show_tell_rl(processor, 48, [4, 8], 8), processor, shapes


def _planned_training(name, arguments, tiny_recipe_inputs, monkeypatch, tmp_path) -> RLCaptionTrainer:
    """The trainer a recipe builds on 8 tiny images, stopped when `train()` is called."""
    model, processor, shapes = tiny_recipe_inputs
    module = load_recipe(name)
    monkeypatch.setattr(module, "load_pretrained_captioner", lambda reference: (model, processor))
    monkeypatch.setattr(module, "load_recipe_dataset", lambda script_args: shapes)

    def stop(trainer, **kwargs):
        raise _TrainingStarts(trainer)

    monkeypatch.setattr(RLCaptionTrainer, "train", stop)
    common = ["--output_dir", str(tmp_path / name), "--use_cpu", "--per_device_train_batch_size", "2"]
    with pytest.raises(_TrainingStarts) as started:
        module.main([*common, "--report_to", "none", *arguments])
    return started.value.args[0]


def test_the_default_epoch_gives_actor_critic_as_many_policy_updates_as_scst(
    tiny_recipe_inputs, monkeypatch, tmp_path
):
    scst = _planned_training("train_scst", [], tiny_recipe_inputs, monkeypatch, tmp_path)
    actor_critic = _planned_training(
        "train_actor_critic", ["--value_pretraining_steps", "3", "--value_hidden_size", "8"], tiny_recipe_inputs,
        monkeypatch, tmp_path,
    )  # fmt: skip
    scst_updates = scst.planned_steps()
    assert scst_updates == 4  # 8 images, 2 a step, one epoch
    planned = actor_critic.planned_steps()
    assert actor_critic.objective.steps_by_phase(planned) == {"value_pretraining": 3, "actor_critic": scst_updates}


def test_a_budget_in_steps_still_counts_both_phases(tiny_recipe_inputs, monkeypatch, tmp_path):
    arguments = ["--max_steps", "5", "--value_pretraining_steps", "3", "--value_hidden_size", "8"]
    trainer = _planned_training("train_actor_critic", arguments, tiny_recipe_inputs, monkeypatch, tmp_path)
    assert trainer.objective.steps_by_phase(trainer.planned_steps()) == {"value_pretraining": 3, "actor_critic": 2}
