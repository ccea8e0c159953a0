"""
WTF-RL: CLIP-guided RL with ground-truth captions (Chaffin et al., "Distinctive Image Captioning:
Leveraging Ground Truth Captions in CLIP Guided Reinforcement Learning").

For every image of a batch the policy's beam-search caption `x_bs` and greedy caption `x_gs`, and one ground-truth
caption `x_gt`, are embedded by a fixed CLIP. A caption's reward is

    r(x) = α · r_bicont(x) + (1 − α) · p_D(x)                                           (eq. 3)

with `r_bicont` the decoupled bidirectional contrastive reward of eq. 2 over the texts `T = {x_bs, x_gs, x_gt}` of
every image and the images `I` = the batch's images plus their nearest neighbours in the CLIP's image space
([`ContrastiveReward`], neighbours mined once before training), and `p_D` the probability that `x` is human-written
according to a discriminator D, a 3-layer MLP on the frozen CLIP text embedding ([`Discriminator`]). Each image's loss
is

    −[ r(x_bs) · log p(x_bs) + r(x_gt) · log p(x_gt) ]                                  (eq. 3)

RL on the beam-search caption plus Weighted Teacher Forcing (WTF) of the ground truth. No baseline is subtracted: each
part of the contrastive reward is already the caption's similarity minus a soft maximum over its negatives (the
greedy caption and the ground truth among them), so it is positive only for captions that beat them.

The variants of the paper's Table 1 are one setting, `wtf_variant`:

| variant              | trajectories  | reward r of each trajectory                       |
|----------------------|---------------|---------------------------------------------------|
| `wtf_rl`             | x_bs and x_gt | α · r_bicont + (1 − α) · p_D (eq. 3)              |
| `wtf`                | x_gt          | α · r_bicont + (1 − α) · p_D                      |
| `rl`                 | x_bs          | α · r_bicont + (1 − α) · p_D                      |
| `rl_unidirectional`  | x_bs          | α · r_i2t + (1 − α) · p_D                         |
| `scst_discriminator` | x_bs          | α · (s(x_bs, i) − s(x_gs, i)) + (1 − α) · p_D     |
| `tf`                 | x_gt          | 1: plain teacher forcing, the control             |

`scst_discriminator` is the setup of Cho et al. 2022 ("SCST - Grammar") with D instead of the grammar network: the
image-to-text reward with the greedy caption as the only text baseline, which is `r_i2t` with `T \\ x_bs = {x_gs}`
exactly (the log-sum-exp of one term is that term); as in the other variants, `p_D` is not baselined (the paper reads
this variant as the one whose similarity part is larger than with the strongest baseline, "for a fixed α").

Choices where the paper leaves a detail open:

- Ground truth: one reference per image and step, drawn at random among those the collator tokenized
  (`xe_captions_per_image=1` tokenizes one); the paper's batches are image-caption pairs. Its text for the CLIP is its
  token ids decoded as generated captions are, so that D cannot tell human from generated captions by casing or
  punctuation the captioner's tokenizer drops, and `r(x_gt)` scores the very sequence whose likelihood it weights.
- Log-probabilities: of `x_bs` in evaluation mode, as it was decoded (see `rlcaption.generation.decoding`); of `x_gt`
  in the model's training mode, with dropout, as teacher forcing computes them (it was not drawn from the policy).
- D is the objective's auxiliary network `discriminator` (own learning rate `discriminator_learning_rate`, saved in
  checkpoints, synchronised across processes). With `discriminator_pretraining_steps`, training opens with a phase
  where D alone learns to tell the ground truth (label 1) from the beam-search captions of the fixed policy (label
  0); afterwards its binary cross-entropy on the batch's captions is added to the policy loss at every step. The two
  share no parameter (rewards are detached, D reads frozen embeddings), so one backward gives each its own gradient
  and the Trainer's single optimizer step updates both. The paper updates D at the start of an iteration; here the
  rewards use D as it is at the start of the step, one update behind, so that a batch is one optimizer step.
- Each process contrasts its own per-device batch (`T` and `I` are per process).
- The discriminator reads the text embedding alone by default (`discriminator_input="text"`), as the paper describes
  it (Sec. 3.2, "an MLP ... taking as input the representations computed by CLIP"). The authors' code feeds it the
  image's CLIP embedding concatenated with the caption's: `discriminator_input="image_text"` does the same, so D can
  also tell a caption that does not fit its image from the ground truth.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..generation.decoding import caption_token_mask, image_inputs_of, sample_token_log_probs, token_log_probs
from ..rewards.contrastive import ContrastiveReward, ContrastiveRewards
from ..rl_config import RLCaptionConfig
from .base import AuxiliaryNetwork, CaptionObjective, TrainingPhase, register_objective, to_device_without_waiting
from .policy_gradient import kl_penalty

__all__ = [
    "DISCRIMINATOR_INPUTS",
    "MINED_NEIGHBOURS_NAME",
    "WTF_VARIANTS",
    "Discriminator",
    "WTFConfig",
    "WTFObjective",
    "WTFRewardParts",
    "wtf_loss",
    "wtf_rewards",
]

WTF_VARIANTS = ("wtf_rl", "wtf", "rl", "rl_unidirectional", "scst_discriminator", "tf")
# What the discriminator reads: the caption's CLIP embedding, or its image's concatenated with it
DISCRIMINATOR_INPUTS = ("text", "image_text")
# The mined neighbours of the training images, in the output directory: a resumed run reads them instead of mining.
MINED_NEIGHBOURS_NAME = "mined_neighbours.safetensors"


@dataclass
class WTFConfig(RLCaptionConfig):
    """
    Configuration of `objective="wtf"` (WTF-RL, Chaffin et al. 2024): the Table 1 variant, the reward CLIP and the
    contrastive reward, and the discriminator, besides the shared fields of [`RLCaptionConfig`].
    """

    objective: str = field(default="wtf", metadata={"help": "Training objective: `wtf`."})
    wtf_variant: str = field(
        default="wtf_rl",
        metadata={
            "help": "Which trajectories `wtf` trains on (Chaffin et al.'s Table 1): `wtf_rl` (eq. 3: the beam-search "
            "caption by RL plus the reward-weighted ground-truth caption), `wtf` (the weighted ground truth only), "
            "`rl` (the beam-search caption only), `rl_unidirectional` (`rl` with the image-to-text part r_i2t only), "
            "`scst_discriminator` (`rl` with the CLIP similarity minus the greedy caption's as similarity reward) "
            "or `tf` (unweighted teacher forcing of the ground truth, the control)."
        },
    )
    wtf_alpha: float = field(
        default=0.94,
        metadata={
            "help": "α of Chaffin et al.'s reward `α · r_bicont + (1 − α) · p_D`: the contrastive CLIP reward against "
            "the discriminator's probability that the caption is human-written. The paper uses 0.94."
        },
    )
    wtf_num_beams: int = field(
        default=5,
        metadata={"help": "Beam size of the beam-search caption `wtf` trains on and the discriminator sees."},
    )
    reward_clip: str | None = field(
        default=None,
        metadata={
            "help": "The fixed CLIP (local folder or Hub id) of the `wtf` rewards, e.g. "
            "`checkpoints/shapes-clip-reward`: it embeds captions for the contrastive reward and the discriminator, "
            "and mines the training images' neighbours."
        },
    )
    contrastive_temperature: float | None = field(
        default=None,
        metadata={
            "help": "τ of Chaffin et al.'s contrastive reward (eq. 2). The paper gives no value; by default the "
            "reward CLIP's own learned temperature `1 / exp(logit_scale)` (0.01 for OpenAI CLIP, as the authors' code "
            "uses), so that the reward follows the contrastive objective the CLIP was trained with."
        },
    )
    num_mined_neighbours: int = field(
        default=5,
        metadata={
            "help": "Most similar training images (CLIP image space, mined once before training and kept in "
            "`<output_dir>/mined_neighbours.safetensors`) added for each batch image to the images of `wtf`'s "
            "text-to-image reward; 0 uses the batch's images only."
        },
    )
    discriminator_learning_rate: float = field(
        default=7e-5,
        metadata={
            "help": "Learning rate of the `wtf` discriminator (its own optimizer parameter group, no weight decay), "
            "scheduled like `learning_rate`; 7e-5 as in the authors' code."
        },
    )
    discriminator_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `wtf` that train only the discriminator, to tell the ground "
            "truth from the fixed policy's beam-search captions (the paper pretrains it so that it guides the policy "
            "from the first step); then both train. 0: joint from the first step."
        },
    )
    discriminator_hidden_size: int = field(
        default=512,
        metadata={"help": "Hidden width of the `wtf` discriminator, a 3-layer MLP on the CLIP text embedding."},
    )
    discriminator_input: str = field(
        default="text",
        metadata={
            "help": "What the `wtf` discriminator reads: `text`, the caption's CLIP embedding (as Chaffin et al. 2024 "
            "describe it), or `image_text`, the image's CLIP embedding concatenated with the caption's (as the "
            "authors' code does), so that it also judges whether the caption fits its image."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.wtf_variant not in WTF_VARIANTS:
            raise ValueError(f"wtf_variant={self.wtf_variant!r} is not one of {WTF_VARIANTS}.")
        if not 0.0 <= self.wtf_alpha <= 1.0:
            raise ValueError(f"wtf_alpha weighs two rewards and must be in [0, 1], got {self.wtf_alpha}.")
        if self.wtf_num_beams < 1:
            raise ValueError(f"wtf_num_beams must be >= 1, got {self.wtf_num_beams}.")
        if self.reward_clip is not None and not self.reward_clip:
            raise ValueError("reward_clip='' names no CLIP: give a folder or Hub id (checkpoints/shapes-clip-reward).")
        if self.reward_clip is None:
            raise ValueError(
                "objective='wtf' rewards captions with a CLIP: set reward_clip to a folder or Hub id (e.g. "
                "checkpoints/shapes-clip-reward)."
            )
        if self.contrastive_temperature is not None and self.contrastive_temperature <= 0:
            raise ValueError(
                f"contrastive_temperature must be > 0, or None for the CLIP's own; got {self.contrastive_temperature}."
            )
        if self.num_mined_neighbours < 0:
            raise ValueError(f"num_mined_neighbours must be >= 0, got {self.num_mined_neighbours}.")
        if self.discriminator_learning_rate <= 0:
            raise ValueError(f"discriminator_learning_rate must be > 0, got {self.discriminator_learning_rate}.")
        if self.discriminator_pretraining_steps < 0:
            raise ValueError(
                f"discriminator_pretraining_steps must be >= 0, got {self.discriminator_pretraining_steps}."
            )
        if self.discriminator_hidden_size < 1:
            raise ValueError(f"discriminator_hidden_size must be >= 1, got {self.discriminator_hidden_size}.")
        if self.discriminator_input not in DISCRIMINATOR_INPUTS:
            raise ValueError(f"discriminator_input={self.discriminator_input!r} is not one of {DISCRIMINATOR_INPUTS}.")


class Discriminator(nn.Module):
    """
    Chaffin et al.'s discriminator D: a 3-layer MLP from frozen CLIP embeddings to the logit of P(human-written): of
    the caption's text embedding, or, with `reads_image`, of its image's embedding concatenated with it (as the
    authors' code does).

    Args:
        embedding_size (`int`): width of the CLIP's embeddings.
        hidden_size (`int`): width of the two hidden layers.
        reads_image (`bool`, *optional*, defaults to `False`): whether D reads the image's embedding too.
    """

    def __init__(self, embedding_size: int, hidden_size: int, reads_image: bool = False):
        super().__init__()
        self.reads_image = reads_image
        input_size = 2 * embedding_size if reads_image else embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(input_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, 1),
        )

    def forward(
        self, text_embeddings: torch.FloatTensor, image_embeddings: torch.FloatTensor | None = None
    ) -> torch.FloatTensor:
        """
        `(N, embedding_size)` text embeddings, and with `reads_image` the `(N, embedding_size)` embeddings of their
        images, -> `(N,)` logits; `sigmoid` of them is `p_D`.
        """
        if self.reads_image != (image_embeddings is not None):
            raise ValueError(
                f"This discriminator reads {'the image and the text' if self.reads_image else 'the text only'}; "
                f"got {'no ' if image_embeddings is None else ''}image embeddings."
            )
        inputs = text_embeddings.detach()
        if self.reads_image:
            inputs = torch.cat([image_embeddings.detach().to(inputs), inputs], dim=-1)  # (N, 2 * embedding_size)
        return self.mlp(inputs).squeeze(-1)


@dataclass
class WTFRewardParts:
    """
    What the rewards of a batch's captions are made of, one value per image.

    Args:
        beam ([`ContrastiveRewards`]): eq. 2's parts of the beam-search captions.
        ground_truth ([`ContrastiveRewards`]): eq. 2's parts of the ground-truth captions.
        greedy_similarity (`torch.Tensor` of shape `(batch_size,)`): `s(x_gs, i)`, the greedy captions' CLIP
            similarity to their images.
        beam_discriminator (`torch.Tensor` of shape `(batch_size,)`): `p_D(x_bs)`.
        ground_truth_discriminator (`torch.Tensor` of shape `(batch_size,)`): `p_D(x_gt)`.
    """

    beam: ContrastiveRewards
    ground_truth: ContrastiveRewards
    greedy_similarity: torch.Tensor
    beam_discriminator: torch.Tensor
    ground_truth_discriminator: torch.Tensor


def wtf_rewards(parts: WTFRewardParts, variant: str, alpha: float) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """
    The reward weighting each trajectory of `variant` (see the module's table), `None` for a trajectory it does not
    train on.

    Args:
        parts ([`WTFRewardParts`]): the batch's reward parts.
        variant (`str`): one of [`WTF_VARIANTS`].
        alpha (`float`): α, the weight of the CLIP reward against the discriminator's, in [0, 1].

    Returns:
        `(beam_rewards, ground_truth_rewards)`, each `torch.Tensor` of shape `(batch_size,)` or `None`.
    """
    if variant not in WTF_VARIANTS:
        raise ValueError(f"wtf_variant={variant!r} is not one of {WTF_VARIANTS}.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    if variant == "tf":
        return None, torch.ones_like(parts.ground_truth_discriminator)
    # Chaffin et al. 2024, eq. 3: r(x) = α · r_sim(x) + (1 − α) · p_D(x), r_sim per variant (Table 1)
    beam_similarity = {
        "wtf_rl": parts.beam.combined("both"),
        "rl": parts.beam.combined("both"),
        "rl_unidirectional": parts.beam.i2t,
        "scst_discriminator": parts.beam.similarity - parts.greedy_similarity,
    }.get(variant)
    beam = None
    if beam_similarity is not None:
        beam = alpha * beam_similarity + (1.0 - alpha) * parts.beam_discriminator
    ground_truth = None
    if variant in ("wtf_rl", "wtf"):
        ground_truth = alpha * parts.ground_truth.combined("both") + (1.0 - alpha) * parts.ground_truth_discriminator
    return beam, ground_truth


def wtf_loss(
    beam_log_probs: torch.Tensor | None,
    beam_mask: torch.Tensor | None,
    beam_rewards: torch.Tensor | None,
    ground_truth_log_probs: torch.Tensor | None,
    ground_truth_mask: torch.Tensor | None,
    ground_truth_rewards: torch.Tensor | None,
    normalization: str,
) -> torch.Tensor:
    """
    Chaffin et al.'s loss (eq. 3) of a batch: `Σ_images −[r(x_bs) log p(x_bs) + r(x_gt) log p(x_gt)]`, over the
    trajectories whose rewards are given, with `log p(x) = Σ_t log p(x_t | x_<t, image)`.

    Args:
        beam_log_probs, ground_truth_log_probs (`torch.FloatTensor` of shape `(batch_size, T)`, *optional*):
            log-probabilities of each caption's tokens (with gradient).
        beam_mask, ground_truth_mask (`torch.FloatTensor` of shape `(batch_size, T)`, *optional*): 1 on the captions'
            tokens (end token included).
        beam_rewards, ground_truth_rewards (`torch.Tensor` of shape `(batch_size,)`, *optional*): each caption's
            reward (detached); `None` leaves the term out (see [`wtf_rewards`]).
        normalization (`str`): `sequence` divides the sum by the number of images (eq. 3 averaged over images),
            `token` by the number of tokens of the trajectories in the loss, as [`policy_gradient_loss`] does.

    Returns:
        `torch.FloatTensor`: the scalar loss.
    """
    terms = [
        (log_probs, mask, rewards)
        for log_probs, mask, rewards in (
            (beam_log_probs, beam_mask, beam_rewards),
            (ground_truth_log_probs, ground_truth_mask, ground_truth_rewards),
        )
        if rewards is not None
    ]
    if not terms:
        raise ValueError("The wtf loss needs the rewards of the beam-search or of the ground-truth captions.")
    if normalization not in ("token", "sequence"):
        raise ValueError(f"normalization={normalization!r} is not one of ('token', 'sequence').")
    total, num_tokens = 0.0, 0.0
    for log_probs, mask, rewards in terms:
        # masked_fill, not a product: log-probabilities after the end token may be -inf, and 0 * -inf = NaN
        masked = log_probs.masked_fill(mask == 0, 0.0)  # (B, T)
        total = total - (rewards.detach().to(masked)[:, None] * masked).sum()
        num_tokens = num_tokens + mask.sum()
    if normalization == "token":
        return total / num_tokens.clamp(min=1.0)
    return total / terms[0][0].size(0)


@register_objective
class WTFObjective(CaptionObjective):
    """
    Chaffin et al.'s WTF-RL and its Table 1 variants (`wtf_variant`; see the module docstring): beam-search captions
    (`wtf_num_beams`) and ground-truth captions weighted by `wtf_alpha` · the contrastive CLIP reward of `reward_clip`
    (temperature `contrastive_temperature`, `num_mined_neighbours` mined images per batch image) + (1 − `wtf_alpha`)
    · the discriminator's probability, with a `discriminator_pretraining_steps` phase that trains D alone first.

    The neighbours are mined when the trainer is built (the main process first, the others then read its file) and
    kept in `<output_dir>/mined_neighbours.safetensors`, which a resumed run reads instead of mining again. The
    trainer's `reward_funcs` are not used: the rewards are the method's. Every variant runs the same steps (captions,
    discriminator updates, logged reward parts), so that their logs compare; they differ only in the trajectories
    their loss weighs.

    Works with every captioner of [`rlcaption.generation.captioners`]: it needs only `generate()` and the
    log-probabilities of given captions.
    """

    name = "wtf"
    config_class = WTFConfig
    uses_rewards = False

    def __init__(self, trainer):
        super().__init__(trainer)
        args = self.args
        if trainer.train_dataset is None:
            raise ValueError(
                "The wtf objective mines the training images' CLIP neighbours when the trainer is built: pass "
                "`train_dataset`."
            )
        processor = trainer.processing_class
        self.reward = ContrastiveReward(
            args.reward_clip,
            temperature=args.contrastive_temperature,
            num_neighbours=args.num_mined_neighbours,
            cache_path=os.path.join(args.output_dir, MINED_NEIGHBOURS_NAME),
            **_pixel_normalisation(processor),
        )
        self.reward.model.to(args.device)
        with args.main_process_first(desc="mining the CLIP neighbours of the training images"):
            self.reward.prepare(trainer.train_dataset, processor)
        embedding_size = self.reward.mined.image_embeddings.size(1)
        self.discriminator = Discriminator(
            embedding_size, args.discriminator_hidden_size, reads_image=args.discriminator_input == "image_text"
        )

    def auxiliary_networks(self) -> dict[str, AuxiliaryNetwork]:
        return {
            "discriminator": AuxiliaryNetwork(self.discriminator, learning_rate=self.args.discriminator_learning_rate)
        }

    def phases(self) -> list[TrainingPhase]:
        joint = TrainingPhase("joint")
        if self.args.discriminator_pretraining_steps == 0:
            return [joint]
        return [
            TrainingPhase(
                "discriminator_pretraining", self.args.discriminator_pretraining_steps, trains_captioner=False
            ),
            joint,
        ]

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args, trainer = self.args, self.trainer
        image_inputs = image_inputs_of(inputs)
        batch_size = len(inputs["references"])
        pretraining = self.current_phase().name == "discriminator_pretraining"

        # 1. the policy's beam-search caption, its greedy caption (a baseline in T, not needed while D pretrains)
        # and one ground-truth caption of every image
        beam = trainer.beam_search_captions(image_inputs, args.wtf_num_beams)
        greedy_texts = [] if pretraining else trainer.greedy_captions(image_inputs).texts
        ground_truth_ids, ground_truth_attention, ground_truth_texts = self._ground_truth(inputs, batch_size)

        # 2. D on the frozen CLIP embeddings (the text's, or the image's and the text's): ground truth is
        # human-written (1), beam-search captions are not (0)
        embeddings = self.reward.embed_texts([*beam.texts, *greedy_texts, *ground_truth_texts])  # (2B or 3B, D)
        device = beam.sequences.device
        beam_embeddings, ground_truth_embeddings = embeddings[:batch_size], embeddings[-batch_size:]
        image_columns = {"image_id": inputs.get("image_id"), "pixel_values": inputs.get("pixel_values")}
        logits = self.discriminator_logits(
            torch.cat([ground_truth_embeddings, beam_embeddings]),
            list(range(batch_size)) * 2,
            image_columns,
            batch_size,
        )  # (2B,)
        # the labels built on the device as well as on the host: a copy to the GPU would wait for D's pass
        labels = torch.cat([torch.ones(batch_size), torch.zeros(batch_size)])
        device_labels = torch.cat([torch.ones(batch_size, device=device), torch.zeros(batch_size, device=device)])
        discriminator_loss = F.binary_cross_entropy_with_logits(logits, device_labels)
        probabilities = torch.sigmoid(logits.detach()).double().cpu()  # p_D: ground truth, then beam search
        self._record_discriminator(discriminator_loss, probabilities, labels)
        if pretraining:
            return discriminator_loss

        # 3. rewards: eq. 2 over T = {x_bs, x_gs, x_gt of every image} and I = batch images + mined neighbours
        text_image_index = list(range(batch_size)) * 3
        contrastive = self.reward.rewards(embeddings, text_image_index, image_columns, batch_size)
        parts = WTFRewardParts(
            beam=contrastive.select(slice(0, batch_size)),
            ground_truth=contrastive.select(slice(2 * batch_size, 3 * batch_size)),
            greedy_similarity=contrastive.similarity[batch_size : 2 * batch_size],
            beam_discriminator=probabilities[batch_size:],
            ground_truth_discriminator=probabilities[:batch_size],
        )
        beam_rewards, ground_truth_rewards = wtf_rewards(parts, args.wtf_variant, args.wtf_alpha)

        # 4. eq. 3 on the trajectories of the variant, with gradient through the wrapped model
        beam_log_probs = beam_mask = ground_truth_log_probs = ground_truth_mask = None
        if beam_rewards is not None:
            beam_log_probs = sample_token_log_probs(model, image_inputs, beam.sequences)
            beam_mask = caption_token_mask(beam.sequences, trainer.eos_token_id)
            beam_rewards = to_device_without_waiting(beam_rewards, device)  # not waiting for the pass just queued
        if ground_truth_rewards is not None:
            ground_truth_log_probs = token_log_probs(model, image_inputs, ground_truth_ids, ground_truth_attention)
            ground_truth_mask = ground_truth_attention[:, 1:].float()
            ground_truth_rewards = to_device_without_waiting(ground_truth_rewards, device)
        policy_loss = wtf_loss(
            beam_log_probs, beam_mask, beam_rewards,
            ground_truth_log_probs, ground_truth_mask, ground_truth_rewards,
            args.loss_normalization,
        )  # fmt: skip
        self._record_rewards(parts, beam_rewards, ground_truth_rewards, policy_loss, beam.sequences)
        if args.beta > 0:
            # 5. KL penalty to the starting policy on its beam-search captions, the captions it outputs (the ground
            # truths are not the policy's): k3 is then a penalty on those captions rather than an unbiased estimate
            # of the KL, which needs samples
            if beam_log_probs is None:
                beam_log_probs = sample_token_log_probs(model, image_inputs, beam.sequences)
                beam_mask = caption_token_mask(beam.sequences, trainer.eos_token_id)
            policy_loss = policy_loss + kl_penalty(trainer, image_inputs, beam.sequences, beam_log_probs, beam_mask)
        return policy_loss + discriminator_loss

    def discriminator_logits(
        self,
        text_embeddings: torch.Tensor,
        text_image_index: Sequence[int],
        image_columns: dict[str, Any],
        num_images: int,
    ) -> torch.FloatTensor:
        """
        D's logits of captions, through the wrapped discriminator.

        Args:
            text_embeddings (`torch.FloatTensor` of shape `(N, dim)`): the captions' CLIP embeddings.
            text_image_index (`Sequence[int]` of length `N`): the batch image of every caption.
            image_columns: one row per batch image: `image_id`, `pixel_values` (see [`ContrastiveReward.image_set`]);
                read with `discriminator_input="image_text"` only.
            num_images (`int`): the batch's images.

        Returns:
            `torch.FloatTensor` of shape `(N,)`.
        """
        discriminator = self.trainer.auxiliary_network("discriminator")
        device = next(self.discriminator.parameters()).device
        if self.args.discriminator_input == "text":
            return discriminator(text_embeddings.to(device)).float()
        # the batch's images come first in the contrastive reward's image set, in their order
        image_embeddings = self.reward.image_set(image_columns, num_images)[:num_images]  # (B, dim)
        captions_images = image_embeddings[list(text_image_index)]  # (N, dim)
        return discriminator(text_embeddings.to(device), captions_images.to(device)).float()

    def _ground_truth(
        self, inputs: dict[str, Any], batch_size: int
    ) -> tuple[torch.LongTensor, torch.LongTensor, list[str]]:
        """
        One tokenized reference per image, drawn at random among those the collator tokenized.

        Returns:
            `(input_ids, attention_mask, texts)`: `(batch_size, T)` each, and the captions decoded from the ids.
        """
        caption_image_index = inputs["caption_image_index"]
        # each image's references listed on the host, from one read of the device rather than one per image
        candidates = [[] for _ in range(batch_size)]
        for row, image in enumerate(caption_image_index.tolist()):
            candidates[image].append(row)
        rows = []
        for image, references in enumerate(candidates):
            if not references:
                raise ValueError(f"Image {image} of the batch has no tokenized reference for the wtf objective.")
            rows.append(references[int(torch.randint(len(references), ()))])
        rows = torch.tensor(rows, device=caption_image_index.device)
        attention_mask = inputs["caption_attention_mask"].index_select(0, rows)
        width = int(attention_mask.sum(dim=1).max())  # drop the padding only the unchosen references needed
        input_ids = inputs["caption_input_ids"].index_select(0, rows)[:, :width]
        texts = self.trainer.processing_class.batch_decode(input_ids, skip_special_tokens=True)
        return input_ids, attention_mask[:, :width], [text.strip() for text in texts]

    def _record_discriminator(self, loss: torch.Tensor, probabilities: torch.Tensor, labels: torch.Tensor) -> None:
        record = self.trainer.record_metric
        batch_size = len(labels) // 2
        record("discriminator_loss", loss.detach())
        record("discriminator_accuracy", ((probabilities > 0.5).double() == labels.double()).double().mean())
        record("discriminator/ground_truth_probability", probabilities[:batch_size].mean())
        record("discriminator/beam_probability", probabilities[batch_size:].mean())

    def _record_rewards(self, parts, beam_rewards, ground_truth_rewards, policy_loss, beam_sequences) -> None:
        record = self.trainer.record_metric
        for name, contrastive in (("beam", parts.beam), ("ground_truth", parts.ground_truth)):
            record(f"similarity/{name}", contrastive.similarity.mean())
            record(f"reward/{name}/i2t", contrastive.i2t.mean())
            record(f"reward/{name}/t2i", contrastive.t2i.mean())
        record("similarity/greedy", parts.greedy_similarity.mean())
        # the rewards the variant weighs its trajectories by
        for name, rewards in (("beam", beam_rewards), ("ground_truth", ground_truth_rewards)):
            if rewards is not None:
                record(f"reward/{name}", rewards.mean())
        record("policy_loss", policy_loss.detach())
        record("beam_length", caption_token_mask(beam_sequences, self.trainer.eos_token_id).sum(dim=1).mean())


def _pixel_normalisation(processor: Any) -> dict[str, Sequence[float]]:
    """`pixel_mean` and `pixel_std` of the reward from the captioner's image processor, where it declares them: they
    turn the batch's `pixel_values` back into images for images the reward has not mined."""
    image_processor = getattr(processor, "image_processor", processor)
    normalisation = {}
    for name, attribute in (("pixel_mean", "image_mean"), ("pixel_std", "image_std")):
        value = getattr(image_processor, attribute, None)
        if value is not None:
            normalisation[name] = tuple(value) if isinstance(value, Sequence) else (float(value),) * 3
    return normalisation
