"""
SPIDEr policy gradient (Liu et al., "Improved Image Captioning via Policy Gradient optimization of SPIDEr",
ICCV 2017).

For each image, M captions `g_{1:T}` are sampled from the policy. For every step t of a sampled caption, K Monte-Carlo
rollouts continue the prefix `g_{1:t}` with the current policy and

    Q(g_{1:t-1}, g_t) ≈ (1/K) Σ_k R(g_{1:t} ; g^k_{t+1:T})                      (paper, eq. 9)

with Q = R(g_{1:T}) itself at the last step (the end token, or the last token at the maximum length). A baseline
`B_phi(s_t)`, an MLP on the detached LSTM hidden state ([`SpiderPGBaseline`], an auxiliary network of the trainer), is
fitted to Q by mean squared error, and the policy follows

    ∇θ V(s_0) ≈ Σ_t (Q(s_t, g_t) − B_phi(s_t)) ∇θ log π_θ(g_t | s_t).          (paper, eq. 12)

All prefixes × rollouts of a batch are decoded together: the LSTM state after every prefix comes from one pass over the
sampled captions ([`ShowTellRL.prefix_states`]), is repeated K times, and all rows are stepped in one loop until they
end; prefixes are never re-encoded. On a GPU that loop is captured as one CUDA graph and replayed, its rows padded to
one of a few counts so that batches of other caption lengths reuse the graph. [`sample_rollouts_per_prefix`] is the
plain one-prefix-at-a-time version, kept as the reference the batched decoder is tested and benchmarked against.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, LogitsProcessorList

from ..generation.decoding import (
    GeneratedCaptions,
    caption_token_mask,
    evaluation_mode,
    image_inputs_of,
    repeat_image_inputs,
    selective_log_softmax,
)
from ..generation.step_decoding import (
    STEPS_BETWEEN_END_CHECKS,
    graphed_call,
    logits_warpers,
    split_state,
    state_with,
    uses_cuda_graphs,
)
from ..models.show_tell_rl import CACHE_NAME
from ..rewards.processes import Pending
from ..rl_config import RLCaptionConfig
from .base import (
    AuxiliaryNetwork,
    CaptionObjective,
    TrainingPhase,
    masked_mean_and_variance,
    register_objective,
    reward_tensor,
)
from .policy_gradient import policy_gradient_loss, start_sample_rewards

__all__ = [
    "Rollouts",
    "SpiderPGConfig",
    "SpiderPGBaseline",
    "SpiderPGObjective",
    "monte_carlo_q_values",
    "rollout_prefixes",
    "sample_rollouts",
    "sample_rollouts_per_prefix",
    "spider_pg_losses",
]


@dataclass
class SpiderPGConfig(RLCaptionConfig):
    """
    Configuration of `objective="spider_pg"` (Liu et al. 2017): sampled paths, Monte-Carlo rollouts and the learned
    baseline, besides the shared fields of [`RLCaptionConfig`].
    """

    objective: str = field(default="spider_pg", metadata={"help": "Training objective: `spider_pg`."})
    num_paths_per_image: int = field(
        default=1,
        metadata={
            "help": "Captions sampled per image and step by `spider_pg` (M in Liu et al. 2017, who use 1), each "
            "continued by `num_rollouts` rollouts from every prefix; `scst` samples `num_samples_per_image`."
        },
    )
    num_rollouts: int = field(
        default=3,
        metadata={
            "help": "Monte-Carlo rollouts continued from every prefix of a sampled caption by `spider_pg` to estimate "
            "Q (K in Liu et al. 2017, who use 3)."
        },
    )
    baseline_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the baseline's mean squared error in the `spider_pg` loss. Only the baseline receives "
            "this gradient; with Adam its step size is set by `learning_rate`, not by this weight."
        },
    )

    baseline_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `spider_pg` that fit the baseline to Q with the policy fixed, "
            "so that joint training starts with a baseline that explains Q (an untrained one only adds noise)."
        },
    )
    baseline_hidden_size: int = field(
        default=512,
        metadata={"help": "Hidden width of the `spider_pg` baseline, an MLP on the captioner's hidden state."},
    )
    baseline_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the `spider_pg` baseline (its own optimizer parameter group, no weight decay); "
            "`learning_rate` when unset. The baseline is a regression that can learn faster than the policy."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.num_paths_per_image < 1:
            raise ValueError(f"num_paths_per_image must be >= 1 for spider_pg, got {self.num_paths_per_image}.")
        if self.num_rollouts < 1:
            raise ValueError(f"num_rollouts must be >= 1 for spider_pg, got {self.num_rollouts}.")
        if self.baseline_loss_weight < 0:
            raise ValueError(f"baseline_loss_weight must be >= 0, got {self.baseline_loss_weight}.")
        if self.baseline_pretraining_steps < 0:
            raise ValueError(f"baseline_pretraining_steps must be >= 0, got {self.baseline_pretraining_steps}.")
        if self.baseline_hidden_size < 1:
            raise ValueError(f"baseline_hidden_size must be >= 1, got {self.baseline_hidden_size}.")
        if self.baseline_learning_rate is not None and self.baseline_learning_rate <= 0:
            raise ValueError(f"baseline_learning_rate must be > 0 or None, got {self.baseline_learning_rate}.")


@dataclass
class Rollouts:
    """
    Captions completed from prefixes of sampled captions, K rows per prefix.

    Args:
        sequences (`torch.LongTensor` of shape `(R, max_length + 1)`):
            Start token, the prefix `g_{1:t}`, then the sampled continuation; padded after the end token.
        caption_index (`torch.LongTensor` of shape `(R,)`):
            Row of the sampled caption whose prefix each rollout continues.
        prefix_length (`torch.LongTensor` of shape `(R,)`):
            t, the number of sampled tokens kept (`1 <= t < ` the caption's length).
    """

    sequences: torch.LongTensor
    caption_index: torch.LongTensor
    prefix_length: torch.LongTensor


def rollout_prefixes(token_mask: torch.Tensor, num_rollouts: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """
    The prefixes that need rollouts: every step of every caption except its last, each repeated `num_rollouts` times.

    Args:
        token_mask (`torch.FloatTensor` of shape `(N, T)`): [`caption_token_mask`] of the sampled captions.

    Returns:
        `(caption_index, prefix_length)`, each `torch.LongTensor` of shape `(R,)` with
        `R = num_rollouts * Σ_n (length_n − 1)`, grouped by caption, then prefix, then rollout.
    """
    lengths = token_mask.sum(dim=1).long()  # (N,)
    positions = torch.arange(token_mask.size(1), device=token_mask.device)
    needs_rollout = positions[None, :] < (lengths[:, None] - 1)  # (N, T): prefixes g_{1:t} with t < length
    caption_index, position = needs_rollout.nonzero(as_tuple=True)
    return caption_index.repeat_interleave(num_rollouts), (position + 1).repeat_interleave(num_rollouts)


def _sample_from(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.LongTensor:
    """
    Inverse-CDF sampling, one token per row, from the softmax of `scores` `(R, V)` (logits after the policy's
    [`logits_warpers`]): `uniforms` `(R,)` in [0, 1) fix the draws, so that two decoders that consume the same uniforms
    for the same rollout step sample the same tokens. Tokens of zero probability (those top-k and top-p set to −inf)
    are never chosen (the CDF does not rise on them) and the normalised CDF ends at exactly 1.
    """
    cumulative = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1)  # (R, V)
    cumulative = cumulative / cumulative[:, -1:]
    return torch.searchsorted(cumulative, uniforms[:, None].to(cumulative.dtype), right=True).squeeze(1)


def _policy_warpers(temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    """The warpers, in `generate()`'s order, that the trainer's samples are drawn with, so that rollouts continue
    prefixes with the policy that sampled them."""
    return logits_warpers(GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p))


def _empty_rollouts(sequences: torch.LongTensor, max_length: int, pad_token_id: int) -> Rollouts:
    empty = torch.zeros(0, dtype=torch.long, device=sequences.device)
    return Rollouts(sequences.new_full((0, max_length + 1), pad_token_id), empty, empty)


def _prefix_sequences(
    sequences: torch.LongTensor, caption_index: torch.LongTensor, prefix_length: torch.LongTensor, width: int, pad: int
) -> torch.LongTensor:
    """`<bos> g_{1:t}` of each rollout row, padded to `width` columns: `(R, width)`."""
    rows = sequences.index_select(0, caption_index)[:, :width]  # (R, <= width)
    full = sequences.new_full((rows.size(0), width), pad)
    full[:, : rows.size(1)] = rows
    positions = torch.arange(width, device=sequences.device)
    return full.masked_fill(positions[None, :] > prefix_length[:, None], pad)


def sample_rollouts(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    token_mask: torch.Tensor,
    num_rollouts: int,
    max_length: int,
    eos_token_id: int,
    pad_token_id: int,
    image_index: torch.LongTensor | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
    drop_finished_rows: bool | None = None,
) -> Rollouts:
    """
    Completes every prefix of every sampled caption `num_rollouts` times with the current policy, all in one batched
    decoding loop that continues from the LSTM state after each prefix.

    Args:
        model: a recurrent captioner with `prefix_states` and `step` ([`ShowTellRL`]); run without dropout or grad.
            Its `generation_config.cuda_graphs` says whether the rollouts may run as a CUDA graph, as it does for
            the decodings of its captions.
        image_inputs: image tensors, one row per image (with `image_index`) or per caption.
        sequences (`torch.LongTensor` of shape `(N, T + 1)`): sampled captions, the start token first.
        token_mask (`torch.FloatTensor` of shape `(N, T)`): their [`caption_token_mask`].
        num_rollouts: K, completions per prefix.
        max_length: the most generated tokens a caption may have (prefix + continuation).
        image_index (`torch.LongTensor` of shape `(N,)`, *optional*): the image row of each caption.
        temperature, top_k, top_p: the policy's sampling settings, those of the sampled captions (the trainer's
            `sample_captions`): applied in `generate()`'s order (temperature, top-k, top-p; 0 and 1.0 disable the last
            two) before each draw.
        uniforms (`torch.FloatTensor` of shape `(R, max_length)`, *optional*): the uniform draws choosing token j of
            rollout row r (inverse-CDF sampling); drawn from torch's global generator when `None`. Row order is that
            of [`rollout_prefixes`].
        drop_finished_rows (`bool`, *optional*): whether rows that ended leave the batch at every step. That saves
            their computation, where computation is the cost (the default on a CPU), but it asks the device which
            rows ended at every step; on a GPU (the default there) the finished rows are stepped along and written
            nowhere, and whether all have ended is asked every few steps, or, unless the model's
            `generation_config.cuda_graphs` is False, the whole loop replays as a CUDA graph. The rollouts are the
            same either way.

    Returns:
        [`Rollouts`] with `R = K * Σ_n (length_n − 1)` rows (no rollout after a caption's last step).
    """
    caption_index, prefix_length = rollout_prefixes(token_mask, num_rollouts)
    num_rows = caption_index.numel()
    if num_rows == 0:
        return _empty_rollouts(sequences, max_length, pad_token_id)
    if uniforms is None:
        uniforms = torch.rand(num_rows, max_length, device=sequences.device)
    if image_index is not None:
        image_inputs = repeat_image_inputs(image_inputs, image_index)
    warpers = _policy_warpers(temperature, top_k, top_p)

    if drop_finished_rows is None:
        drop_finished_rows = sequences.device.type == "cpu"
    with evaluation_mode(model), torch.no_grad():
        # 1. LSTM state after every prefix of the sampled captions: (L, N, T+1, H) each
        prefix_states = model.prefix_states(sequences, **image_inputs)
        # 2. on a GPU, the whole loop as a CUDA graph, over rows padded to one of a few counts (the graph keeps a copy
        # of its inputs: an attention model's grid for every row, 66 MB for 3,584 rows of a 3 x 3 grid of 512 floats)
        if not drop_finished_rows and uses_cuda_graphs(model.generation_config, sequences.device):
            settings = ("rollouts", max_length, eos_token_id, pad_token_id, temperature, top_k, top_p)
            padding = _padded_row_count(num_rows) - num_rows  # rows that continue the first prefix, dropped after
            inputs = _rollout_start(
                prefix_states, sequences, F.pad(caption_index, (0, padding)),
                F.pad(prefix_length, (0, padding), value=1), max_length, pad_token_id,
            )  # fmt: skip
            template, state_tensors = split_state(inputs.pop("state"))
            inputs |= state_tensors | {"uniforms": F.pad(uniforms, (0, 0, 0, padding))}
            steps = functools.partial(_rollout_steps_from, model, template, warpers, eos_token_id)
            completed = graphed_call(model, steps, inputs, settings)
            if completed is not None:
                return Rollouts(completed[:num_rows], caption_index, prefix_length)
        # 3. or one loop over all rows, step by step
        inputs = _rollout_start(prefix_states, sequences, caption_index, prefix_length, max_length, pad_token_id)
        loop = _steps_dropping_finished_rows if drop_finished_rows else _steps_keeping_finished_rows
        loop(model, inputs.pop("state"), **inputs, uniforms=uniforms, warpers=warpers, eos=eos_token_id)
    return Rollouts(inputs["completed"], caption_index, prefix_length)


def _rollout_start(
    prefix_states: Any,
    sequences: torch.LongTensor,
    caption_index: torch.LongTensor,
    prefix_length: torch.LongTensor,
    max_length: int,
    pad_token_id: int,
) -> dict[str, Any]:
    """Where each rollout row starts: the state after <bos> g_{1:t-1}, the token g_t it reads next (whose logits give
    token t+1), the sequences so far and the tokens each row may still add (>= 1)."""
    return {
        "state": prefix_states.state_after(caption_index, prefix_length),
        "tokens": sequences[caption_index, prefix_length],  # (R,) g_t
        "completed": _prefix_sequences(sequences, caption_index, prefix_length, max_length + 1, pad_token_id),
        "prefix_length": prefix_length,
        "budget": max_length - prefix_length,  # (R,)
    }


def _rollout_rows(token_mask: torch.Tensor, num_rollouts: int, num_paths: int) -> list[int]:
    """The batch row of each rollout's image, in [`rollout_prefixes`]' order, from the sampled captions' lengths: read
    before the rollouts are queued, since reading the rollouts' own index afterwards would wait for all the work queued
    up to then."""
    lengths = token_mask.sum(dim=1).long().tolist()
    return [caption // num_paths for caption, length in enumerate(lengths) for _ in range((length - 1) * num_rollouts)]


def _padded_row_count(num_rows: int) -> int:
    """`num_rows` rounded up to a multiple of an eighth of its power of two: at most a quarter more rows, and, as the
    rollouts of a batch size vary in number, a few row counts, whose graphs are reused."""
    granularity = 2 ** max(num_rows.bit_length() - 3, 0)
    return -(-num_rows // granularity) * granularity


def _rollout_steps_from(
    model, state_template, warpers, eos, *, tokens, completed, prefix_length, budget, uniforms, **state_tensors
) -> torch.LongTensor:
    """Every step of the rollout loop from the state `state_template` holding `state_tensors`, the finished rows
    stepped along: what a CUDA graph captures. Returns `completed`, written in place."""
    state = state_with(state_template, state_tensors)
    _steps_keeping_finished_rows(
        model, state, tokens, completed, prefix_length, budget, uniforms, warpers, eos, stops_early=False
    )
    return completed


def _steps_dropping_finished_rows(model, state, tokens, completed, prefix_length, budget, uniforms, warpers, eos):
    """Rollout steps where rows that end leave the batch, so that later steps only pay for live rows."""
    active = torch.arange(tokens.numel(), device=tokens.device)
    for step in range(int(budget.max())):
        logits, _, state = model.step(tokens, state)  # (A, V)
        # the warpers read the scores only: no tokens so far are passed
        tokens = _sample_from(warpers(None, logits.float()), uniforms[active, step])  # (A,)
        completed[active, prefix_length[active] + 1 + step] = tokens
        alive = (tokens != eos) & (step + 1 < budget[active])
        if not bool(alive.any()):
            break
        if not bool(alive.all()):
            active, tokens = active[alive], tokens[alive]
            state = state.select(alive)


def _steps_keeping_finished_rows(
    model, state, tokens, completed, prefix_length, budget, uniforms, warpers, eos, stops_early: bool = True
):
    """Rollout steps over every row, the finished ones written nowhere; with `stops_early`, whether all have ended is
    asked every few steps, the only waits for the device."""
    rows = torch.arange(tokens.numel(), device=tokens.device)
    alive = torch.ones_like(tokens, dtype=torch.bool)
    last_column = completed.shape[1] - 1
    uniforms_by_step = uniforms.t().contiguous()  # a step's draws side by side, as the search over the CDF reads them
    # rows start after a prefix of at least one token: the longest continuation is one token short of the budget
    for step in range(completed.shape[1] - 2):
        logits, _, state = model.step(tokens, state)
        tokens = _sample_from(warpers(None, logits.float()), uniforms_by_step[step])
        # a finished row's position may lie past the last column: it writes back what is there
        columns = (prefix_length + 1 + step).clamp(max=last_column)
        completed[rows, columns] = torch.where(alive, tokens, completed[rows, columns])
        alive &= (tokens != eos) & (step + 1 < budget)
        if stops_early and step % STEPS_BETWEEN_END_CHECKS == STEPS_BETWEEN_END_CHECKS - 1 and not bool(alive.any()):
            break


def sample_rollouts_per_prefix(
    model: nn.Module,
    image_inputs: Mapping[str, torch.Tensor],
    sequences: torch.LongTensor,
    token_mask: torch.Tensor,
    num_rollouts: int,
    max_length: int,
    eos_token_id: int,
    pad_token_id: int,
    image_index: torch.LongTensor | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
) -> Rollouts:
    """
    The plain version of [`sample_rollouts`]: one prefix at a time, the image and prefix encoded again by a forward
    pass, then its K rollouts stepped until they all end. Same arguments and result (given the same `uniforms`, the
    same tokens up to floating-point ties); slower, kept as the reference for tests and `benchmarks/bench_rollouts.py`.
    """
    caption_index, prefix_length = rollout_prefixes(token_mask, num_rollouts)
    num_rows = caption_index.numel()
    if num_rows == 0:
        return _empty_rollouts(sequences, max_length, pad_token_id)
    if uniforms is None:
        uniforms = torch.rand(num_rows, max_length, device=sequences.device)
    completed = _prefix_sequences(sequences, caption_index, prefix_length, max_length + 1, pad_token_id)
    warpers = _policy_warpers(temperature, top_k, top_p)
    with evaluation_mode(model), torch.no_grad():
        for first in range(0, num_rows, num_rollouts):
            caption, length = int(caption_index[first]), int(prefix_length[first])
            image_row = caption if image_index is None else int(image_index[caption])
            image = {name: tensor[image_row : image_row + 1] for name, tensor in image_inputs.items()}
            outputs = model(input_ids=sequences[caption : caption + 1, : length + 1], use_cache=True, **image)
            logits = outputs.logits[:, -1].expand(num_rollouts, -1)  # (K, V)
            state = getattr(outputs, CACHE_NAME).repeat_interleave(num_rollouts)
            rows = torch.arange(first, first + num_rollouts, device=sequences.device)
            alive = torch.ones(num_rollouts, dtype=torch.bool, device=sequences.device)
            for step in range(max_length - length):
                tokens = _sample_from(warpers(None, logits.float()), uniforms[rows, step])
                tokens = torch.where(alive, tokens, pad_token_id)
                completed[rows, length + 1 + step] = tokens
                alive &= tokens != eos_token_id
                if not bool(alive.any()):
                    break
                logits, _, state = model.step(tokens, state)
    return Rollouts(completed, caption_index, prefix_length)


def monte_carlo_q_values(
    token_mask: torch.Tensor,
    caption_rewards: torch.Tensor,
    rollouts: Rollouts,
    rollout_rewards: torch.Tensor,
    num_rollouts: int,
) -> torch.FloatTensor:
    """
    Q(s_t, g_t) for every step of the sampled captions (paper, eq. 9).

    Args:
        token_mask (`torch.FloatTensor` of shape `(N, T)`): the sampled captions' [`caption_token_mask`].
        caption_rewards (`torch.FloatTensor` of shape `(N,)`): R of each sampled caption.
        rollouts ([`Rollouts`]): from [`sample_rollouts`], K rows per non-final prefix.
        rollout_rewards (`torch.FloatTensor` of shape `(R,)`): R of each completed rollout caption.

    Returns:
        `torch.FloatTensor` of shape `(N, T)`: the mean reward of the K rollouts from `g_{1:t}` at position `t − 1`,
        the caption's own reward at its last step, 0 after it.
    """
    q_values = torch.zeros_like(token_mask, dtype=torch.float32)
    q_values.index_put_(
        (rollouts.caption_index, rollouts.prefix_length - 1),
        rollout_rewards.to(q_values) / num_rollouts,
        accumulate=True,
    )
    last_position = token_mask.sum(dim=1).long() - 1  # (N,)
    captions = torch.arange(token_mask.size(0), device=token_mask.device)
    q_values[captions, last_position] = caption_rewards.to(q_values)
    return q_values * token_mask


def spider_pg_losses(
    token_log_probs: torch.Tensor,
    baseline_values: torch.Tensor,
    q_values: torch.Tensor,
    token_mask: torch.Tensor,
    normalization: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The two terms of the Liu et al. 2017 loss.

    Args:
        token_log_probs (`torch.FloatTensor` of shape `(N, T)`): log π(g_t | s_t) of the sampled tokens (with grad).
        baseline_values (`torch.FloatTensor` of shape `(N, T)`): B_phi(s_t) ([`SpiderPGBaseline`]).
        q_values (`torch.FloatTensor` of shape `(N, T)`): the Monte-Carlo Q estimates ([`monte_carlo_q_values`]).
        token_mask (`torch.FloatTensor` of shape `(N, T)`): 1 on the captions' tokens.
        normalization: `token` or `sequence`, as in [`policy_gradient_loss`].

    Returns:
        `(policy_loss, baseline_loss)`: `Σ_t (Q − B_phi) · −log π(g_t | s_t)` normalised like SCST, with the advantage
        detached (the policy term never trains the baseline); and the mean over tokens of `(Q − B_phi)²` (the
        baseline term, whose gradient reaches only the baseline).
    """
    advantages = q_values - baseline_values.detach()  # (N, T)
    policy_loss = policy_gradient_loss(token_log_probs, token_mask, advantages, normalization)
    squared_errors = (q_values - baseline_values).pow(2) * token_mask
    baseline_loss = squared_errors.sum() / token_mask.sum().clamp(min=1.0)
    return policy_loss, baseline_loss


class SpiderPGBaseline(nn.Module):
    """
    Liu et al.'s baseline `B_phi(s_t)`: an MLP from the captioner's hidden state after each token to a scalar.

    Its input is detached, so its regression loss trains only this network, never the captioner.

    Args:
        hidden_size (`int`): width of the captioner's hidden states.
        baseline_hidden_size (`int`): width of the MLP's hidden layer.
    """

    def __init__(self, hidden_size: int, baseline_hidden_size: int):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, baseline_hidden_size), nn.ReLU(), nn.Linear(baseline_hidden_size, 1)
        )

    def forward(self, hidden_states: torch.FloatTensor) -> torch.FloatTensor:
        """`(N, T, hidden_size)` hidden states -> `(N, T)` baseline values."""
        return self.mlp(hidden_states.detach()).squeeze(-1)


