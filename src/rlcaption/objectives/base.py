"""
The interface every training objective implements, the trainer services it may use ([`TrainerInterface`]), the
networks and phases it may declare, and the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn
from transformers import TrainerState

from ..generation.decoding import GeneratedCaptions
from ..rewards.processes import Pending
from ..rl_config import RLCaptionConfig, register_objective_config

__all__ = [
    "AuxiliaryNetwork",
    "CaptionObjective",
    "TrainerInterface",
    "TrainingPhase",
    "available_objectives",
    "get_objective_class",
    "register_objective",
    "reward_tensor",
]

_OBJECTIVES: dict[str, type[CaptionObjective]] = {}


@dataclass
class AuxiliaryNetwork:
    """
    A network an objective trains besides the captioner: a baseline, a value network, a discriminator, a listener.

    The trainer puts its trainable parameters into its one optimizer as their own parameter group, wraps it with
    accelerate like the model (DDP keeps the replicas equal, mixed precision applies), saves it in every checkpoint
    (`auxiliary_networks.safetensors`) and restores it on resume. Networks that are only read (a reward CLIP) are
    not auxiliary networks: keep them in the reward, frozen, so they are never optimised nor written to checkpoints.

    Args:
        module (`nn.Module`): the network, with at least one trainable parameter.
        learning_rate (`float`, *optional*): its learning rate; the config's `learning_rate` when `None`. The
            trainer's scheduler scales it like the model's.
        weight_decay (`float`, *optional*, defaults to 0.0): its weight decay.
    """

    module: nn.Module
    learning_rate: float | None = None
    weight_decay: float = 0.0


@dataclass(frozen=True)
class TrainingPhase:
    """
    One phase of an objective's schedule, e.g. "pretrain the value network for 500 steps, then train jointly".

    Args:
        name (`str`): logged as the objective's current phase.
        num_steps (`int`, *optional*): optimizer steps the phase lasts; `None` for the last phase, which lasts to the
            end of training.
        trains_captioner (`bool`, *optional*, defaults to `True`): `False` for a phase that keeps the captioner fixed
            and trains auxiliary networks only (a pretraining phase; such phases come first). The learning-rate
            schedule counts the steps that train the captioner only, so that a method with a pretraining phase gives
            its captioner the schedule of a method without one at the same number of captioner steps.
    """

    name: str
    num_steps: int | None = None
    trains_captioner: bool = True


class TrainerInterface(Protocol):
    """
    What an objective may ask of the trainer that runs it: the config, the step, decoding, rewards, logging and the
    auxiliary networks. [`RLCaptionTrainer`] implements it; a unit test can hand an objective a small fake instead.

    Attributes:
        args: the run's config, of the objective's `config_class`.
        state: `state.global_step` is the current optimizer step (phases are a function of it).
        model: the captioner as given to the trainer (not wrapped); `unwrap_model` unwraps the one `compute_loss` gets.
        processing_class: the captioner's processor (`batch_decode`, its tokenizer).
        eos_token_id: the token that ends a caption.
        train_dataset, data_collator: the training data and how it is batched.
    """

    args: RLCaptionConfig
    state: TrainerState
    model: nn.Module
    processing_class: Any
    eos_token_id: int
    train_dataset: Any
    data_collator: Any

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The network inside a DDP or mixed-precision wrapper (itself without one)."""

    def sample_captions(
        self, image_inputs: Mapping[str, torch.Tensor], num_return_sequences: int, trim: bool = True
    ) -> GeneratedCaptions:
        """Samples captions per image with the config's sampling settings, in evaluation mode; `trim=False` may
        return them `max_caption_length + 1` wide, from a decoding the device still runs."""

    def greedy_captions(self, image_inputs: Mapping[str, torch.Tensor]) -> GeneratedCaptions:
        """One greedy caption per image."""

    def sample_and_greedy_captions(
        self, image_inputs: Mapping[str, torch.Tensor], num_return_sequences: int, trim: bool = True
    ) -> tuple[GeneratedCaptions, GeneratedCaptions]:
        """`sample_captions` and `greedy_captions` of the same images, each image encoded once where possible."""

    def beam_search_captions(self, image_inputs: Mapping[str, torch.Tensor], num_beams: int) -> GeneratedCaptions:
        """The best beam-search caption per image."""

    def compute_rewards(
        self, completions: list[str], inputs: Mapping[str, Any], row_index: Sequence[int], log_prefix: str = "reward"
    ) -> np.ndarray:
        """The weighted reward of each caption for the image of its batch row, `(len(completions),)`."""

    def start_rewards(
        self,
        completions: list[str],
        inputs: Mapping[str, Any],
        row_index: Sequence[int],
        log_prefix: str = "reward",
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> Pending[np.ndarray]:
        """`compute_rewards`, its rewards in worker processes still running: `result()` waits for them.
        `completion_ids`, each caption's tokens, reach the rewards written for TRL."""

    def reference_token_log_probs(
        self,
        image_inputs: Mapping[str, torch.Tensor],
        sequences: torch.LongTensor,
        image_index: torch.LongTensor | None = None,
    ) -> torch.FloatTensor:
        """The starting policy's log-probabilities of the tokens of `sequences`, without gradient, `(N, T - 1)`: the
        reference of the KL penalty (`args.beta` > 0)."""

    def record_metric(self, name: str, value: float | torch.Tensor) -> None:
        """Adds a scalar (a float, or a one-element tensor read at the log) to the next training log, averaged over
        the steps since the last and over processes; a NaN (undefined in this step) is left out of the average."""

    def auxiliary_network(self, name: str) -> nn.Module:
        """The objective's auxiliary network `name`, wrapped for the run (DDP, mixed precision)."""


class CaptionObjective:
    """
    A training objective: owns the algorithm (what to sample, which loss), while the trainer owns the loop
    (backward, accumulation, mixed precision, DDP, checkpoints, logging).

    Subclasses set `name`, say whether they use rewards, and implement [`compute_loss`]. They record scalars for
    logging with `self.trainer.record_metric(name, value)`. An objective that trains more than the captioner returns
    its networks from [`auxiliary_networks`] and reaches them, wrapped for the current run, with
    `self.trainer.auxiliary_network(name)`. An objective in phases returns them from [`phases`]; the current one is
    [`current_phase`], a function of the global step alone, so that a run resumed in the middle of a phase continues
    in that phase.
    """

    name: ClassVar[str]
    uses_rewards: ClassVar[bool] = True
    # the config class that holds the objective's options (a subclass of RLCaptionConfig for a method with its own)
    config_class: ClassVar[type[RLCaptionConfig]] = RLCaptionConfig

    def __init__(self, trainer: TrainerInterface):
        self.trainer = trainer
        self.args = trainer.args

    def auxiliary_networks(self) -> dict[str, AuxiliaryNetwork]:
        """The networks this objective trains besides the captioner, by name; called once, after `__init__`."""
        return {}

    def phases(self) -> list[TrainingPhase]:
        """The objective's schedule; one phase lasting the whole training by default."""
        return [TrainingPhase(self.name)]

    def current_phase(self) -> TrainingPhase:
        """The phase of the current optimizer step (`trainer.state.global_step`)."""
        step = self.trainer.state.global_step
        phases = self.phases()
        for phase in phases[:-1]:
            if phase.num_steps is None:
                raise ValueError(f"Phase {phase.name!r} of {self.name!r} has no num_steps but is not the last phase.")
            if step < phase.num_steps:
                return phase
            step -= phase.num_steps
        return phases[-1]

    def steps_by_phase(self, num_steps: int) -> dict[str, int]:
        """The optimizer steps each phase takes in a run of `num_steps` steps, in order; a phase the run does not
        reach takes 0."""
        steps = {}
        for phase in self.phases():
            steps[phase.name] = num_steps if phase.num_steps is None else min(phase.num_steps, num_steps)
            num_steps -= steps[phase.name]
        return steps

    def captioner_fixed_steps(self, num_steps: int) -> int:
        """The optimizer steps at the start of a run of `num_steps` steps that keep the captioner fixed: those of the
        leading phases that do not train it (see [`TrainingPhase.trains_captioner`])."""
        fixed_steps = 0
        for phase, steps in zip(self.phases(), self.steps_by_phase(num_steps).values(), strict=True):
            if phase.trains_captioner:
                break
            fixed_steps += steps
        return fixed_steps

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """Returns the scalar loss of one batch (a per-batch mean; the trainer scales it for accumulation)."""
        raise NotImplementedError


def register_objective(cls: type[CaptionObjective]) -> type[CaptionObjective]:
    """Class decorator adding an objective to the registry under `cls.name`."""
    if cls.name in _OBJECTIVES and _OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"An objective named {cls.name!r} is already registered ({_OBJECTIVES[cls.name].__name__}).")
    _OBJECTIVES[cls.name] = cls
    register_objective_config(cls.name, cls.config_class)
    return cls


