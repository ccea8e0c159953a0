"""
A differentiable call, its forward and its backward pass, captured as two CUDA graphs and replayed with autograd:
what an RL step's teacher-forced scoring pass needs to stop costing the host a launch per kernel.

An RL step scores its samples in one teacher-forced pass over `max_caption_length` positions (the samples are padded
to the token budget, so the pass has one shape per batch size), then differentiates it. For a small captioner on a
GPU both passes are host-bound: an attending LSTM launches a few thousand kernels for them, each costing the host
more than the device. Replayed as graphs, each pass is one launch.

This follows `torch.cuda.make_graphed_callables`, with three differences that an RL step needs:
- the parameters' gradients reach autograd as the graph's own buffers, which the graph keeps referencing, so that
  autograd copies them into `.grad` (`make_graphed_callables` hands over detached views, which autograd may adopt
  as `.grad`: the next replay then overwrites `.grad`, and under gradient accumulation doubles it);
- a graph is captured at a shape's second call and kept among a few per model, as the decoding graphs are
  ([`rlcaption.models.step_decoding.graphed_call`]), and calls a graph cannot hold run eagerly;
- a backward pass that would read activations of a later replay raises instead of computing wrong gradients.

Off by default until measured on more GPUs: [`use_training_graphs`] turns it on.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping

import torch
from torch import nn

from .step_decoding import _captured, graph_key

__all__ = ["CapturedTraining", "graphed_training_call", "training_graphs_on", "use_training_graphs"]

_TRAINING_GRAPHS = {"enabled": False}


def use_training_graphs(enabled: bool) -> None:
    """Whether [`graphed_training_call`] replays differentiable calls (the RL objectives' scoring of their samples)
    as CUDA graphs on CUDA devices. Off by default."""
    _TRAINING_GRAPHS["enabled"] = enabled


def training_graphs_on() -> bool:
    """Whether [`use_training_graphs`] is on."""
    return _TRAINING_GRAPHS["enabled"]


class CapturedTraining:
    """
    `function(**inputs)`, returning a tuple of tensors, captured for the shapes of `inputs` as a forward graph, and the
    gradients of its outputs with respect to `model`'s trainable parameters as a backward graph. Calls replay both
    through autograd: the outputs require grad, and their backward pass returns the parameters' gradients, which
    autograd accumulates into `.grad` as for an eager pass.

    As for [`rlcaption.models.step_decoding.CapturedCall`], `function` must not read the device's values on the host.
    The inputs never get gradients. Each call's backward pass must come before the next call: the graphs keep one set
    of activations.
    """

    def __init__(self, model: nn.Module, function: Callable[..., tuple[torch.Tensor, ...]], inputs: Mapping):
        self.inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        self.parameters = tuple(parameter for parameter in model.parameters() if parameter.requires_grad)
        self.device = next(iter(self.inputs.values())).device
        self.replays = itertools.count()
        self.last_replay = -1
        with self._on_device():
            self._capture(function)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """The inputs' device made current: the graphs are captured and replayed on its current stream."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _capture(self, function: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        device = self.device
        generator_state = torch.cuda.get_rng_state(device)
        side_stream = torch.cuda.Stream(device)
        side_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side_stream):
            # warm-up, as capture requires (cuDNN's and cuBLAS's lazy set-up, a first run's allocations); autograd.grad
            # leaves `.grad` alone
            for _ in range(2):
                outputs = function(**self.inputs)
                self._gradients(outputs, [torch.ones_like(output) for output in outputs])
        torch.cuda.current_stream(device).wait_stream(side_stream)
        torch.cuda.set_rng_state(generator_state, device)
        self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        # thread-local: a data loader's pin-memory thread allocating during the capture must not break it
        with torch.cuda.graph(self.forward_graph, capture_error_mode="thread_local"):
            outputs = function(**self.inputs)
        if not all(isinstance(output, torch.Tensor) and output.requires_grad for output in outputs):
            raise RuntimeError("a captured training call must return tensors that depend on trainable parameters")
        self.outputs = tuple(output.detach() for output in outputs)
        self.output_gradients = tuple(torch.zeros_like(output) for output in outputs)
        # the same memory pool: the backward graph reads the forward graph's saved activations
        with torch.cuda.graph(self.backward_graph, pool=self.forward_graph.pool(), capture_error_mode="thread_local"):
            self.gradients = self._gradients(outputs, self.output_gradients)

    def _gradients(self, outputs, output_gradients) -> tuple[torch.Tensor | None, ...]:
        return torch.autograd.grad(outputs, self.parameters, output_gradients, allow_unused=True)

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with self._on_device():
            for name, tensor in inputs.items():
                self.inputs[name].copy_(tensor)
            return _Replayed.apply(self, *self.parameters)

    def replay_forward(self) -> tuple[int, tuple[torch.Tensor, ...]]:
        """Runs the forward graph: the replay's number, and copies of the outputs (the next replay overwrites them)."""
        self.forward_graph.replay()
        self.last_replay = next(self.replays)
        return self.last_replay, tuple(output.clone() for output in self.outputs)

    def replay_backward(self, replay: int, output_gradients) -> tuple[torch.Tensor | None, ...]:
        """Runs the backward graph for the outputs of forward replay `replay`: the parameters' gradients, in the
        graph's buffers (autograd copies a gradient it does not hold the only reference to)."""
        if replay != self.last_replay:
            raise RuntimeError(
                "A captured training call was replayed again before the backward pass of an earlier replay, whose "
                "activations are gone: differentiate each call before the next one, or turn training graphs off with "
                "rlcaption.models.training_graphs.use_training_graphs(False)."
            )
        for buffer, gradient in zip(self.output_gradients, output_gradients, strict=True):
            if gradient is None:
                buffer.zero_()
            else:
                buffer.copy_(gradient)
        self.backward_graph.replay()
        return self.gradients