@register_objective
class SpiderPGObjective(CaptionObjective):
    """
    Liu et al. 2017 policy gradient: `num_paths_per_image` (M) sampled captions per image, `num_rollouts` (K)
    Monte-Carlo rollouts from each of their prefixes to estimate Q, the baseline ([`SpiderPGBaseline`]) fitted to Q,
    and the loss `policy_loss + baseline_loss_weight * baseline_loss` ([`spider_pg_losses`]). Rewards are the trainer's
    weighted mix (SPIDEr in the paper; `reward_funcs`).

    The baseline receives gradient only from its squared error (its input is detached) and the LSTM only from the
    policy term, so one optimizer trains both. With Adam the baseline's step size is its learning rate whatever
    `baseline_loss_weight` is (Adam normalises the gradient's scale). The baseline starts untrained after XE: on the
    shapes recipe (learning rate 2e-4, batch 8) it reaches Q's mean within about 100 steps but explains little of
    Q's spread between states within one epoch (`baseline_explained_variance` in the logs stays near 0), so there it
    mainly centres the advantage. Watch that metric when choosing the learning rate.

    The baseline is the objective's auxiliary network `baseline` (own learning rate `baseline_learning_rate`, saved in
    checkpoints, synchronised across processes). With `baseline_pretraining_steps`, training opens with a phase that
    fits only the baseline, the policy fixed; the policy gradient starts after it.

    Needs a recurrent model with `prefix_states`, `step` and its hidden states from
    `forward(..., output_hidden_states=True)`, i.e. [`ShowTellRL`]; start from an XE checkpoint.
    """

    name = "spider_pg"
    config_class = SpiderPGConfig

    def __init__(self, trainer):
        super().__init__(trainer)
        args = self.args
        model = trainer.unwrap_model(trainer.model)
        missing = [name for name in ("prefix_states", "step") if not callable(getattr(model, name, None))]
        if "output_hidden_states" not in inspect.signature(model.forward).parameters:
            missing.append("forward(output_hidden_states=...)")
        if missing:
            raise ValueError(
                f"The spider_pg objective needs a recurrent captioner with {missing} (Monte-Carlo rollouts from the "
                f"LSTM state, and the hidden states its baseline reads); {type(model).__name__} lacks them. Use "
                "rlcaption.models.ShowTellRL, or the `scst`, `sle` or `wtf` objective for other models (transformers "
                "captioners such as Florence-2 or PaliGemma)."
            )
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        self.pad_token_id = tokenizer.pad_token_id
        self.baseline = SpiderPGBaseline(model.config.hidden_size, args.baseline_hidden_size)

    def auxiliary_networks(self) -> dict[str, AuxiliaryNetwork]:
        return {"baseline": AuxiliaryNetwork(self.baseline, learning_rate=self.args.baseline_learning_rate)}

    def phases(self) -> list[TrainingPhase]:
        joint = TrainingPhase("policy_gradient")
        if self.args.baseline_pretraining_steps == 0:
            return [joint]
        return [
            TrainingPhase("baseline_pretraining", self.args.baseline_pretraining_steps, trains_captioner=False),
            joint,
        ]

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        args, trainer = self.args, self.trainer
        policy = trainer.unwrap_model(model)
        image_inputs = image_inputs_of(inputs)
        references = inputs["references"]
        num_paths = args.num_paths_per_image

        # 1. M sampled captions per image
        samples = trainer.sample_captions(image_inputs, num_return_sequences=num_paths)
        sequences = samples.sequences  # (N, T+1)
        device = sequences.device
        sample_index = torch.arange(len(references), device=device).repeat_interleave(num_paths)  # (N,)
        token_mask = caption_token_mask(sequences, trainer.eos_token_id)  # (N, T)
        rollout_rows = _rollout_rows(token_mask, args.num_rollouts, num_paths)

        # 2. K rollouts from every non-final prefix, decoded together (on a GPU, a graph the device may still be
        # running: their texts are copied to the host behind it)
        rollouts = sample_rollouts(
            policy, image_inputs, sequences, token_mask, args.num_rollouts, args.max_caption_length,
            trainer.eos_token_id, self.pad_token_id, image_index=sample_index, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p,
        )  # fmt: skip
        rollout_captions = GeneratedCaptions(rollouts.sequences, trainer.processing_class)

        # 3. log π(g_t | s_t) from one forward pass with gradient (through the wrapped model), B_phi(s_t) from its
        # hidden states (through the wrapped baseline); while the baseline is pretrained, the policy is fixed
        # in evaluation mode, as the captions and rollouts were sampled: the gradient is that of the sampling policy.
        # Queued before the rollouts' texts are read, which waits for the rollouts.
        pretraining_baseline = self.current_phase().name == "baseline_pretraining"
        with evaluation_mode(model), torch.no_grad() if pretraining_baseline else nullcontext():
            outputs = (policy if pretraining_baseline else model)(
                **image_inputs, input_ids=sequences, image_index=sample_index, use_cache=False,
                output_hidden_states=True,
            )  # fmt: skip

        # 4. the rewards of the captions and of their rollouts, Q from these
        caption_rewards = start_sample_rewards(trainer, inputs, samples, num_paths)  # (N,)
        rollout_rewards = Pending.done(np.zeros(0))
        if rollouts.caption_index.numel():
            rollout_rewards = trainer.start_rewards(
                rollout_captions.texts, inputs, row_index=rollout_rows, log_prefix="rollout"
            )
        token_log_probs = selective_log_softmax(outputs.logits[:, :-1], sequences[:, 1:])  # (N, T)
        q_values = monte_carlo_q_values(
            token_mask,
            reward_tensor(caption_rewards.result(), device),
            rollouts,
            reward_tensor(rollout_rewards.result(), device),
            args.num_rollouts,
        )  # (N, T)
        baseline = trainer.auxiliary_network("baseline")
        baseline_values = baseline(outputs.hidden_states[:, :-1]).float()  # (N, T): B_phi(s_t), s_t = <bos> g_{1:t-1}
        policy_loss, baseline_loss = spider_pg_losses(
            token_log_probs, baseline_values, q_values, token_mask, args.loss_normalization
        )
        self._record(token_mask, q_values, baseline_values.detach(), policy_loss, baseline_loss, rollouts)
        if pretraining_baseline:
            return baseline_loss
        return policy_loss + args.baseline_loss_weight * baseline_loss

    def _record(self, token_mask, q_values, baseline_values, policy_loss, baseline_loss, rollouts) -> None:
        # tensors, read at the log: nothing here waits for the device
        record = self.trainer.record_metric
        q_mean, q_variance = masked_mean_and_variance(q_values, token_mask)
        _, advantage_variance = masked_mean_and_variance(q_values - baseline_values, token_mask)
        record("policy_loss", policy_loss.detach())
        record("baseline_loss", baseline_loss.detach())
        record("q_mean", q_mean)
        record("baseline_mean", masked_mean_and_variance(baseline_values, token_mask)[0])
        record("advantage_std", advantage_variance.sqrt().nan_to_num(0.0))  # 0 for a single scored token
        # 1 − Var(Q − B) / Var(Q): how much of Q's spread the baseline explains (0 for a constant baseline); undefined
        # (NaN, left out of the log) where Q does not vary, as a constant Q's rounding-level variance makes it noise
        explained = 1.0 - advantage_variance / q_variance
        record("baseline_explained_variance", explained.where(q_variance.sqrt() > 1e-6, torch.nan))
        record("sample_length", token_mask.sum(dim=1).mean())
        record("rollout_captions", rollouts.caption_index.numel())
