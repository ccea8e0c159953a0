"""MixedPrecisionLSTM: bf16 autocast works on every CPU, AVX2-only ones included (whose oneDNN has no bf16 LSTM)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlcaption.models.show_tell_rl import encoders
from rlcaption.models.show_tell_rl.encoders import MixedPrecisionLSTM


def make_lstm_and_inputs():
    torch.manual_seed(0)
    lstm = MixedPrecisionLSTM(6, 5, batch_first=True)
    inputs = torch.randn(3, 4, 6)
    state = (torch.randn(1, 3, 5).bfloat16(), torch.randn(1, 3, 5).bfloat16())  # as a bf16 first step leaves it
    return lstm, inputs, state


def test_without_a_bf16_lstm_the_recurrence_runs_in_float32(monkeypatch):
    lstm, inputs, state = make_lstm_and_inputs()
    monkeypatch.setattr(encoders, "cpu_runs_lstm_in", lambda dtype: False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs, (hidden, cell) = lstm(inputs, state)
    assert outputs.dtype == hidden.dtype == cell.dtype == torch.float32
    expected, _ = torch.nn.LSTM.forward(lstm, inputs, tuple(tensor.float() for tensor in state))
    torch.testing.assert_close(outputs, expected, rtol=0, atol=0)


def test_with_a_bf16_lstm_autocast_is_left_alone(monkeypatch):
    lstm, inputs, state = make_lstm_and_inputs()
    monkeypatch.setattr(encoders, "cpu_runs_lstm_in", lambda dtype: True)
    calls = []
    monkeypatch.setattr(torch.nn.LSTM, "forward", lambda self, *args: calls.append(torch.is_autocast_enabled("cpu")))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lstm(inputs, state)
    assert calls == [True]


def test_a_bf16_training_step_runs_where_onednn_is_limited_to_avx2(tmp_path):
    # ONEDNN_MAX_CPU_ISA=AVX2 makes any x86 CPU look like an AVX2-only one to oneDNN, which then refuses a bf16 LSTM
    script = textwrap.dedent(
        """
        import torch
        from rlcaption.models import ShowTellRL, ShowTellRLConfig

        torch.manual_seed(0)
        model = ShowTellRL(ShowTellRLConfig(vocab_size=12, hidden_size=8, word_embedding_size=8, image_size=16,
                                            cnn_channels=[4, 4], image_attention=True))
        ids = torch.randint(3, 12, (2, 5))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, pixel_values=torch.randn(2, 3, 16, 16), labels=ids).loss
        loss.backward()
        assert torch.isfinite(loss) and model.lstm.weight_ih_l0.grad is not None
        # the value network's LSTM option (Ren et al. 2017) too
        from rlcaption.models import PolicyValueCaptioner

        policy_value = PolicyValueCaptioner.from_policy(
            model, value_word_embedding_size=4, value_hidden_size=4, value_mlp_hidden_size=4, value_rnn_type="lstm"
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            values = policy_value.value(pixel_values=torch.randn(2, 3, 16, 16), input_ids=ids)
        values.float().sum().backward()
        assert torch.isfinite(values.float()).all()
        print("ok")
        """
    )
    if os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip("ONEDNN_MAX_CPU_ISA names x86 instruction sets")
    result = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("num_layers", [1, 2])
def test_one_step_of_the_fused_cell_is_the_lstm_over_a_sequence_of_one(num_layers):
    torch.manual_seed(0)
    lstm = MixedPrecisionLSTM(6, 5, num_layers=num_layers, dropout=0.5 if num_layers > 1 else 0.0, batch_first=True)
    inputs = torch.randn(3, 6, requires_grad=True)
    state = (torch.randn(num_layers, 3, 5), torch.randn(num_layers, 3, 5))
    lstm.eval()
    outputs, (hidden, cell) = lstm(inputs[:, None], state)
    top, (step_hidden, step_cell) = lstm.step(inputs, state)
    torch.testing.assert_close(top, outputs[:, 0])
    torch.testing.assert_close(step_hidden, hidden)
    torch.testing.assert_close(step_cell, cell)
    gradients = [torch.autograd.grad(output.sum(), [inputs, lstm.weight_hh_l0]) for output in (outputs, top)]
    for sequence_gradient, step_gradient in zip(*gradients, strict=True):
        torch.testing.assert_close(step_gradient, sequence_gradient)
    if num_layers > 1:  # training mode: dropout between the layers, as nn.LSTM applies it
        lstm.train()
        assert not torch.allclose(lstm.step(inputs, state)[0], top)
