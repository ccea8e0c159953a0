"""VisualSemanticEmbedding: the caption-image embedding of Ren et al. (CVPR 2017), "Deep Reinforcement
Learning-based Image Captioning with Embedding Reward") as a `transformers` model.

A caption `S` is embedded by word embeddings, a GRU and a linear map of its last state `h_T(S)`; an image by a linear
map `l_e` of its features `f_I` (from a CNN, a `transformers` vision backbone, or precomputed features: pooled vectors,
or the masked mean of a grid or of regions); both are L2-normalised, so the dot product of a caption and an image
embedding is Ren et al.'s reward `cos(h_T(S), l_e(f_I))` (Shi et al. 2018, eq. 6). The network is
[`CaptionImageEmbedding`], which Vered et al.'s listener ([`Listener`]) is too: the listener reads the speaker's word
embeddings, this model has its own.

The interface is that of `transformers.CLIPModel` (`get_text_features`, `get_image_features`), so the CLIP tools of
`rlcaption.metrics.clip` (embedding, retrieval) work on it. Train it with
[`rlcaption.rewards.embedding.train_embedding_model`]; score captions with the `embedding` reward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

from rlcaption.models.show_tell_rl.encoders import (
    build_image_encoder,
    image_encoder_arguments,
    init_cnn_and_gru_weights,
)
from rlcaption.models.show_tell_rl.hub_errors import HubUploadErrorsMixin

from .configuration_visual_semantic_embedding import VisualSemanticEmbeddingConfig

__all__ = ["CaptionImageEmbedding", "VisualSemanticEmbedding", "VisualSemanticEmbeddingPreTrainedModel"]


class CaptionImageEmbedding(nn.Module):
    """
    A visual-semantic embedding network (Kiros et al. 2014): a GRU over a caption's word vectors whose last state is
    mapped linearly into a joint space, and a linear map of an image encoder's features into the same space; both
    embeddings are L2-normalised, so their dot product is their cosine similarity.

    Args:
        image_encoder (`nn.Module`): an encoder of `rlcaption.models.show_tell_rl.encoders` (see
            [`build_image_encoder`]): a [`ConvImageEncoder`] or [`BackboneImageEncoder`] (reads `pixel_values`) or a
            [`PrecomputedFeatureEncoder`] (reads `image_features` and `image_feature_mask`), with its `output_size`.
        word_embedding_size (`int`): width of the word vectors the GRU reads.
        hidden_size (`int`): state size of the GRU.
        joint_embedding_size (`int`): width of the joint space.
    """

    def __init__(
        self, image_encoder: nn.Module, word_embedding_size: int, hidden_size: int, joint_embedding_size: int
    ):
        super().__init__()
        self.image_encoder = image_encoder
        self.image_projection = nn.Linear(image_encoder.output_size, joint_embedding_size)
        self.caption_rnn = nn.GRU(word_embedding_size, hidden_size, batch_first=True)
        self.caption_projection = nn.Linear(hidden_size, joint_embedding_size)

    def embed_word_vectors(
        self, inputs: torch.FloatTensor, caption_mask: torch.Tensor | None = None
    ) -> torch.FloatTensor:
        """
        Embeds captions given as the word vectors of their steps.

        Args:
            inputs (`torch.FloatTensor` of shape `(batch_size, num_steps, word_embedding_size)`): the GRU's inputs.
            caption_mask (`torch.Tensor` of shape `(batch_size, num_steps)`, *optional*): 1 on each caption's steps,
                0 after them; every step counts when unset. The GRU stops at each caption's last step.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, joint_embedding_size)`, of unit norm.
        """
        if caption_mask is None:
            lengths = torch.full((inputs.shape[0],), inputs.shape[1], dtype=torch.long)
        else:
            lengths = caption_mask.long().sum(dim=1).cpu()
        if bool((lengths < 1).any()):
            raise ValueError(f"Every caption needs at least one step (its end token); got lengths {lengths.tolist()}.")
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        _, last_state = self.caption_rnn(packed)  # (1, B, H), in the captions' order
        return F.normalize(self.caption_projection(last_state[0]), dim=-1)

    def embed_images(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        Embeds images with this network's own encoder.

        Args:
            pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`, *optional*):
                Images, for a CNN or vision backbone encoder.
            image_features (`torch.FloatTensor` of shape `(batch_size, image_feature_size)`, or `(batch_size,
            num_regions, image_feature_size)` for grids and regions, *optional*):
                Precomputed features, for a features encoder.
            image_feature_mask (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*):
                1 for a real region, 0 for padding; an image is the mean of its real regions.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, joint_embedding_size)`, of unit norm.
        """
        arguments = image_encoder_arguments(
            self.image_encoder, pixel_values, image_features, image_feature_mask, self.image_projection.weight.dtype
        )
        features = self.image_encoder(*arguments)  # (B, F)
        return F.normalize(self.image_projection(features), dim=-1)


