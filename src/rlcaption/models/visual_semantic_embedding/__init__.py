"""VisualSemanticEmbedding: the caption-image embedding whose cosine is Ren et al.'s reward."""

from .configuration_visual_semantic_embedding import JOINT_EMBEDDING_ENCODER_TYPES, VisualSemanticEmbeddingConfig
from .modeling_visual_semantic_embedding import (
    CaptionImageEmbedding,
    VisualSemanticEmbedding,
    VisualSemanticEmbeddingPreTrainedModel,
)

__all__ = [
    "JOINT_EMBEDDING_ENCODER_TYPES",
    "CaptionImageEmbedding",
    "VisualSemanticEmbedding",
    "VisualSemanticEmbeddingConfig",
    "VisualSemanticEmbeddingPreTrainedModel",
]
