"""The training configuration and trainer."""

from ..generation.decoding import forward_through
from ..rl_config import RLCaptionConfig
from .rl_trainer import AUXILIARY_NETWORKS_NAME, RLCaptionTrainer, last_complete_checkpoint

__all__ = [
    "AUXILIARY_NETWORKS_NAME",
    "RLCaptionConfig",
    "RLCaptionTrainer",
    "forward_through",
    "last_complete_checkpoint",
]
