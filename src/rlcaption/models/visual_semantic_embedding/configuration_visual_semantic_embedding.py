"""Configuration of VisualSemanticEmbedding, the caption-image embedding whose cosine is Ren et al.'s reward."""

from __future__ import annotations

from transformers import PretrainedConfig

from rlcaption.models.show_tell_rl.encoders import ImageEncoderConfigMixin

__all__ = ["VisualSemanticEmbeddingConfig"]


class VisualSemanticEmbeddingConfig(ImageEncoderConfigMixin, PretrainedConfig):
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
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of linear and embedding weights.
        pad_token_id (`int`, *optional*, defaults to 0), bos_token_id (`int`, *optional*, defaults to 1),
        eos_token_id (`int`, *optional*, defaults to 2):
            Special token ids; the defaults are those of [`CaptionProcessor`]. The GRU reads the tokens after
            `<bos>`, the end token included.
        kwargs (*optional*):
            The fields of the image encoder, whose output `f_I` is mapped by `l_e`: all those of
            [`ImageEncoderConfigMixin`] (`encoder_type`, `image_size`, `cnn_channels`, `backbone`,
            `image_feature_size`, ...). [`VisualSemanticEmbedding.from_captioner`] sets `freeze_image_encoder` for
            the captioner's pretrained CNN it copies: the image side is then a linear map of fixed pretrained
            features, as in Shi et al. 2018 (and Ren et al. 2017, on VGG-16 features). Then the fields of
            [`PretrainedConfig`].

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
        self._init_image_encoder_fields(kwargs)
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
        self._validate_image_encoder_fields()
