"""
rlcaption's public API, which `import rlcaption` brings in: every name below, and the Auto classes of transformers
registered for rlcaption's models and processor.
"""

from . import auto  # noqa: F401  (registers the Auto classes before anyone calls from_pretrained)
from .data import CaptionCollator, load_caption_dataset, load_coco, load_karpathy, load_shapes
from .evaluation import evaluate_model
from .metrics import evaluate_captions
from .models import (
    PolicyValueCaptioner,
    PolicyValueConfig,
    ShapesCLIPConfig,
    ShapesCLIPModel,
    ShowTellRL,
    ShowTellRLConfig,
    ShowTellRLOutput,
    ShowTellRLState,
    SpeakerListener,
    SpeakerListenerConfig,
    VisualSemanticEmbedding,
    VisualSemanticEmbeddingConfig,
)
from .objectives import (
    ActorCriticConfig,
    PSSTConfig,
    SCSTConfig,
    SLEConfig,
    SpiderPGConfig,
    WTFConfig,
)
from .processing import CaptionProcessor
from .rewards import RewardMix, available_rewards, get_reward, register_reward
from .trainer import RLCaptionConfig, RLCaptionTrainer

__all__ = [
    "ActorCriticConfig",
    "PSSTConfig",
    "PolicyValueCaptioner",
    "PolicyValueConfig",
    "CaptionCollator",
    "CaptionProcessor",
    "RLCaptionConfig",
    "RLCaptionTrainer",
    "RewardMix",
    "SCSTConfig",
    "SLEConfig",
    "ShapesCLIPConfig",
    "ShapesCLIPModel",
    "ShowTellRL",
    "ShowTellRLConfig",
    "ShowTellRLOutput",
    "ShowTellRLState",
    "SpeakerListener",
    "SpeakerListenerConfig",
    "SpiderPGConfig",
    "VisualSemanticEmbedding",
    "VisualSemanticEmbeddingConfig",
    "WTFConfig",
    "available_rewards",
    "evaluate_captions",
    "evaluate_model",
    "get_reward",
    "load_caption_dataset",
    "load_coco",
    "load_karpathy",
    "load_shapes",
    "register_reward",
]
