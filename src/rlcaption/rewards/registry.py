"""Registry of named reward functions: `get_reward("cider", document_frequencies=...)`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

from .base import RewardFunc

__all__ = ["register_reward", "get_reward", "available_rewards", "reward_parameters", "reward_reads_images"]

RewardFactory = TypeVar("RewardFactory", bound=Callable[..., RewardFunc])

_REWARD_FACTORIES: dict[str, Callable[..., RewardFunc]] = {}


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Class or function decorator registering a reward factory under `name`.

    The factory (a reward class, or a function building a reward) receives `get_reward`'s keyword arguments.

    Example:
    ```python
    >>> @register_reward("length")
    ... def length_reward():
    ...     return lambda *, completions, references, **columns: [float(len(c.split())) for c in completions]
    ```
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"A reward needs a non-empty string name, got {name!r}.")

    def decorator(factory: RewardFactory) -> RewardFactory:
        existing = _REWARD_FACTORIES.get(name)
        if existing is not None and existing is not factory:
            raise ValueError(
                f"A reward named {name!r} is already registered ({existing!r}); choose another name for {factory!r}."
            )
        _REWARD_FACTORIES[name] = factory
        return factory

    return decorator


def available_rewards() -> list[str]:
    """Names accepted by `get_reward`, sorted."""
    return sorted(_REWARD_FACTORIES)


def reward_parameters(name: str) -> set[str]:
    """The keyword arguments the reward registered under `name` is built with (e.g. `document_frequencies`)."""
    return set(inspect.signature(_factory(name)).parameters)


def reward_reads_images(reward: str | Callable[..., object]) -> bool:
    """Whether a reward (a registered name, or a reward function) scores captions against their images' pixels, as a
    CLIP does: its class or function says so with `reads_images = True`. A run on precomputed features then keeps
    the images beside them for it."""
    func = _factory(reward) if isinstance(reward, str) else reward
    return bool(getattr(func, "reads_images", False))


def get_reward(name: str, **kwargs) -> RewardFunc:
    """Builds the reward registered under `name` with `kwargs` (e.g. `document_frequencies=` for `"cider"`).

    Raises:
        `ValueError`: for an unknown name, listing the available ones.
    """
    return _factory(name)(**kwargs)


def _factory(name: str) -> Callable[..., RewardFunc]:
    if not isinstance(name, str):
        raise TypeError(
            f"get_reward takes a reward name, got {type(name).__name__} {name!r}; pass callables to RewardMix "
            "directly."
        )
    factory = _REWARD_FACTORIES.get(name)
    if factory is None:
        raise ValueError(
            f"Unknown reward {name!r}; available rewards: {', '.join(available_rewards())}. "
            "Register your own with `@register_reward(name)` or pass a callable."
        )
    return factory
