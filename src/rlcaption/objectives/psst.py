"""
Cooperative speaker-listener training with partial-sampling straight-through (Vered et al., "Joint
Optimization for Cooperative Image Captioning", ICCV 2019).

A [`SpeakerListener`]'s speaker and listener minimise together (eq. 1)

    λ · l_disc(w, I) + (1 − λ) · l_nat(w)

- `l_nat = −CIDEr-D(w)` needs discrete words, so it is optimised by REINFORCE: it is exactly the loss of the `scst`
  objective without its entropy bonus ([`self_critical_loss`]: samples, rewards, `baseline` and `loss_normalization`
  of the config; the self-critical greedy baseline by default) on captions sampled as test-time decoding would, in
  evaluation mode.
- `l_disc` (eq. 2, VSE++ with the hardest negatives of the batch in both directions, margin 1) is the listener's loss
  on the words the speaker passes while decoding with gradients ([`decode_with_word_passing`] in mode `psst_mode`):
  straight-through one-hots (`st`, ρ = 0), Gumbel-softmax vectors (`gumbel`, `st_gumbel`), or PSST's per-step mix of
  the full distribution (probability `psst_rho`) and the straight-through one-hot (`psst`, `psst_gumbel`). Its
  gradient trains the listener and, through the words and the word embeddings the listener reads, the speaker. In
  `reinforce` mode neither carries a gradient: the listener still trains on `l_disc`, and the speaker learns from it by
  a REINFORCE term alone, whose reward is each caption's negated listener loss, with the mean reward of the batch's
  other captions as baseline.

Both networks learn in every step (`psst_schedule="joint"`), or in turns (`"alternating"`, as the paper trains its
REINFORCE baseline): `alternating_listener_steps` steps where the listener alone learns `l_disc` from the fixed
speaker's words, then `alternating_speaker_steps` where the speaker alone learns eq. 1 from the fixed listener. The
Gumbel modes' temperature is fixed or annealed as Jang et al. 2017 anneal it, `τ = max(0.5, exp(−r t))`
(`gumbel_temperature_schedule`), the "Gumbel temperature annealing" baseline of the paper.

The listener is an auxiliary network of the trainer, with its own learning rate (`listener_learning_rate`). It lives
in the [`SpeakerListener`], whose published checkpoints must hold it; this objective takes it out of the model's
parameters for the run ([`SpeakerListener.detach_listener`]), so that it is in the listener's optimizer group only and
never in the model's, nor in DDP's replica of the model. The model keeps using and saving it: training checkpoints and
the final `save_model` both write the trained listener with the speaker, and resuming restores it (from the model's
weights, then from `auxiliary_networks.safetensors`, which hold the same values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..generation.decoding import evaluation_mode, forward_through, image_inputs_of
from ..models.captions import soft_word_embeddings
from ..models.speaker_listener import SpeakerListener
from ..rl_config import RLCaptionConfig
from .base import AuxiliaryNetwork, CaptionObjective, TrainingPhase, register_objective
from .policy_gradient import policy_gradient_loss
from .scst import check_self_critical_baseline, self_critical_loss
from .word_passing import WORD_PASSING_MODES, decode_with_word_passing

PSST_SCHEDULES = ("joint", "alternating")
GUMBEL_TEMPERATURE_SCHEDULES = ("constant", "annealed")

__all__ = [
    "GUMBEL_TEMPERATURE_SCHEDULES",
    "PSST_SCHEDULES",
    "DiscriminabilityTerms",
    "PSSTConfig",
    "PSSTObjective",
    "annealed_gumbel_temperature",
    "vse_hardest_negative_losses",
    "vse_mean_violation_losses",
]


@dataclass
class PSSTConfig(RLCaptionConfig):
    """
    Configuration of `objective="psst"` (Vered et al. 2019): the weight λ of the listener's loss, how words are passed
    to the listener, the listener's training, and the reward baseline of the naturalness term, besides the shared
    fields of [`RLCaptionConfig`].
    """

    objective: str = field(default="psst", metadata={"help": "Training objective: `psst`."})
    baseline: str = field(
        default="greedy",
        metadata={
            "help": "Reward baseline of the naturalness term of `psst`, `scst`'s REINFORCE: `greedy` (reward of the "
            "greedy caption, Rennie et al. 2017), `mean_of_others` (mean reward of the other samples of the same "
            "image) or `none`."
        },
    )
    psst_lambda: float = field(
        default=5e-3,
        metadata={
            "help": "λ of Vered et al.'s eq. 1, `λ · l_disc + (1 − λ) · l_nat`: the weight of the listener's "
            "discriminability loss against the naturalness loss (−CIDEr-D by `scst`'s REINFORCE) in `psst`. The "
            "paper traces the trade-off over λ in {10, 5, 2.5, 1.6, 1, 0.5} × 1e-3; 0 is `scst`."
        },
    )
    psst_mode: str = field(
        default="psst",
        metadata={
            "help": "How the `psst` speaker passes words to the listener (`rlcaption.objectives.word_passing`): `st` "
            "(straight-through one-hots, ρ = 0), `psst` (the full distribution at a share `psst_rho` of the steps), "
            "`gumbel` (Gumbel-softmax vectors), `st_gumbel`, `psst_gumbel`, or `reinforce` (plain one-hots; the "
            "speaker is rewarded by the negated listener loss)."
        },
    )
    psst_rho: float = field(
        default=0.25,
        metadata={
            "help": "ρ of the `psst` and `psst_gumbel` modes: the probability that a step passes the full "
            "distribution instead of a straight-through one-hot. The paper finds 0.25 best; 0 and 1 are worse."
        },
    )
    gumbel_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Temperature τ of the Gumbel-softmax in the `gumbel`, `st_gumbel` and `psst_gumbel` modes; the "
            "starting temperature τ₀ of an annealed schedule."
        },
    )
    gumbel_temperature_schedule: str = field(
        default="constant",
        metadata={
            "help": "`constant` (τ = `gumbel_temperature` throughout) or `annealed`: Jang et al. 2017's schedule, "
            "τ = max(`gumbel_min_temperature`, τ₀ · exp(−r · t)) at optimizer step t, with r "
            "`gumbel_annealing_rate` and t rounded down to a multiple of `gumbel_annealing_interval`. `st_gumbel` "
            "with `annealed` is Vered et al.'s 'Gumbel temperature annealing' baseline."
        },
    )
    gumbel_annealing_rate: float = field(
        default=1e-5,
        metadata={"help": "r of the `annealed` Gumbel temperature schedule (Jang et al. 2017 use 1e-5 or 1e-4)."},
    )
    gumbel_annealing_interval: int = field(
        default=500,
        metadata={
            "help": "Optimizer steps between updates of the `annealed` Gumbel temperature (Jang et al. 2017: 500 "
            "or 1,000)."
        },
    )
    gumbel_min_temperature: float = field(
        default=0.5, metadata={"help": "The floor of the `annealed` Gumbel temperature (0.5 in Jang et al. 2017)."}
    )
    psst_schedule: str = field(
        default="joint",
        metadata={
            "help": "`joint`: the speaker and the listener both learn in every step after the listener's warm-up. "
            "`alternating`: they take turns, as in Vered et al.'s REINFORCE baseline: `alternating_listener_steps` "
            "where only the listener learns (eq. 2 on the fixed speaker's words), then `alternating_speaker_steps` "
            "where only the speaker learns (eq. 1 against the fixed listener), and again."
        },
    )
    alternating_listener_steps: int = field(
        default=1, metadata={"help": "Optimizer steps of each listener turn of `psst_schedule=alternating`."}
    )
    alternating_speaker_steps: int = field(
        default=1, metadata={"help": "Optimizer steps of each speaker turn of `psst_schedule=alternating`."}
    )
    listener_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Steps at the start of a `psst` run where only the listener learns, from the words of the fixed "
            "speaker, by the hinge averaged over all negatives (the hardest-negative hinge of eq. 2 does not train a "
            "new listener); then the joint phase. 0: joint from the first step."
        },
    )
    listener_learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "Learning rate of the `psst` listener (its own optimizer parameter group, no weight decay), "
            "scheduled like `learning_rate`."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_self_critical_baseline(self.baseline, self.num_samples_per_image)
        if not 0.0 <= self.psst_lambda <= 1.0:
            raise ValueError(f"psst_lambda weighs two losses and must be in [0, 1], got {self.psst_lambda}.")
        if self.psst_mode not in WORD_PASSING_MODES:
            raise ValueError(f"psst_mode={self.psst_mode!r} is not one of {WORD_PASSING_MODES}.")
        if not 0.0 <= self.psst_rho <= 1.0:
            raise ValueError(f"psst_rho is a probability and must be in [0, 1], got {self.psst_rho}.")
        if self.gumbel_temperature <= 0:
            raise ValueError(f"gumbel_temperature must be > 0, got {self.gumbel_temperature}.")
        if self.gumbel_temperature_schedule not in GUMBEL_TEMPERATURE_SCHEDULES:
            raise ValueError(
                f"gumbel_temperature_schedule={self.gumbel_temperature_schedule!r} is not one of "
                f"{GUMBEL_TEMPERATURE_SCHEDULES}."
            )
        if self.gumbel_annealing_rate < 0:
            raise ValueError(f"gumbel_annealing_rate must be >= 0, got {self.gumbel_annealing_rate}.")
        if self.gumbel_annealing_interval < 1:
            raise ValueError(
                f"gumbel_annealing_interval counts steps and must be >= 1, got {self.gumbel_annealing_interval}."
            )
        if not 0 < self.gumbel_min_temperature <= self.gumbel_temperature:
            raise ValueError(
                f"gumbel_min_temperature must be in (0, gumbel_temperature={self.gumbel_temperature}], got "
                f"{self.gumbel_min_temperature}."
            )
        if self.psst_schedule not in PSST_SCHEDULES:
            raise ValueError(f"psst_schedule={self.psst_schedule!r} is not one of {PSST_SCHEDULES}.")
        if self.psst_schedule == "alternating" and self.psst_lambda == 0:
            raise ValueError(
                "psst_schedule='alternating' gives the listener turns of its own, but psst_lambda=0 never trains it "
                "(that is `scst`); set psst_lambda > 0 or psst_schedule='joint'."
            )
        if self.alternating_listener_steps < 1 or self.alternating_speaker_steps < 1:
            raise ValueError(
                "alternating_listener_steps and alternating_speaker_steps must be >= 1, got "
                f"{self.alternating_listener_steps} and {self.alternating_speaker_steps}."
            )
        if self.listener_learning_rate <= 0:
            raise ValueError(f"listener_learning_rate must be > 0, got {self.listener_learning_rate}.")
        if self.listener_pretraining_steps < 0:
            raise ValueError(f"listener_pretraining_steps must be >= 0, got {self.listener_pretraining_steps}.")


def vse_hardest_negative_losses(similarities: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """
    Vered et al.'s discriminability loss (eq. 2), the VSE++ hinge with the hardest negatives of the batch (Faghri et
    al. 2018), for every caption:

        max(0, margin − Φ(w, I) + Φ(w', I)) + max(0, margin − Φ(w, I) + Φ(w, I'))

    with `w'` the caption of another image most similar to `I`, and `I'` the other image most similar to `w`.

    Args:
        similarities (`torch.FloatTensor` of shape `(batch_size, batch_size)`):
            `Φ(w_i, I_j)`, caption `i` against image `j`; caption `i` describes image `i`.
        margin (`float`, *optional*, defaults to 1.0): the hinge's margin.

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`; 0 for a batch of one (it has no negative).
    """
    if similarities.dim() != 2 or similarities.shape[0] != similarities.shape[1]:
        raise ValueError(f"Expected a square caption-by-image similarity matrix, got {tuple(similarities.shape)}.")
    positives = similarities.diagonal()  # (B,)
    is_positive = torch.eye(similarities.shape[0], dtype=torch.bool, device=similarities.device)
    negatives = similarities.masked_fill(is_positive, float("-inf"))  # a hinge of -inf is 0, with zero gradient
    hardest_caption = negatives.max(dim=0).values  # (B,): for image i, the most similar caption of another image
    hardest_image = negatives.max(dim=1).values  # (B,): for caption i, the most similar other image
    return F.relu(margin - positives + hardest_caption) + F.relu(margin - positives + hardest_image)


def vse_mean_violation_losses(similarities: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """
    The hinge of eq. 2 averaged over every negative of the batch instead of the hardest one (VSE0, Kiros et al.
    2014), for every caption: the loss that warms a new listener up. From a random start the hardest negative is as
    close as the positive for every caption, and the hardest-negative loss stays at `2 · margin` with a gradient that
    does not separate them (measured on shapes: 2.00 after 1,200 steps, batch R@1 at chance); the mean over all
    negatives does (1.29 after 200 steps at learning rate 2e-3).

    Args:
        similarities (`torch.FloatTensor` of shape `(batch_size, batch_size)`): as in [`vse_hardest_negative_losses`].
        margin (`float`, *optional*, defaults to 1.0): the hinge's margin.

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`; 0 for a batch of one.
    """
    if similarities.dim() != 2 or similarities.shape[0] != similarities.shape[1]:
        raise ValueError(f"Expected a square caption-by-image similarity matrix, got {tuple(similarities.shape)}.")
    batch_size = similarities.shape[0]
    if batch_size < 2:
        return similarities.diagonal() * 0.0
    positives = similarities.diagonal()  # (B,)
    is_negative = ~torch.eye(batch_size, dtype=torch.bool, device=similarities.device)
    images_for_caption = F.relu(margin - positives[:, None] + similarities) * is_negative  # row i: caption i
    captions_for_image = F.relu(margin - positives[None, :] + similarities) * is_negative  # column j: image j
    return (images_for_caption.sum(dim=1) + captions_for_image.sum(dim=0)) / (batch_size - 1)


def annealed_gumbel_temperature(
    step: int,
    initial_temperature: float = 1.0,
    rate: float = 1e-5,
    interval: int = 500,
    min_temperature: float = 0.5,
) -> float:
    """
    Jang et al. 2017's annealed Gumbel-softmax temperature, `τ = max(τ_min, τ₀ · exp(−r · t))`, with `t` the
    optimizer step rounded down to a multiple of `interval` (the temperature is updated every `interval` steps).
    `τ₀ = 1`, `τ_min = 0.5` are theirs and Vered et al.'s, `τ = max(0.5, exp(−r t))`.
    """
    updated_at = step - step % interval
    return max(min_temperature, initial_temperature * math.exp(-rate * updated_at))


@dataclass
class DiscriminabilityTerms:
    """
    The `l_disc` part of a batch's [`PSSTObjective`] loss, before the weight λ.

    Args:
        listener_losses (`torch.FloatTensor` of shape `(batch_size,)`):
            [`vse_hardest_negative_losses`] of the listener's similarities. Its gradient trains the listener (unless
            it is fixed for the speaker's turn) and the speaker's word embeddings (which the listener reads), and the
            rest of the speaker through the passed words, except in `reinforce` mode, where it reaches no speaker
            parameter.
        speaker_policy_loss (`torch.FloatTensor` of shape `()`, *optional*):
            In `reinforce` mode only: the REINFORCE loss of the speaker's sampled words, rewarded by their negated
            listener losses.
        similarities (`torch.FloatTensor` of shape `(batch_size, batch_size)`):
            The listener's cosine similarities of the passed captions (rows) with the images (columns).
        soft_step_share (`torch.FloatTensor` of shape `()`):
            Share of the decoded steps that passed a soft vector instead of a one-hot.
    """

    listener_losses: torch.Tensor
    speaker_policy_loss: torch.Tensor | None
    similarities: torch.Tensor
    soft_step_share: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        """`l_disc` of the batch: the mean listener loss, plus the speaker's REINFORCE term in `reinforce` mode."""
        loss = self.listener_losses.mean()
        return loss if self.speaker_policy_loss is None else loss + self.speaker_policy_loss


