"""The interface every training objective implements, and the objective registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from ..trainer.rl_trainer import RLCaptionTrainer

__all__ = ["CaptionObjective", "available_objectives", "get_objective_class", "register_objective"]

_OBJECTIVES: dict[str, type[CaptionObjective]] = {}


class CaptionObjective:
    """
    A training objective: owns the algorithm (what to sample, which loss), while [`RLCaptionTrainer`] owns the loop
    (backward, accumulation, mixed precision, DDP, checkpoints, logging).

    Subclasses set `name`, say whether they use rewards, and implement [`compute_loss`]. They record scalars for
    logging with `self.trainer.record_metric(name, value)`.
    """

    name: ClassVar[str]
    uses_rewards: ClassVar[bool] = True

    def __init__(self, trainer: RLCaptionTrainer):
        self.trainer = trainer
        self.args = trainer.args

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """Returns the scalar loss of one batch (a per-batch mean; the trainer scales it for accumulation)."""
        raise NotImplementedError


def register_objective(cls: type[CaptionObjective]) -> type[CaptionObjective]:
    """Class decorator adding an objective to the registry under `cls.name`."""
    if cls.name in _OBJECTIVES and _OBJECTIVES[cls.name] is not cls:
        raise ValueError(f"An objective named {cls.name!r} is already registered ({_OBJECTIVES[cls.name].__name__}).")
    _OBJECTIVES[cls.name] = cls
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
