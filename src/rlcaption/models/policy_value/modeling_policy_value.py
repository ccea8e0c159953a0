"""PolicyValueCaptioner: the policy network and value network of Ren et al. (CVPR 2017), "Deep Reinforcement
Learning-based Image Captioning with Embedding Reward") as a `transformers` model.

The policy `p_π(a_t | s_t)` is a [`ShowTellRL`] captioner: `generate`, `forward` and `caption_log_probs` of a
PolicyValueCaptioner are the policy's, so every objective and evaluation that captions works on it unchanged. The
value network ([`ValueNetwork`]) predicts the final reward `v(s_t)` of a partial caption `s_t` from its own image
encoder (of the policy's kind: a CNN, a vision backbone, or precomputed features, pooled over grids and regions), its
own word embeddings and GRU (or LSTM) over the partial caption, and a three-layer perceptron; it shares no parameter
with the policy, so its regression loss never reaches the policy. [`PolicyValueCaptioner.value`] gives `v(s_t)` for
every prefix of given captions.

Inference uses both networks: `generate(..., num_beams=k, lookahead_lambda=λ)` is Ren et al.'s lookahead beam search
([`ValueLookaheadLogitsProcessor`]), which ranks the extensions of the beams by `λ · log p_π + (1 − λ) · v(s_{t+1})`.

The `actor_critic` objective trains the value network with its own learning rate, as an auxiliary network of the
trainer: it takes the network out of the model's parameters for the run
([`PolicyValueCaptioner.detach_value_network`]), so that the optimizer's group of the model and DDP's replica of it
hold the policy alone. The model still owns the value network: it follows the model's `to()` and `train()`, and
`save_pretrained` and `load_state_dict` include it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init

from rlcaption.models.detachable import DetachableNetworkMixin
from rlcaption.models.show_tell_rl import ShowTellRL
from rlcaption.models.show_tell_rl.encoders import (
    MixedPrecisionLSTM,
    build_image_encoder,
    image_encoder_arguments,
    init_cnn_and_gru_weights,
)
from rlcaption.models.show_tell_rl.hub_errors import HubUploadErrorsMixin
from rlcaption.models.wrapped_captioner import WrappedCaptionerMixin

from .configuration_policy_value import PolicyValueConfig

__all__ = [
    "DEFAULT_LOOKAHEAD_CANDIDATES",
    "PolicyValueCaptioner",
    "PolicyValuePreTrainedModel",
    "ValueLookaheadLogitsProcessor",
    "ValueNetwork",
]

# Next-token values of a batch of prefixes: `(input_ids (N, T), candidate_ids (N, K))` -> `(v(s_t) (N,),
# v(s_t + a) (N, K))`.
NextTokenValues = Callable[[torch.LongTensor, torch.LongTensor], tuple[torch.FloatTensor, torch.FloatTensor]]

# The policy's most probable next tokens per beam that lookahead decoding hands to the value network, by default.
# Valuing every word costs a GRU step and the value head per word and beam (about 9,500 words on COCO), while a word
# far down the policy's ranking rarely wins: at λ = 0.4, a word 8 nats (3,000 times) less likely than the best one
# needs a value gain of 0.4 · 8 / 0.6 ≈ 5 reward units to be ranked above it, and CIDEr-D rewards are of order 1.
# 50 words also leave beam search the 2 · num_beams candidates per beam it keeps, for any usual beam width.
DEFAULT_LOOKAHEAD_CANDIDATES = 50


class ValueNetwork(nn.Module):
    """
    The value network `v(s_t)` (Shi et al. 2018, Fig. 3): the final reward expected from the partial caption `s_t` of
    an image.

    The image goes through the network's own encoder, of the policy's kind (a CNN, a vision backbone, or the policy's
    precomputed features: pooled vectors, or the masked mean of a grid or of regions), a linear map and a LayerNorm;
    the partial caption through the network's own word embeddings and a GRU (or an LSTM, `value_rnn_type`) from a zero
    state; a three-layer perceptron maps `[image embedding; recurrent state]` to a scalar.

    Args:
        config ([`PolicyValueConfig`]): the value network's sizes and the policy's vocabulary and image input.
    """

    def __init__(self, config: PolicyValueConfig):
        super().__init__()
        policy_config = config.policy_config
        self.image_encoder = build_image_encoder(policy_config, cnn_channels=config.value_cnn_channels)
        hidden_size = config.value_hidden_size
        self.image_projection = nn.Linear(self.image_encoder.output_size, hidden_size)
        # bounded-scale image features for the regression head, as the policy's image input (see ShowTellRL)
        self.image_norm = nn.LayerNorm(hidden_size)
        self.word_embeddings = nn.Embedding(policy_config.vocab_size, config.value_word_embedding_size)
        # a GRU by default (published checkpoints); Ren et al. 2017's value network reads the caption with an LSTM
        # the LSTM as the policy's: in float32 under bf16 autocast on CPUs without a bf16 LSTM (a GRU runs there)
        rnn_class = MixedPrecisionLSTM if config.value_rnn_type == "lstm" else nn.GRU
        self.caption_rnn = rnn_class(config.value_word_embedding_size, hidden_size, batch_first=True)
        mlp_size = config.value_mlp_hidden_size
        self.value_head = nn.Sequential(
            nn.Linear(2 * hidden_size, mlp_size), nn.ReLU(), nn.Linear(mlp_size, mlp_size), nn.ReLU(),
            nn.Linear(mlp_size, 1),
        )  # fmt: skip
        self.pad_token_id = policy_config.pad_token_id

    def encode_images(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """The image embeddings `(num_images, value_hidden_size)` the value head reads, from the image inputs the
        policy reads (see [`PolicyValueCaptioner.value`])."""
        arguments = image_encoder_arguments(
            self.image_encoder, pixel_values, image_features, image_feature_mask, self.image_projection.weight.dtype
        )
        features = self.image_encoder(*arguments)  # (I, F)
        return self.image_norm(self.image_projection(features))  # (I, H)

    def _prefix_states(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, final_state: bool = False
    ) -> tuple[torch.FloatTensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None]:
        """
        The recurrent output after every prefix of `input_ids` `(N, T)`, the tokens where `attention_mask` is 0 skipped
        (left or right padding, or holes): `(N, T, H)`; and, with `final_state`, the recurrent state after the whole
        prefix to continue from: `(1, N, H)` for a GRU, its `(h, c)` for an LSTM (whose cell is not in its outputs).
        """
        mask = input_ids != self.pad_token_id if attention_mask is None else attention_mask.bool()
        # the tokens read moved to the front, in order: one call from the zero state reads every row's tokens (the
        # network is causal, so what it reads after a row's last token never reaches the states gathered below)
        order = torch.sort((~mask).long(), dim=1, stable=True).indices
        embedded = self.word_embeddings(input_ids.gather(1, order))  # (N, T, W)
        outputs, _ = self.caption_rnn(embedded)  # (N, T, H)
        states = torch.cat([outputs.new_zeros(outputs.shape[0], 1, outputs.shape[2]), outputs], dim=1)  # (N, T+1, H)
        num_read = mask.long().cumsum(dim=1)  # (N, T): tokens read up to each position
        prefix_states = states.gather(1, num_read[:, :, None].expand(-1, -1, states.shape[2]))  # (N, T, H)
        if not final_state:
            return prefix_states, None
        if isinstance(self.caption_rnn, nn.GRU):
            return prefix_states, prefix_states[:, -1][None]  # a GRU's state is its output
        # the LSTM's (h, c) after each row's last read token, from the same tokens packed to their lengths
        lengths = num_read[:, -1]
        packed = nn.utils.rnn.pack_padded_sequence(
            embedded, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        _, (hidden, cell) = self.caption_rnn(packed)  # (1, N, H) each
        read_any = (lengths > 0)[None, :, None]  # a row that read nothing stays at the zero state
        return prefix_states, (hidden * read_any, cell * read_any)

    def _values(self, image_embeddings: torch.FloatTensor, states: torch.FloatTensor) -> torch.FloatTensor:
        """The value head on `[image; state]`: `(..., H)` and `(..., H)` -> `(...)`."""
        return self.value_head(torch.cat([image_embeddings.expand_as(states), states], dim=-1)).squeeze(-1)

    def prefix_values(
        self,
        image_embeddings: torch.FloatTensor,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """`v(s_t)` for every prefix `input_ids[:, : t + 1]`, given each row's image embedding `(N, H)`: `(N, T)`."""
        prefix_states, _ = self._prefix_states(input_ids, attention_mask)
        return self._values(image_embeddings[:, None, :], prefix_states)

    def next_token_values(
        self,
        image_embeddings: torch.FloatTensor,
        input_ids: torch.LongTensor,
        candidate_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.FloatTensor, torch.FloatTensor]:
        """
        The value of each prefix and of its extension by each candidate token, from one recurrent pass over the
        prefixes and one step for all candidates.

        Args:
            image_embeddings (`torch.FloatTensor` of shape `(N, H)`): each row's [`encode_images`].
            input_ids (`torch.LongTensor` of shape `(N, T)`): the prefixes `s_t`.
            candidate_ids (`torch.LongTensor` of shape `(N, K)`): the tokens `a` to try after each prefix.
            attention_mask (`torch.Tensor` of shape `(N, T)`, *optional*): 0 at padding.

        Returns:
            `(v(s_t), v(s_t + a))`: `torch.FloatTensor`s of shapes `(N,)` and `(N, K)`.
        """
        prefix_states, final_state = self._prefix_states(input_ids, attention_mask, final_state=True)
        last_states = prefix_states[:, -1]  # (N, H)
        num_rows, num_candidates = candidate_ids.shape
        candidates = self.word_embeddings(candidate_ids.reshape(-1, 1))  # (N*K, 1, W)
        if isinstance(final_state, tuple):  # an LSTM's (h, c)
            initial = tuple(part.repeat_interleave(num_candidates, dim=1) for part in final_state)  # (1, N*K, H) each
        else:
            initial = final_state.repeat_interleave(num_candidates, dim=1)  # (1, N*K, H)
        extended, _ = self.caption_rnn(candidates, initial)  # (N*K, 1, H)
        extended = extended.reshape(num_rows, num_candidates, -1)  # (N, K, H)
        return self._values(image_embeddings, last_states), self._values(image_embeddings[:, None, :], extended)

    def forward(
        self,
        input_ids: torch.LongTensor,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_index: torch.LongTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        `v(s_t)` for every prefix of given captions (see [`PolicyValueCaptioner.value`]); a forward, so that a DDP
        wrapper of the network synchronises its gradients.

        Returns:
            `torch.FloatTensor` of shape `(N, T)`.
        """
        image_embeddings = self.encode_images(pixel_values, image_features, image_feature_mask)  # (I, H)
        if image_index is not None:
            image_embeddings = image_embeddings.index_select(0, image_index.to(image_embeddings.device))
        return self.prefix_values(image_embeddings, input_ids, attention_mask)


class ValueLookaheadLogitsProcessor(LogitsProcessor):
    """
    Ren et al.'s lookahead inference as a beam-search logits processor: the policy proposes, the value network
    judges. Every extension `a` of a beam `s_t` is scored

        λ · log p_π(a | s_t) + (1 − λ) · (v(s_t + a) − v(s_t)).

    Beam search adds the scores of a hypothesis's steps, so its score telescopes to

        λ · log p_π(a_1 .. a_t) + (1 − λ) · (v(s_{t+1}) − v(s_0)),

    and `v(s_0)`, the value of the bare start token, is the same for every beam of an image: beam search ranks the
    hypotheses by Ren et al.'s `λ · log p_π + (1 − λ) · v(s_{t+1})`, its policy term accumulated over the steps as in
    plain beam search (their eq. writes the step's `log p_π(a_t | s_t)`; a per-step term would not reduce to beam
    search at λ = 1), its value term not (`v(s_{t+1})` already estimates the final reward of the whole prefix). At
    λ = 1 the scores are exactly the log-probabilities: plain beam search. The generation config's `length_penalty`
    (1.0 by default) divides a finished hypothesis's total score by its length; `length_penalty=0` keeps Ren et al.'s
    score as is. Beam search stops once `num_beams` hypotheses have finished and no running beam scores above the
    worst of them, which assumes scores only fall as beams grow: a beam whose value would rise later is cut then.

    Tokens the policy gives zero probability (`<pad>`, `<bos>`, or tokens another processor set to `-inf`) stay
    excluded whatever their value.

    Args:
        next_token_values (`Callable`): `(input_ids (N, T), candidate_ids (N, K))` -> `(v(s_t) (N,), v(s_t + a) (N,
            K))`, e.g. [`ValueNetwork.next_token_values`] with each beam's image.
        lookahead_lambda (`float`, *optional*, defaults to 0.4): λ in `[0, 1]`; Ren et al. report 0.4.
        num_candidates (`int`, *optional*, defaults to `DEFAULT_LOOKAHEAD_CANDIDATES` (50)): the value network scores
            only each beam's `num_candidates` most probable tokens (the others are excluded), which bounds its cost
            with a large vocabulary. The vocabulary size (or more) scores every token: the full search. Whenever
            every extension the full search ranks among a beam's `2 · num_beams` best (all beam search can keep) is
            among the beam's `num_candidates` most probable, both searches return the same captions and scores.
    """

    def __init__(
        self,
        next_token_values: NextTokenValues,
        lookahead_lambda: float = 0.4,
        num_candidates: int = DEFAULT_LOOKAHEAD_CANDIDATES,
    ):
        if not 0.0 <= lookahead_lambda <= 1.0:
            raise ValueError(f"lookahead_lambda weighs two scores and must be in [0, 1], got {lookahead_lambda}.")
        if num_candidates < 1:
            raise ValueError(
                f"num_candidates must be >= 1, got {num_candidates}; pass the vocabulary size to score every token."
            )
        self.next_token_values = next_token_values
        self.lookahead_lambda = lookahead_lambda
        self.num_candidates = num_candidates

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """`input_ids` `(N, T)`, the beams; `scores` `(N, vocab_size)`, their next-token log-probabilities."""
        num_candidates = min(self.num_candidates, scores.shape[-1])
        candidate_scores, candidate_ids = scores.topk(num_candidates, dim=-1)  # (N, K)
        current_values, candidate_values = self.next_token_values(input_ids, candidate_ids)  # (N,), (N, K)
        weight = self.lookahead_lambda
        lookahead = weight * candidate_scores + (1 - weight) * (candidate_values - current_values[:, None]).float()
        lookahead = torch.where(candidate_scores.exp() > 0, lookahead, candidate_scores)
        return torch.full_like(scores, float("-inf")).scatter(-1, candidate_ids, lookahead.to(scores.dtype))


class PolicyValuePreTrainedModel(HubUploadErrorsMixin, PreTrainedModel):
    config_class = PolicyValueConfig
    config: PolicyValueConfig
    base_model_prefix = "policy_value"
    main_input_name = "input_ids"
    # the policy contributes its own blocks; the value network is one
    _no_split_modules = ["ConvImageEncoder", "ValueNetwork"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # The policy is a sub-model, initialised by its own `_init_weights`: only the value network's layers come here.
        if isinstance(module, nn.LSTM):  # as the GRU: Xavier-uniform weights, zero biases
            for name, parameter in module.named_parameters():
                (init.xavier_uniform_ if "weight" in name else init.zeros_)(parameter)
        elif not init_cnn_and_gru_weights(module):
            super()._init_weights(module)


class PolicyValueCaptioner(WrappedCaptionerMixin, DetachableNetworkMixin, PolicyValuePreTrainedModel, GenerationMixin):
    """
    Ren et al.'s policy network ([`ShowTellRL`], `self.policy`) and value network ([`ValueNetwork`],
    `self.value_network`).

    Captioning is the policy's: `model.generate(pixel_values=...)` (greedy, sampling, beams),
    `model(input_ids, pixel_values, labels=...)` and `caption_log_probs`; with `lookahead_lambda`, `generate` is the
    lookahead beam search of both networks. The value of partial captions is [`value`].
    """

    # the network an objective trains in its own optimizer group (see `DetachableNetworkMixin`)
    detachable_network_name = "value_network"
    wrapped_captioner_name = "policy"

    def __init__(self, config: PolicyValueConfig):
        super().__init__(config)
        policy_config = config.policy_config
        # read before the policy loads its pretrained backbone (and records that its weights are now its own)
        loads_pretrained_backbone = policy_config.encoder_type == "backbone" and policy_config.use_pretrained_backbone
        self.policy = ShowTellRL(policy_config)
        self.value_network = ValueNetwork(config)
        self.post_init()
        if loads_pretrained_backbone:
            # after post_init, which would otherwise re-initialise the pretrained weights
            self.value_network.image_encoder.load_pretrained_backbone(policy_config.backbone)
        self._freeze_value_image_encoder()

    def _freeze_value_image_encoder(self) -> None:
        if self.config.freeze_value_image_encoder:
            self.value_network.image_encoder.requires_grad_(False)

    @classmethod
    def from_policy(cls, policy: ShowTellRL, **value_kwargs) -> PolicyValueCaptioner:
        """
        A PolicyValueCaptioner whose policy is a copy of `policy` (e.g. trained by cross-entropy first, as in seed
        001) and whose value network is new.

        When the policy's CNN encoder is fixed (pretrained, e.g. on the shapes scene annotations), the value network's
        encoder starts as a copy of it and stays fixed, as the listener's does in [`SpeakerListener.from_speaker`]:
        the value network then reads fixed pretrained features, as Ren et al.'s reads a pretrained VGG-16's. A
        policy's vision backbone is copied too (frozen or fine-tuned as the policy's `freeze_backbone` says), so that
        the value network starts from its pretrained weights. The copy is the value network's own, so the two
        networks share no weights.

        Args:
            policy ([`ShowTellRL`]): the captioner to start from; left unchanged.
            value_kwargs: the value network's fields of [`PolicyValueConfig`] (`value_hidden_size`, ...).
        """
        policy_config = policy.config
        copies_fixed_cnn = (
            policy_config.encoder_type == "cnn"
            and policy_config.freeze_image_encoder
            and value_kwargs.get("value_cnn_channels", policy_config.cnn_channels) == policy_config.cnn_channels
        )
        value_kwargs.setdefault("freeze_value_image_encoder", copies_fixed_cnn)
        model = cls(PolicyValueConfig(policy_config=copy.deepcopy(policy_config), **value_kwargs))
        model.policy.load_state_dict(policy.state_dict())
        model.policy.generation_config = copy.deepcopy(policy.generation_config)
        if copies_fixed_cnn or policy_config.encoder_type == "backbone":
            model.value_network.image_encoder.load_state_dict(policy.image_encoder.state_dict())
        return model.to(policy.device)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for
        # loading materialises fresh, trainable parameters: apply the saved freezing again
        if model.config.policy_config.encoder_type == "cnn" and model.config.policy_config.freeze_image_encoder:
            model.policy.image_encoder.requires_grad_(False)
        model._freeze_value_image_encoder()
        return loaded

    # ---------------------------------------------------------------- generation, by the policy (with lookahead)
    def generate(
        self, *args, lookahead_lambda: float | None = None, lookahead_candidates: int | None = None, **kwargs
    ) -> torch.LongTensor:
        """
        The policy's [`ShowTellRL.generate`] (recurrent state, text prompts, each image encoded once): captions
        starting with `<bos>`.

        Args:
            lookahead_lambda (`float`, *optional*):
                λ of Ren et al.'s lookahead inference (they report 0.4): the beam search (`num_beams >= 2`) ranks every
                extension by `λ · log p_π + (1 − λ) · v(s_{t+1})`, see [`ValueLookaheadLogitsProcessor`]. Unset: the
                policy alone decodes.
            lookahead_candidates (`int`, *optional*, defaults to `DEFAULT_LOOKAHEAD_CANDIDATES` (50)):
                With `lookahead_lambda`: the value network scores only each beam's `lookahead_candidates` most
                probable next tokens, the others are excluded; the vocabulary size (or more) scores every token, at a
                cost that grows with the vocabulary. Both give the same captions whenever the full search's choices
                are among the policy's top candidates (see [`ValueLookaheadLogitsProcessor`]).
            args, kwargs: as for [`ShowTellRL.generate`]: the images (`pixel_values` or `image_features`), a
                `generation_config` and its settings.
        """
        if lookahead_lambda is None:
            if lookahead_candidates is not None:
                raise ValueError("lookahead_candidates applies to lookahead decoding: set lookahead_lambda too.")
            return self.policy.generate(*args, **kwargs)
        settings = kwargs.get("generation_config")
        if settings is None:
            settings = self.generation_config
        # unset fields of a transformers 5 generation config are None: greedy decoding
        num_beams = kwargs.get("num_beams", settings.num_beams) or 1
        do_sample = bool(kwargs.get("do_sample", settings.do_sample))
        if num_beams < 2 or do_sample:
            raise ValueError(
                f"Lookahead decoding is a beam search (Ren et al. 2017): pass num_beams >= 2 without sampling, got "
                f"num_beams={num_beams}, do_sample={do_sample}."
            )
        # each image is encoded once; the processor looks its embedding up for every beam of it
        image_embeddings = self.value_network.encode_images(
            kwargs.get("pixel_values"), kwargs.get("image_features"), kwargs.get("image_feature_mask")
        )

        def next_token_values(input_ids: torch.LongTensor, candidate_ids: torch.LongTensor):
            beams_per_image = input_ids.shape[0] // image_embeddings.shape[0]
            rows = image_embeddings.repeat_interleave(beams_per_image, dim=0)  # (N, H): beams are grouped by image
            return self.value_network.next_token_values(rows, input_ids, candidate_ids)

        if lookahead_candidates is None:
            lookahead_candidates = DEFAULT_LOOKAHEAD_CANDIDATES
        lookahead = ValueLookaheadLogitsProcessor(next_token_values, lookahead_lambda, lookahead_candidates)
        # after the other processors, so that tokens they exclude stay excluded
        kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), lookahead])
        return self.policy.generate(*args, **kwargs)

    # ---------------------------------------------------------------- the value network
    def value(
        self,
        pixel_values: torch.FloatTensor | None = None,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_index: torch.LongTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor:
        """
        The value network's `v(s_t)` for every prefix of given captions: the final reward it expects from there.

        Args:
            pixel_values (`torch.FloatTensor` of shape `(num_images, num_channels, height, width)`, *optional*):
                The images, for a `"cnn"` or `"backbone"` policy.
            input_ids (`torch.LongTensor` of shape `(N, T)`): captions starting with `<bos>`, as `generate` returns
                them.
            attention_mask (`torch.Tensor` of shape `(N, T)`, *optional*): 0 at padding (left, right or inside),
                which the network skips; `input_ids != pad_token_id` when unset.
            image_features (`torch.FloatTensor` of shape `(num_images, image_feature_size)`, or `(num_images,
                num_regions, image_feature_size)` for `image_feature_layout="grid"`, *optional*): the images, for a
                `"features"` policy.
            image_feature_mask (`torch.LongTensor` of shape `(num_images, num_regions)`, *optional*): 1 for a real
                region, 0 for padding (grids and regions); the value network reads the mean of the real regions.
            image_index (`torch.LongTensor` of shape `(N,)`, *optional*): the image row of each caption, when the
                images are given once for several captions; row `i` is caption `i`'s image when unset.

        Returns:
            `torch.FloatTensor` of shape `(N, T)`: `[:, t]` is `v` of the prefix `input_ids[:, : t + 1]` (after the
            end of a caption, the value of the whole caption).
        """
        if input_ids is None:
            raise ValueError("PolicyValueCaptioner.value needs input_ids, the captions whose prefixes to value.")
        return self.value_network(
            input_ids, pixel_values, image_features, attention_mask, image_index, image_feature_mask
        )

    @property
    def value_network_is_detached(self) -> bool:
        """Whether [`detach_value_network`] took the value network out of the model's parameters."""
        return self.network_is_detached

    def detach_value_network(self) -> ValueNetwork:
        """The value network, out of the model's parameters for a run (`DetachableNetworkMixin.detach_network`)."""
        return self.detach_network()

    def attach_value_network(self) -> None:
        """Puts a [`detach_value_network`]-ed value network back among the model's parameters."""
        self.attach_network()
