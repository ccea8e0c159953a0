"""
The KL leash (`beta`): β · KL(π‖π_ref) with the k3 estimator on the sampled captions' tokens, the reference a frozen
copy of the starting model, or under LoRA the same model with its adapters disabled.
"""

import math

import pytest
import torch
from tiny_training import IMAGE_SIZE

from rlcaption.objectives.policy_gradient import k3_kl_divergence
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_foreign_captioner


def test_k3_by_hand():
    log_probs = torch.tensor([[-1.0, -2.0, -float("inf")], [-0.5, -0.1, -0.3]])
    reference = torch.tensor([[-1.5, -1.0, -float("inf")], [-0.5, -0.7, -0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # r = log π_ref − log π on the caption's tokens: -0.5, 1.0 | 0.0, -0.6, 0.1
    terms = [math.exp(r) - r - 1 for r in (-0.5, 1.0, 0.0, -0.6, 0.1)]
    token = k3_kl_divergence(log_probs, reference, mask, "token")
    sequence = k3_kl_divergence(log_probs, reference, mask, "sequence")
    assert token.item() == pytest.approx(sum(terms) / 5)
    assert sequence.item() == pytest.approx(sum(terms) / 2)
    assert torch.isfinite(token)  # the -inf after the end token is masked out, not turned into NaN


def test_k3_gradient_pulls_the_policy_toward_the_reference():
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    reference = torch.tensor([[-1.5, -1.0]])
    k3_kl_divergence(log_probs, reference, torch.ones(1, 2), "sequence").backward()
    # d/dlogπ (exp(r) − r − 1) = 1 − exp(r): a token the policy likes more than the reference is pushed down
    expected = [1 - math.exp(-0.5), 1 - math.exp(1.0)]
    assert log_probs.grad[0].tolist() == pytest.approx(expected)


@pytest.fixture(scope="module")
def train_captions(tiny_shapes):
    return [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]


def scst_trainer(kind, train_captions, shapes, tmp_path, **overrides):
    model, processor = make_foreign_captioner(kind, train_captions, IMAGE_SIZE)
    settings = dict(
        output_dir=str(tmp_path), use_cpu=True, objective="scst", per_device_train_batch_size=4, max_steps=1,
        learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True, max_caption_length=8,
        num_samples_per_image=2, seed=0, log_completions=False,
    )  # fmt: skip
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model, args=RLCaptionConfig(**settings), processing_class=processor, train_dataset=shapes["train"]
    )


def step_losses(trainer) -> list[torch.Tensor]:
    """Trains, keeping the loss the objective returned at every step."""
    losses = []
    compute_loss = trainer.objective.compute_loss

    def recorded(model, inputs):
        loss = compute_loss(model, inputs)
        losses.append(loss.detach().clone())
        return loss

    trainer.objective.compute_loss = recorded
    trainer.train()
    return losses


@pytest.mark.parametrize("use_peft", [False, True], ids=["frozen_copy", "lora"])
def test_untrained_policy_has_zero_kl_and_the_loss_of_beta_zero(use_peft, tiny_shapes, train_captions, tmp_path):
    # each trainer trains once built: building one seeds the random draws of the next training
    without = scst_trainer("blip", train_captions, tiny_shapes, tmp_path / "a", use_peft=use_peft)
    loss_without = step_losses(without)[0]
    leashed = scst_trainer("blip", train_captions, tiny_shapes, tmp_path / "b", use_peft=use_peft, beta=0.5)
    loss_leashed = step_losses(leashed)[0]
    assert without.reference_policy is None
    # under LoRA the reference is the model itself with its adapters off: no copy
    assert (leashed.reference_policy.frozen_copy is None) == use_peft
    # the reference is the policy at the first step: k3 is exactly 0 and the loss is that of beta=0, bit for bit
    assert torch.equal(loss_without, loss_leashed)
    logs = [entry for entry in leashed.state.log_history if "kl" in entry]
    assert logs and logs[0]["kl"] == 0.0
    assert not any("kl" in entry for entry in without.state.log_history)


def test_kl_grows_as_the_policy_leaves_its_frozen_reference(tiny_shapes, train_captions, tmp_path):
    beta = 0.5
    trainer = scst_trainer("git", train_captions, tiny_shapes, tmp_path, beta=beta, max_steps=3, learning_rate=0.1)
    recorded = []
    reference_token_log_probs = trainer.reference_token_log_probs

    def reference_log_probs(*args, **kwargs):
        recorded.append(reference_token_log_probs(*args, **kwargs))
        return recorded[-1]

    trainer.reference_token_log_probs = reference_log_probs
    trainer.train()
    kls = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    assert kls[0] == 0.0 and kls[-1] > 0.0
    assert all(not log_probs.requires_grad for log_probs in recorded)  # the reference gets no gradient
    # the reference did not move: a frozen copy of the starting weights
    start, _ = make_foreign_captioner("git", train_captions, IMAGE_SIZE)
    for (name, copied), (_, original) in zip(
        trainer.reference_policy.frozen_copy.named_parameters(), start.named_parameters(), strict=True
    ):
        assert torch.equal(copied, original), name
        assert not copied.requires_grad


@pytest.mark.parametrize("objective", ["xe", "spider_pg", "actor_critic", "psst"])
def test_objectives_without_the_penalty_refuse_beta(objective, tmp_path):
    with pytest.raises(ValueError, match=rf"beta=0.1 asks for a KL penalty, which objective='{objective}'"):
        RLCaptionConfig(output_dir=str(tmp_path), objective=objective, beta=0.1)


def test_negative_beta_is_refused(tmp_path):
    with pytest.raises(ValueError, match="beta must be >= 0"):
        RLCaptionConfig(output_dir=str(tmp_path), objective="scst", beta=-1.0)
