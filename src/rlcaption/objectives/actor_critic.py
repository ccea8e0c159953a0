"""
Actor-critic training of a policy network and a value network (Ren et al., CVPR 2017, "Deep Reinforcement
Learning-based Image Captioning with Embedding Reward"; the equations and steps cited are those of Shi et al., ICIMCS
2018, "Image Captioning based on Deep Reinforcement Learning", which follows the same scheme).

The model is a [`PolicyValueCaptioner`]: a policy `p_π(a_t | s_t)` (a [`ShowTellRL`]) and a value network `v(s_t)`
that predicts the final reward of a caption from its image and a partial caption `s_t`. Training goes in the steps of
Shi et al. 2018 (Sec. 3.3.2):

1. The policy learns by cross-entropy first (the `xe` objective, or a published XE checkpoint), then is wrapped with
   [`PolicyValueCaptioner.from_policy`]. The reward is the trainer's mix: the visual-semantic `embedding` reward
   (trained beforehand by [`rlcaption.rewards.embedding.train_embedding_model`]), CIDEr-D, or both.
2. Phase `value_pretraining` (`value_pretraining_steps` optimizer steps): the policy is fixed; captions sampled from it
   are rewarded, and the value network is regressed to each caption's reward `R` at each of its states (eq. 9,
   `||v(s_t) − R||²`).
3. Phase `actor_critic`, to the end: both networks learn from the same samples,

       policy:  −Σ_t log p_π(a_t | s_t) · (R − v(s_t))     with v(s_t) detached    (eq. 10)
       value:   mean over states of (v(s_t) − R)²                                   (eqs. 9, 11)

   and the loss is `policy_loss + value_loss_weight · value_loss` ([`actor_critic_losses`]).

The states a caption `<bos> a_1 .. a_n` is regressed at are `s_0 = <bos>` to `s_n`, the complete caption included:
the policy's advantages read `v(s_0) .. v(s_{n−1})`, and lookahead decoding (`generate(..., lookahead_lambda=λ)`)
scores an extension by the end token with the value of the complete caption.

Each step samples `num_samples_per_image` captions per image from the current policy in evaluation mode and scores
them in evaluation mode too, as `scst` does (see `rlcaption.generation.decoding`), so the gradient is that of the
sampling policy.

The value network is the objective's auxiliary network `value` (own learning rate `value_learning_rate`, its own
parameter group, synchronised across processes, saved in every checkpoint and restored on resume). As `psst` does
with its listener, the objective takes it out of the model's parameters for the run
([`PolicyValueCaptioner.detach_value_network`]): it is in the value group only, never in the model's group nor in
DDP's replica of the model. The model still owns it, so training checkpoints and the final `save_model` hold the
trained value network with the policy, which lookahead decoding needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..evaluation import with_image_ids
from ..generation.decoding import caption_token_mask, evaluation_mode, image_inputs_of, sample_token_log_probs
from ..models.policy_value import PolicyValueCaptioner
from ..rl_config import RLCaptionConfig
from .base import (
    AuxiliaryNetwork,
    CaptionObjective,
    TrainerInterface,
    TrainingPhase,
    masked_mean_and_variance,
    register_objective,
    reward_tensor,
)
from .policy_gradient import policy_gradient_loss, sample_captions_to_score, start_sample_rewards

__all__ = [
    "ActorCriticConfig",
    "ActorCriticObjective",
    "actor_critic_losses",
    "state_mask",
    "value_explained_variance",
    "value_regression_loss",
]


@dataclass
class ActorCriticConfig(RLCaptionConfig):
    """
    Configuration of `objective="actor_critic"` (a policy and a value network, Ren et al. 2017): the value network's
    learning rate, pretraining and loss weight, besides the shared fields of [`RLCaptionConfig`].
    """

    objective: str = field(default="actor_critic", metadata={"help": "Training objective: `actor_critic`."})
    value_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the `actor_critic` value network (its own optimizer parameter group, no weight "
            "decay), scheduled like `learning_rate`; `learning_rate` when unset. The value network is a regression "
            "that can learn faster than the policy."
        },
    )
    value_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `actor_critic` that regress the value network on the rewards of "
            "captions sampled from the fixed policy (Shi et al.'s training step 3), so that joint training starts "
            "with a value network that predicts the reward; then both networks learn. 0: joint from the first step."
        },
    )
    value_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the value network's mean squared error in the joint `actor_critic` loss. Only the "
            "value network receives this gradient; with Adam its step size is set by `value_learning_rate`, not by "
            "this weight."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.value_learning_rate is not None and self.value_learning_rate <= 0:
            raise ValueError(f"value_learning_rate must be > 0 or None, got {self.value_learning_rate}.")
        if self.value_pretraining_steps < 0:
            raise ValueError(f"value_pretraining_steps must be >= 0, got {self.value_pretraining_steps}.")
        if self.value_loss_weight < 0:
            raise ValueError(f"value_loss_weight must be >= 0, got {self.value_loss_weight}.")


def state_mask(token_mask: torch.Tensor) -> torch.Tensor:
    """
    The states of sampled captions the value network is regressed at: `s_0` (`<bos>`) and the state after each
    token, the complete caption included.

    Args:
        token_mask (`torch.FloatTensor` of shape `(N, T)`): the captions' [`caption_token_mask`].

    Returns:
        `torch.FloatTensor` of shape `(N, T + 1)`, aligned with [`PolicyValueCaptioner.value`] of the sequences.
    """
    return torch.cat([token_mask.new_ones(token_mask.shape[0], 1), token_mask], dim=1)


def value_regression_loss(state_values: torch.Tensor, rewards: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """
    The value loss (Shi et al. 2018, eqs. 9, 11): the mean over the regressed states ([`state_mask`]) of
    `(v(s_t) − R)²`.

    Args:
        state_values (`torch.FloatTensor` of shape `(N, T + 1)`): `v` of every prefix of the sampled sequences.
        rewards (`torch.FloatTensor` of shape `(N,)`): `R` of each sampled caption.
        token_mask (`torch.FloatTensor` of shape `(N, T)`): the captions' [`caption_token_mask`].
    """
    states = state_mask(token_mask)  # (N, T + 1)
    squared_errors = (state_values - rewards.to(state_values)[:, None]).pow(2)
    return (squared_errors * states).sum() / states.sum()


def actor_critic_losses(
    token_log_probs: torch.Tensor,
    state_values: torch.Tensor,
    rewards: torch.Tensor,
    token_mask: torch.Tensor,
    normalization: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The two terms of Ren et al.'s joint loss.

    Args:
        token_log_probs (`torch.FloatTensor` of shape `(N, T)`): `log p_π(a_t | s_t)` of the sampled tokens.
        state_values (`torch.FloatTensor` of shape `(N, T + 1)`): `v` of every prefix of the sampled sequences
            ([`PolicyValueCaptioner.value`]): `[:, t]` is `v(s_t)`, the state before token `t + 1`.
        rewards (`torch.FloatTensor` of shape `(N,)`): `R` of each sampled caption.
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the captions' tokens, the end token included.
        normalization: `token` or `sequence`, as in [`policy_gradient_loss`].

    Returns:
        `(policy_loss, value_loss)`: `Σ_t (R − v(s_t)) · −log p_π(a_t | s_t)` normalised like SCST, with the values
        detached (the policy term never trains the value network); and the mean over the states of [`state_mask`]
        of `(v(s_t) − R)²`, whose gradient reaches only the value network.
    """
    # (N, T): R − v(s_t), for the state each token is drawn in
    advantages = rewards.to(state_values)[:, None] - state_values[:, :-1].detach()
    policy_loss = policy_gradient_loss(token_log_probs, token_mask, advantages, normalization)
    return policy_loss, value_regression_loss(state_values, rewards, token_mask)


