"""Captioning models (`transformers` `PreTrainedModel`s) and the image encoders they share."""

from rlcaption.models.shapes_clip import ShapesCLIPConfig, ShapesCLIPModel, ShapesCLIPOutput
from rlcaption.models.show_tell_rl import (
    ShowTellRL,
    ShowTellRLConfig,
    ShowTellRLOutput,
    ShowTellRLPreTrainedModel,
    ShowTellRLState,
)

__all__ = [
    "ShapesCLIPConfig",
    "ShapesCLIPModel",
    "ShapesCLIPOutput",
    "ShowTellRL",
    "ShowTellRLConfig",
    "ShowTellRLOutput",
    "ShowTellRLPreTrainedModel",
    "ShowTellRLState",
]

# Registers the Auto classes (AutoConfig, AutoModel, AutoModelForImageTextToText, AutoProcessor).
from rlcaption.models import auto  # noqa: E402, F401
