"""ShapesCLIP: a small CLIP-style dual encoder trained on the shapes data, standing in for OpenAI CLIP."""

from .configuration_shapes_clip import ShapesCLIPConfig
from .modeling_shapes_clip import ShapesCLIPModel, ShapesCLIPOutput, ShapesCLIPPreTrainedModel, ShapesCLIPTextEncoder

__all__ = [
    "ShapesCLIPConfig",
    "ShapesCLIPModel",
    "ShapesCLIPOutput",
    "ShapesCLIPPreTrainedModel",
    "ShapesCLIPTextEncoder",
]
