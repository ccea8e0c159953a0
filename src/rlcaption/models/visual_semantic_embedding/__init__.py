"""VisualSemanticEmbedding: the caption-image embedding whose cosine is Ren et al.'s reward."""

from .configuration_visual_semantic_embedding import VisualSemanticEmbeddingConfig
from .modeling_visual_semantic_embedding import (
    CaptionImageEmbedding,
    VisualSemanticEmbedding,
    VisualSemanticEmbeddingPreTrainedModel,
)

__all__ = [
    "CaptionImageEmbedding",
    "VisualSemanticEmbedding",
    "VisualSemanticEmbeddingConfig",
    "VisualSemanticEmbeddingPreTrainedModel",
]
