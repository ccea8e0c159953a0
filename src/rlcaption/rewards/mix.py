"""Weighted sums of reward functions, with each reward's raw values kept for logging."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import RewardFunc, reward_name
from .registry import get_reward

__all__ = ["RewardMix"]


class RewardMix:
    """A weighted sum of reward functions: `total = sum_i weight_i * reward_i(**inputs)`.

    Args:
        funcs (`Sequence[RewardFunc | str]`): reward functions, or names of registered rewards (built with their
            default arguments; use `get_reward(name, **kwargs)` for others).
        weights (`Sequence[float]`, *optional*): one weight per function; all 1.0 by default.

    The logging name of each function is `reward_name(func)`; a name used twice gets a `_2`, `_3`, ... suffix.
    """

    def __init__(self, funcs: Sequence[RewardFunc | str], weights: Sequence[float] | None = None):
        if isinstance(funcs, str) or callable(funcs):
            funcs = [funcs]
        if len(funcs) == 0:
            raise ValueError("RewardMix needs at least one reward function or reward name.")
        resolved = []
        for func in funcs:
            if isinstance(func, str):
                func = get_reward(func)
            elif not callable(func):
                raise ValueError(f"Reward {func!r} is neither a callable nor a registered reward name.")
            resolved.append(func)
        if weights is None:
            weights = [1.0] * len(resolved)
        if len(weights) != len(resolved):
            raise ValueError(
                f"Got {len(weights)} weights for {len(resolved)} reward functions; pass one weight per function."
            )
        for weight in weights:
            if not math.isfinite(float(weight)):
                raise ValueError(f"Reward weights must be finite numbers, got {list(weights)}.")
        self.funcs = resolved
        self.weights = np.asarray(weights, dtype=np.float64)
        self.names = self._unique_names([reward_name(func) for func in resolved])
        self.__name__ = "+".join(self.names) if len(self.names) > 1 else self.names[0]

    @staticmethod
    def _unique_names(names: list[str]) -> list[str]:
        seen: dict[str, int] = {}
        unique = []
        for name in names:
            seen[name] = seen.get(name, 0) + 1
            unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
        return unique

    def score(self, **inputs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Calls every reward function with `inputs` (`completions=`, `references=`, columns).

        Returns:
            `tuple[np.ndarray, dict[str, np.ndarray]]`: the weighted total of shape `(batch_size,)`, and each
            function's raw values of shape `(batch_size,)` keyed by its logging name.

        Raises:
            `ValueError`: naming the reward function that returned the wrong number of values, or a NaN, an
                infinity or a non-number.
        """
        completions = inputs.get("completions")
        if completions is None:
            raise ValueError("RewardMix.score needs `completions=` (the generated captions).")
        batch_size = len(completions)
        total = np.zeros(batch_size)
        components: dict[str, np.ndarray] = {}
        for name, func, weight in zip(self.names, self.funcs, self.weights, strict=True):
            values = func(**inputs)
            if values is None or len(values) != batch_size:
                count = "None" if values is None else len(values)
                raise ValueError(
                    f"Reward function {name!r} returned {count} values for {batch_size} completions; a reward must "
                    "return one float per completion."
                )
            try:
                values = np.asarray(values, dtype=np.float64).reshape(batch_size)
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"Reward function {name!r} returned values that are not numbers: {list(values)[:5]!r}..."
                ) from error
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                raise ValueError(
                    f"Reward function {name!r} returned non-finite values {values[bad[:5]].tolist()} at completions "
                    f"{bad[:5].tolist()}; fix the reward (or the captions it cannot score) before training."
                )
            components[name] = values
            total += weight * values
        return total, components

    def __call__(self, **inputs: Any) -> list[float]:
        """The weighted total as `list[float]`, so a `RewardMix` is itself a reward function."""
        total, _ = self.score(**inputs)
        return total.tolist()

    def __repr__(self) -> str:
        terms = ", ".join(f"{weight:g}*{name}" for name, weight in zip(self.names, self.weights, strict=True))
        return f"RewardMix({terms})"
