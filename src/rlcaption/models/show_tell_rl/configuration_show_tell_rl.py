"""Configuration of ShowTellRL, the Show-and-Tell captioner of Liu et al. 2017."""

from __future__ import annotations

from transformers import PretrainedConfig

from .encoders import ImageEncoderConfigMixin

__all__ = ["ShowTellRLConfig"]


class ShowTellRLConfig(ImageEncoderConfigMixin, PretrainedConfig):
    r"""
    Configuration of [`ShowTellRL`]: image encoder -> linear -> first LSTM input, then an LSTM over the words; with
    `image_attention`, every word is also predicted from a soft attention over the encoder's feature grid.

    Args:
        vocab_size (`int`, *optional*, defaults to 1000):
            Size of the word vocabulary, special tokens included (take it from the processor's tokenizer).
        hidden_size (`int`, *optional*, defaults to 512):
            LSTM state size (512 in Liu et al. 2017).
        word_embedding_size (`int`, *optional*, defaults to 512):
            Size of the word embeddings and of the projected image embedding (both are LSTM inputs).
        num_layers (`int`, *optional*, defaults to 1):
            Number of stacked LSTM layers (1 in Liu et al. 2017).
        dropout (`float`, *optional*, defaults to 0.5):
            Dropout on the LSTM output before the vocabulary projection, and between stacked LSTM layers.
        image_attention (`bool`, *optional*, defaults to `False`):
            Attend over the image encoder's feature grid at every step (Show, Attend and Tell; Xu et al. 2015): the
            LSTM output queries the grid cells (with learned position embeddings for the `"cnn"` encoder) and the
            word is predicted from both. Without it the image is read once, before `<bos>` (Show and Tell), which is
            too little to bind each colour to its shape. With precomputed `"features"`, needs
            `image_feature_layout="grid"`.
        max_caption_length (`int`, *optional*, defaults to 20):
            Most tokens a generated caption gets after `<bos>`, its end token included: the trainer's
            `max_caption_length`. The generation config's `max_length`, which counts `<bos>` too, is this + 1.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of linear and embedding weights.
        image_feature_extractor (`dict`, *optional*):
            With precomputed `"features"`: what extracted them, as `rlcaption extract-features` records it in its
            manifest (`model`, the backbone's Hub id or folder; `image_processor`, its settings; `pooling`; `layout`;
            `feature_shape`). Given `pixel_values` (prepared by that image processor, which the processor saved with
            the model carries), the model runs that backbone itself, loaded once and not saved with it: `generate`,
            the `image-text-to-text` pipeline and `rlcaption caption` caption photos. `None` for features with no
            such record (region features, which need a detector).
        pad_token_id (`int`, *optional*, defaults to 0), bos_token_id (`int`, *optional*, defaults to 1),
        eos_token_id (`int`, *optional*, defaults to 2):
            Special token ids; the defaults are those of [`CaptionProcessor`].
        kwargs (*optional*):
            The fields of the image encoder, whose output is projected to the first LSTM input (and whose grid
            `image_attention` attends over): all those of [`ImageEncoderConfigMixin`] (`encoder_type`, `image_size`,
            `cnn_channels`, `backbone`, `image_feature_size`, ...). Then those of [`PretrainedConfig`].

    Example:

    ```python
    >>> from rlcaption import ShowTellRL, ShowTellRLConfig
    >>> config = ShowTellRLConfig(vocab_size=200, hidden_size=256, word_embedding_size=256)
    >>> model = ShowTellRL(config)
    ```
    """

    model_type = "show_tell_rl"

    def __init__(
        self,
        vocab_size: int = 1000,
        hidden_size: int = 512,
        word_embedding_size: int = 512,
        num_layers: int = 1,
        dropout: float = 0.5,
        image_attention: bool = False,
        max_caption_length: int = 20,
        initializer_range: float = 0.02,
        image_feature_extractor: dict | None = None,
        pad_token_id: int = 0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.word_embedding_size = word_embedding_size
        self.num_layers = num_layers
        self.dropout = dropout
        self._init_image_encoder_fields(kwargs)
        self.image_attention = image_attention
        self.max_caption_length = max_caption_length
        self.initializer_range = initializer_range
        self.image_feature_extractor = image_feature_extractor
        # the output projection (hidden_size wide) cannot share the word embeddings (word_embedding_size wide)
        kwargs["tie_word_embeddings"] = False
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
        self._validate_show_tell_fields()

    def _validate_show_tell_fields(self) -> None:
        for name in ("vocab_size", "hidden_size", "word_embedding_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ShowTellRLConfig.{name} must be a positive int, got {value!r}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ShowTellRLConfig.dropout must be in [0, 1), got {self.dropout!r}.")
        if not isinstance(self.max_caption_length, int) or self.max_caption_length < 1:
            raise ValueError(
                f"ShowTellRLConfig.max_caption_length counts the tokens after <bos> and must be at least 1, "
                f"got {self.max_caption_length!r}."
            )
        special = {"pad_token_id": self.pad_token_id, "bos_token_id": self.bos_token_id}
        special["eos_token_id"] = self.eos_token_id
        for name, token_id in special.items():
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"ShowTellRLConfig.{name}={token_id!r} is not a token id of a vocabulary of size "
                    f"{self.vocab_size}; take the ids from the processor's tokenizer."
                )
        if len(set(special.values())) != 3:
            raise ValueError(f"The pad, bos and eos token ids must differ, got {special}.")
        self._validate_image_encoder_fields()
        if self.encoder_type == "features" and self.image_attention and self.image_feature_layout != "grid":
            raise ValueError(
                "image_attention=True needs a feature grid, which pooled image features (one vector per image) "
                "do not have; set image_feature_layout='grid' and pass features of shape (batch_size, "
                "num_regions, image_feature_size), or set image_attention=False."
            )
