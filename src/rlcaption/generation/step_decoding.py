"""
Sampling and greedy decoding in one tight loop over a captioner's step function (a token in, the next token's logits
out), for the plain settings RL training decodes with: the loop behind [`decode_recurrent`] and [`decode_blip`].

`generate()` is general: at every token it prepares model inputs, runs its logits processors and stopping criteria
and asks the device whether every caption has ended. A step of a captioner's decoder costs a GPU much less than
that bookkeeping costs the host, and each question stalls the host until the device has caught up, so on a GPU
`generate()` leaves the device idle most of the time. This loop computes the same thing — the same network calls,
the same logits warpers in the same order, the same draw from torch's generator, so the same sequences for the same
seed — and asks whether all captions have ended only every few tokens. On a GPU it goes further: the whole decoding
after the image encoding is captured as a CUDA graph (at a batch shape's second decoding) and replayed, one launch
for every kernel of every token.

Whether it does is a setting of the generation config the loop is given, `cuda_graphs` (True when absent), beside
the decoding settings, as transformers keeps `disable_compile` there: `GenerationConfig(..., cuda_graphs=False)`
decodes step by step. A model's own `generation_config.cuda_graphs` holds for the decodings of that model whose
config does not set it ([`rlcaption.generation.captioners.Captioner.complete_generation_config`]), so two models in
one process may differ.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.utils import logging

__all__ = [
    "CapturedCall",
    "check_decodes_plainly",
    "decode_steps",
    "decodes_plainly",
    "draw_tokens",
    "graph_key",
    "graphed_call",
    "logits_warpers",
    "split_state",
    "state_with",
    "uses_cuda_graphs",
]

logger = logging.get_logger(__name__)

# The settings this loop honours (`cuda_graphs`: how it runs, not what it decodes); any other setting a config changes
# from the library defaults is left to generate().
PLAIN_SETTINGS = frozenset(
    {
        "do_sample", "num_beams", "temperature", "top_k", "top_p", "max_new_tokens", "num_return_sequences",
        "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "_from_model_config", "cuda_graphs",
    }
)  # fmt: skip
# Tokens decoded between two checks of whether every caption has ended: each check waits for the device, and a few
# steps past the end of the last caption cost less than a wait per token.
STEPS_BETWEEN_END_CHECKS = 4


def uses_cuda_graphs(config: GenerationConfig, device: torch.device) -> bool:
    """Whether a decoding with `config` on `device` runs as CUDA graphs: on a CUDA device, unless `config.cuda_graphs`
    is False (e.g. to compare with running it step by step). Graphs captured already are kept for when they are used
    again; they are freed with their model."""
    return device.type == "cuda" and getattr(config, "cuda_graphs", True)


def decodes_plainly(config: GenerationConfig) -> bool:
    """Whether [`decode_steps`] decodes `config` exactly as `generate()` would: one beam, greedy or sampled with
    temperature, top-k and top-p given explicitly, a token budget, and nothing else."""
    if config.num_beams not in (None, 1) or config.max_new_tokens is None:
        return False
    if config.do_sample and None in (config.temperature, config.top_k, config.top_p):
        return False  # generate() would fill these from its own defaults
    return set(config.to_diff_dict()) <= PLAIN_SETTINGS


def check_decodes_plainly(config: GenerationConfig) -> None:
    """Raises for a config that [`decode_steps`] cannot decode as `generate()` would."""
    if not decodes_plainly(config):
        raise ValueError(
            f"This loop decodes greedily or samples, with nothing else set; got {config}. Decode other settings "
            "(beam search, penalties, length constraints) with the model's `generate()`."
        )


def logits_warpers(config: GenerationConfig) -> LogitsProcessorList:
    """The warpers `generate()` applies when sampling with `config`, in its order: temperature, top-k, top-p. They
    read the scores only, never the tokens so far."""
    warpers = LogitsProcessorList()
    if not config.do_sample:
        return warpers
    if config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    return warpers


def draw_tokens(probs: torch.Tensor) -> torch.LongTensor:
    """One token per row of `probs` `(N, V)`, drawn as `torch.multinomial(probs, 1)` draws it (its one-sample path:
    the argmax of `probs` over exponential noise), so from the same generator state the same tokens. Unlike
    `torch.multinomial`, it never asks the device whether `probs` is valid, a wait per token that a CUDA graph cannot
    hold."""
    return probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1)


def _decode_step(step, tokens, state, sequences, position, unfinished, config, warpers):
    """Token `position` of every caption, written into `sequences`; `unfinished` is updated in place."""
    logits, state = step(tokens, state)
    scores = warpers(sequences[:, :position], logits.float())
    tokens = draw_tokens(torch.softmax(scores, dim=-1)) if config.do_sample else scores.argmax(dim=-1)
    tokens = tokens.masked_fill(~unfinished, config.pad_token_id)
    sequences[:, position] = tokens
    unfinished &= tokens != config.eos_token_id
    return tokens, state


def _trim_after_last_end(sequences: torch.LongTensor, end: int) -> torch.LongTensor:
    """`sequences` up to the end token of the caption that ends last, or whole if one never ends, as `generate()`
    returns them."""
    ended = sequences[:, 1:] == end
    end_position = torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, sequences.shape[1] - 1)
    return sequences[:, : int(end_position.max()) + 1]


def _decode_steps(step, state, sequences, config, stops_early: bool) -> None:
    """Writes a decoding from `state` into `sequences` (of `max_new_tokens + 1` columns). With `stops_early`, it stops
    once every caption has ended, asked every few tokens; without, it decodes every step: what a CUDA graph holds,
    where nothing can depend on the device's values."""
    sequences.fill_(config.pad_token_id)
    sequences[:, 0] = config.bos_token_id
    tokens = sequences[:, 0].clone()
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    warpers = logits_warpers(config)
    for position in range(1, sequences.shape[1]):
        tokens, state = _decode_step(step, tokens, state, sequences, position, unfinished, config, warpers)
        if stops_early and position % STEPS_BETWEEN_END_CHECKS == 0 and not bool(unfinished.any()):
            return


