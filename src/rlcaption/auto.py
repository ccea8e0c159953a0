"""Registrations that let the `transformers` Auto classes resolve rlcaption's models and processor.

Importing this module (done by `import rlcaption`, or by importing any of its modules) is enough: afterwards
`AutoConfig`, `AutoModel`, `AutoModelForImageTextToText` and `AutoProcessor` load folders and hub repos saved by
rlcaption, and so does the captioning pipeline of transformers 5:

    captioner = pipeline("image-text-to-text", model="checkpoints/show-tell-rl-shapes-xe")
    captioner(images=image, text="")  # a whole caption; a text such as "a red" is continued

Saved checkpoints carry no code, so transformers alone does not know their classes: without rlcaption imported,
`AutoConfig` refuses the `show_tell_rl` model type and `AutoProcessor` falls back to the bare tokenizer. To publish a
checkpoint that also loads with `trust_remote_code=True` for users without rlcaption, register the classes before
saving; the code saved next to the weights is then standalone:

    ShowTellRLConfig.register_for_auto_class("AutoConfig")
    ShowTellRL.register_for_auto_class("AutoModelForImageTextToText")  # the class the pipeline loads
    CaptionProcessor.register_for_auto_class("AutoProcessor")
"""

from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText, AutoProcessor

from rlcaption.models.policy_value import PolicyValueCaptioner, PolicyValueConfig
from rlcaption.models.shapes_clip import ShapesCLIPConfig, ShapesCLIPModel
from rlcaption.models.show_tell_rl import ShowTellRL, ShowTellRLConfig
from rlcaption.models.speaker_listener import SpeakerListener, SpeakerListenerConfig
from rlcaption.models.visual_semantic_embedding import VisualSemanticEmbedding, VisualSemanticEmbeddingConfig
from rlcaption.processing import CaptionProcessor

__all__: list[str] = []

# (config, model, whether it captions): every model loads with AutoModel and its processor with AutoProcessor; the
# captioners also with AutoModelForImageTextToText, the class transformers' captioning pipeline loads
_MODELS = (
    (ShowTellRLConfig, ShowTellRL, True),
    (SpeakerListenerConfig, SpeakerListener, True),
    (PolicyValueConfig, PolicyValueCaptioner, True),
    (ShapesCLIPConfig, ShapesCLIPModel, False),
    (VisualSemanticEmbeddingConfig, VisualSemanticEmbedding, False),
)
for config_class, model_class, captions in _MODELS:
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, model_class, exist_ok=True)
    if captions:
        AutoModelForImageTextToText.register(config_class, model_class, exist_ok=True)
    AutoProcessor.register(config_class, CaptionProcessor, exist_ok=True)
