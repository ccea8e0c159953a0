import math
import shutil

import numpy as np
import pytest
import torch
from test_policy_gradient import samples_padded_to_the_token_budget
from transformers import TrainerCallback

from rlcaption.generation.decoding import caption_token_mask
from rlcaption.models import PolicyValueCaptioner
from rlcaption.objectives.actor_critic import (
    actor_critic_losses,
    state_mask,
    value_explained_variance,
    value_regression_loss,
)
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

IMAGE_SIZE = 48
MAX_LENGTH = 8


def make_policy_value(processor, seed: int = 0) -> PolicyValueCaptioner:
    policy = make_show_tell(processor, IMAGE_SIZE, seed=seed)
    return PolicyValueCaptioner.from_policy(
        policy, value_word_embedding_size=16, value_hidden_size=16, value_mlp_hidden_size=16
    )


def word_count_reward(completions, **columns):
    # a reward that differs from caption to caption, so that the value network has something to predict
    return [0.1 * len(completion.split()) for completion in completions]


def make_trainer(processor, shapes, output_dir, model=None, reward=word_count_reward, **fields) -> RLCaptionTrainer:
    fields = {"max_steps": 3, "save_strategy": "no", "value_learning_rate": 5e-3, **fields}
    args = RLCaptionConfig(
        output_dir=str(output_dir), use_cpu=True, objective="actor_critic", per_device_train_batch_size=4,
        learning_rate=1e-2, logging_steps=1, disable_tqdm=True, num_samples_per_image=2,
        max_caption_length=MAX_LENGTH, seed=0, **fields,
    )  # fmt: skip
    model = make_policy_value(processor) if model is None else model
    return RLCaptionTrainer(
        model=model,
        args=args,
        processing_class=processor,
        train_dataset=shapes["train"],
        reward_funcs=[reward],
    )


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def phases_by_step(trainer) -> dict[int, float]:
    return {
        entry["step"]: entry["objective_phase"] for entry in trainer.state.log_history if "objective_phase" in entry
    }


# ---------------------------------------------------------------- losses


def test_state_mask_covers_bos_and_every_token_of_the_caption():
    token_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    expected = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(state_mask(token_mask), expected)


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_advantages_and_losses_match_a_hand_computation(normalization):
    # two captions: "a <eos>" (2 tokens, the third position is padding) and "a b <eos>" (3 tokens)
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -0.3]], requires_grad=True)
    token_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # v(s_0) .. v(s_3); the states after the end of caption 0 do not count
    values = torch.tensor([[0.5, 0.0, 1.0, 9.0], [1.0, 2.0, 0.0, 1.0]], requires_grad=True)
    rewards = torch.tensor([1.0, 2.0])
    policy_loss, value_loss = actor_critic_losses(log_probs, values, rewards, token_mask, normalization)

    # advantages R − v(s_t) of the tokens: caption 0: 1 − 0.5, 1 − 0; caption 1: 2 − 1, 2 − 2, 2 − 0
    weighted = (0.5 * 1.0 + 1.0 * 2.0) + (1.0 * 0.1 + 0.0 * 0.2 + 2.0 * 0.3)  # Σ A · (−log p)
    divisor = 5 if normalization == "token" else 2
    assert policy_loss.item() == pytest.approx(weighted / divisor)
    # squared errors at s_0, s_1, s_2 of caption 0 and s_0 .. s_3 of caption 1
    squared = (0.25 + 1.0 + 0.0) + (1.0 + 0.0 + 4.0 + 1.0)
    assert value_loss.item() == pytest.approx(squared / 7)
    assert value_regression_loss(values, rewards, token_mask).item() == pytest.approx(squared / 7)

    # the policy term never trains the value network, the value term never the policy
    policy_loss.backward(retain_graph=True)
    assert values.grad is None and log_probs.grad is not None
    log_probs.grad = None
    value_loss.backward()
    assert log_probs.grad is None
    expected_gradient = 2 * (values.detach() - rewards[:, None]) * state_mask(token_mask) / 7
    torch.testing.assert_close(values.grad, expected_gradient)