def _state_tensors(state: Any) -> dict[str, torch.Tensor]:
    return {name: value for name, value in vars(state).items() if isinstance(value, torch.Tensor)}


def _state_device(state: Any) -> torch.device:
    """Where the captions are decoded: the device of the state's first tensor."""
    return next(iter(_state_tensors(state).values())).device


class CapturedCall:
    """
    `function(**inputs)` captured as one CUDA graph for the shapes of `inputs`, and replayed on new values of the same
    shapes: every kernel of the call at once, with no host work per kernel. The call must not read the device's
    values on the host (no `.item()`, no branching on them: a decoding loop runs every step rather than stop early)
    and returns one tensor, which the graph overwrites at each replay: a replay returns a copy. Parameters are read
    where they live, so updates in place (optimizer steps, `load_state_dict`) are seen. Random draws come from the
    device's default generator, as in eager calls.
    """

    def __init__(self, function: Callable[..., torch.Tensor], inputs: Mapping[str, torch.Tensor]):
        self.inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        self.device = next(iter(self.inputs.values())).device
        with torch.cuda.device(self.device):  # the streams, generator and graph of the inputs' device, current or not
            self._capture(function, self.device)

    def _capture(self, function: Callable[..., torch.Tensor], device: torch.device) -> None:
        # autocast's cache of cast weights would be freed under the graph when autocast exits
        autocast = torch.autocast(
            "cuda", torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False
        )
        generator_state = torch.cuda.get_rng_state(device)
        side_stream = torch.cuda.Stream(device)
        side_stream.wait_stream(torch.cuda.current_stream(device))
        # the caller's stream is restored even where the capture fails midway (torch.cuda.graph leaves its own stream
        # current when ending a broken capture raises)
        with torch.cuda.stream(side_stream), autocast:
            function(**self.inputs)  # warm-up, as capture requires: lazy initialisations and a first run's allocations
            torch.cuda.set_rng_state(generator_state, device)  # the first replay draws what an eager call would draw
            self.graph = torch.cuda.CUDAGraph()
            # thread-local: a data loader's pin-memory thread allocating during the capture must not break it
            with torch.cuda.graph(self.graph, stream=side_stream, capture_error_mode="thread_local"):
                self.output = function(**self.inputs)
        torch.cuda.current_stream(device).wait_stream(side_stream)

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        with torch.cuda.device(self.device):
            for name, tensor in inputs.items():
                self.inputs[name].copy_(tensor)
            self.graph.replay()
            return self.output.clone()


