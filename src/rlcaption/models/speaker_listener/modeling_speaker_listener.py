"""SpeakerListener: the cooperative speaker-listener captioner of Vered et al., ICCV 2019 as a
`transformers` model.

The speaker is a [`ShowTellRL`] captioner: `generate`, `forward` and `caption_log_probs` of a SpeakerListener are the
speaker's, so every objective and evaluation that captions works on it unchanged (the `psst` objective decodes with
word passing through the speaker). The
listener ([`Listener`]) embeds captions and images into one space, where Vered et al.'s `Φ(w, I)` is the cosine
similarity: a caption is read as word vectors over the vocabulary (one-hot tokens, or the soft vectors the speaker
passes during training) times the speaker's word embedding matrix, then a GRU; an image by its own encoder (not the
speaker's, so the speaker cannot pass the listener a private code through shared image features) and a linear map.

The `psst` objective trains the listener with its own learning rate, as an auxiliary network of the trainer: it takes
the listener out of the model's parameters for the run ([`SpeakerListener.detach_listener`]), so that the optimizer's
group of the model and DDP's replica of it hold the speaker alone. The model still owns the listener: it follows the
model's `to()` and `train()`, and `save_pretrained` and `load_state_dict` include it, so every saved folder, training
checkpoints and the final published one alike, holds the listener as trained, and resuming or loading the best model
restores it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel

from rlcaption.models.captions import caption_token_mask, soft_word_embeddings
from rlcaption.models.detachable import DetachableNetworkMixin
from rlcaption.models.show_tell_rl import ShowTellRL
from rlcaption.models.show_tell_rl.encoders import build_image_encoder, init_cnn_and_gru_weights
from rlcaption.models.show_tell_rl.hub_errors import HubUploadErrorsMixin
from rlcaption.models.visual_semantic_embedding import CaptionImageEmbedding
from rlcaption.models.wrapped_captioner import WrappedCaptionerMixin

from .configuration_speaker_listener import SpeakerListenerConfig

__all__ = ["Listener", "SpeakerListener", "SpeakerListenerPreTrainedModel"]


class Listener(CaptionImageEmbedding):
    """
    Vered et al.'s listener: embeds captions and images into a joint space of `config.joint_embedding_size`,
    L2-normalised, so that the dot product of a caption and an image embedding is their cosine similarity `Φ(w, I)`. It
    is the visual-semantic embedding network [`CaptionImageEmbedding`] (Ren et al.'s embedding reward is one too), with
    an image encoder of the speaker's kind (a CNN, a vision backbone, or precomputed features).

    It has no word embeddings of its own: every call takes the speaker's word embedding matrix, so that the words
    keep the meaning the speaker gives them and the listener's loss also trains the speaker's embeddings.

    Args:
        config ([`SpeakerListenerConfig`]): the listener's sizes and the speaker's image input.
    """

    def __init__(self, config: SpeakerListenerConfig):
        speaker_config = config.speaker_config
        image_encoder = build_image_encoder(speaker_config, cnn_channels=config.listener_cnn_channels)
        super().__init__(
            image_encoder, speaker_config.word_embedding_size, config.listener_hidden_size, config.joint_embedding_size
        )

    def embed_captions(
        self,
        captions: torch.Tensor,
        word_embeddings: torch.Tensor | nn.Embedding | None,
        caption_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        Embeds captions given as word vectors or token ids (the steps after `<bos>`).

        Args:
            captions (`torch.FloatTensor` of shape `(batch_size, num_steps, vocab_size)` or `torch.LongTensor` of
            shape `(batch_size, num_steps)`):
                Word vectors over the vocabulary (one-hot or soft, e.g. [`PassedWords.words`]) or token ids. A
                one-hot vector and its token id give the same embedding.
            word_embeddings (`torch.FloatTensor` of shape `(vocab_size, word_embedding_size)` or `nn.Embedding`):
                The speaker's word embeddings; `None` when `captions` are the embedded words already `(batch_size,
                num_steps, word_embedding_size)`.
            caption_mask (`torch.Tensor` of shape `(batch_size, num_steps)`, *optional*):
                1 on each caption's steps, its end token included, 0 after (e.g. [`PassedWords.step_mask`]); every
                step counts when unset. The GRU stops at each caption's last step.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, joint_embedding_size)`, of unit norm.
        """
        if word_embeddings is None:
            inputs = captions  # (B, T, W)
        elif captions.is_floating_point():
            inputs = soft_word_embeddings(captions, word_embeddings)  # (B, T, W)
        else:
            weight = word_embeddings.weight if isinstance(word_embeddings, nn.Embedding) else word_embeddings
            inputs = F.embedding(captions, weight)  # (B, T, W)
        return self.embed_word_vectors(inputs, caption_mask)

    def forward(
        self,
        captions: torch.Tensor,
        word_embeddings: torch.Tensor | nn.Embedding | None,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        caption_mask: torch.Tensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> tuple[torch.FloatTensor, torch.FloatTensor]:
        """
        [`embed_captions`] and [`embed_images`] in one call, so that a DDP wrapper of the listener synchronises the
        gradients of both.

        Returns:
            `(caption_embeddings, image_embeddings)`, each `torch.FloatTensor` of shape `(batch_size,
            joint_embedding_size)`; `caption_embeddings @ image_embeddings.T` are their cosine similarities.
        """
        caption_embeddings = self.embed_captions(captions, word_embeddings, caption_mask)
        return caption_embeddings, self.embed_images(pixel_values, image_features, image_feature_mask)


class SpeakerListenerPreTrainedModel(HubUploadErrorsMixin, PreTrainedModel):
    config_class = SpeakerListenerConfig
    config: SpeakerListenerConfig
    base_model_prefix = "speaker_listener"
    main_input_name = "input_ids"
    # the speaker contributes its own blocks; the listener is one
    _no_split_modules = ["ConvImageEncoder", "Listener"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # The speaker is a sub-model, initialised by its own `_init_weights`: only the listener's layers come here.
        if not init_cnn_and_gru_weights(module):
            super()._init_weights(module)


class SpeakerListener(WrappedCaptionerMixin, DetachableNetworkMixin, SpeakerListenerPreTrainedModel, GenerationMixin):
    """
    Vered et al.'s speaker ([`ShowTellRL`], `self.speaker`) and listener ([`Listener`], `self.listener`).

    Captioning is the speaker's: `model.generate(pixel_values=...)` (greedy, sampling, beams; test-time words are
    always discrete), `model(input_ids, pixel_values, labels=...)` and `caption_log_probs`. The listener ranks images
    for captions with [`rank_images`].
    """

    # the network an objective trains in its own optimizer group (see `DetachableNetworkMixin`)
    detachable_network_name = "listener"
    wrapped_captioner_name = "speaker"

    def __init__(self, config: SpeakerListenerConfig):
        super().__init__(config)
        speaker_config = config.speaker_config
        # read before the speaker loads its pretrained backbone (and records that its weights are now its own)
        loads_pretrained_backbone = (
            speaker_config.encoder_type == "backbone" and speaker_config.use_pretrained_backbone
        )
        self.speaker = ShowTellRL(speaker_config)
        self.listener = Listener(config)
        self.post_init()
        if loads_pretrained_backbone:
            # after post_init, which would otherwise re-initialise the pretrained weights
            self.listener.image_encoder.load_pretrained_backbone(speaker_config.backbone)
        self._freeze_listener_image_encoder()

    def _freeze_listener_image_encoder(self) -> None:
        if self.config.freeze_listener_image_encoder:
            self.listener.image_encoder.requires_grad_(False)

    @classmethod
    def from_speaker(cls, speaker: ShowTellRL, **listener_kwargs) -> SpeakerListener:
        """
        A SpeakerListener whose speaker is a copy of `speaker` (e.g. one trained by cross-entropy first, as in seed
        004) and whose listener is new.

        When the speaker's CNN encoder is fixed (pretrained, e.g. on the shapes scene annotations), the listener's
        image encoder starts as a copy of it and stays fixed: the listener then learns a linear map of fixed
        pretrained features, as in Vered et al. 2019, where both networks read a pretrained ResNet. A listener that
        learns its CNN from scratch beside a GRU needs many epochs before its recall leaves chance (on shapes: batch
        R@1 still about 0.03 after 150 steps, against 0.15-0.25 with the copied encoder). A speaker's vision backbone
        is copied too (frozen or fine-tuned as the speaker's `freeze_backbone` says), so that the listener starts from
        its pretrained weights. The copy is the listener's own, so the two networks share no trainable weights.

        Args:
            speaker ([`ShowTellRL`]): the captioner to start from; left unchanged.
            listener_kwargs: the listener's fields of [`SpeakerListenerConfig`] (`joint_embedding_size`, ...).
        """
        speaker_config = speaker.config
        copies_fixed_cnn = (
            speaker_config.encoder_type == "cnn"
            and speaker_config.freeze_image_encoder
            and listener_kwargs.get("listener_cnn_channels", speaker_config.cnn_channels)
            == speaker_config.cnn_channels
        )
        listener_kwargs.setdefault("freeze_listener_image_encoder", copies_fixed_cnn)
        model = cls(SpeakerListenerConfig(speaker_config=copy.deepcopy(speaker_config), **listener_kwargs))
        model.speaker.load_state_dict(speaker.state_dict())
        model.speaker.generation_config = copy.deepcopy(speaker.generation_config)
        if copies_fixed_cnn or speaker_config.encoder_type == "backbone":
            model.listener.image_encoder.load_state_dict(speaker.image_encoder.state_dict())
        return model.to(speaker.device)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for
        # loading materialises fresh, trainable parameters: apply the speaker's saved freezing again, as
        # `ShowTellRL.from_pretrained` does
        if model.config.speaker_config.encoder_type == "cnn" and model.config.speaker_config.freeze_image_encoder:
            model.speaker.image_encoder.requires_grad_(False)
        model._freeze_listener_image_encoder()
        return loaded

    # ---------------------------------------------------------------- captioning, by the speaker
    # ---------------------------------------------------------------- the listener
    def embed_captions(self, captions: torch.LongTensor) -> torch.FloatTensor:
        """
        The listener's embeddings of captions as `generate` returns them.

        Args:
            captions (`torch.LongTensor` of shape `(num_captions, length)`): `<bos>` first, padded after the end
                token.

        Returns:
            `torch.FloatTensor` of shape `(num_captions, joint_embedding_size)`, of unit norm.
        """
        caption_mask = caption_token_mask(captions, self.config.speaker_config.eos_token_id)
        return self.listener.embed_captions(captions[:, 1:], self.get_input_embeddings(), caption_mask)

    def embed_images(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """The listener's embeddings of images, `(num_images, joint_embedding_size)`: see [`Listener.embed_images`]."""
        return self.listener.embed_images(pixel_values, image_features, image_feature_mask)

    def rank_images(
        self,
        captions: torch.LongTensor,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        The listener's cosine similarity `Φ(w, I)` of every caption with every image: sort a row to rank the images
        for that caption.

        Args:
            captions (`torch.LongTensor` of shape `(num_captions, length)`):
                Captions as `generate` returns them: `<bos>` first, padded after the end token.
            pixel_values (`torch.FloatTensor` of shape `(num_images, num_channels, height, width)`, *optional*):
                The images, for a `"cnn"` or `"backbone"` speaker.
            image_features (`torch.FloatTensor` of shape `(num_images, image_feature_size)`, or `(num_images,
            num_regions, image_feature_size)` for `image_feature_layout="grid"`, *optional*):
                The images' precomputed features, for a `"features"` speaker.
            image_feature_mask (`torch.LongTensor` of shape `(num_images, num_regions)`, *optional*):
                1 for a real region, 0 for padding (grids and regions).

        Returns:
            `torch.FloatTensor` of shape `(num_captions, num_images)`.
        """
        return self.embed_captions(captions) @ self.embed_images(pixel_values, image_features, image_feature_mask).T

    @property
    def listener_is_detached(self) -> bool:
        """Whether [`detach_listener`] took the listener out of the model's parameters."""
        return self.network_is_detached

    def detach_listener(self) -> Listener:
        """The listener, out of the model's parameters for a run: see [`DetachableNetworkMixin.detach_network`]."""
        return self.detach_network()

    def attach_listener(self) -> None:
        """Puts a [`detach_listener`]-ed listener back among the model's parameters."""
        self.attach_network()
