"""Configuration of ShapesCLIP, a small CLIP-style dual encoder trained from scratch on the shapes dataset."""

from __future__ import annotations

from transformers import PretrainedConfig

from rlcaption.models.show_tell_rl.encoders import IMAGE_ENCODER_TYPES, ImageEncoderConfigMixin

__all__ = ["ShapesCLIPConfig"]


class ShapesCLIPConfig(ImageEncoderConfigMixin, PretrainedConfig):
    r"""
    Configuration of [`ShapesCLIPModel`]: an image tower and a text tower, each followed by a LayerNorm and a linear
    projection into one `projection_dim`-wide embedding space, compared by cosine similarity times `exp(logit_scale)`
    (Radford et al. 2021).

    Args:
        vocab_size (`int`, *optional*, defaults to 100):
            Size of the word vocabulary, special tokens included (take it from the processor's tokenizer).
        word_embedding_size (`int`, *optional*, defaults to 128):
            Width of the word embeddings, the text tower's input.
        text_hidden_size (`int`, *optional*, defaults to 128):
            State size of each direction of the text tower's bidirectional GRU.
        text_num_layers (`int`, *optional*, defaults to 1):
            Number of stacked bidirectional GRU layers.
        projection_dim (`int`, *optional*, defaults to 128):
            Width of the shared image-text embedding space.
        logit_scale_init_value (`float`, *optional*, defaults to 2.6592):
            Initial value of `logit_scale` (log of the inverse temperature; CLIP's `ln(1 / 0.07)`).
        max_position_embeddings (`int`, *optional*, defaults to 32):
            Longest caption, in tokens with `<bos>` and `<eos>`, the model is meant for (the processor's truncation
            length; the GRU itself has no position limit).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of linear and embedding weights.
        pad_token_id (`int`, *optional*, defaults to 0), bos_token_id (`int`, *optional*, defaults to 1),
        eos_token_id (`int`, *optional*, defaults to 2):
            Special token ids; the defaults are those of [`CaptionProcessor`]. The text tower reads every
            non-padding token (the attention mask gives the lengths), so it does not depend on where `<eos>` is.
        kwargs (*optional*):
            The fields of the image tower, those of [`ImageEncoderConfigMixin`] that an encoder trained from scratch
            on pixels has: `encoder_type` (`"cnn"`, whose flattened last feature map keeps the spatial layout, or
            `"backbone"`, randomly initialised from `backbone_config`, e.g. `{"model_type": "vit", "image_size": 48,
            "patch_size": 16, "hidden_size": 128, ...}`), `image_size` (defaults to 48; the processor resizes every
            image to it, and a backbone must expect it), `num_channels`, `cnn_channels` (defaults to
            `[16, 32, 64, 64]`) and `backbone_config`. Then the fields of [`PretrainedConfig`].

    Example:

    ```python
    >>> from rlcaption.models import ShapesCLIPConfig, ShapesCLIPModel
    >>> config = ShapesCLIPConfig(vocab_size=90)
    >>> model = ShapesCLIPModel(config)
    ```
    """

    model_type = "shapes_clip"
    # a CLIP embeds pixels with an image tower trained from scratch: no precomputed features, no pretrained or frozen
    # backbone, and a smaller default CNN
    image_encoder_types = IMAGE_ENCODER_TYPES
    image_encoder_defaults = {
        "encoder_type": "cnn",
        "image_size": 48,
        "num_channels": 3,
        "cnn_channels": (16, 32, 64, 64),
        "backbone_config": None,
    }

    def __init__(
        self,
        vocab_size: int = 100,
        word_embedding_size: int = 128,
        text_hidden_size: int = 128,
        text_num_layers: int = 1,
        projection_dim: int = 128,
        logit_scale_init_value: float = 2.6592,
        max_position_embeddings: int = 32,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.word_embedding_size = word_embedding_size
        self.text_hidden_size = text_hidden_size
        self.text_num_layers = text_num_layers
        self._init_image_encoder_fields(kwargs)
        self.projection_dim = projection_dim
        self.logit_scale_init_value = logit_scale_init_value
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        kwargs["tie_word_embeddings"] = False
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
        self._validate_shapes_clip_fields()

    def _validate_shapes_clip_fields(self) -> None:
        for name in (
            "vocab_size",
            "word_embedding_size",
            "text_hidden_size",
            "text_num_layers",
            "projection_dim",
            "image_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ShapesCLIPConfig.{name} must be a positive int, got {value!r}.")
        special = {"pad_token_id": self.pad_token_id, "bos_token_id": self.bos_token_id}
        special["eos_token_id"] = self.eos_token_id
        for name, token_id in special.items():
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"ShapesCLIPConfig.{name}={token_id!r} is not a token id of a vocabulary of size "
                    f"{self.vocab_size}; take the ids from the processor's tokenizer."
                )
        self._validate_image_encoder_fields()
        if (
            self.encoder_type == "backbone"
            and self.backbone_config.get("image_size", self.image_size) != self.image_size
        ):
            raise ValueError(
                f"The backbone expects {self.backbone_config['image_size']}px images but image_size="
                f"{self.image_size}; give both the same value (the processor resizes to image_size)."
            )
