import math

import pytest
import torch
from torch import nn

from rlcaption.generation import decoding
from rlcaption.generation.decoding import (
    caption_logits,
    caption_token_mask,
    sample_token_log_probs,
    sample_token_log_probs_and_entropies,
    selective_log_softmax,
)
from rlcaption.objectives import policy_gradient_loss
from rlcaption.objectives.scst import mean_token_entropy
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

BOS, EOS, PAD = 1, 2, 0
IMAGE_SIZE = 48


def test_caption_token_mask_stops_after_first_end_token():
    sequences = torch.tensor(
        [
            [BOS, 5, 6, EOS, PAD, PAD],
            [BOS, 5, EOS, EOS, EOS, EOS],  # padding that shares the end token's id
            [BOS, 7, 8, 9, 10, 11],  # cut at the maximum length, no end token
        ]
    )
    mask = caption_token_mask(sequences, eos_token_id=EOS)
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.float32,
    )
    assert torch.equal(mask, expected)


def test_policy_gradient_loss_normalizations_match_hand_computation():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([2.0, -1.0])
    # per caption: -(A * sum log p) = -(2 * -6) = 12 and -(-1 * -1) = -1
    assert policy_gradient_loss(log_probs, mask, advantages, "sequence").item() == pytest.approx((12 - 1) / 2)
    assert policy_gradient_loss(log_probs, mask, advantages, "token").item() == pytest.approx((12 - 1) / 5)


def test_policy_gradient_raises_probability_of_positive_advantage_caption():
    logits = torch.zeros(2, 4, requires_grad=True)  # two one-token captions over a 4-word vocabulary
    chosen = torch.tensor([1, 3])
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])  # (2, 1)
    loss = policy_gradient_loss(log_probs, torch.ones(2, 1), torch.tensor([1.0, -1.0]), "sequence")
    loss.backward()
    # gradient descent raises the logit of the rewarded word and lowers the punished one
    assert logits.grad[0, 1] < 0
    assert logits.grad[1, 3] > 0


def test_advantage_carries_no_gradient():
    log_probs = torch.tensor([[-1.0]], requires_grad=True)
    advantages = torch.tensor([3.0], requires_grad=True)
    policy_gradient_loss(log_probs, torch.ones(1, 1), advantages, "token").backward()
    assert advantages.grad is None
    assert log_probs.grad.item() == pytest.approx(-3.0)


def test_minus_infinite_log_probabilities_of_padding_are_ignored():
    log_probs = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    loss = policy_gradient_loss(log_probs, torch.tensor([[1.0, 0.0]]), torch.tensor([2.0]), "token")
    loss.backward()
    assert loss.item() == pytest.approx(2.0)
    assert torch.isfinite(log_probs.grad).all()


# ---------------------------------------------------------------- maximum-entropy bonus (Chen & Jin's SLL-ME)


# A word is ruled out with logit -inf, or the lowest finite one (scores are float32), as ShowTellRL rules out <pad> and
# <bos>. A weight of 10 makes the gradient reaching the entropy terms larger than 1, where the backward pass of
# 0 * (lowest float) overflows to NaN.
@pytest.mark.parametrize("weight", [0.1, 10.0])
@pytest.mark.parametrize("ruled_out", [-math.inf, torch.finfo(torch.float32).min], ids=["-inf", "lowest_finite"])
def test_entropy_bonus_gradient_equals_the_hand_computed_gradient(monkeypatch, ruled_out, weight):
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.5, 0.0], [1.0, 1.0, -2.0, 3.0]],
            [[0.3, -0.7, 1.1, 0.2], [ruled_out, 1.0, 0.0, 2.0], [5.0, 0.0, 0.0, 0.0]],
        ],
        dtype=torch.float64,
        requires_grad=True,
    )  # (N=2, T-1=3, V=4)
    sequences = torch.tensor([[BOS, 3, 1, EOS], [BOS, 0, EOS, PAD]])
    # the logits of one forward pass, without a model
    monkeypatch.setattr(decoding, "caption_logits", lambda *args, **kwargs: logits)
    log_probs, entropies = sample_token_log_probs_and_entropies(nn.Identity(), {}, sequences)
    assert torch.equal(log_probs, selective_log_softmax(logits, sequences[:, 1:]))
    assert entropies[0, 0].item() == pytest.approx(math.log(4))  # uniform over 4 words

    mask = caption_token_mask(sequences, EOS)  # 3 + 2 tokens; the last position of row 1 is padding
    (-weight * mean_token_entropy(entropies, mask)).backward()

    # by hand: H = -Σ_i p_i log p_i, dH/dz_i = -p_i (log p_i + H) (0 for a word with p_i = 0); the loss term is
    # -w Σ_t mask_t H_t / Σ_t mask_t
    with torch.no_grad():
        p = torch.softmax(logits, dim=-1)
        log_p = torch.where(p > 0, torch.log(p), torch.zeros_like(p))
        entropy = -(p * log_p).sum(dim=-1, keepdim=True)
        expected = weight * mask[..., None] * p * (log_p + entropy) / mask.sum()
    assert torch.isfinite(logits.grad).all()
    assert torch.allclose(logits.grad, expected, atol=1e-12)
    assert torch.count_nonzero(logits.grad[0, 0]) == 0  # the uniform distribution is a maximum of the entropy
    assert torch.count_nonzero(logits.grad[1, 2]) == 0  # padding


