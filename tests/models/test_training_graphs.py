"""Scoring passes replayed with their backward pass as CUDA graphs (rlcaption.models.training_graphs). The graphs
themselves run on a GPU only (tests/trainer/test_cuda.py compares them with eager steps there). Here a stand-in
replays a call by running it again into the same output and gradient buffers, as a graph writes into the memory of
its capture, so that what the library does around the graphs is tested: autograd's accumulation of the replayed
gradients, `.grad` kept apart from the graph's buffers, the refusal of a stale backward pass, and which calls
are never captured."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

from rlcaption.decoding import sample_token_log_probs, sample_token_log_probs_and_entropies
from rlcaption.models import step_decoding, training_graphs
from rlcaption.models.training_graphs import CapturedTraining
from tiny_captioners import regions_show_tell

IMAGES, SAMPLES, LENGTH = 4, 3, 9


class ReplayedEagerly(CapturedTraining):
    """A [`CapturedTraining`] whose "graphs" run the call again on the CPU, writing into the buffers of the capture."""

    captures = 0

    def _capture(self, function):
        type(self).captures += 1
        outputs = function(**self.inputs)
        first_gradients = self._gradients(outputs, [torch.ones_like(output) for output in outputs])
        self.outputs = tuple(output.detach().clone() for output in outputs)
        self.output_gradients = tuple(torch.zeros_like(output) for output in outputs)
        self.gradients = tuple(
            None if gradient is None else torch.zeros_like(gradient) for gradient in first_gradients
        )
        live = {}

        def forward():
            with torch.enable_grad():  # an autograd Function's forward runs without; a graph needs none
                live["outputs"] = function(**self.inputs)
            for buffer, output in zip(self.outputs, live["outputs"], strict=True):
                buffer.copy_(output.detach())

        def backward():
            gradients = self._gradients(live.pop("outputs"), self.output_gradients)
            for buffer, gradient in zip(self.gradients, gradients, strict=True):
                if buffer is not None:
                    buffer.copy_(gradient)

        self.forward_graph, self.backward_graph = SimpleNamespace(replay=forward), SimpleNamespace(replay=backward)


@pytest.fixture
def graphs_on_the_cpu(monkeypatch):
    """Training graphs on, keyed on the CPU as on a GPU, replayed by the stand-in."""
    monkeypatch.setitem(training_graphs._TRAINING_GRAPHS, "enabled", True)
    monkeypatch.setattr(
        training_graphs, "graph_key", lambda model, inputs, settings: (settings, *(t.shape for t in inputs.values()))
    )
    monkeypatch.setattr(training_graphs, "CapturedTraining", ReplayedEagerly)
    monkeypatch.setattr(ReplayedEagerly, "captures", 0)


def samples(seed: int) -> tuple[dict[str, torch.Tensor], torch.LongTensor, torch.LongTensor]:
    """Image inputs of IMAGES region grids, SAMPLES captions of each (one shape for every seed), their image rows."""
    generator = torch.Generator().manual_seed(seed)
    image_inputs = {
        "image_features": torch.randn(IMAGES, 4, 6, generator=generator),
        "image_feature_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]]),
    }
    sequences = torch.randint(3, 30, (IMAGES * SAMPLES, LENGTH), generator=generator)
    sequences[:, 0] = 1
    return image_inputs, sequences, torch.arange(IMAGES).repeat_interleave(SAMPLES)


def scored_loss(model, seed: int, entropies: bool) -> tuple[torch.Tensor, ...]:
    """A loss on the samples of `seed` scored as an RL step scores them; its backward pass is run."""
    image_inputs, sequences, image_index = samples(seed)
    weights = torch.linspace(-1, 1, sequences.shape[0])[:, None]
    if entropies:
        scores = sample_token_log_probs_and_entropies(model, image_inputs, sequences, image_index)
    else:
        scores = (sample_token_log_probs(model, image_inputs, sequences, image_index),)
    sum(((score * weights) * (index + 1)).sum() for index, score in enumerate(scores)).backward()
    return tuple(score.detach() for score in scores)


@pytest.mark.parametrize("entropies", [False, True], ids=["log_probs", "with_entropies"])
@pytest.mark.parametrize("attention", [False, True], ids=["show_tell", "attention"])
def test_replayed_scoring_passes_give_the_eager_scores_and_accumulate_the_eager_gradients(
    graphs_on_the_cpu, attention, entropies
):
    graphed = regions_show_tell(image_attention=attention)
    eager = copy.deepcopy(graphed)
    # gradients accumulate over the steps (no zero_grad), as over a gradient accumulation's micro-batches
    for seed in range(4):
        graphed_scores = scored_loss(graphed, seed, entropies)
        with training_graphs.use_training_graphs(False):
            eager_scores = scored_loss(eager, seed, entropies)
        for graphed_score, eager_score in zip(graphed_scores, eager_scores, strict=True):
            torch.testing.assert_close(graphed_score, eager_score)
        for (name, parameter), reference in zip(graphed.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(parameter.grad, reference.grad, msg=f"{name}, step {seed}")
    # captured at the shape's second call, replayed at the third and fourth
    assert ReplayedEagerly.captures == 1


def test_the_gradients_autograd_keeps_are_not_the_graphs_buffers(graphs_on_the_cpu):
    model = regions_show_tell(image_attention=True)
    for seed in range(2):  # the second call captures and replays
        model.zero_grad(set_to_none=True)
        scored_loss(model, seed, entropies=False)
    (captured,) = step_decoding._CAPTURED_CALLS[model].values()
    kept = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    # a replay for the next batch rewrites the graph's buffers; the gradients autograd kept must not change with them
    captured.replay_backward(*captured.replay_forward()[:1], [torch.ones_like(o) for o in captured.outputs])
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter.grad, kept[name]), name
        assert all(buffer is None or buffer.data_ptr() != parameter.grad.data_ptr() for buffer in captured.gradients)


def graphed_scores(model) -> torch.Tensor:
    """Log-probabilities of the samples of seed 0, replayed (the shape's graph is captured first)."""
    image_inputs, sequences, image_index = samples(0)
    for _ in range(2):
        sample_token_log_probs(model, image_inputs, sequences, image_index).sum().backward()
    return sample_token_log_probs(model, image_inputs, sequences, image_index)


def test_a_backward_pass_after_the_next_replay_raises_instead_of_reading_its_activations(graphs_on_the_cpu):
    model = regions_show_tell(image_attention=True)
    first = graphed_scores(model)
    second = sample_token_log_probs(model, *samples(0))
    with pytest.raises(RuntimeError, match="ran after a later replay of the call, or a second time"):
        first.sum().backward()
    second.sum().backward()  # the latest replay's backward pass still runs


def test_a_second_backward_pass_of_a_replay_raises(graphs_on_the_cpu):
    scores = graphed_scores(regions_show_tell(image_attention=True))
    scores.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="or a second time"):
        scores.sum().backward()


