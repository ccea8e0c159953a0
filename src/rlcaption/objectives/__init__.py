"""Training objectives, one module each; importing this package registers the built-in ones."""

from .actor_critic import ActorCriticObjective
from .base import (
    AuxiliaryNetwork,
    CaptionObjective,
    TrainingPhase,
    available_objectives,
    get_objective_class,
    register_objective,
)
from .psst import PSSTObjective
from .scst import SCSTObjective, policy_gradient_loss
from .sle import SLEObjective, sequence_level_exploration_loss
from .spider_pg import SpiderPGObjective
from .wtf import WTFObjective
from .xe import XEObjective

__all__ = [
    "ActorCriticObjective",
    "AuxiliaryNetwork",
    "CaptionObjective",
    "PSSTObjective",
    "SCSTObjective",
    "SLEObjective",
    "SpiderPGObjective",
    "TrainingPhase",
    "WTFObjective",
    "XEObjective",
    "available_objectives",
    "get_objective_class",
    "policy_gradient_loss",
    "register_objective",
    "sequence_level_exploration_loss",
]