@torch.no_grad()
def value_explained_variance(
    trainer: TrainerInterface, dataset, num_samples_per_image: int | None = None, seed: int = 0
) -> float:
    """
    How well the value network predicts the reward of captions it was not trained on: the explained variance

        EV = 1 − Var(R − v(s_t)) / Var(R)

    over every state `s_0 .. s_n` ([`state_mask`]) of captions sampled from the policy for the images of `dataset`
    (e.g. the test split), each state paired with its caption's final reward `R`. 1: `v` predicts every caption's
    reward from each of its prefixes; 0: no better than a constant (such as the mean reward); below 0: worse. The
    training logs the same ratio on the training batches.

    The captions are drawn as the run draws them ([`TrainerInterface.sample_captions`], from a random state seeded
    with `seed`, the global one left as it was) and scored by the run's rewards ([`TrainerInterface.compute_rewards`],
    recorded under `value_evaluation`); `v` is [`PolicyValueCaptioner.value`], in evaluation mode.

    Args:
        trainer ([`TrainerInterface`]): the run, its model a [`PolicyValueCaptioner`].
        dataset (`datasets.Dataset`): images and their `captions`, collated by the trainer's collator.
        num_samples_per_image (`int`, *optional*): captions sampled per image; the run's `num_samples_per_image`
            when unset.
        seed (`int`, *optional*, defaults to 0): seeds the sampling.

    Returns:
        `float`: EV; `nan` when the rewards do not vary (the ratio is undefined).
    """
    model = trainer.unwrap_model(trainer.model)
    if not isinstance(model, PolicyValueCaptioner):
        raise ValueError(
            f"The explained variance of a value network needs a PolicyValueCaptioner, got {type(model).__name__}."
        )
    num_samples = num_samples_per_image or trainer.args.num_samples_per_image
    loader = DataLoader(
        with_image_ids(dataset), batch_size=trainer.args.per_device_eval_batch_size, collate_fn=trainer.data_collator
    )
    device = next(model.parameters()).device
    targets, predictions = [], []
    with torch.random.fork_rng(), evaluation_mode(model):
        torch.manual_seed(seed)
        for batch in loader:
            # 1. captions sampled from the policy and their rewards R
            image_inputs = {name: tensor.to(device) for name, tensor in image_inputs_of(batch).items()}
            samples = trainer.sample_captions(image_inputs, num_return_sequences=num_samples)
            sample_index = torch.arange(len(batch["references"]), device=device).repeat_interleave(num_samples)
            rewards = trainer.compute_rewards(
                samples.texts, batch, row_index=sample_index.tolist(), log_prefix="value_evaluation"
            )  # (N,)
            # 2. v(s_t) at every state of every caption, each state paired with R
            values = model.value(input_ids=samples.sequences, image_index=sample_index, **image_inputs)  # (N, T + 1)
            states = state_mask(caption_token_mask(samples.sequences, trainer.eos_token_id)).bool()
            rewards = torch.as_tensor(rewards, dtype=torch.float64, device=device)[:, None].expand_as(values)
            targets.append(rewards[states])
            predictions.append(values[states].double())
    targets, predictions = torch.cat(targets), torch.cat(predictions)
    # only where the rewards vary, as in training: the ratio of a constant reward's (rounding-level) variance is noise
    if float(targets.std()) <= 1e-6:
        return float("nan")
    return 1.0 - float((targets - predictions).var(unbiased=False) / targets.var(unbiased=False))


