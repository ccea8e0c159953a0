"""Registrations that let the `transformers` Auto classes resolve rlcaption's models and processor.

Importing this module (done by `import rlcaption`) is enough: afterwards `AutoConfig`, `AutoModel`,
`AutoModelForImageTextToText` and `AutoProcessor` load folders and hub repos saved by rlcaption. Saved checkpoints
carry no code: they load wherever rlcaption is installed. To publish one that also loads with `trust_remote_code=True`
for users without rlcaption, register the classes before saving:

    ShowTellRLConfig.register_for_auto_class("AutoConfig")
    ShowTellRL.register_for_auto_class("AutoModel")
"""

from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText, AutoProcessor

from rlcaption.models.shapes_clip import ShapesCLIPConfig, ShapesCLIPModel
from rlcaption.models.show_tell_rl import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor

__all__: list[str] = []

AutoConfig.register(ShowTellRLConfig.model_type, ShowTellRLConfig, exist_ok=True)
AutoModel.register(ShowTellRLConfig, ShowTellRL, exist_ok=True)
AutoModelForImageTextToText.register(ShowTellRLConfig, ShowTellRL, exist_ok=True)
AutoProcessor.register(ShowTellRLConfig, CaptionProcessor, exist_ok=True)

AutoConfig.register(ShapesCLIPConfig.model_type, ShapesCLIPConfig, exist_ok=True)
AutoModel.register(ShapesCLIPConfig, ShapesCLIPModel, exist_ok=True)
AutoProcessor.register(ShapesCLIPConfig, CaptionProcessor, exist_ok=True)
