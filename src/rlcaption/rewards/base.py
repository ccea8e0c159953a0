"""The reward-function protocol shared by built-in rewards, user functions and TRL.

A reward function is any callable taking keyword arguments — `completions` (the generated captions), `references`
(each caption's reference captions) and any dataset column such as `image_id` — and returning one float per
completion. This is TRL's reward-function convention, so the same function works in `RLCaptionTrainer` and in
`trl.GRPOTrainer`.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["RewardFunc", "reward_name", "completion_texts", "check_reward_inputs", "row_keys"]


@runtime_checkable
class RewardFunc(Protocol):
    """A callable scoring generated captions.

    Args (keyword-only):
        completions (`list[str]` of length `batch_size`): raw generated captions (rewards tokenize them).
        references (`list[list[str]]` of length `batch_size`): the raw reference captions of each completion's image.
        **columns: any other dataset column, one value per completion (e.g. `image_id`); ignored when unused.

    Returns:
        `list[float]` of length `batch_size`: one finite reward per completion.
    """

    def __call__(self, *, completions: list[str], references: list[list[str]], **columns: Any) -> list[float]: ...


def reward_name(func: Any) -> str:
    """The name under which a reward function's values are logged.

    The `__name__` attribute, as TRL uses it (built-in rewards set it on the instance, e.g. `"cider"`, `"bleu_4"`);
    for a `functools.partial` the wrapped function's name; otherwise the class name.
    """
    name = getattr(func, "__name__", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(func, functools.partial):
        return reward_name(func.func)
    return type(func).__name__


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """Caption strings from completions given as strings or as TRL conversational messages.

    Args:
        completions (`Sequence[str | list[dict]]`): plain strings, or lists of `{"role", "content"}` messages of
            which the last one is the generated caption.

    Returns:
        `list[str]`: one caption per completion.
    """
    texts = []
    for row, completion in enumerate(completions):
        if isinstance(completion, str):
            texts.append(completion)
        elif isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
            content = completion[-1].get("content")
            if not isinstance(content, str):
                raise ValueError(
                    f"Completion {row} is a conversation whose last message has no string 'content': {completion!r}."
                )
            texts.append(content)
        else:
            raise ValueError(
                f"Completion {row} is {type(completion).__name__} {completion!r}; expected a caption string or a list "
                "of chat messages ending with the generated caption."
            )
    return texts


def row_keys(values: Any, batch_size: int, column: str = "image_id") -> list[Hashable] | None:
    """A per-row key column (e.g. `image_id`) as a list of hashable values, or `None` when absent.

    Accepts a list, a NumPy array or a tensor (collated batches hold ids as tensors).
    """
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values)
    if len(values) != batch_size:
        raise ValueError(
            f"Column {column!r} has {len(values)} values for {batch_size} completions; pass one value per completion."
        )
    for row, value in enumerate(values):
        if not isinstance(value, Hashable):
            raise ValueError(f"Column {column!r} value {value!r} of row {row} is not hashable; use ids or strings.")
    return values


def check_reward_inputs(
    completions: Sequence[Any], references: Sequence[Sequence[str]] | None, image_ids: Sequence[Hashable] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Validates a reward call's inputs and returns the caption strings and reference lists.

    Raises:
        `ValueError`: when `references` is missing, lengths differ, or an image has no reference list or an empty
            one (named by its `image_id` when given, else by its row).
    """
    texts = completion_texts(completions)
    if references is None:
        raise ValueError(
            "This reward needs `references`: pass `references=` (one list of reference captions per completion), "
            "e.g. the dataset's `captions` column repeated for every completion of an image."
        )
    if len(references) != len(texts):
        raise ValueError(
            f"Got {len(texts)} completions but {len(references)} reference lists; pass one list per completion."
        )
    reference_lists = []
    for row, image_references in enumerate(references):
        where = f"image_id {image_ids[row]!r}" if image_ids is not None else f"row {row}"
        if isinstance(image_references, str) or not isinstance(image_references, Sequence):
            raise ValueError(
                f"References of {where} are {type(image_references).__name__} {image_references!r}; expected a list "
                "of caption strings."
            )
        if len(image_references) == 0:
            raise ValueError(f"{where} has no references; every completion needs at least one reference caption.")
        # whether each reference is a string is checked where it is tokenized: cached images skip that work
        reference_lists.append(image_references)
    return texts, reference_lists
