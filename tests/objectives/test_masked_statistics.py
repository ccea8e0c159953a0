"""The masked mean and variance that objectives log without waiting for the device."""

import math

import pytest
import torch

from rlcaption.objectives.base import masked_mean_and_variance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_masked_statistics_equal_those_of_the_selected_values(dtype):
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(6, 9, generator=generator, dtype=dtype) * 3 + 1
    mask = torch.rand(6, 9, generator=generator) < 0.6
    mean, variance = masked_mean_and_variance(values, mask)
    torch.testing.assert_close(mean, values[mask].mean())
    torch.testing.assert_close(variance, values[mask].var())  # unbiased, as torch's default
    # a float mask (a caption token mask) gives the same
    torch.testing.assert_close(masked_mean_and_variance(values, mask.float())[1], variance)


def test_a_masked_variance_by_hand_and_the_undefined_cases():
    values = torch.tensor([[1.0, 5.0, 100.0], [3.0, -7.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    mean, variance = masked_mean_and_variance(values, mask)
    assert mean.item() == pytest.approx(3.0)  # (1 + 5 + 3) / 3
    assert variance.item() == pytest.approx(((1 - 3) ** 2 + (5 - 3) ** 2 + 0) / 2)
    one_value = masked_mean_and_variance(values, torch.tensor([[0, 0, 1], [0, 0, 0]]))
    assert one_value[0].item() == 100.0 and math.isnan(one_value[1].item())
    assert all(math.isnan(statistic.item()) for statistic in masked_mean_and_variance(values, torch.zeros(2, 3)))


def test_values_left_out_by_the_mask_may_be_anything_and_low_precision_values_are_summed_in_float32():
    values = torch.tensor([[1.0, float("inf")], [3.0, float("nan")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    mean, variance = masked_mean_and_variance(values, mask)
    assert mean.item() == 2.0 and variance.item() == 2.0
    generator = torch.Generator().manual_seed(1)
    many = torch.randn(3000, generator=generator)
    mean, variance = masked_mean_and_variance(many.bfloat16(), torch.ones(3000))
    assert mean.dtype == torch.float32
    reference = many.bfloat16().float()
    torch.testing.assert_close(variance, reference.var(), rtol=1e-5, atol=0)  # a bfloat16 count stops at 256