def available_objectives() -> list[str]:
    """Names accepted by `RLCaptionConfig.objective`."""
    return sorted(_OBJECTIVES)


def get_objective_class(name: str) -> type[CaptionObjective]:
    """Looks an objective up by name, with the list of known names in the error."""
    try:
        return _OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"Unknown objective {name!r}; available objectives: {available_objectives()}.") from None


def reward_tensor(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """
    Rewards, advantages or other values computed on the host (SLE's distances between samples), as a float32 tensor
    on `device`, copied by [`to_device_without_waiting`]: objectives collect their rewards just after launching the
    forward pass that scores the samples.
    """
    return to_device_without_waiting(torch.as_tensor(np.asarray(values, dtype=np.float32)), device)


def to_device_without_waiting(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; from the host to a GPU, copied from pinned memory without waiting: a copy from ordinary
    host memory first waits for every kernel queued before it."""
    if tensor.device.type != "cpu" or torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def masked_mean_and_variance(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The mean and the unbiased variance of `values` where `mask` (of the same shape) is nonzero, as 0-dim tensors for
    [`TrainerInterface.record_metric`], in at least float32. Computed over the values with the others set to 0:
    selecting the values (`values[mask]`) would wait for the device to learn how many there are. The mean is NaN
    without a value and the variance with fewer than two, which the training log leaves out.
    """
    selected = mask.bool()
    dtype = torch.promote_types(values.dtype, torch.float32)  # a bfloat16 count is exact only up to 256
    count = selected.sum().to(dtype)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    mean = torch.where(selected, values.to(dtype), zero).sum() / count
    variance = torch.where(selected, values.to(dtype) - mean, zero).square().sum() / (count - 1)
    return mean, variance.where(count > 1, torch.nan)
