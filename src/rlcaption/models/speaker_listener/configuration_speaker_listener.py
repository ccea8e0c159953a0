"""Configuration of SpeakerListener, the cooperative speaker-listener captioner of Vered et al. 2019."""

from __future__ import annotations

from transformers import PretrainedConfig

from rlcaption.models.show_tell_rl import ShowTellRLConfig
from rlcaption.models.show_tell_rl.encoders import check_cnn_fields

__all__ = ["SpeakerListenerConfig"]


class SpeakerListenerConfig(PretrainedConfig):
    r"""
    Configuration of [`SpeakerListener`]: a [`ShowTellRL`] speaker (its config nested as `speaker_config`) and a
    listener that embeds captions and images into one space.

    The listener embeds a caption by multiplying each step's word vector over the vocabulary by the speaker's word
    embedding matrix, running a GRU over the steps and mapping its last state linearly into the joint space; it embeds
    an image by a linear map of the features of its own image encoder, of the speaker's kind: a CNN, a copy of the
    speaker's vision backbone, or the speaker's precomputed features (the paper's listener; grids and regions pooled
    by their masked mean). Both embeddings are L2-normalised, so their dot product is the cosine
    similarity `Φ(w, I)` of Vered et al. 2019.

    Args:
        speaker_config ([`ShowTellRLConfig`] or `dict`, *optional*):
            The speaker; a default [`ShowTellRLConfig`] when unset. The listener's image encoder is of its
            `encoder_type`: a CNN (of `listener_cnn_channels`), its `backbone_config` (frozen as `freeze_backbone`
            says), or its `image_feature_size` and `image_feature_layout`.
        listener_hidden_size (`int`, *optional*, defaults to 512):
            State size of the listener's GRU over the caption.
        joint_embedding_size (`int`, *optional*, defaults to 512):
            Size of the joint caption-image space.
        listener_cnn_channels (`list[int]`, *optional*):
            Output channels of the listener's CNN blocks (`"cnn"` speakers); the speaker's `cnn_channels` when unset.
        freeze_listener_image_encoder (`bool`, *optional*, defaults to `False`):
            Keep the listener's image encoder fixed. [`SpeakerListener.from_speaker`] sets it when it gives the
            listener a copy of the speaker's pretrained, fixed encoder: the listener then maps fixed pretrained CNN
            features linearly, as in Vered et al. 2019 (where both networks read a pretrained ResNet's features).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of the listener's linear weights.

    Example:

    ```python
    >>> from rlcaption.models import ShowTellRLConfig, SpeakerListener, SpeakerListenerConfig
    >>> speaker_config = ShowTellRLConfig(vocab_size=200, hidden_size=256, word_embedding_size=256)
    >>> model = SpeakerListener(SpeakerListenerConfig(speaker_config=speaker_config, joint_embedding_size=128))
    ```
    """

    model_type = "speaker_listener"
    sub_configs_defaults = {"speaker_config": ShowTellRLConfig}

    def __init__(
        self,
        speaker_config: ShowTellRLConfig | dict | None = None,
        listener_hidden_size: int = 512,
        joint_embedding_size: int = 512,
        listener_cnn_channels: list[int] | tuple[int, ...] | None = None,
        freeze_listener_image_encoder: bool = False,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        if speaker_config is None:
            speaker_config = ShowTellRLConfig()
        elif isinstance(speaker_config, dict):
            speaker_config = ShowTellRLConfig(**speaker_config)
        self.speaker_config = speaker_config
        self.listener_hidden_size = listener_hidden_size
        self.joint_embedding_size = joint_embedding_size
        if listener_cnn_channels is None and speaker_config.encoder_type == "cnn":
            listener_cnn_channels = speaker_config.cnn_channels
        self.listener_cnn_channels = None if listener_cnn_channels is None else list(listener_cnn_channels)
        self.freeze_listener_image_encoder = freeze_listener_image_encoder
        self.initializer_range = initializer_range
        # the listener reads the speaker's word embeddings, but nothing ties input and output weights
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
        self._validate_listener_fields()

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> ShowTellRLConfig:
        """The speaker's config: the speaker reads and writes the captions, so its vocabulary and special tokens are
        the model's (those the Trainer aligns with the tokenizer, and generation reads)."""
        return self.speaker_config

    def _validate_listener_fields(self) -> None:
        if not isinstance(self.speaker_config, ShowTellRLConfig):
            raise ValueError(
                f"SpeakerListenerConfig.speaker_config must be a ShowTellRLConfig or its dict, got "
                f"{type(self.speaker_config).__name__}."
            )
        for name in ("listener_hidden_size", "joint_embedding_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SpeakerListenerConfig.{name} must be a positive int, got {value!r}.")
        if self.speaker_config.encoder_type == "cnn":
            # the listener's own CNN reads the speaker's images
            check_cnn_fields(self.listener_cnn_channels, self.speaker_config.image_size, "listener_cnn_channels")
