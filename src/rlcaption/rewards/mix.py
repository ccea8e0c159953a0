"""Weighted sums of reward functions, with each reward's raw values kept for logging."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .base import GroupRewardFunc, RewardFunc, group_sizes, is_group_reward, prepare_reward, reward_name
from .processes import Pending, RewardProcesses, scores_captions_independently
from .registry import get_reward

__all__ = ["TRL_ONLY_KEYWORDS", "RewardMix"]

# The keyword arguments `trl.GRPOTrainer` gives its reward functions besides `completions` and the dataset columns.
# rlcaption's own rewards take them through `**kwargs` and ignore them; the rewards computed in worker processes
# (`use_processes`, rlcaption's rewards that score each caption on its own) do not receive them, so that the trainer
# state is not copied to the processes at every step.
TRL_ONLY_KEYWORDS = ("prompts", "completion_ids", "trainer_state")


class RewardMix:
    """A weighted sum of reward functions: `total = sum_i weight_i * reward_i(**inputs)`.

    Args:
        funcs (`Sequence[RewardFunc | GroupRewardFunc | str]`): reward functions (per-completion callables, group
            rewards with `score_groups`, or both), or names of registered rewards (built with their default
            arguments; use `get_reward(name, **kwargs)` for others).
        weights (`Sequence[float]`, *optional*): one weight per function; all 1.0 by default.

    The logging name of each function is `reward_name(func)`; a name used twice gets a `_2`, `_3`, ... suffix.
    """

    # not a group reward itself, although it has `score_groups` (see `is_group_reward`)
    mixes_rewards = True

    def __init__(self, funcs: Sequence[RewardFunc | GroupRewardFunc | str], weights: Sequence[float] | None = None):
        if isinstance(funcs, str) or callable(funcs) or is_group_reward(funcs):
            funcs = [funcs]
        if len(funcs) == 0:
            raise ValueError("RewardMix needs at least one reward function or reward name.")
        resolved = []
        for func in funcs:
            if isinstance(func, str):
                func = get_reward(func)
            elif not (callable(func) or is_group_reward(func)):
                raise ValueError(
                    f"Reward {func!r} is neither a callable, an object with a `score_groups` method nor a registered "
                    "reward name."
                )
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
        # the parameters each function names in its signature: only those receive image tensors row by row
        self._named_parameters = [_named_parameters(func) for func in resolved]
        self._processes: RewardProcesses | None = None
        self._in_processes: dict[int, int] = {}  # function index -> its index in the processes

    @staticmethod
    def _unique_names(names: list[str]) -> list[str]:
        seen: dict[str, int] = {}
        unique = []
        for name in names:
            seen[name] = seen.get(name, 0) + 1
            unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
        return unique

    def prepare(self, train_dataset: Any, processor: Any = None) -> None:
        """Calls `prepare_reward(func, train_dataset, processor)` for every function of the mix, once before training.

        Args:
            train_dataset (`datasets.Dataset`): the training set.
            processor (*optional*): the captioner's processor.
        """
        for func in self.funcs:
            prepare_reward(func, train_dataset, processor)

    def use_processes(self, num_processes: int) -> list[str]:
        """
        Computes the functions that score each caption independently of the others
        ([`scores_captions_independently`]: CIDEr-D with fixed document frequencies, BLEU, ROUGE-L) and read no image
        tensor in `num_processes` worker processes, each call of [`score_groups`] split by rows over them: the same
        values, with the host's other cores. 0 computes everything in this process again.

        Call it after [`prepare`]: the functions are copied into the processes now, with their state. The processes
        start in the background; calls made before they have started are scored in this process, with the same
        values ([`wait_for_processes`] waits for them).

        Returns:
            the names of the functions computed in the processes.
        """
        self.close()
        chosen = [
            index
            for index, func in enumerate(self.funcs)
            if callable(func)
            and not is_group_reward(func)
            and not isinstance(func, RewardMix)
            and scores_captions_independently(func)
        ]
        if num_processes > 0 and chosen:
            self._processes = RewardProcesses([self.funcs[index] for index in chosen], num_processes)
            self._in_processes = {index: position for position, index in enumerate(chosen)}
        return [self.names[index] for index in self._in_processes]

    def wait_for_processes(self, timeout: float | None = None) -> bool:
        """Waits until the worker processes of [`use_processes`] have started; returns whether they have within
        `timeout` seconds (`None`: no limit). True when there are none."""
        return self._processes is None or self._processes.wait_started(timeout)

    def close(self) -> None:
        """Stops the worker processes of [`use_processes`], if any."""
        if self._processes is not None:
            self._processes.close()
        self._processes, self._in_processes = None, {}

    def score(self, **inputs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Calls every reward function with `inputs` (`completions=`, `references=`, columns), one row per completion.

        Returns:
            `tuple[np.ndarray, dict[str, np.ndarray]]`: the weighted total of shape `(batch_size,)`, and each
            function's raw values of shape `(batch_size,)` keyed by its logging name.

        Raises:
            `ValueError`: naming the reward function that returned the wrong number of values, or a NaN, an
                infinity or a non-number; or naming a reward that only scores groups (use `score_groups`).
        """
        completions = inputs.get("completions")
        if completions is None:
            raise ValueError("RewardMix.score needs `completions=` (the generated captions).")
        batch_size = len(completions)
        components = {}
        for name, func in zip(self.names, self.funcs, strict=True):
            if not callable(func):
                raise ValueError(
                    f"Reward function {name!r} only scores groups of completions (it has `score_groups` but is not "
                    "callable); call `RewardMix.score_groups` with the completions grouped per image."
                )
            components[name] = _checked_values(
                name, func(**inputs), batch_size, lambda row: f"completion {row} ({completions[row]!r})"
            )
        return self._weighted_total(components, batch_size), components

    def score_groups(
        self,
        *,
        completions: Sequence[Sequence[Any]],
        references: Sequence[Sequence[str]] | None = None,
        **image_columns: Any,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Scores completions grouped per image: [`submit_groups`]'s result, waited for."""
        return self.submit_groups(completions=completions, references=references, **image_columns).result()

    def submit_groups(
        self,
        *,
        completions: Sequence[Sequence[Any]],
        references: Sequence[Sequence[str]] | None = None,
        completion_columns: Mapping[str, Sequence[Sequence[Any]]] | None = None,
        **image_columns: Any,
    ) -> Pending[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Scores completions grouped per image, with every image column given once per image. The rewards computed
        in worker processes ([`use_processes`]) run on while the caller goes on; the others are computed now.

        A reward may return `None` for a completion it cannot score, as TRL's rewards do: the value is NaN in its
        component, left out of the weighted total (the other rewards' weighted values are summed), and a completion
        that no reward scored has a NaN total, which the caller masks out. A NaN or infinite float is an error.

        Group rewards (`is_group_reward`) are called once with the groups, as given. Every other function is called
        as TRL would call it, one row per completion: the completions flattened in group order, each image's
        references repeated for each of its completions, and the image columns expanded per completion as follows.

        - `list` and `tuple` columns (`image_id`, dataset columns, PIL images) are repeated for every function:
          repeating a list copies references to the values, not the values.
        - Array columns (`torch.Tensor` such as `pixel_values` or `image_features`, `np.ndarray`) are expanded
          (`index_select`, one row per completion) only for functions whose signature names the column, e.g.
          `def reward(*, completions, references, pixel_values, **columns)`. A function taking them through
          `**kwargs` (such as `cider` and `bleu`) does not receive them, so the pixels of an image are never copied
          once per completion for a function that does not read them.
        - Any other value (a number, a string, `None`) is passed unchanged.

        A function that scores each caption on its own ([`scores_captions_independently`]) and names no array column
        is called with one row per distinct (image, completion) pair instead, and its values are spread back to every
        row: a trained policy's samples and rollouts repeat themselves.

        Args:
            completions (`Sequence[Sequence[str]]` of length `num_images`): group `i` holds image `i`'s completions;
                groups may differ in size.
            references (`Sequence[Sequence[str]]` of length `num_images`, *optional*): image `i`'s reference captions.
            completion_columns (`Mapping[str, Sequence[Sequence[Any]]]`, *optional*): columns with one value per
                completion, grouped as `completions` (`completion_ids`, `prompts`), passed flat as `completions` is.
            **image_columns: one row per image (`image_id` list, `pixel_values` `(num_images, 3, H, W)`, ...).

        Returns:
            [`Pending`] `tuple[np.ndarray, dict[str, np.ndarray]]`: the weighted total of shape `(num_completions,)`,
            and each function's raw values of shape `(num_completions,)` keyed by its logging name, both flat in group
            order (group 0's completions, then group 1's, ...).

        Raises:
            `ValueError`: for grouped inputs of the wrong shape (a column without one row per image), or, from the
                result, naming the reward function that returned the wrong number of groups or values, or a NaN, an
                infinity or a non-number, with the image and the completion within its group.
        """
        sizes = group_sizes(completions)
        num_images = len(sizes)
        if references is not None and len(references) != num_images:
            raise ValueError(
                f"Got {num_images} groups of completions but {len(references)} reference lists; pass one list of "
                "references per image."
            )
        for column, value in image_columns.items():
            rows = _num_rows(value)
            if rows is not None and rows != num_images:
                raise ValueError(
                    f"Column {column!r} has {rows} rows for {num_images} images; pass every image column once per "
                    "image, in the order of the groups of completions."
                )
        image_of = np.repeat(np.arange(num_images), sizes)  # (num_completions,): each completion's group
        num_completions = len(image_of)
        label = _image_labels(image_columns.get("image_id"), num_images)
        offsets = np.cumsum([0, *sizes])

        flat_completions = [completion for group in completions for completion in group]

        def locate(row: int) -> str:
            image = int(image_of[row])
            return f"{label(image)} completion {row - offsets[image]} ({flat_completions[row]!r})"

        flat_references = None if references is None else [references[image] for image in image_of]
        repeated, arrays = {}, {}
        for column, grouped in (completion_columns or {}).items():
            if group_sizes(grouped) != sizes:
                raise ValueError(
                    f"Column {column!r} is not grouped as the completions (groups of {sizes}); pass one value per "
                    "completion, in the groups of `completions`."
                )
            repeated[column] = [value for group in grouped for value in group]
        for column, value in image_columns.items():
            if _is_array(value):
                arrays[column] = value
            elif isinstance(value, list | tuple):
                repeated[column] = [value[image] for image in image_of]
            else:
                repeated[column] = value
        expanded: dict[str, Any] = {}  # array columns expanded per completion, shared by the functions that name them

        def expand(column: str) -> Any:
            if column not in expanded:
                value = arrays[column]
                if isinstance(value, torch.Tensor):
                    expanded[column] = value.index_select(0, torch.as_tensor(image_of, device=value.device))
                else:
                    expanded[column] = np.take(value, image_of, axis=0)
            return expanded[column]

        every_row = _Rows(flat_completions, flat_references, repeated, locate)
        once_per_pair: _Rows | None = None  # the distinct (image, completion) pairs, found when a reward needs them
        components: dict[str, Any] = {}  # each function's checked values, or a Pending of them
        for index, (name, func, named) in enumerate(zip(self.names, self.funcs, self._named_parameters, strict=True)):
            reads_arrays = bool(named & set(arrays))
            rows = every_row
            if (
                scores_captions_independently(func)
                and not is_group_reward(func)
                and not isinstance(func, RewardMix)
                and not reads_arrays
            ):
                # computed once per distinct pair: a trained policy's samples and rollouts repeat themselves (3,177
                # rollouts of 128 images held 464 pairs)
                once_per_pair = once_per_pair or every_row.distinct_pairs(image_of)
                rows = once_per_pair
            if index in self._in_processes and not reads_arrays:
                columns = {name: value for name, value in rows.columns.items() if name not in TRL_ONLY_KEYWORDS}
                submitted = self._processes.submit(
                    self._in_processes[index], rows.completions, rows.references, **columns
                )
                components[name] = Pending(lambda rows=rows, name=name, submitted=submitted: rows.checked(
                    name, submitted.result()
                ))  # fmt: skip
                continue
            if rows is not every_row:
                values = func(completions=rows.completions, references=rows.references, **rows.columns)
            elif isinstance(func, RewardMix):
                values, _ = func.score_groups(completions=completions, references=references, **image_columns)
            elif is_group_reward(func):
                grouped = func.score_groups(completions=completions, references=references, **image_columns)
                values = _flattened_groups(name, grouped, sizes, label)
            else:
                columns = dict(repeated)
                columns.update({column: expand(column) for column in arrays if column in named})
                values = func(completions=flat_completions, references=flat_references, **columns)
            components[name] = rows.checked(name, values)

        def collect() -> tuple[np.ndarray, dict[str, np.ndarray]]:
            for name, values in components.items():
                if isinstance(values, Pending):
                    components[name] = values.result()
            return self._weighted_total(components, num_completions), components

        return Pending(collect)

    def _weighted_total(self, components: dict[str, np.ndarray], batch_size: int) -> np.ndarray:
        # a reward's NaN (it returned None) is left out of the sum, as TRL's `nansum` does; NaN where none scored
        total = np.zeros(batch_size)
        scored = np.zeros(batch_size, dtype=bool)
        for weight, values in zip(self.weights, components.values(), strict=True):
            unscored = np.isnan(values)
            total += np.where(unscored, 0.0, weight * values)
            scored |= ~unscored
        total[~scored] = np.nan
        return total

    def __call__(self, **inputs: Any) -> list[float | None]:
        """The weighted total as `list[float | None]` (`None` where no reward scored the completion), so a
        `RewardMix` is itself a reward function."""
        total, _ = self.score(**inputs)
        return [None if math.isnan(value) else value for value in total.tolist()]

    def __repr__(self) -> str:
        terms = ", ".join(f"{weight:g}*{name}" for name, weight in zip(self.names, self.weights, strict=True))
        return f"RewardMix({terms})"


class _Rows:
    """The rows a reward function is called with: every completion's, or one per distinct (image, completion) pair
    with `inverse`, each completion's pair, to spread the values back to every row."""

    def __init__(
        self,
        completions: list[Any],
        references: list[Any] | None,
        columns: dict[str, Any],
        locate: Callable[[int], str],
        inverse: np.ndarray | None = None,
    ):
        self.completions, self.references, self.columns, self.locate = completions, references, columns, locate
        self.inverse = inverse

    def checked(self, name: str, values: Any) -> np.ndarray:
        """A reward's values for these rows, checked (see [`_checked_values`]), for every completion."""
        array = _checked_values(name, values, len(self.completions), self.locate)
        return array if self.inverse is None else array[self.inverse]

    def distinct_pairs(self, image_of: np.ndarray) -> _Rows:
        """One row per distinct (image, completion) pair, at its first row; these rows themselves where every pair
        is distinct or a completion cannot be hashed."""
        first_of_pair: dict[tuple[int, Any], int] = {}
        pairs = zip(image_of.tolist(), self.completions, strict=True)
        try:
            inverse = np.fromiter(
                (first_of_pair.setdefault(pair, len(first_of_pair)) for pair in pairs),
                dtype=np.int64,
                count=len(self.completions),
            )
        except TypeError:
            return self
        if len(first_of_pair) == len(self.completions):
            return self
        rows = np.unique(inverse, return_index=True)[1]
        return _Rows(
            [self.completions[row] for row in rows],
            None if self.references is None else [self.references[row] for row in rows],
            {
                column: [values[row] for row in rows] if isinstance(values, list) else values
                for column, values in self.columns.items()
            },
            lambda row: self.locate(int(rows[row])),
            inverse,
        )


def _named_parameters(func: Any) -> frozenset[str]:
    """The parameters a reward's signature names explicitly (not those it takes through `**kwargs`)."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(parameter.name for parameter in parameters if parameter.kind in kinds)


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray) and value.ndim > 0


def _num_rows(value: Any) -> int | None:
    """Rows of a per-image column (a list, tuple or array); `None` for a value passed unchanged."""
    if _is_array(value) or isinstance(value, list | tuple):
        return len(value)
    return None


def _image_labels(image_ids: Any, num_images: int) -> Callable[[int], str]:
    """How errors name image `i`: by its `image_id` when the column has one per image, else by its group."""
    if isinstance(image_ids, torch.Tensor | np.ndarray):
        image_ids = image_ids.tolist()
    if isinstance(image_ids, list | tuple) and len(image_ids) == num_images:
        return lambda image: f"image_id {image_ids[image]!r} (group {image})"
    return lambda image: f"group {image}"


def _length(values: Any) -> int | None:
    if values is None or isinstance(values, str):
        return None
    try:
        return len(values)
    except TypeError:
        return None


def _flattened_groups(name: str, grouped: Any, sizes: list[int], label: Callable[[int], str]) -> list[Any]:
    """A group reward's values, checked to hold one list per group as long as the group, flattened in group order."""
    count = _length(grouped)
    if count != len(sizes):
        raise ValueError(
            f"Group reward {name!r} returned {count if count is not None else repr(grouped)} groups of values for "
            f"{len(sizes)} images; `score_groups` must return one list of floats per image."
        )
    for image, (values, size) in enumerate(zip(grouped, sizes, strict=True)):
        length = _length(values)
        if length != size:
            raise ValueError(
                f"Group reward {name!r} returned {length if length is not None else repr(values)} values for "
                f"{label(image)}, which has {size} completions; return one float per completion of each group."
            )
    return [value for values in grouped for value in values]


def _checked_values(name: str, values: Any, count: int, locate: Callable[[int], str]) -> np.ndarray:
    """A reward's values as a float64 array of shape `(count,)`, refusing a wrong count, non-numbers and NaN/inf; a
    `None` (a completion the reward cannot score, as in TRL) becomes NaN.

    `locate(row)` names the completion of a flat row in error messages.
    """
    length = _length(values)
    unscored = None
    if length is not None and any(value is None for value in values):
        unscored = np.array([value is None for value in values])
        values = [np.nan if value is None else value for value in values]
    if length != count:
        raise ValueError(
            f"Reward function {name!r} returned {length if length is not None else repr(values)} values for {count} "
            "completions; a reward must return one float per completion."
        )
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Reward function {name!r} returned values that are not numbers: {list(values)[:5]!r}..."
        ) from error
    if array.shape != (count,):
        raise ValueError(
            f"Reward function {name!r} returned values of shape {array.shape} for {count} completions; a reward must "
            f"return one float per completion, got {list(values)[:5]!r}..."
        )
    bad = np.flatnonzero(~np.isfinite(array) & (True if unscored is None else ~unscored))
    if len(bad):
        where = ", ".join(locate(int(row)) for row in bad[:5])
        raise ValueError(
            f"Reward function {name!r} returned non-finite values {array[bad[:5]].tolist()} at {where}; fix the "
            "reward (or the captions it cannot score) before training."
        )
    return array