class VisualSemanticEmbeddingPreTrainedModel(HubUploadErrorsMixin, PreTrainedModel):
    config_class = VisualSemanticEmbeddingConfig
    config: VisualSemanticEmbeddingConfig
    base_model_prefix = "visual_semantic_embedding"
    main_input_name = "input_ids"
    input_modalities = ("image", "text")
    _no_split_modules = ["CaptionImageEmbedding"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if not init_cnn_and_gru_weights(module):
            super()._init_weights(module)


class VisualSemanticEmbedding(VisualSemanticEmbeddingPreTrainedModel):
    """
    Ren et al.'s visual-semantic embedding: its own word embeddings (`self.word_embeddings`) and a
    [`CaptionImageEmbedding`] (`self.embedding`).

    Example:

    ```python
    >>> import torch
    >>> from rlcaption import CaptionProcessor, load_shapes
    >>> from rlcaption.models import VisualSemanticEmbedding, VisualSemanticEmbeddingConfig
    >>> from rlcaption.rewards.embedding import train_embedding_model
    >>> shapes = load_shapes(image_size=48)
    >>> processor = CaptionProcessor.from_captions(shapes["train"]["captions"], image_size=48)
    >>> config = VisualSemanticEmbeddingConfig(vocab_size=len(processor.tokenizer), image_size=48)
    >>> model = VisualSemanticEmbedding(config)
    >>> losses = train_embedding_model(model, processor, shapes["train"])
    >>> inputs = processor(images=shapes["test"]["image"][:1], text=["a red circle"])
    >>> with torch.no_grad():
    ...     similarity = model(**inputs)  # (1, 1): the cosine of the caption and the image
    ```
    """

    def __init__(self, config: VisualSemanticEmbeddingConfig):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.word_embedding_size)
        self.embedding = CaptionImageEmbedding(
            build_image_encoder(config), config.word_embedding_size, config.hidden_size, config.joint_embedding_size
        )
        self.post_init()
        if config.encoder_type == "backbone" and config.use_pretrained_backbone:
            # after post_init, which would otherwise re-initialise the pretrained weights
            self.embedding.image_encoder.load_pretrained_backbone(config.backbone)
            # the weights are now part of this model: a saved copy must not download them again
            config.use_pretrained_backbone = False
        self._freeze_image_encoder()

    def _freeze_image_encoder(self) -> None:
        if self.config.freeze_image_encoder:
            self.embedding.image_encoder.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for
        model._freeze_image_encoder()  # loading materialises fresh, trainable parameters
        return loaded

    @classmethod
    def from_captioner(cls, captioner: nn.Module, **fields) -> VisualSemanticEmbedding:
        """
        A new embedding over the vocabulary and images of `captioner` (a [`ShowTellRL`], e.g. the XE policy).

        When the captioner's CNN is fixed (pretrained, e.g. on the shapes scene annotations), the embedding's CNN
        starts as a copy of it and stays fixed, so that `l_e` maps fixed pretrained features, as in Ren et al. 2017.
        A captioner's vision backbone is copied too (frozen or fine-tuned as its `freeze_backbone` says), and its
        precomputed features are read alike (pooled, or grids and regions). The copy is the embedding's own.

        Args:
            captioner: a captioner with a `"cnn"`, `"backbone"` or `"features"` encoder; left unchanged.
            fields: the other fields of [`VisualSemanticEmbeddingConfig`] (`joint_embedding_size`, ...).
        """
        source = captioner.config
        fields = {
            "vocab_size": source.vocab_size, "encoder_type": source.encoder_type, "image_size": source.image_size,
            "num_channels": source.num_channels, "cnn_channels": source.cnn_channels,
            "image_feature_size": source.image_feature_size, "image_feature_layout": source.image_feature_layout,
            "backbone": source.backbone, "backbone_config": source.backbone_config, "use_pretrained_backbone": False,
            "freeze_backbone": source.freeze_backbone, "pad_token_id": source.pad_token_id,
            "bos_token_id": source.bos_token_id, "eos_token_id": source.eos_token_id, **fields,
        }  # fmt: skip
        copies_fixed_cnn = (
            source.encoder_type == "cnn"
            and source.freeze_image_encoder
            and list(fields["cnn_channels"]) == list(source.cnn_channels)
        )
        fields.setdefault("freeze_image_encoder", copies_fixed_cnn)
        model = cls(VisualSemanticEmbeddingConfig(**fields))
        if copies_fixed_cnn or fields["encoder_type"] == "backbone":
            model.embedding.image_encoder.load_state_dict(captioner.image_encoder.state_dict())
        return model.to(captioner.device)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.word_embeddings = value

    def get_text_features(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None
    ) -> BaseModelOutputWithPooling:
        """
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, length)`): captions as [`CaptionProcessor`]
                tokenizes them, `<bos> w_1 ... w_n <eos>`, right-padded.
            attention_mask (`torch.Tensor` of shape `(batch_size, length)`, *optional*): 1 for tokens, 0 for
                padding; `input_ids != pad_token_id` when unset.

        Returns:
            [`BaseModelOutputWithPooling`]: `pooler_output` `(batch_size, joint_embedding_size)` is the caption
            embedding, of unit norm.
        """
        if bool((input_ids[:, 0] != self.config.bos_token_id).any()):
            raise ValueError(
                f"Captions must start with <bos> (id {self.config.bos_token_id}), as the model's CaptionProcessor "
                "tokenizes them."
            )
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_token_id
        # the GRU reads the steps after <bos>, the end token included, as the listener reads passed words
        embeddings = self.embedding.embed_word_vectors(self.word_embeddings(input_ids[:, 1:]), attention_mask[:, 1:])
        return BaseModelOutputWithPooling(pooler_output=embeddings)

    def get_image_features(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPooling:
        """
        Args:
            pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`, *optional*):
                Images prepared by the model's processor (`"cnn"` and `"backbone"` encoders).
            image_features (`torch.FloatTensor` of shape `(batch_size, image_feature_size)`, or `(batch_size,
            num_regions, image_feature_size)` with `image_feature_layout="grid"`, *optional*):
                Precomputed features (`"features"` encoder).
            image_feature_mask (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*):
                1 for a real region, 0 for padding (grids and regions).

        Returns:
            [`BaseModelOutputWithPooling`]: `pooler_output` `(batch_size, joint_embedding_size)` is `l_e(f_I)`,
            of unit norm.
        """
        embeddings = self.embedding.embed_images(pixel_values, image_features, image_feature_mask)
        return BaseModelOutputWithPooling(pooler_output=embeddings)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        The cosine similarity of every caption with every image.

        Args:
            input_ids (`torch.LongTensor` of shape `(num_captions, length)`): see [`get_text_features`].
            pixel_values, image_features, image_feature_mask: the images, see [`get_image_features`].
            attention_mask (`torch.Tensor` of shape `(num_captions, length)`, *optional*): 1 for tokens.

        Returns:
            `torch.FloatTensor` of shape `(num_captions, num_images)`.
        """
        if input_ids is None:
            raise ValueError("VisualSemanticEmbedding.forward needs input_ids and the images.")
        captions = self.get_text_features(input_ids, attention_mask).pooler_output  # (N, J)
        images = self.get_image_features(pixel_values, image_features, image_feature_mask).pooler_output  # (I, J)
        return captions @ images.T