@register_objective
class ActorCriticObjective(CaptionObjective):
    """
    Ren et al.'s actor-critic for a [`PolicyValueCaptioner`] (see the module documentation): value pretraining with the
    policy fixed for `value_pretraining_steps`, then policy gradient with the advantage `R − v(s_t)` and value
    regression together, `policy_loss + value_loss_weight · value_loss`.

    Logs `policy_loss` (joint phase), `value_loss`, `value_mean`, `value_explained_variance` (1 − Var(R − v) / Var(R)
    over the regressed states: how much of the rewards' spread the value network predicts), `advantage_std`,
    `sample_length`, and the rewards.
    """

    name = "actor_critic"
    config_class = ActorCriticConfig

    def __init__(self, trainer):
        super().__init__(trainer)
        model = trainer.unwrap_model(trainer.model)
        if not isinstance(model, PolicyValueCaptioner):
            raise ValueError(
                f"The actor_critic objective trains a PolicyValueCaptioner (a policy and its value network), got "
                f"{type(model).__name__}. Wrap a trained ShowTellRL with "
                "`PolicyValueCaptioner.from_policy(captioner)`: the value network reads the policy's recurrent "
                "states, which needs rlcaption's recurrent captioners; train transformers captioners (Florence-2, "
                "BLIP, PaliGemma, ...) with `xe`, `scst`, `sle` or `wtf`."
            )
        self.value_network = model.detach_value_network()

    def auxiliary_networks(self) -> dict[str, AuxiliaryNetwork]:
        return {"value": AuxiliaryNetwork(self.value_network, learning_rate=self.args.value_learning_rate)}

    def phases(self) -> list[TrainingPhase]:
        joint = TrainingPhase("actor_critic")
        if self.args.value_pretraining_steps == 0:
            return [joint]
        return [TrainingPhase("value_pretraining", self.args.value_pretraining_steps, trains_captioner=False), joint]

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args, trainer = self.args, self.trainer
        image_inputs = image_inputs_of(inputs)

        # 1. captions sampled from the current policy (evaluation mode); on a GPU the device may still be sampling when
        # this returns, the samples `max_caption_length + 1` wide
        num_samples = args.num_samples_per_image
        samples, sample_index, _ = sample_captions_to_score(trainer, inputs, num_samples)
        sequences = samples.sequences  # (N, T + 1)
        token_mask = caption_token_mask(sequences, trainer.eos_token_id)  # (N, T)
        value_pretraining = self.current_phase().name == "value_pretraining"

        # 2. the passes that need the samples' token ids only, queued before their texts are read for the rewards
        # (which waits for the samples): v(s_t) at every prefix, through the wrapped value network (its gradients are
        # synchronised); and, unless the value network is pretrained with the policy fixed, log p_π(a_t | s_t) under
        # the distribution that sampled the captions, with gradient, through the wrapped model
        state_values = trainer.auxiliary_network("value")(
            sequences, **image_inputs, image_index=sample_index
        ).float()  # (N, T + 1)
        if not value_pretraining:
            token_log_probs = sample_token_log_probs(
                model, image_inputs, sequences, image_index=sample_index
            )  # (N, T)

        # 3. the rewards R, computed on the host while the device runs those passes
        pending_rewards = start_sample_rewards(trainer, inputs, samples, num_samples)
        rewards = reward_tensor(pending_rewards.result(), sequences.device)  # (N,)
        if value_pretraining:
            value_loss = value_regression_loss(state_values, rewards, token_mask)
            self._record(state_values.detach(), rewards, token_mask, value_loss)
            return value_loss

        # 4. the advantage R − v(s_t) weighs the policy's tokens; the value network regresses R
        policy_loss, value_loss = actor_critic_losses(
            token_log_probs, state_values, rewards, token_mask, args.loss_normalization
        )
        self._record(state_values.detach(), rewards, token_mask, value_loss)
        trainer.record_metric("policy_loss", policy_loss)
        return policy_loss + args.value_loss_weight * value_loss

    def _record(
        self, state_values: torch.Tensor, rewards: torch.Tensor, token_mask: torch.Tensor, value_loss: torch.Tensor
    ) -> None:
        # tensors, read at the log: nothing here waits for the device
        record = self.trainer.record_metric
        states = state_mask(token_mask)
        targets = rewards[:, None].expand_as(state_values)
        _, target_variance = masked_mean_and_variance(targets, states)
        _, error_variance = masked_mean_and_variance(targets - state_values, states)
        _, advantage_variance = masked_mean_and_variance(rewards[:, None] - state_values[:, :-1], token_mask)
        record("value_loss", value_loss.detach())
        record("value_mean", masked_mean_and_variance(state_values, states)[0])
        record("advantage_std", advantage_variance.sqrt().nan_to_num(0.0))  # 0 for a single scored token
        # only where the rewards vary: the ratio of a constant reward's (rounding-level) variance is noise; NaN (left
        # out of the log) elsewhere
        explained = 1.0 - error_variance / target_variance
        record("value_explained_variance", explained.where(target_variance.sqrt() > 1e-6, torch.nan))
        record("sample_length", token_mask.sum(dim=1).mean())
