"""
A differentiable call, its forward and its backward pass, captured as two CUDA graphs and replayed with autograd:
what an RL step's teacher-forced scoring pass needs to stop costing the host a launch per kernel.

An RL step scores its samples in one teacher-forced pass over `max_caption_length` positions (the samples are padded
to the token budget, so the pass has one shape per batch size), then differentiates it. For a small captioner on a
GPU both passes are host-bound: an attending LSTM launches a few thousand kernels for them, each costing the host
more than the device. Replayed as graphs, each pass is one launch.

This follows `torch.cuda.make_graphed_callables`, with three differences that an RL step needs:
- the parameters' gradients reach autograd as copies of the graph's buffers (`make_graphed_callables` hands over
  detached views of them, which autograd adopts as `.grad` where it is None: the next replay then overwrites `.grad`,
  and under gradient accumulation doubles it);
- a graph is captured at a shape's second call and kept among a few per model, as the decoding graphs are
  ([`rlcaption.models.step_decoding.graphed_call`]), and calls a graph cannot hold run eagerly;
- autograd's own checks hold: a backward pass that would read activations gone (after a later replay, or a second
  backward pass of the same replay) raises, as does one after the parameters were changed in place.

Off by default until it has been checked and measured on a GPU: [`use_training_graphs`] turns it on.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping

import torch
from torch import nn

from .step_decoding import SwitchChange, _captured, graph_key

__all__ = ["CapturedTraining", "graphed_training_call", "use_training_graphs"]

# Operations that act around a module's passes, outside what a graph replays.
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")

_TRAINING_GRAPHS = {"enabled": False}


def use_training_graphs(enabled: bool) -> SwitchChange:
    """Whether [`graphed_training_call`] replays differentiable calls (the RL objectives' scoring of their samples)
    as CUDA graphs on CUDA devices. Off by default; for a block only as `with use_training_graphs(True): ...`."""
    return SwitchChange(_TRAINING_GRAPHS, enabled)


class CapturedTraining:
    """
    `function(**inputs)`, returning a tuple of tensors, captured for the shapes of `inputs` as a forward graph, and the
    gradients of its outputs with respect to `model`'s trainable parameters as a backward graph. Calls replay both
    through autograd: the outputs require grad, and their backward pass returns the parameters' gradients, which
    autograd accumulates into `.grad` as for an eager pass.

    As for [`rlcaption.models.step_decoding.CapturedCall`], `function` must not read the device's values on the host.
    The inputs never get gradients. Each call's backward pass must come before the next call, and only once: the
    graphs keep one set of activations, and the backward pass frees and reuses their memory as it goes.
    """

    def __init__(self, model: nn.Module, function: Callable[..., tuple[torch.Tensor, ...]], inputs: Mapping):
        self.inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        self.parameters = tuple(parameter for parameter in model.parameters() if parameter.requires_grad)
        self.device = next(iter(self.inputs.values())).device
        self.replays = itertools.count()
        self.last_replay = -1
        with self._on_device():
            try:
                self._capture(function)
            except torch.cuda.OutOfMemoryError as error:
                # the graphs keep their memory for good: where they do not fit, the pass runs eagerly
                raise RuntimeError(f"out of memory while capturing a training call ({error})") from error

    def _on_device(self) -> contextlib.AbstractContextManager:
        """The inputs' device made current (on the CPU, where the tests stand in for the graphs: nothing)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _capture(self, function: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        device = self.device
        generator_state = torch.cuda.get_rng_state(device)
        capture_stream = torch.cuda.Stream(device)
        capture_stream.wait_stream(torch.cuda.current_stream(device))
        # the caller's stream is restored even where a capture fails midway (torch.cuda.graph leaves its own stream
        # current when ending a broken capture raises)
        with torch.cuda.stream(capture_stream):
            # warm-up, as capture requires (cuDNN's and cuBLAS's lazy set-up, a first run's allocations);
            # autograd.grad leaves `.grad` alone
            for _ in range(2):
                outputs = function(**self.inputs)
                if not all(isinstance(output, torch.Tensor) and output.requires_grad for output in outputs):
                    raise RuntimeError("a captured training call must return tensors that depend on its parameters")
                self._gradients(outputs, [torch.ones_like(output) for output in outputs])
            torch.cuda.set_rng_state(generator_state, device)
            self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            # thread-local: a data loader's pin-memory thread allocating during the capture must not break it
            with torch.cuda.graph(self.forward_graph, stream=capture_stream, capture_error_mode="thread_local"):
                outputs = function(**self.inputs)
            self.outputs = tuple(output.detach() for output in outputs)
            self.output_gradients = tuple(torch.zeros_like(output) for output in outputs)
            # the same memory pool: the backward graph reads the forward graph's saved activations
            with torch.cuda.graph(
                self.backward_graph, pool=self.forward_graph.pool(), stream=capture_stream,
                capture_error_mode="thread_local",
            ):  # fmt: skip
                self.gradients = self._gradients(outputs, self.output_gradients)
        torch.cuda.current_stream(device).wait_stream(capture_stream)

    def _gradients(
        self, outputs: tuple[torch.Tensor, ...], output_gradients: list[torch.Tensor] | tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor | None, ...]:
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

    def replay_backward(
        self, replay: int, output_gradients: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor | None, ...]:
        """Runs the backward graph for the outputs of forward replay `replay`, once: copies of the parameters'
        gradients (the next replay overwrites the graph's buffers; `torch.autograd.grad` and hooks get these)."""
        if replay != self.last_replay:
            raise RuntimeError(
                "The backward pass of a captured training call ran after a later replay of the call, or a second "
                "time, when the activations it reads are gone: differentiate each call once, before the next one, "
                "or turn training graphs off with rlcaption.models.training_graphs.use_training_graphs(False)."
            )
        self.last_replay = -1
        for buffer, gradient in zip(self.output_gradients, output_gradients, strict=True):
            buffer.copy_(gradient)
        self.backward_graph.replay()
        return tuple(None if gradient is None else gradient.clone() for gradient in self.gradients)


class _Replayed(torch.autograd.Function):
    """A forward replay of a [`CapturedTraining`], whose backward is the captured backward pass. The parameters are
    arguments so that autograd connects the outputs to them, and saved so that autograd refuses the backward pass
    after they changed in place, as for an eager pass."""

    @staticmethod
    def forward(ctx, captured: CapturedTraining, *parameters: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.captured = captured
        ctx.save_for_backward(*parameters)
        ctx.replay, outputs = captured.replay_forward()
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *output_gradients: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ctx.saved_tensors  # noqa: B018 -- raises where a parameter changed in place since the forward replay
        return None, *ctx.captured.replay_backward(ctx.replay, output_gradients)


def _refused(model: nn.Module) -> bool:
    """Whether `model` runs work around its passes that a graph would not replay, or drop: a wrapper (DDP, FSDP,
    DeepSpeed), hooks or a forward patched on an instance (accelerate's mixed precision and device maps), a compiled
    forward (whose guards would stop running), or gradient checkpointing (which draws and restores random states
    inside the backward pass)."""
    if isinstance(getattr(model, "module", None), nn.Module):
        return True
    if type(model).__module__.startswith(("torch.nn.parallel", "torch.distributed")):
        return True
    if getattr(model, "_compiled_call_impl", None) is not None:
        return True
    global_hooks = (nn.modules.module._global_forward_hooks, nn.modules.module._global_forward_pre_hooks)
    if any(global_hooks) or nn.modules.module._global_backward_hooks:
        return True
    return any(
        "forward" in vars(module)
        or any(getattr(module, hooks, None) for hooks in _HOOKS)
        or getattr(module, "gradient_checkpointing", False)
        or type(module).__module__.startswith("torch.distributed")
        for module in model.modules()
    )


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
    hold (or that does not fit in memory), inputs that require grad, or a model that a graph must not hold (see
    [`_refused`]), or a call under autocast (whose cache of cast weights does not survive the capture).
    """
    if not _TRAINING_GRAPHS["enabled"] or not torch.is_grad_enabled() or torch.is_autocast_enabled("cuda"):
        return None
    if _refused(model) or any(tensor.requires_grad for tensor in inputs.values()):
        return None
    parameters = list(model.parameters())
    if not any(parameter.requires_grad for parameter in parameters):
        return None
    # the parameters' objects too: gradients go to the objects captured, even where new ones share their storage
    trainable = tuple((id(parameter), parameter.requires_grad) for parameter in parameters)
    key = graph_key(model, inputs, ("training", *settings, trainable))
    graph = None if key is None else _captured(model, key, lambda: CapturedTraining(model, function, inputs))
    return None if graph is None else graph(inputs)
