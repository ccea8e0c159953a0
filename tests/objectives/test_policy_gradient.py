import pytest
import torch

from rlcaption.decoding import caption_token_mask
from rlcaption.objectives import policy_gradient_loss

BOS, EOS, PAD = 1, 2, 0


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