def test_a_backward_pass_after_the_parameters_changed_in_place_raises(graphs_on_the_cpu):
    model = regions_show_tell(image_attention=True)
    scores = graphed_scores(model)
    with torch.no_grad():
        # a bias, which an eager pass does not save either: the stand-in's own autograd graph would not notice
        model.lm_head.bias.add_(0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        scores.sum().backward()


def test_gradients_asked_of_autograd_directly_are_not_overwritten_by_the_next_replay(graphs_on_the_cpu):
    model = regions_show_tell(image_attention=True)
    parameters = list(model.parameters())
    gradients = torch.autograd.grad(graphed_scores(model).sum(), parameters)
    kept = [gradient.clone() for gradient in gradients]
    image_inputs, sequences, image_index = samples(1)  # the same shape: a replay
    torch.autograd.grad((sample_token_log_probs(model, image_inputs, sequences, image_index) * 3).sum(), parameters)
    assert all(torch.equal(gradient, before) for gradient, before in zip(gradients, kept, strict=True))


class Wrapper(torch.nn.Module):
    """A wrapper around the model, as DDP or DeepSpeed put one."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


CASES = [
    "graphs off", "no gradients", "frozen", "inputs with gradients", "wrapper", "patched forward", "forward hook",
    "compiled", "checkpointing",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_calls_a_graph_must_not_hold_run_eagerly(graphs_on_the_cpu, case):
    model = regions_show_tell(image_attention=True)
    image_inputs, sequences, _ = samples(0)
    features = image_inputs["image_features"].requires_grad_(case == "inputs with gradients")
    if case == "graphs off":
        training_graphs.use_training_graphs(False)
    if case == "frozen":
        model.requires_grad_(False)
    if case == "patched forward":  # accelerate's mixed precision patches the instance's forward with autocast
        model.forward = model.forward
    if case == "forward hook":
        model.lm_head.register_forward_hook(lambda module, inputs, output: output)
    if case == "compiled":
        model._compiled_call_impl = model.forward  # as `model.compile()` sets it
    if case == "checkpointing":
        model.lm_head.gradient_checkpointing = True  # how transformers marks the modules it checkpoints
    caller = Wrapper(model) if case == "wrapper" else model
    function = lambda **inputs: (caller(**inputs).logits,)  # noqa: E731
    inputs = {"image_features": features, "input_ids": sequences[:IMAGES]}
    with torch.no_grad() if case == "no gradients" else contextlib.nullcontext():
        results = [training_graphs.graphed_training_call(caller, function, inputs, ()) for _ in range(3)]
    assert results == [None, None, None]
    assert ReplayedEagerly.captures == 0


def test_a_plain_model_is_captured(graphs_on_the_cpu):
    """The counterpart of the refusals: the same call of the plain model is captured at its second call."""
    model = regions_show_tell(image_attention=True)
    image_inputs, sequences, _ = samples(0)
    function = lambda **inputs: (model(**inputs).logits,)  # noqa: E731
    inputs = {"image_features": image_inputs["image_features"], "input_ids": sequences[:IMAGES]}
    results = [training_graphs.graphed_training_call(model, function, inputs, ()) for _ in range(3)]
    assert results[0] is None and all(result is not None for result in results[1:])
    assert ReplayedEagerly.captures == 1