# The captured calls of each network, most recently used last. A graph keeps the memory of its intermediates, so only
# a few are kept: RL training decodes the same few batch shapes at every step.
_CAPTURED_CALLS: weakref.WeakKeyDictionary[nn.Module, OrderedDict] = weakref.WeakKeyDictionary()
MAX_GRAPHS_PER_MODEL = 6
_UNCAPTURABLE = object()
# The keys each network was called with once, most recent last. A key's graph is captured at its second call: shapes
# that change at almost every batch (region features padded to each batch's largest count, a last smaller batch) then
# run eagerly, instead of each costing a capture and evicting the graphs that are reused.
_KEYS_CALLED_ONCE: weakref.WeakKeyDictionary[nn.Module, OrderedDict] = weakref.WeakKeyDictionary()
MAX_KEYS_REMEMBERED_PER_MODEL = 64


def graph_key(model: nn.Module, inputs: Mapping[str, torch.Tensor], settings: tuple) -> tuple | None:
    """What a captured call of `model` on `inputs` depends on besides their values (their shapes, the parameters'
    storage, every module's dropout, autocast, the caller's `settings`), or None where a CUDA graph cannot hold the
    call (not all on one CUDA device, or inside another capture)."""
    parameters = list(model.parameters())
    devices = {tensor.device for tensor in [*inputs.values(), *parameters]}
    if len(devices) != 1 or next(iter(devices)).type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    return (
        tuple((name, tensor.shape, tensor.dtype) for name, tensor in inputs.items()),
        tuple(parameter.data_ptr() for parameter in parameters),
        # dropout on or off is baked into the graph
        tuple(
            (module.training, getattr(module, "p", None), getattr(module, "dropout", None))
            for module in model.modules()
        ),
        torch.is_autocast_enabled("cuda"),
        torch.get_autocast_dtype("cuda"),
        *settings,
    )


def _captured(model: nn.Module, key: tuple, capture: Callable[[], CapturedCall]) -> CapturedCall | None:
    """The graph of `key` among `model`'s, captured now at the key's second call; None where the call runs eagerly:
    its first call, or an operation that a CUDA graph cannot capture."""
    graphs = _CAPTURED_CALLS.setdefault(model, OrderedDict())
    graph = graphs.get(key)
    if graph is None:
        called_once = _KEYS_CALLED_ONCE.setdefault(model, OrderedDict())
        if key not in called_once:
            called_once[key] = None
            while len(called_once) > MAX_KEYS_REMEMBERED_PER_MODEL:
                called_once.popitem(last=False)
            return None
        del called_once[key]
        try:
            graph = capture()
        except torch.cuda.OutOfMemoryError:
            raise  # not a property of the call: the next capture may fit
        except RuntimeError as error:  # an operation that a CUDA graph cannot capture: run eagerly
            logger.warning_once(f"Running eagerly a call of this model that a CUDA graph cannot capture ({error}).")
            graph = _UNCAPTURABLE
        graphs[key] = graph
        while len(graphs) > MAX_GRAPHS_PER_MODEL:
            graphs.popitem(last=False)
    graphs.move_to_end(key)
    return None if graph is _UNCAPTURABLE else graph