# ---------------------------------------------------------------- explained variance on held-out captions


def set_value_network_output(model, processor, monkeypatch, value_of_state):
    """
    Makes the value network return `value_of_state(text, t)` for state `s_t` of every caption, `text` the decoded
    sampled caption; returns the list of `(text, input_ids row)` it was called on.
    """
    calls = []

    def forward(input_ids, *args, **kwargs):
        texts = [text.strip() for text in processor.batch_decode(input_ids, skip_special_tokens=True)]
        calls.extend(zip(texts, input_ids, strict=True))
        return torch.tensor([[value_of_state(text, t) for t in range(input_ids.shape[1])] for text in texts])

    monkeypatch.setattr(model.value_network, "forward", forward)
    return calls


def word_count(text: str) -> float:
    return 0.1 * len(text.split())  # = word_count_reward, the reward of make_trainer


@pytest.mark.parametrize(
    "value_of_state, expected",
    [
        (lambda text, t: 0.35, 0.0),  # a constant explains nothing, whatever it is (the mean reward included)
        (lambda text, t: word_count(text), 1.0),  # v ≡ R: everything
        (lambda text, t: 0.5 * word_count(text), 0.75),  # v = R / 2: Var(R − v) = Var(R) / 4
    ],
)
def test_value_explained_variance_of_a_value_network_with_a_known_output(
    processor, shapes, tmp_path, monkeypatch, value_of_state, expected
):
    trainer = make_trainer(processor, shapes, tmp_path)
    set_value_network_output(trainer.model, processor, monkeypatch, value_of_state)
    state = torch.random.get_rng_state()
    explained = value_explained_variance(trainer, shapes["test"], num_samples_per_image=3)
    assert explained == pytest.approx(expected, abs=1e-6)  # not nan: the sampled captions' rewards vary
    # sampling is seeded, and leaves the global random state as it was
    assert torch.equal(torch.random.get_rng_state(), state)
    assert value_explained_variance(trainer, shapes["test"], num_samples_per_image=3) == explained


def test_value_explained_variance_pairs_every_state_of_every_caption_with_its_reward(
    processor, shapes, tmp_path, monkeypatch
):
    trainer = make_trainer(processor, shapes, tmp_path)
    # v(s_0) = 0 at the start token, then the caption's reward: only the first state of each caption errs
    calls = set_value_network_output(
        trainer.model, processor, monkeypatch, lambda text, t: 0.0 if t == 0 else word_count(text)
    )
    explained = value_explained_variance(trainer, shapes["test"], num_samples_per_image=4)

    targets, errors = [], []
    for text, input_ids in calls:
        num_states = 1 + int(caption_token_mask(input_ids[None], trainer.eos_token_id).sum())  # s_0 .. s_n
        targets += [word_count(text)] * num_states
        errors += [word_count(text)] + [0.0] * (num_states - 1)
    assert len(calls) == 4 * shapes["test"].num_rows and np.var(targets) > 0
    assert explained == pytest.approx(1.0 - np.var(errors) / np.var(targets))


def test_value_explained_variance_is_undefined_for_a_constant_reward(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, reward=lambda completions, **columns: [0.7] * len(completions))
    assert math.isnan(value_explained_variance(trainer, shapes["test"]))


# ---------------------------------------------------------------- training with RLCaptionTrainer


def snapshot(trainer):
    policy = torch.cat([parameter.detach().flatten() for parameter in trainer.model.parameters()]).clone()
    value = {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()}
    return policy, value


