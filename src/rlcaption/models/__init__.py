"""Captioning models (`transformers` `PreTrainedModel`s) and the image encoders they share."""

from rlcaption.models.policy_value import PolicyValueCaptioner, PolicyValueConfig
from rlcaption.models.shapes_clip import ShapesCLIPConfig, ShapesCLIPModel, ShapesCLIPOutput
from rlcaption.models.show_tell_rl import (
    ShowTellRL,
    ShowTellRLConfig,
    ShowTellRLOutput,
    ShowTellRLPreTrainedModel,
    ShowTellRLState,
)
from rlcaption.models.speaker_listener import Listener, SpeakerListener, SpeakerListenerConfig
from rlcaption.models.visual_semantic_embedding import (
    CaptionImageEmbedding,
    VisualSemanticEmbedding,
    VisualSemanticEmbeddingConfig,
)

__all__ = [
    "CaptionImageEmbedding",
    "Listener",
    "PolicyValueCaptioner",
    "PolicyValueConfig",
    "ShapesCLIPConfig",
    "ShapesCLIPModel",
    "ShapesCLIPOutput",
    "ShowTellRL",
    "ShowTellRLConfig",
    "ShowTellRLOutput",
    "ShowTellRLPreTrainedModel",
    "ShowTellRLState",
    "SpeakerListener",
    "SpeakerListenerConfig",
    "VisualSemanticEmbedding",
    "VisualSemanticEmbeddingConfig",
]