def graphed_call(
    model: nn.Module, function: Callable[..., torch.Tensor], inputs: Mapping[str, torch.Tensor], settings: tuple
) -> torch.Tensor | None:
    """
    `function(**inputs)` replayed as the CUDA graph of `model` for these shapes and `settings` (captured at their
    second call, a few kept per model; see [`CapturedCall`] for what `function` may do), or None where the caller
    runs it eagerly: not on one CUDA device, the first call of a key, or an operation that a graph cannot capture.
    `settings` holds whatever else `function` bakes in (sizes, sampling settings, special tokens). Callers call it
    where [`uses_cuda_graphs`] says so.
    """
    key = graph_key(model, inputs, settings)
    graph = None if key is None else _captured(model, key, lambda: CapturedCall(function, inputs))
    return None if graph is None else graph(inputs)


def split_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """A copy of a decoding state without its tensors, and the tensors by name: a graph of a loop from the state takes
    the tensors as its inputs, and keeps no tensor of the state it was captured from."""
    tensors = _state_tensors(state)
    template = copy.copy(state)
    for name in tensors:
        setattr(template, name, None)
    return template, tensors


def state_with(template: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The state of [`split_state`]'s `template` holding `tensors`."""
    state = copy.copy(template)
    for name, tensor in tensors.items():
        setattr(state, name, tensor)
    return state


def _decoding_from(
    step: Callable, state_template: Any, num_captions: int, config: GenerationConfig, **state_tensors: torch.Tensor
) -> torch.LongTensor:
    """Every step of a decoding from the state `state_template` holding `state_tensors`: what a graph captures."""
    state = state_with(state_template, state_tensors)
    device = next(iter(state_tensors.values())).device
    sequences = torch.empty(num_captions, config.max_new_tokens + 1, dtype=torch.long, device=device)
    _decode_steps(step, state, sequences, config, stops_early=False)
    return sequences


@torch.no_grad()
def decode_steps(
    model: nn.Module,
    step: Callable[[torch.LongTensor, Any], tuple[torch.FloatTensor, Any]],
    state: Any,
    num_captions: int,
    config: GenerationConfig,
    trim: bool = True,
) -> torch.LongTensor:
    """
    Decodes `num_captions` captions from `state` with `step(token_ids, state) -> (next_token_logits, next_state)`, as
    `generate()` does for a config that [`decodes_plainly`]. `step` must not modify the tensors of the state it is
    given: a CUDA graph of the decoding reads its initial state at every replay.

    On a CUDA device, unless `config.cuda_graphs` is False ([`uses_cuda_graphs`]), the decoding is one CUDA graph,
    captured at the second call for each batch shape (a few are kept per `model`, the module whose parameters `step`
    reads); it draws the same captions as step-by-step decoding.

    Trimming the sequences after the end of the longest caption, as `generate()` does, reads the device's values, so
    it waits until the decoding is done. With `trim=False`, a decoding replayed as a graph is returned `max_new_tokens
    + 1` wide instead, while the device still runs it: the host can meanwhile queue the work that needs only the
    token ids (an RL step's scoring pass) rather than wait idle. Step by step, the loop has waited for the device
    already, to stop after the last end token, and trims either way.

    Returns:
        `torch.LongTensor` of shape `(num_captions, length)`: the start token, then the caption, padded after its end
        token; `length` is that of the longest caption, as `generate()` returns it, or `max_new_tokens + 1` for a
        graph's decoding without `trim`.
    """
    check_decodes_plainly(config)
    sequences = None
    device = _state_device(state)
    if uses_cuda_graphs(config, device):
        template, state_tensors = split_state(state)
        settings = (
            "decoding", num_captions, config.do_sample, config.temperature, config.top_k, config.top_p,
            config.max_new_tokens, config.bos_token_id, config.eos_token_id, config.pad_token_id,
        )  # fmt: skip
        decoding = functools.partial(_decoding_from, step, template, num_captions, config)
        sequences = graphed_call(model, decoding, state_tensors, settings)
    if sequences is not None:
        return _trim_after_last_end(sequences, config.eos_token_id) if trim else sequences
    sequences = torch.empty(num_captions, config.max_new_tokens + 1, dtype=torch.long, device=device)
    _decode_steps(step, state, sequences, config, stops_early=True)
    return _trim_after_last_end(sequences, config.eos_token_id)
