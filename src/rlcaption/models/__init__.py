"""Captioning models (`transformers` `PreTrainedModel`s) and the image encoders they share."""

from rlcaption.models.show_tell_rl import (
    ShowTellRL,
    ShowTellRLConfig,
    ShowTellRLOutput,
    ShowTellRLPreTrainedModel,
    ShowTellRLState,
)

__all__ = ["ShowTellRL", "ShowTellRLConfig", "ShowTellRLOutput", "ShowTellRLPreTrainedModel", "ShowTellRLState"]
