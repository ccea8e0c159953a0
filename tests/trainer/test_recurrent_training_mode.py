"""
The rule that keeps RL training working on GPUs: a recurrent module never builds an autograd graph in evaluation mode.

cuDNN computes an RNN's backward only after a training-mode forward ("cudnn RNN backward can only be called in
training mode"), so a loss that reaches an `nn.LSTM`/`nn.GRU` run in evaluation mode fails on CUDA in its first step,
and nowhere on the CPU. CI has no GPU: these tests watch every recurrent forward during one step of every objective
and phase, with each of our models, and fail where one would build a graph in evaluation mode.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from objective_steps import CASES, case_id, make_step_trainer
from torch import nn

from rlcaption.generation.decoding import RECURRENT_MODULES, evaluation_mode


@contextlib.contextmanager
def recurrent_forwards():
    """Records `(module type, training, builds a graph)` for every recurrent forward run inside the block."""
    seen: list[tuple[str, bool, bool]] = []

    def record(module, inputs, output):
        if isinstance(module, RECURRENT_MODULES):
            first = output[0] if isinstance(output, tuple) else output
            first = first.data if isinstance(first, nn.utils.rnn.PackedSequence) else first
            seen.append((type(module).__name__, module.training, torch.is_grad_enabled() and first.requires_grad))

    handle = nn.modules.module.register_module_forward_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


def graphs_built_in_evaluation_mode(seen):
    return [name for name, training, builds_graph in seen if builds_graph and not training]


def test_the_watch_sees_a_recurrent_graph_built_in_evaluation_mode():
    lstm = nn.LSTM(4, 4, batch_first=True).eval()
    with recurrent_forwards() as seen:
        lstm(torch.randn(2, 3, 4))
        with torch.no_grad():
            lstm(torch.randn(2, 3, 4))  # no graph: allowed
        lstm.train()(torch.randn(2, 3, 4))  # training mode: allowed
    assert graphs_built_in_evaluation_mode(seen) == ["LSTM"]
    assert len(seen) == 3


def test_evaluation_mode_turns_dropout_off_and_keeps_recurrent_modules_training():
    model = nn.Sequential(nn.LSTM(4, 4, num_layers=2, dropout=0.5), nn.Dropout(0.5)).train()
    with evaluation_mode(model):
        assert not model.training and not model[1].training
        assert model[0].training and model[0].dropout == 0.0  # no dropout between the layers either
        inputs = torch.randn(3, 2, 4)
        torch.testing.assert_close(model[0](inputs)[0], model[0].eval()(inputs)[0].detach(), rtol=0, atol=1e-6)
        model[0].train()
    assert model.training and model[0].training and model[1].training and model[0].dropout == 0.5


@pytest.mark.parametrize(
    ("objective", "fields", "kind"),
    [pytest.param(*case, kind, id=case_id(*case, kind)) for *case, kinds in CASES for kind in kinds],
)
def test_no_recurrent_module_builds_a_graph_in_evaluation_mode(
    objective, fields, kind, tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    trainer = make_step_trainer(
        objective, fields, kind, tiny_processor, tiny_shapes, tmp_path, reward_clip, embedding_model
    )
    with recurrent_forwards() as seen:
        trainer.train()
    assert graphs_built_in_evaluation_mode(seen) == []
    # the watch saw the step: a recurrent forward that builds the graph the loss goes back through
    assert any(builds_graph for _, _, builds_graph in seen)
    assert trainer.state.global_step == trainer.args.max_steps
