"""PolicyValueCaptioner: the policy network and value network of Ren et al. 2017, with lookahead decoding."""

from .configuration_policy_value import PolicyValueConfig
from .modeling_policy_value import (
    PolicyValueCaptioner,
    PolicyValuePreTrainedModel,
    ValueLookaheadLogitsProcessor,
    ValueNetwork,
)

__all__ = [
    "PolicyValueCaptioner",
    "PolicyValueConfig",
    "PolicyValuePreTrainedModel",
    "ValueLookaheadLogitsProcessor",
    "ValueNetwork",
]
