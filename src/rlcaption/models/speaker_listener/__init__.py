"""SpeakerListener: the cooperative speaker-listener captioner of Vered et al. 2019."""

from .configuration_speaker_listener import SpeakerListenerConfig
from .modeling_speaker_listener import Listener, SpeakerListener, SpeakerListenerPreTrainedModel

__all__ = [
    "Listener",
    "SpeakerListener",
    "SpeakerListenerConfig",
    "SpeakerListenerPreTrainedModel",
]
