"""Configuration of VisualSemanticEmbedding, the caption-image embedding whose cosine is Ren et al.'s reward."""

from __future__ import annotations

from transformers import PretrainedConfig

__all__ = ["JOINT_EMBEDDING_ENCODER_TYPES", "VisualSemanticEmbeddingConfig"]

# The image encoders a joint-embedding network builds for itself: a small CNN trained from scratch (or copied from a
# captioner's pretrained one), or a linear map of precomputed features. A vision backbone is not built a second time:
# extract its features once instead.
JOINT_EMBEDDING_ENCODER_TYPES = ("cnn", "features")


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
            `"cnn"` (a small CNN, see [`ConvImageEncoder`]) or `"features"` (precomputed `image_features`).
        image_size (`int`, *optional*, defaults to 64):
            Side of the square input images (`"cnn"` encoder).
        num_channels (`int`, *optional*, defaults to 3):
            Input image channels (`"cnn"` encoder).
        cnn_channels (`list[int]`, *optional*, defaults to `[32, 64, 64, 64]`):
            Output channels of the CNN blocks; each block halves the image side.
        image_feature_size (`int`, *optional*):
            Width of precomputed `image_features` (`"features"` encoder).
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
        image_feature_size: int | None = None,
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
        self.image_feature_size = image_feature_size
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
        if self.encoder_type not in JOINT_EMBEDDING_ENCODER_TYPES:
            raise ValueError(
                f"VisualSemanticEmbeddingConfig.encoder_type={self.encoder_type!r} is not one of "
                f"{JOINT_EMBEDDING_ENCODER_TYPES}; for a vision backbone, extract features once (`rlcaption "
                "extract-features`) and use encoder_type='features'."
            )
        if self.encoder_type == "cnn":
            channels = self.cnn_channels
            if not channels or any(not isinstance(c, int) or c < 1 for c in channels):
                raise ValueError(f"cnn_channels must be a non-empty list of positive ints, got {channels!r}.")
            reduction = 2 ** len(channels)
            if self.image_size % reduction != 0:
                raise ValueError(
                    f"image_size={self.image_size} must be divisible by {reduction} (each of the {len(channels)} CNN "
                    "blocks halves the side); change image_size or cnn_channels."
                )
        elif not isinstance(self.image_feature_size, int) or self.image_feature_size < 1:
            raise ValueError(
                "encoder_type='features' needs image_feature_size (the width of the precomputed image features), "
                f"got {self.image_feature_size!r}."
            )