@register_objective
class PSSTObjective(CaptionObjective):
    """
    `λ · l_disc + (1 − λ) · l_nat` of Vered et al. 2019 for a [`SpeakerListener`] (see the module documentation), with
    λ = `psst_lambda`. λ = 0 is the `scst` objective (the listener is then not trained); λ = 1 drops `l_nat`.

    Logs `listener_loss` (the mean of eq. 2), `listener_batch_R@1` (the share of passed captions whose own image the
    listener ranks first in the batch), `soft_step_share`, `gumbel_temperature` in the Gumbel modes, `speaker_turn` (1
    in a speaker turn, 0 in a listener turn) with `psst_schedule="alternating"`, and what `scst` logs for `l_nat`.
    """

    name = "psst"
    config_class = PSSTConfig

    def __init__(self, trainer):
        super().__init__(trainer)
        model = trainer.unwrap_model(trainer.model)
        if not isinstance(model, SpeakerListener):
            raise ValueError(
                f"The psst objective trains a SpeakerListener (a speaker and its listener), got "
                f"{type(model).__name__}. Wrap a trained ShowTellRL with `SpeakerListener.from_speaker(captioner)`: "
                "word passing feeds the listener the speaker's soft words step by step, which needs rlcaption's "
                "recurrent captioners; train transformers captioners (Florence-2, BLIP, PaliGemma, ...) with `xe`, "
                "`scst`, `sle` or `wtf`."
            )
        self.listener = model.detach_listener()

    def auxiliary_networks(self) -> dict[str, AuxiliaryNetwork]:
        return {"listener": AuxiliaryNetwork(self.listener, learning_rate=self.args.listener_learning_rate)}

    def phases(self) -> list[TrainingPhase]:
        joint = TrainingPhase("joint")
        if self.args.listener_pretraining_steps == 0:
            return [joint]
        warm_up = TrainingPhase("listener_pretraining", self.args.listener_pretraining_steps, trains_captioner=False)
        return [warm_up, joint]

    def gumbel_temperature(self) -> float:
        """The Gumbel-softmax temperature τ of the current optimizer step (`gumbel_temperature_schedule`)."""
        args = self.args
        if args.gumbel_temperature_schedule == "constant":
            return args.gumbel_temperature
        return annealed_gumbel_temperature(
            self.trainer.state.global_step,
            initial_temperature=args.gumbel_temperature,
            rate=args.gumbel_annealing_rate,
            interval=args.gumbel_annealing_interval,
            min_temperature=args.gumbel_min_temperature,
        )

    def learning_network(self) -> str:
        """
        Which network learns in the current step of the joint phase: `"both"` (`psst_schedule="joint"`), or in turns,
        `"listener"` for the first `alternating_listener_steps` of every cycle and `"speaker"` for the rest. Like the
        phases, a function of the optimizer step alone, so a resumed run continues in its turn.
        """
        args = self.args
        if args.psst_schedule == "joint":
            return "both"
        step_in_joint_phase = self.trainer.state.global_step - args.listener_pretraining_steps
        cycle = args.alternating_listener_steps + args.alternating_speaker_steps
        return "listener" if step_in_joint_phase % cycle < args.alternating_listener_steps else "speaker"

    def listener_pretraining_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """
        The listener alone learns to find the images from the words the fixed speaker passes, by the mean-violation
        hinge ([`vse_mean_violation_losses`]): a new listener does not learn from the hardest negatives, and the
        speaker must not learn from a listener that cannot yet listen.
        """
        return self.fixed_speaker_listener_loss(model, inputs, vse_mean_violation_losses)

    def fixed_speaker_listener_loss(self, model: nn.Module, inputs: dict[str, Any], losses_of=None) -> torch.Tensor:
        """
        The listener's loss on the words of the fixed speaker (decoded in evaluation mode, without gradient), which
        trains the listener alone: `losses_of(similarities)` (default: eq. 2, [`vse_hardest_negative_losses`]),
        averaged over the batch. The listener's warm-up, and its turns of an alternating schedule.
        """
        args, trainer = self.args, self.trainer
        losses_of = vse_hardest_negative_losses if losses_of is None else losses_of
        image_inputs = image_inputs_of(inputs)
        with evaluation_mode(model), torch.no_grad():
            passed = forward_through(
                model, decode_with_word_passing, **image_inputs, mode=args.psst_mode,
                max_length=args.max_caption_length + 1, rho=args.psst_rho,
                gumbel_temperature=self.gumbel_temperature(), temperature=args.temperature,
            )  # fmt: skip
        # the words embedded by the speaker without gradient: the fixed speaker gets none through them either
        with torch.no_grad():
            word_vectors = soft_word_embeddings(passed.words, trainer.unwrap_model(model).get_input_embeddings())
        caption_embeddings, image_embeddings = trainer.auxiliary_network("listener")(
            word_vectors, None, caption_mask=passed.step_mask, **image_inputs
        )
        similarities = caption_embeddings @ image_embeddings.T  # (B, B)
        self._record_listener_metrics(vse_hardest_negative_losses(similarities.detach()), similarities)
        return losses_of(similarities).mean()

    def _record_listener_metrics(self, listener_losses: torch.Tensor, similarities: torch.Tensor) -> None:
        similarities = similarities.detach()
        own_image_first = similarities.argmax(dim=1) == torch.arange(len(similarities), device=similarities.device)
        self.trainer.record_metric("listener_loss", listener_losses.mean())
        self.trainer.record_metric("listener_batch_R@1", own_image_first.float().mean())

    def discriminability_terms(
        self, model: nn.Module, inputs: dict[str, Any], fixed_listener: bool = False
    ) -> DiscriminabilityTerms:
        """
        Decodes the batch's images with word passing (`psst_mode`) and scores the passed words with the listener.

        Args:
            model: the (possibly DDP-wrapped) [`SpeakerListener`]; its decoding runs through the wrapper's forward.
            inputs: the collated batch.
            fixed_listener: the speaker's turn of an alternating schedule: the listener's parameters are constants,
                so its loss reaches the speaker alone.
        """
        args, trainer = self.args, self.trainer
        image_inputs = image_inputs_of(inputs)
        # 1. the speaker decodes, passing word vectors over the vocabulary (in the model's mode, dropout included)
        passed = forward_through(
            model,
            decode_with_word_passing,
            **image_inputs,
            mode=args.psst_mode,
            max_length=args.max_caption_length + 1,  # + <bos>
            rho=args.psst_rho,
            gumbel_temperature=self.gumbel_temperature(),
            temperature=args.temperature,
        )
        # 2. the listener embeds them with the speaker's word embeddings, and the images with its own encoder
        word_embeddings = trainer.unwrap_model(model).get_input_embeddings()
        listener_arguments = (passed.words, word_embeddings)
        if args.psst_mode == "reinforce":
            # REINFORCE (Williams 1992) trains the speaker by its reward alone: the listener reads the embedded words
            # as constants, so its loss reaches no speaker parameter
            with torch.no_grad():
                listener_arguments = (soft_word_embeddings(passed.words, word_embeddings), None)
        listener_keywords = {"caption_mask": passed.step_mask, **image_inputs}
        if fixed_listener:
            # outside the listener's DDP wrapper: with its parameters as constants it has no gradient to synchronise
            constants = {name: parameter.detach() for name, parameter in self.listener.named_parameters()}
            caption_embeddings, image_embeddings = functional_call(
                self.listener, constants, listener_arguments, listener_keywords
            )
        else:
            caption_embeddings, image_embeddings = trainer.auxiliary_network("listener")(
                *listener_arguments, **listener_keywords
            )
        similarities = caption_embeddings @ image_embeddings.T  # (B, B)
        listener_losses = vse_hardest_negative_losses(similarities)  # (B,)
        # 3. in `reinforce` mode, the speaker learns from the listener's loss as a reward instead of its gradient
        speaker_policy_loss = None
        if args.psst_mode == "reinforce":
            rewards = -listener_losses.detach()
            batch_size = rewards.shape[0]
            others_mean = (rewards.sum() - rewards) / (batch_size - 1) if batch_size > 1 else torch.zeros_like(rewards)
            speaker_policy_loss = policy_gradient_loss(
                passed.log_probs, passed.step_mask.float(), rewards - others_mean, args.loss_normalization
            )
        soft_steps = passed.soft_steps.float().sum() / passed.step_mask.sum()
        return DiscriminabilityTerms(listener_losses, speaker_policy_loss, similarities, soft_steps)

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        if "gumbel" in self.args.psst_mode:
            self.trainer.record_metric("gumbel_temperature", self.gumbel_temperature())
        if self.current_phase().name == "listener_pretraining":
            return self.listener_pretraining_loss(model, inputs)
        learning = self.learning_network()
        if learning != "both":
            self.trainer.record_metric("speaker_turn", float(learning == "speaker"))
        if learning == "listener":
            return self.fixed_speaker_listener_loss(model, inputs)
        weight = self.args.psst_lambda
        loss = None
        if weight > 0:
            terms = self.discriminability_terms(model, inputs, fixed_listener=learning == "speaker")
            loss = weight * terms.loss
            self._record_listener_metrics(terms.listener_losses, terms.similarities)
            self.trainer.record_metric("soft_step_share", terms.soft_step_share)
        if weight < 1:
            naturalness = (1 - weight) * self_critical_loss(self.trainer, model, inputs, self.args.baseline)
            loss = naturalness if loss is None else loss + naturalness
        return loss
