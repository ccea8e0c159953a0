"""The reward-function protocol shared by built-in rewards, user functions and TRL.

A reward function is any callable taking keyword arguments — `completions` (the generated captions), `references`
(each caption's reference captions) and any dataset column such as `image_id` — and returning one float per
completion. This is TRL's reward-function convention, so the same function works in `RLCaptionTrainer` and in
`trl.GRPOTrainer`.

A reward may add two optional methods:

- `prepare(train_dataset, processor)`: called once before training (by `prepare_reward`) with the training
  `datasets.Dataset` and the captioner's processor, for statistics of the training set such as CIDEr-D's document
  frequencies. TRL never calls it, so a reward must still work without it.
- `score_groups(*, completions, references, **image_columns)`: the completions grouped per image, with every image
  column given once per image (`GroupRewardFunc`). Set-level rewards (contrastive over the batch, diversity between an
  image's samples) need the groups, and image rewards embed each image once instead of once per completion.
  `RewardMix.score_groups` calls it when present and the plain call otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "RewardFunc",
    "GroupRewardFunc",
    "is_group_reward",
    "prepare_reward",
    "reward_name",
    "completion_texts",
    "group_sizes",
    "check_reward_inputs",
    "row_keys",
]


@runtime_checkable
class RewardFunc(Protocol):
    """A callable scoring generated captions.

    Args (keyword-only):
        completions (`list[str]` of length `batch_size`): raw generated captions (rewards tokenize them).
        references (`list[list[str]]` of length `batch_size`): the raw reference captions of each completion's image.
        **columns: any other dataset column, one value per completion (e.g. `image_id`); ignored when unused.

    Returns:
        `list[float]` of length `batch_size`: one finite reward per completion.

    A reward that reads the images' pixels (the `image` or `pixel_values` column, as a CLIP does) says so with an
    attribute `reads_images = True`: a run on precomputed features then keeps the images for it. Values of the `image`
    column may come undecoded (`{"bytes", "path"}`); `rlcaption.data.images.decode_image` decodes them. Tensor
    columns may be the training batch's own: read them, never change them in place.
    """

    def __call__(self, *, completions: list[str], references: list[list[str]], **columns: Any) -> list[float]: ...


@runtime_checkable
class GroupRewardFunc(Protocol):
    """A reward scoring the completions of each image together, with every image column given once per image.

    Args (keyword-only):
        completions (`list[list[str]]` of length `num_images`): group `i` holds the raw captions generated for image
            `i`; groups may differ in size (e.g. 5 samples, or beam + greedy + ground truth).
        references (`list[list[str]]` of length `num_images`, or `None`): the raw reference captions of image `i`.
        **image_columns: any other column, one row per image, never repeated per completion: `image_id` (`list` of
            length `num_images`), `pixel_values` (`torch.FloatTensor` of shape `(num_images, 3, H, W)`), dataset
            columns (`list`); ignored when unused.

    Returns:
        `list[list[float]]`: one list per group, as long as the group, of finite rewards in the group's order.
    """

    def score_groups(
        self, *, completions: list[list[str]], references: list[list[str]] | None, **image_columns: Any
    ) -> list[list[float]]: ...


def is_group_reward(func: Any) -> bool:
    """Whether `func` scores groups of completions (has a callable `score_groups`, see `GroupRewardFunc`).

    A `RewardMix` is not one (it says so with `mixes_rewards`): its `score_groups` returns the weighted total and each
    reward's values, and a mix inside a mix is handled by the outer mix.
    """
    return callable(getattr(func, "score_groups", None)) and not getattr(func, "mixes_rewards", False)


def prepare_reward(func: Any, train_dataset: Any, processor: Any = None) -> None:
    """Calls `func.prepare(train_dataset, processor)` when the reward has a `prepare` method; does nothing otherwise.

    A trainer calls it once per reward before training. Built-in rewards use it for statistics of the training set:
    `cider` and `spider` built without `document_frequencies` count them from the dataset's `captions` column.

    Args:
        func (`RewardFunc` or `GroupRewardFunc`): the reward.
        train_dataset (`datasets.Dataset`): the training set (columns `captions`, `image_id`, `image` or
            `pixel_values`, and any others).
        processor (*optional*): the captioner's processor (e.g. a [`CaptionProcessor`]), for rewards that need to
            know how images were prepared.
    """
    prepare = getattr(func, "prepare", None)
    if callable(prepare):
        prepare(train_dataset, processor)


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


def group_sizes(completions: Sequence[Any]) -> list[int]:
    """The size of every group of grouped completions (one list of completions per image).

    Raises:
        `ValueError`: when `completions` or one of its groups is not a list of completions (e.g. a flat list of
            strings, which a group-aware call cannot tell apart from groups of characters).
    """
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise ValueError(
            f"Grouped completions must be a list with one list of completions per image, got "
            f"{type(completions).__name__} {completions!r}."
        )
    sizes = []
    for index, group in enumerate(completions):
        if isinstance(group, str) or not isinstance(group, Sequence):
            raise ValueError(
                f"Group {index} of the completions is {type(group).__name__} {group!r}; pass one list of completions "
                "per image (e.g. `[[caption]]` for a single caption)."
            )
        sizes.append(len(group))
    return sizes


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
        # ids are ints or strings: they pass without the slower abstract type check
        if type(value) not in (int, str) and not isinstance(value, Hashable):
            raise ValueError(f"Column {column!r} value {value!r} of row {row} is not hashable; use ids or strings.")
    return values


def _row_name(row: int, image_ids: Sequence[Hashable] | None) -> str:
    return f"image_id {image_ids[row]!r}" if image_ids is not None else f"row {row}"


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
        # lists and tuples, the usual case, pass without the slower abstract type check; the row is named only for
        # an error
        if type(image_references) not in (list, tuple) and (
            isinstance(image_references, str) or not isinstance(image_references, Sequence)
        ):
            raise ValueError(
                f"References of {_row_name(row, image_ids)} are {type(image_references).__name__} "
                f"{image_references!r}; expected a list of caption strings."
            )
        if len(image_references) == 0:
            raise ValueError(
                f"{_row_name(row, image_ids)} has no references; every completion needs at least one reference "
                "caption."
            )
        # whether each reference is a string is checked where it is tokenized: cached images skip that work
        reference_lists.append(image_references)
    return texts, reference_lists