class _Replayed(torch.autograd.Function):
    """A forward replay of a [`CapturedTraining`], whose backward is the captured backward pass. The parameters are
    arguments so that autograd connects the outputs to them."""

    @staticmethod
    def forward(ctx, captured: CapturedTraining, *parameters: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.captured = captured
        ctx.replay, outputs = captured.replay_forward()
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *output_gradients: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return None, *ctx.captured.replay_backward(ctx.replay, output_gradients)


def graphed_training_call(
    model: nn.Module,
    function: Callable[..., tuple[torch.Tensor, ...]],
    inputs: Mapping[str, torch.Tensor],
    settings: tuple,
) -> tuple[torch.Tensor, ...] | None:
    """
    `function(**inputs)` (a tuple of tensors that depend on `model`'s trainable parameters) replayed, with its backward
    pass, as the CUDA graphs of `model` for these shapes and `settings`; or None where the caller runs it eagerly:
    [`use_training_graphs`] off, gradients off, not on one CUDA device, the first call of a key, a call a graph cannot
    hold, or a model that a graph must not hold: a wrapper (DDP and FSDP act in hooks around each pass), a model with
    gradient checkpointing, or a call under autocast (whose cache of cast weights does not survive the capture).
    """
    if not _TRAINING_GRAPHS["enabled"] or not torch.is_grad_enabled() or torch.is_autocast_enabled("cuda"):
        return None
    if any(getattr(module, "gradient_checkpointing", False) for module in model.modules()):
        return None  # recomputes its forward inside the backward pass
    if type(model).__module__.startswith(("torch.nn.parallel", "torch.distributed")) or "forward" in vars(model):
        return None  # a wrapper, or a forward patched on the instance (accelerate's mixed precision)
    if any(tensor.requires_grad for tensor in inputs.values()):
        return None
    trainable = tuple(parameter.requires_grad for parameter in model.parameters())
    if not any(trainable):
        return None
    key = graph_key(model, inputs, ("training", *settings, trainable))
    graph = None if key is None else _captured(model, key, lambda: CapturedTraining(model, function, inputs))
    return None if graph is None else graph(inputs)