def test_value_pretraining_keeps_the_policy_fixed_then_both_learn(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, value_pretraining_steps=2, max_steps=3)
    model = trainer.model
    # the value network is trained in its own optimizer group, never in the model's
    assert model.value_network_is_detached
    assert not {id(p) for p in model.value_network.parameters()} & {id(p) for p in model.parameters()}
    snapshots = [snapshot(trainer)]

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots.append(snapshot(trainer))

    trainer.add_callback(Snapshot())
    trainer.train()
    for step in (1, 2):  # value pretraining: the policy is fixed, every part of the value network learns
        assert torch.equal(snapshots[step][0], snapshots[step - 1][0]), step
        before, after = snapshots[step - 1][1], snapshots[step][1]
        changed = {name.split(".")[1] for name in after if not torch.equal(after[name], before[name])}
        assert changed == {"image_encoder", "image_projection", "image_norm", "word_embeddings", "caption_rnn",
                           "value_head"}, step  # fmt: skip
    assert not torch.equal(snapshots[3][0], snapshots[2][0])  # then the policy gradient starts
    assert not torch.equal(snapshots[3][1]["value.value_head.0.weight"], snapshots[2][1]["value.value_head.0.weight"])
    assert logged(trainer, "objective_phase") == [0.0, 0.0, 1.0]
    [value_group] = [group for group in trainer.optimizer.param_groups if group.get("name") == "auxiliary/value"]
    assert value_group["initial_lr"] == 5e-3
    for key in ("value_loss", "value_mean", "advantage_std", "reward", "loss_actor_critic"):
        assert len(logged(trainer, key)) == 3 and all(math.isfinite(value) for value in logged(trainer, key)), key
    assert len(logged(trainer, "policy_loss")) == 1  # the joint phase only

    # the final save holds the trained value network with the policy
    trainer.save_model(str(tmp_path / "final"))
    saved = PolicyValueCaptioner.from_pretrained(tmp_path / "final")
    for name, tensor in trainer.auxiliary_state_dict().items():
        assert torch.equal(saved.value_network.state_dict()[name.removeprefix("value.")], tensor), name


@pytest.mark.slow  # 30 steps
def test_the_value_network_learns_to_predict_a_constant_reward(processor, shapes, tmp_path):
    def constant_reward(completions, **columns):
        return [0.7] * len(completions)

    trainer = make_trainer(
        processor, shapes, tmp_path, reward=constant_reward, value_pretraining_steps=30, max_steps=30,
        value_learning_rate=1e-2, lr_scheduler_type="constant",
    )  # fmt: skip
    trainer.train()
    value_losses, value_means = logged(trainer, "value_loss"), logged(trainer, "value_mean")
    assert abs(value_means[0] - 0.7) > 0.5 and abs(np.mean(value_means[-5:]) - 0.7) < 0.1
    assert np.mean(value_losses[-5:]) < 0.05 * value_losses[0]
    assert "value_explained_variance" not in trainer.state.log_history[-2]  # undefined for a constant reward


def test_resume_in_the_value_pretraining_phase_equals_uninterrupted_training(processor, shapes, tmp_path):
    settings = {"max_steps": 4, "value_pretraining_steps": 2, "save_strategy": "steps", "save_steps": 1}
    straight = make_trainer(processor, shapes, tmp_path / "straight", **settings)
    straight.train()
    expected_model = {name: tensor.clone() for name, tensor in straight.model.state_dict().items()}
    expected_value = {name: tensor.clone() for name, tensor in straight.auxiliary_state_dict().items()}
    expected_phases = phases_by_step(straight)
    assert expected_phases == {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}

    # a run killed after its first step: only checkpoint-1 survives; a new process resumes from it
    output_dir = tmp_path / "killed"
    output_dir.mkdir()
    shutil.copytree(tmp_path / "straight" / "checkpoint-1", output_dir / "checkpoint-1")
    resumed = make_trainer(processor, shapes, output_dir, model=make_policy_value(processor, seed=9), **settings)
    resumed.train(resume_from_checkpoint=True)
    # the resumed run logs steps 2 to 4 (after step 1's log, restored from the checkpoint): step 2 is still value
    # pretraining
    assert phases_by_step(resumed) == expected_phases
    for name, tensor in resumed.model.state_dict().items():
        torch.testing.assert_close(tensor, expected_model[name], rtol=0, atol=0, msg=name)
    for name, tensor in resumed.auxiliary_state_dict().items():
        torch.testing.assert_close(tensor, expected_value[name], rtol=0, atol=0, msg=name)


