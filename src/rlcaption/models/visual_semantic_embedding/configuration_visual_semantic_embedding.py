"""Configuration of VisualSemanticEmbedding, the caption-image embedding whose cosine is Ren et al.'s reward."""

from __future__ import annotations

from transformers import PretrainedConfig

from rlcaption.models.encoders import check_image_encoder_fields, resolve_backbone_config

__all__ = ["VisualSemanticEmbeddingConfig"]


class VisualSemanticEmbeddingConfig(PretrainedConfig):
    r"""
    Configuration of [`VisualSemanticEmbedding`]: word embeddings and a GRU whose last state, linearly mapped, embeds a
    caption; a linear map `l_e` of image features `f_I` embeds an image; both L2-normalised into one space, where the
    reward of Ren et al. 2017 (Shi et al. 2018, eq. 6) is the cosine of a caption and its image.

    Args:
        vocab_size (`int`, *optional*, defaults to 1000):
            Size of the word vocabulary, special tokens included (take it from the processor's tokenizer).
        word_embedding_size (`int`, *optional*, defaults to 300):
            Width of the word embeddings, the GRU's input.
        hidden_size (`int`, *optional*, defaults to 512):
            State size of the GRU over the caption.
        joint_embedding_size (`int`, *optional*, defaults to 512):
            Width of the joint caption-image space.
        encoder_type (`str`, *optional*, defaults to `"cnn"`):
            `"cnn"` (a small CNN, see [`ConvImageEncoder`]), `"backbone"` (any `transformers` vision model, pooled
            output) or `"features"` (precomputed `image_features`).
        image_size (`int`, *optional*, defaults to 64):
            Side of the square input images (`"cnn"` encoder).
        num_channels (`int`, *optional*, defaults to 3):
            Input image channels (`"cnn"` encoder).
        cnn_channels (`list[int]`, *optional*, defaults to `[32, 64, 64, 64]`):
            Output channels of the CNN blocks; each block halves the image side.
        backbone (`str`, *optional*):
            Hub id or local folder of a `transformers` vision model (`"backbone"` encoder). Its config is read at
            once and stored in `backbone_config`.
        backbone_config (`dict`, *optional*):
            Config of the vision backbone as a dict with its `model_type` (`"backbone"` encoder); builds a randomly
            initialised backbone when `use_pretrained_backbone` is False.
        use_pretrained_backbone (`bool`, *optional*):
            Load the weights of `backbone` when the model is built. Defaults to True when `backbone` is given. The
            model sets it to False once the weights are part of it, so reloading a saved model downloads nothing.
        freeze_backbone (`bool`, *optional*, defaults to `True`):
            Keep the backbone's weights fixed (`"backbone"` encoder).
        image_feature_size (`int`, *optional*):
            Width of precomputed `image_features` (`"features"` encoder).
        image_feature_layout (`str`, *optional*, defaults to `"pooled"`):
            How precomputed `image_features` hold an image (`"features"` encoder): `"pooled"`, one vector per image
            `(batch_size, image_feature_size)`; or `"grid"`, a fixed grid or regions `(batch_size, num_regions,
            image_feature_size)` with an `image_feature_mask` `(batch_size, num_regions)`, 1 for a real region and 0
            for padding; the image is then the mean of its real regions.
        freeze_image_encoder (`bool`, *optional*, defaults to `False`):
            Keep the CNN fixed, e.g. a captioner's pretrained encoder copied by
            [`VisualSemanticEmbedding.from_captioner`]: the image side is then a linear map of fixed pretrained
            features, as in Shi et al. 2018 (and Ren et al. 2017, on VGG-16 features).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of linear and embedding weights.
        pad_token_id (`int`, *optional*, defaults to 0), bos_token_id (`int`, *optional*, defaults to 1),
        eos_token_id (`int`, *optional*, defaults to 2):
            Special token ids; the defaults are those of [`CaptionProcessor`]. The GRU reads the tokens after
            `<bos>`, the end token included.

    Example:

    ```python
    >>> from rlcaption.models import VisualSemanticEmbedding, VisualSemanticEmbeddingConfig
    >>> model = VisualSemanticEmbedding(VisualSemanticEmbeddingConfig(vocab_size=90, image_size=48))
    ```
    """

    model_type = "visual_semantic_embedding"

    def __init__(
        self,
        vocab_size: int = 1000,
        word_embedding_size: int = 300,
        hidden_size: int = 512,
        joint_embedding_size: int = 512,
        encoder_type: str = "cnn",
        image_size: int = 64,
        num_channels: int = 3,
        cnn_channels: list[int] | tuple[int, ...] = (32, 64, 64, 64),
        backbone: str | None = None,
        backbone_config: dict | None = None,
        use_pretrained_backbone: bool | None = None,
        freeze_backbone: bool = True,
        image_feature_size: int | None = None,
        image_feature_layout: str = "pooled",
        freeze_image_encoder: bool = False,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.word_embedding_size = word_embedding_size
        self.hidden_size = hidden_size
        self.joint_embedding_size = joint_embedding_size
        self.encoder_type = encoder_type
        self.image_size = image_size
        self.num_channels = num_channels
        self.cnn_channels = list(cnn_channels)
        self.backbone = backbone
        self.backbone_config = resolve_backbone_config(encoder_type, backbone, backbone_config)
        self.use_pretrained_backbone = (
            backbone is not None if use_pretrained_backbone is None else use_pretrained_backbone
        )
        self.freeze_backbone = freeze_backbone
        self.image_feature_size = image_feature_size
        self.image_feature_layout = image_feature_layout
        self.freeze_image_encoder = freeze_image_encoder
        self.initializer_range = initializer_range
        kwargs["tie_word_embeddings"] = False  # no output projection over the vocabulary to tie
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
        self._validate_embedding_fields()

    def _validate_embedding_fields(self) -> None:
        for name in ("vocab_size", "word_embedding_size", "hidden_size", "joint_embedding_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"VisualSemanticEmbeddingConfig.{name} must be a positive int, got {value!r}.")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            token_id = getattr(self, name)
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"VisualSemanticEmbeddingConfig.{name}={token_id!r} is not a token id of a vocabulary of size "
                    f"{self.vocab_size}; take the ids from the processor's tokenizer."
                )
        check_image_encoder_fields(self, "VisualSemanticEmbeddingConfig")