def test_log_probs_and_entropies_are_scored_in_evaluation_mode_like_sample_token_log_probs(processor, shapes):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0, dropout=0.5).train()
    pixel_values = processor(images=shapes["train"]["image"][:2], return_tensors="pt")["pixel_values"]
    sequences = torch.tensor([[BOS, 5, 6, EOS], [BOS, 7, EOS, PAD]])
    log_probs, entropies = sample_token_log_probs_and_entropies(model, {"pixel_values": pixel_values}, sequences)
    assert model.training  # the mode is restored
    # no dropout mask: the same values as the log-probabilities RL objectives score, and as a second call
    assert torch.equal(log_probs, sample_token_log_probs(model, {"pixel_values": pixel_values}, sequences))
    assert torch.equal(
        entropies, sample_token_log_probs_and_entropies(model, {"pixel_values": pixel_values}, sequences)[1]
    )
    assert entropies.shape == (2, 3) and (entropies > 0).all()


def scst_loss_and_gradients(model, processor, shapes, output_dir, **overrides):
    """The SCST loss (or that of the objective in `overrides`) of the first batch, its gradients, the trainer and
    the batch, with seeded sampling."""
    settings = {"objective": "scst", "num_samples_per_image": 2, **overrides}
    args = RLCaptionConfig(
        output_dir=str(output_dir), use_cpu=True, per_device_train_batch_size=4, max_caption_length=10,
        reward_funcs=["cider"], seed=0, disable_tqdm=True, **settings,
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    model.zero_grad()
    torch.manual_seed(0)
    loss = trainer.objective.compute_loss(model, batch)
    loss.backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    return loss.detach(), gradients, trainer, batch


def test_entropy_bonus_adds_minus_weight_times_the_policy_entropy_and_weight_zero_changes_nothing(
    processor, shapes, tmp_path
):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    with torch.no_grad():  # far from uniform distributions, whose entropy has a sizeable gradient
        model.lm_head.weight.mul_(30.0)
        model.lm_head.bias.copy_(torch.linspace(-3.0, 3.0, model.lm_head.bias.numel()))
    weight = 0.5
    loss_0, gradients_0, trainer_0, batch = scst_loss_and_gradients(
        model, processor, shapes, tmp_path / "w0", entropy_bonus_weight=0.0
    )
    loss_w, gradients_w, trainer_w, _ = scst_loss_and_gradients(
        model, processor, shapes, tmp_path / "w", entropy_bonus_weight=weight
    )

    # the same samples, scored on their own: the plain SCST loss and the policy's entropy at their prefixes
    image_inputs = {"pixel_values": batch["pixel_values"]}
    torch.manual_seed(0)
    samples = trainer_0.sample_captions(image_inputs, num_return_sequences=2)
    image_index = torch.arange(4).repeat_interleave(2)
    rewards = trainer_0.compute_rewards(samples.texts, batch, row_index=image_index.tolist())
    # the baseline decoded on its own, not with the samples as the objective decodes it: the same captions
    greedy = trainer_0.greedy_captions(image_inputs)
    greedy_rewards = trainer_0.compute_rewards(greedy.texts, batch, row_index=list(range(4)), log_prefix="greedy")
    advantages = torch.as_tensor(rewards - greedy_rewards.repeat(2), dtype=torch.float32)
    mask = caption_token_mask(samples.sequences, trainer_0.eos_token_id)
    log_probs = sample_token_log_probs(model, image_inputs, samples.sequences, image_index=image_index)
    plain_loss = policy_gradient_loss(log_probs, mask, advantages, "token")
    model.eval()
    log_p = torch.log_softmax(caption_logits(model, image_inputs, samples.sequences, image_index=image_index), -1)
    entropy = (-(log_p.exp() * log_p).sum(-1) * mask).sum() / mask.sum()
    entropy_gradients = torch.autograd.grad(entropy, list(model.parameters()))

    # weight 0: exactly SCST, no entropy logged
    assert loss_0.item() == pytest.approx(plain_loss.item(), rel=1e-6)
    assert "entropy" not in trainer_0._recorded_metrics
    # weight w: the loss and its gradient change by -w H and -w grad H, nothing else
    assert (loss_w - loss_0).item() == pytest.approx(-weight * entropy.item(), rel=1e-5)
    assert trainer_w._recorded_metrics["entropy"] == [pytest.approx(entropy.item(), rel=1e-5)]
    for (name, _), entropy_gradient in zip(model.named_parameters(), entropy_gradients, strict=True):
        difference = gradients_w[name] - gradients_0[name]
        assert torch.allclose(difference, -weight * entropy_gradient, rtol=1e-4, atol=1e-6), name
    assert max(gradient.abs().max() for gradient in entropy_gradients) > 1e-2


def samples_padded_to_the_token_budget(trainer_class, monkeypatch):
    """Makes the trainer's sampling return its sequences `max_caption_length + 1` wide where asked not to trim, as a
    CUDA graph's decoding returns them, and records the widths."""
    widths = []

    def padded(captions, trainer):
        budget = trainer.args.max_caption_length + 1
        pad = trainer.processing_class.tokenizer.pad_token_id
        sequences = nn.functional.pad(captions.sequences, (0, budget - captions.sequences.shape[1]), value=pad)
        widths.append((captions.sequences.shape[1], sequences.shape[1]))
        return decoding.GeneratedCaptions(sequences, trainer.processing_class)

    sample, sample_and_greedy = trainer_class.sample_captions, trainer_class.sample_and_greedy_captions

    def sample_captions(self, image_inputs, num_return_sequences, trim=True):
        samples = sample(self, image_inputs, num_return_sequences)
        return samples if trim else padded(samples, self)

    def sample_and_greedy_captions(self, image_inputs, num_return_sequences, trim=True):
        samples, greedy = sample_and_greedy(self, image_inputs, num_return_sequences)
        return (samples, greedy) if trim else (padded(samples, self), padded(greedy, self))

    monkeypatch.setattr(trainer_class, "sample_captions", sample_captions)
    monkeypatch.setattr(trainer_class, "sample_and_greedy_captions", sample_and_greedy_captions)
    return widths


@pytest.mark.parametrize(
    "overrides",
    [{"baseline": "greedy", "entropy_bonus_weight": 0.1}, {"baseline": "mean_of_others"}],
    ids=["greedy-baseline-entropy-bonus", "mean-of-others"],
)
def test_scst_gives_the_same_loss_and_gradients_for_samples_padded_to_the_token_budget(
    processor, shapes, tmp_path, monkeypatch, overrides
):
    # a GPU's decoding graph returns the samples max_caption_length + 1 wide, without waiting to trim them
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    with torch.no_grad():  # captions that end early, so that the padding is real
        model.lm_head.bias[processor.tokenizer.eos_token_id] += 3.0
    loss, gradients, trainer, _ = scst_loss_and_gradients(model, processor, shapes, tmp_path / "trimmed", **overrides)
    widths = samples_padded_to_the_token_budget(RLCaptionTrainer, monkeypatch)
    padded_loss, padded_gradients, padded_trainer, _ = scst_loss_and_gradients(
        model, processor, shapes, tmp_path / "padded", **overrides
    )
    assert widths and all(trimmed < padded == 11 for trimmed, padded in widths)
    assert padded_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    for name, gradient in gradients.items():
        assert torch.allclose(padded_gradients[name], gradient, rtol=1e-5, atol=1e-7), name
    for name in ("reward", "greedy", "sample_length", "entropy", "advantage_std"):
        assert [float(value) for value in padded_trainer._recorded_metrics.get(name, [])] == pytest.approx(
            [float(value) for value in trainer._recorded_metrics.get(name, [])], rel=1e-6
        ), name


@pytest.mark.parametrize("objective", ["scst", "sle"])
def test_samples_are_scored_before_their_texts_are_read(processor, shapes, tmp_path, monkeypatch, objective):
    # on a GPU the host then queues the scoring pass while the device still samples, instead of waiting for the
    # samples to decode their texts first
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    events = []
    model.register_forward_pre_hook(lambda *_: events.append("score") if torch.is_grad_enabled() else None)
    batch_decode = processor.batch_decode
    monkeypatch.setattr(processor, "batch_decode", lambda *a, **k: events.append("texts") or batch_decode(*a, **k))
    overrides = {"objective": objective, "num_samples_per_image": 3} if objective == "sle" else {}
    loss, *_ = scst_loss_and_gradients(model, processor, shapes, tmp_path, **overrides)
    assert torch.isfinite(loss)
    assert events.count("score") == 1 and "texts" in events
    assert events.index("score") < events.index("texts"), events
