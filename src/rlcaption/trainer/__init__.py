"""The training configuration and trainer."""

from .rl_config import RLCaptionConfig
from .rl_trainer import RLCaptionTrainer, last_complete_checkpoint

__all__ = ["RLCaptionConfig", "RLCaptionTrainer", "last_complete_checkpoint"]