def test_actor_critic_refuses_a_captioner_without_a_value_network(processor, shapes, tmp_path):
    with pytest.raises(ValueError, match="PolicyValueCaptioner.from_policy"):
        make_trainer(processor, shapes, tmp_path, model=make_show_tell(processor, IMAGE_SIZE))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(value_learning_rate=0.0), "value_learning_rate"),
        (dict(value_pretraining_steps=-1), "value_pretraining_steps"),
        (dict(value_loss_weight=-0.5), "value_loss_weight"),
    ],
)
def test_config_rejects_bad_actor_critic_fields(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, objective="actor_critic", **fields)


# ---------------------------------------------------------------- the step's order on a GPU


def actor_critic_loss_and_gradients(processor, shapes, output_dir, **fields):
    """The loss of the first batch (of the phase of step 0), with seeded sampling, and the gradients of the policy
    and of the value network."""
    policy = make_show_tell(processor, IMAGE_SIZE, seed=0)
    with torch.no_grad():  # captions that end early, so that the padding is real
        policy.lm_head.bias[processor.tokenizer.eos_token_id] += 3.0
    model = PolicyValueCaptioner.from_policy(
        policy, value_word_embedding_size=16, value_hidden_size=16, value_mlp_hidden_size=16
    )
    trainer = make_trainer(processor, shapes, output_dir, model=model, **fields)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    torch.manual_seed(0)
    loss = trainer.objective.compute_loss(trainer.model, batch)
    loss.backward()
    parameters = [*trainer.model.named_parameters(), *trainer.objective.value_network.named_parameters()]
    return loss.detach(), {name: parameter.grad for name, parameter in parameters if parameter.grad is not None}


@pytest.mark.parametrize("value_pretraining_steps", [1, 0], ids=["value-pretraining", "joint"])
def test_samples_padded_to_the_token_budget_give_the_same_loss_and_gradients(
    processor, shapes, tmp_path, monkeypatch, value_pretraining_steps
):
    # a GPU's decoding graph returns the samples max_caption_length + 1 wide, without waiting to trim them
    loss, gradients = actor_critic_loss_and_gradients(
        processor, shapes, tmp_path / "trimmed", value_pretraining_steps=value_pretraining_steps
    )
    widths = samples_padded_to_the_token_budget(RLCaptionTrainer, monkeypatch)
    padded_loss, padded_gradients = actor_critic_loss_and_gradients(
        processor, shapes, tmp_path / "padded", value_pretraining_steps=value_pretraining_steps
    )
    assert widths and all(trimmed < padded == MAX_LENGTH + 1 for trimmed, padded in widths)
    assert padded_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert padded_gradients.keys() == gradients.keys() and gradients
    for name, gradient in gradients.items():
        assert torch.allclose(padded_gradients[name], gradient, rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("value_pretraining_steps", [1, 0], ids=["value-pretraining", "joint"])
def test_the_value_and_policy_passes_are_queued_before_the_samples_texts_are_read(
    processor, shapes, tmp_path, monkeypatch, value_pretraining_steps
):
    # on a GPU the host then queues them while the device still samples, and computes the rewards while it runs them
    events = []
    batch_decode = processor.batch_decode
    monkeypatch.setattr(processor, "batch_decode", lambda *a, **k: events.append("texts") or batch_decode(*a, **k))
    trainer = make_trainer(processor, shapes, tmp_path, value_pretraining_steps=value_pretraining_steps)
    trainer.objective.value_network.register_forward_pre_hook(lambda *_: events.append("value"))
    trainer.model.register_forward_pre_hook(lambda *_: events.append("policy") if torch.is_grad_enabled() else None)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert torch.isfinite(trainer.objective.compute_loss(trainer.model, batch))
    scored = ["value"] if value_pretraining_steps else ["value", "policy"]
    assert events == [*scored, "texts"]
