"""Training objectives, one module each; importing this package registers the built-in ones."""

from .actor_critic import ActorCriticConfig, ActorCriticObjective
from .base import (
    AuxiliaryNetwork,
    CaptionObjective,
    TrainerInterface,
    TrainingPhase,
    available_objectives,
    get_objective_class,
    register_objective,
)
from .policy_gradient import policy_gradient_loss
from .psst import PSSTConfig, PSSTObjective
from .scst import SCSTConfig, SCSTObjective
from .sle import SLEConfig, SLEObjective, sequence_level_exploration_loss
from .spider_pg import SpiderPGConfig, SpiderPGObjective
from .wtf import WTFConfig, WTFObjective
from .xe import XEObjective

__all__ = [
    "ActorCriticConfig",
    "ActorCriticObjective",
    "AuxiliaryNetwork",
    "CaptionObjective",
    "PSSTConfig",
    "PSSTObjective",
    "SCSTConfig",
    "SCSTObjective",
    "SLEConfig",
    "SLEObjective",
    "SpiderPGConfig",
    "SpiderPGObjective",
    "TrainerInterface",
    "TrainingPhase",
    "WTFConfig",
    "WTFObjective",
    "XEObjective",
    "available_objectives",
    "get_objective_class",
    "policy_gradient_loss",
    "register_objective",
    "sequence_level_exploration_loss",
]
