"""ShowTellRL: the Show-and-Tell LSTM captioner of Liu et al. 2017."""

from .configuration_show_tell_rl import ShowTellRLConfig
from .modeling_show_tell_rl import ShowTellRL, ShowTellRLOutput, ShowTellRLPreTrainedModel
from .state_show_tell_rl import CACHE_NAME, ShowTellRLPrefixStates, ShowTellRLState

__all__ = [
    "CACHE_NAME",
    "ShowTellRL",
    "ShowTellRLConfig",
    "ShowTellRLOutput",
    "ShowTellRLPreTrainedModel",
    "ShowTellRLPrefixStates",
    "ShowTellRLState",
]
