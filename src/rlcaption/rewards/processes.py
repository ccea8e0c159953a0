"""
Rewards computed in worker processes, each on a share of a call's captions.

The consensus-metric rewards run on the host in Python: at a few thousand captions a step (SCST at 128 images × 5
samples plus their greedy baselines, or `spider_pg`'s rollouts) they cost a training step more than a GPU's whole
forward and backward pass. A reward whose value for a caption depends on that caption's row alone says so with
`scores_captions_independently = True` (CIDEr-D with fixed document frequencies, BLEU, ROUGE-L); its calls can then be
split by rows over processes and the values put back together, the same values in the same order.
"""

from __future__ import annotations

import multiprocessing
import pickle
import weakref
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from .base import reward_name

__all__ = ["RewardProcesses", "scores_captions_independently"]

# A call is split into shares of at least this many rows: sending a share to a process and its values back costs about
# what scoring a hundred captions with CIDEr-D costs.
MIN_ROWS_PER_SHARE = 128
# the reward functions of a worker process, copied into it when it starts
_worker_rewards: list[Any] = []


def scores_captions_independently(func: Any) -> bool:
    """Whether a reward's value for each caption depends on that caption's row of inputs only, as its class or
    function declares with `scores_captions_independently = True`: then its calls can be split by rows."""
    return bool(getattr(func, "scores_captions_independently", False))


def _start_worker(rewards: list[Any]) -> None:
    _worker_rewards[:] = rewards


def _score_rows(reward_index: int, inputs: dict[str, Any]) -> list[float]:
    return list(_worker_rewards[reward_index](**inputs))


class RewardProcesses:
    """
    Worker processes that call reward functions on shares of the rows of a call.

    The functions are copied (pickled) into every process when the processes start, with their state at that time
    (prepare them first: CIDEr-D's document frequencies of the training set, ...). The processes are spawned, not
    forked, so that a training process's CUDA context and threads are never copied; as with a `DataLoader`'s workers,
    a training script then needs the `if __name__ == "__main__":` guard.

    Args:
        funcs (`Sequence`): per-caption reward functions that [`scores_captions_independently`], picklable.
        num_processes (`int`): the worker processes; a call is split into at most this many shares.
    """

    def __init__(self, funcs: Sequence[Any], num_processes: int):
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
        self.funcs = list(funcs)
        self.num_processes = num_processes
        for func in self.funcs:
            try:
                pickle.dumps(func)
            except Exception as error:  # pickling raises whatever the object's reducers raise
                raise ValueError(
                    f"Reward {reward_name(func)!r} cannot be copied into worker processes ({error}): define it at "
                    "the top level of a module, or compute the rewards in the training process (reward_processes=0)."
                ) from error
        self._executor = ProcessPoolExecutor(
            num_processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(self.funcs,),
        )
        # start every process now, in the background: each imports the library and unpickles the functions, seconds
        # that the first training step would otherwise wait for
        for _ in range(num_processes):
            self._executor.submit(int)
        # the processes end with this object, or at exit
        self._finalizer = weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)

    def score(
        self, func_index: int, completions: Sequence[Any], references: Sequence[Any] | None, **columns: Any
    ) -> list[float]:
        """
        `funcs[func_index](completions=completions, references=references, **columns)`, its rows split over the
        processes in shares of at least `MIN_ROWS_PER_SHARE` (a smaller call is scored in this process): list columns
        are split with the rows, any other value goes to every share unchanged.

        Returns:
            the values of every row, in the order of `completions`.
        """
        num_rows = len(completions)
        num_shares = min(self.num_processes, num_rows // MIN_ROWS_PER_SHARE)
        if num_shares <= 1:  # sending the rows would cost more than scoring them here
            return list(self.funcs[func_index](completions=completions, references=references, **columns))
        bounds = np.linspace(0, num_rows, num_shares + 1).round().astype(int)
        futures = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            share = {
                "completions": list(completions[start:end]),
                "references": None if references is None else list(references[start:end]),
                **{name: value[start:end] if isinstance(value, list) else value for name, value in columns.items()},
            }
            futures.append(self._executor.submit(_score_rows, func_index, share))
        try:
            return [value for future in futures for value in future.result()]
        except BrokenProcessPool as error:
            raise RuntimeError(
                f"The worker processes computing reward {reward_name(self.funcs[func_index])!r} stopped ({error}); "
                "compute the rewards in the training process (reward_processes=0) to see the reward's own error."
            ) from error

    def close(self) -> None:
        """Stops the worker processes."""
        self._finalizer.detach()
        self._executor.shutdown(wait=True, cancel_futures=True)
