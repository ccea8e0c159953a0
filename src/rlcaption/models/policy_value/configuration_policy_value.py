"""Configuration of PolicyValueCaptioner, the policy and value networks of Ren et al. 2017."""

from __future__ import annotations

from transformers import PretrainedConfig

from rlcaption.models.show_tell_rl import ShowTellRLConfig
from rlcaption.models.show_tell_rl.encoders import check_cnn_fields

__all__ = ["VALUE_RNN_TYPES", "PolicyValueConfig"]

VALUE_RNN_TYPES = ("gru", "lstm")


class PolicyValueConfig(PretrainedConfig):
    r"""
    Configuration of [`PolicyValueCaptioner`]: a [`ShowTellRL`] policy network (its config nested as
    `policy_config`) and a value network `v(s_t)` that predicts the final reward of a caption from the image and a
    partial caption: its own image encoder, of the policy's kind (a CNN, a copy of the policy's vision backbone, or
    the policy's precomputed features, pooled by their masked mean over grids and regions) mapped to
    `value_hidden_size`, its own word embeddings and recurrent network (a GRU, or Ren et al. 2017's LSTM) over the
    partial caption, and a three-layer perceptron on the concatenated image embedding and recurrent state (Shi et al.
    2018, Fig. 3; a 3-layer perceptron in its Sec. 4.1).

    Args:
        policy_config ([`ShowTellRLConfig`] or `dict`, *optional*):
            The policy; a default [`ShowTellRLConfig`] when unset. The value network's image encoder is of its
            `encoder_type`: a CNN (of `value_cnn_channels`), its `backbone_config` (frozen as `freeze_backbone`
            says), or its `image_feature_size` and `image_feature_layout`.
        value_word_embedding_size (`int`, *optional*, defaults to 512):
            Width of the value network's word embeddings.
        value_hidden_size (`int`, *optional*, defaults to 512):
            State size of the value network's recurrent network, and width of its image embedding.
        value_rnn_type (`str`, *optional*, defaults to `"gru"`):
            The value network's recurrent network over the partial caption: `"gru"`, or `"lstm"` as in Ren et al.
            2017. The default is the GRU that published checkpoints were trained with.
        value_mlp_hidden_size (`int`, *optional*, defaults to 512):
            Width of the two hidden layers of the value network's perceptron.
        value_cnn_channels (`list[int]`, *optional*):
            Output channels of the value network's CNN blocks (`"cnn"` policies); the policy's `cnn_channels` when
            unset.
        freeze_value_image_encoder (`bool`, *optional*, defaults to `False`):
            Keep the value network's image encoder fixed. [`PolicyValueCaptioner.from_policy`] sets it when it gives
            the value network a copy of the policy's pretrained, fixed CNN.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of the value network's linear and embedding weights.

    Example:

    ```python
    >>> from rlcaption.models import PolicyValueCaptioner, PolicyValueConfig, ShowTellRLConfig
    >>> policy_config = ShowTellRLConfig(vocab_size=200, hidden_size=256, word_embedding_size=256)
    >>> model = PolicyValueCaptioner(PolicyValueConfig(policy_config=policy_config, value_hidden_size=128))
    ```
    """

    model_type = "policy_value"
    sub_configs_defaults = {"policy_config": ShowTellRLConfig}

    def __init__(
        self,
        policy_config: ShowTellRLConfig | dict | None = None,
        value_word_embedding_size: int = 512,
        value_hidden_size: int = 512,
        value_mlp_hidden_size: int = 512,
        value_rnn_type: str = "gru",
        value_cnn_channels: list[int] | tuple[int, ...] | None = None,
        freeze_value_image_encoder: bool = False,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        if policy_config is None:
            policy_config = ShowTellRLConfig()
        elif isinstance(policy_config, dict):
            policy_config = ShowTellRLConfig(**policy_config)
        self.policy_config = policy_config
        self.value_word_embedding_size = value_word_embedding_size
        self.value_hidden_size = value_hidden_size
        self.value_mlp_hidden_size = value_mlp_hidden_size
        self.value_rnn_type = value_rnn_type
        if value_cnn_channels is None and policy_config.encoder_type == "cnn":
            value_cnn_channels = policy_config.cnn_channels
        self.value_cnn_channels = None if value_cnn_channels is None else list(value_cnn_channels)
        self.freeze_value_image_encoder = freeze_value_image_encoder
        self.initializer_range = initializer_range
        # the value network has its own word embeddings, and nothing ties the policy's input and output weights
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
        self._validate_value_fields()

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> ShowTellRLConfig:
        """The policy's config: the policy writes the captions, so its vocabulary and special tokens are the model's
        (those the Trainer aligns with the tokenizer, and generation reads)."""
        return self.policy_config

    def _validate_value_fields(self) -> None:
        if not isinstance(self.policy_config, ShowTellRLConfig):
            raise ValueError(
                f"PolicyValueConfig.policy_config must be a ShowTellRLConfig or its dict, got "
                f"{type(self.policy_config).__name__}."
            )
        for name in ("value_word_embedding_size", "value_hidden_size", "value_mlp_hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"PolicyValueConfig.{name} must be a positive int, got {value!r}.")
        if self.value_rnn_type not in VALUE_RNN_TYPES:
            raise ValueError(f"value_rnn_type={self.value_rnn_type!r} is not one of {VALUE_RNN_TYPES}.")
        if self.policy_config.encoder_type == "cnn":
            # the value network's own CNN reads the policy's images
            check_cnn_fields(self.value_cnn_channels, self.policy_config.image_size, "value_cnn_channels")
