"""
Rewards of [`RLCaptionTrainer`]: the weighted reward mix built from names and callables, and the scoring of captions
grouped by image, with each reward's mean and std logged, and the keyword arguments of rewards written for TRL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers.utils import logging

from ..rewards import Pending, RewardMix, get_reward, is_group_reward, reward_parameters

__all__ = ["RewardLike", "RewardScoringMixin"]

logger = logging.get_logger(__name__)

RewardLike = str | Callable[..., list[float | None]]


def _nan_mean(values: np.ndarray, statistic: Callable[[np.ndarray], float] = np.nanmean) -> float:
    """`statistic` of the values that are not NaN (a reward's None), NaN when there are none (then left out of the
    log, see `record_metric`)."""
    return float(statistic(values)) if not np.isnan(values).all() else float("nan")


class RewardScoringMixin:
    """The reward side of [`RLCaptionTrainer`]: `self.args`, `self.state`, `self.objective`, `self.processing_class`
    and `self.record_metric` are the trainer's."""

    def _build_reward_mix(self, reward_funcs: RewardLike | Sequence[RewardLike] | None, train_dataset) -> RewardMix:
        if reward_funcs is None:
            reward_funcs = self.args.reward_funcs
        elif isinstance(reward_funcs, str) or callable(reward_funcs) or is_group_reward(reward_funcs):
            reward_funcs = [reward_funcs]
        built = []
        for func in reward_funcs:
            if isinstance(func, str):
                given = {}
                if self.args.document_frequencies is not None and "document_frequencies" in reward_parameters(func):
                    given["document_frequencies"] = self.args.document_frequencies
                func = get_reward(func, **given)
            built.append(func)
        reward_mix = RewardMix(built, weights=self.args.reward_weights)
        # once, before training: CIDEr-D's document frequencies of the training references, image embeddings, ...
        reward_mix.prepare(train_dataset, self.processing_class)
        if self.args.reward_processes:
            in_processes = reward_mix.use_processes(self.args.reward_processes)
            if not in_processes:
                logger.warning(
                    f"reward_processes={self.args.reward_processes}, but no reward of {reward_mix!r} can be split "
                    "over processes (none declares `scores_captions_independently`): every reward is computed in "
                    "the training process."
                )
        return reward_mix

    def compute_rewards(
        self,
        completions: list[str],
        inputs: Mapping[str, Any],
        row_index: Sequence[int],
        log_prefix: str = "reward",
    ) -> np.ndarray:
        """
        Scores captions with the weighted reward mix and records each reward's mean and std: [`start_rewards`]'s
        result, waited for.

        Returns:
            `np.ndarray` of shape `(N,)`, the weighted total of each caption, in the order of `completions`.
        """
        return self.start_rewards(completions, inputs, row_index, log_prefix).result()

    def start_rewards(
        self,
        completions: list[str],
        inputs: Mapping[str, Any],
        row_index: Sequence[int],
        log_prefix: str = "reward",
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> Pending[np.ndarray]:
        """
        Starts scoring captions with the weighted reward mix; each reward's mean and std are recorded with the
        result. The rewards computed in worker processes (`reward_processes`) run on while the objective goes on,
        e.g. with the forward pass that scores the samples; the others are computed now.

        The captions are grouped by image: set-level rewards (`score_groups`) see every image's captions together and
        each image's columns once; per-caption rewards see one row per caption, with the keyword arguments
        `trl.GRPOTrainer` gives its reward functions, so that a reward written for TRL, `reward(prompts, completions,
        completion_ids, **kwargs)`, runs unchanged: `prompts` (the batch's `prompt` column, else empty strings: a
        captioner's prompt is its image), `completions`, `completion_ids`, `trainer_state` and the dataset columns.
        A reward may return `None` for a caption it cannot score (see [`RewardMix.submit_groups`]); a caption no
        reward scored gets a NaN total, which the objectives that declare `masks_unscored_captions` mask out, as TRL
        does (its advantage is 0, and it is left out of its image's baseline); the others stop with an error.

        Args:
            completions: decoded captions, `N` of them, in any order.
            inputs: the collated batch; its `references` and per-image columns (`image_id`, extra dataset columns,
                image tensors) reach the reward functions as keyword arguments.
            row_index: for each caption, the row of its image in the batch.
            completion_ids: each caption's token ids after its start token, up to its end token included (TRL's
                `completion_ids`); `None` when the caller has no token ids (then empty lists).

        Captions scored under the default `log_prefix`, the samples, are shown at the next training log with
        `args.log_completions`.

        Returns:
            [`Pending`] `np.ndarray` of shape `(N,)`, the weighted total of each caption, in the order of
            `completions`.
        """
        if self.reward_mix is None:
            raise RuntimeError(f"Objective {self.args.objective!r} declared no rewards but asked for them.")
        if len(row_index) != len(completions):
            raise ValueError(f"Got {len(completions)} completions but {len(row_index)} image rows.")
        rows = list(dict.fromkeys(row_index))  # each image once, in order of first appearance
        position = {row: index for index, row in enumerate(rows)}
        groups: list[list[int]] = [[] for _ in rows]
        for caption, row in enumerate(row_index):
            groups[position[row]].append(caption)
        prompt_column = inputs.get("prompt")
        prompts = prompt_column if isinstance(prompt_column, list) else [""] * len(inputs["references"])
        scores = self.reward_mix.submit_groups(
            completions=[[completions[caption] for caption in group] for group in groups],
            references=[inputs["references"][row] for row in rows],
            completion_columns={
                "prompts": [[prompts[row]] * len(group) for group, row in zip(groups, rows, strict=True)],
                "completion_ids": [
                    [[] if completion_ids is None else list(completion_ids[caption]) for caption in group]
                    for group in groups
                ],
            },
            trainer_state=self.state,
            **self._image_columns(inputs, rows),
        )

        def collect() -> np.ndarray:
            totals, components = scores.result()
            for name, values in components.items():
                self.record_metric(f"{log_prefix}/{name}/mean", _nan_mean(values))
                self.record_metric(f"{log_prefix}/{name}/std", _nan_mean(values, np.nanstd))
            self.record_metric(log_prefix, _nan_mean(totals))
            unscored = np.flatnonzero(np.isnan(totals))  # in group order
            if len(unscored) and not getattr(self.objective, "masks_unscored_captions", False):
                in_group_order = [caption for group in groups for caption in group]
                raise ValueError(
                    f"No reward scored {len(unscored)} caption(s) (every reward returned None), e.g. "
                    f"{completions[in_group_order[unscored[0]]]!r}; the {self.args.objective!r} objective cannot "
                    "leave a caption out of its loss: return a float for it."
                )
            if log_prefix == "reward" and self.args.log_completions:
                self._keep_completions(groups, rows, completions, inputs, totals, components)
            rewards = np.empty(len(completions), dtype=np.float64)
            rewards[[caption for group in groups for caption in group]] = totals  # back from group order
            return rewards

        return Pending(collect)

    def _keep_completions(self, groups, rows, completions, inputs, totals, components) -> None:
        """Keeps the first `args.num_completions_to_print` scored captions for the next training log; only those
        few are copied, so the cost does not grow with the batch."""
        image_ids = inputs.get("image_id")
        # `totals` and `components` are in group order
        captions = [(caption, row) for group, row in zip(groups, rows, strict=True) for caption in group]
        self._completions_to_log = [
            {
                "image_id": row if image_ids is None else image_ids[row],
                "reward": float(totals[position]),
                **{name: float(values[position]) for name, values in components.items()},
                "caption": completions[caption],
            }
            for position, (caption, row) in enumerate(captions[: self.args.num_completions_to_print])
        ]

    @staticmethod
    def _image_columns(inputs: Mapping[str, Any], rows: Sequence[int]) -> dict[str, Any]:
        """The batch's per-image columns (lists and tensors with one row per image), at `rows`; when `rows` are all
        its images in order, as for every sample or greedy caption of a step, its own tensors (the images are not
        copied for each reward call: rewards read them, never change them in place)."""
        batch_size = len(inputs["references"])
        every_row_in_order = list(rows) == list(range(batch_size))
        index_tensor = None
        columns: dict[str, Any] = {}
        for name, value in inputs.items():
            if name == "references" or name.startswith("caption_"):
                continue
            is_column = isinstance(value, list) and len(value) == batch_size
            is_column |= isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == batch_size
            if not is_column:
                continue
            if every_row_in_order:
                columns[name] = list(value) if isinstance(value, list) else value
            elif isinstance(value, list):
                columns[name] = [value[row] for row in rows]
            else:
                if index_tensor is None:
                    index_tensor = torch.as_tensor(list(rows), device=value.device)
                columns[name] = value.index_select(0, index_tensor)
        return columns
