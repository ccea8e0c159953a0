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
import multiprocessing.forkserver
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, TypeVar

import numpy as np

from .base import reward_name

__all__ = ["Pending", "RewardProcesses", "scores_captions_independently"]

# A call is split into shares of at least this many rows: sending a share to a process and its values back costs about
# what scoring a hundred captions with CIDEr-D costs.
MIN_ROWS_PER_SHARE = 128
# the reward functions of a worker process, copied into it when it starts
_worker_rewards: list[Any] = []
T = TypeVar("T")


class Pending(Generic[T]):
    """A result that worker processes may still be computing: the training process goes on (e.g. with the forward
    pass that scores the samples) until it needs it. `result()` waits for it, and raises any error of its
    computation there."""

    def __init__(self, collect: Callable[[], T]):
        self._collect = collect

    def result(self) -> T:
        if self._collect is not None:
            self._value, self._collect = self._collect(), None
        return self._value

    @classmethod
    def done(cls, value: T) -> Pending[T]:
        """A result computed already."""
        return cls(lambda: value)


def _process_context() -> multiprocessing.context.BaseContext:
    """A fork server where there is one (not on Windows: spawn). The server imports the library once and forks every
    worker from that import, so that N workers cost one import of torch and the library, not N; like spawn, it copies
    no CUDA context or thread of the training process."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The server's own preload of the training script (`__main__`) never happens before CPython 3.14 and some 3.13
    # releases (the server reads a key of the preparation data that it is not sent), so the library is added to the
    # modules it preloads, those already set kept; this holds for a server not yet started.
    preload = getattr(multiprocessing.forkserver._forkserver, "_preload_modules", None) or ["__main__"]
    if "rlcaption" not in preload:
        context.set_forkserver_preload([*preload, "rlcaption"])
    return context


def scores_captions_independently(func: Any) -> bool:
    """Whether a reward's value for each caption depends on that caption's row of inputs only, as its class or
    function declares with `scores_captions_independently = True`: then its calls can be split by rows, and a row
    repeated (the same caption of the same image) is computed once."""
    return bool(getattr(func, "scores_captions_independently", False))


def _start_worker(pickled_rewards: list[bytes]) -> None:
    _worker_rewards[:] = [pickle.loads(pickled) for pickled in pickled_rewards]


def _pickled(func: Any) -> bytes:
    try:
        return pickle.dumps(func)
    except Exception as error:  # pickling raises whatever the object's reducers raise
        raise ValueError(
            f"Reward {reward_name(func)!r} cannot be copied into worker processes ({error}): define it at the top "
            "level of a module, or compute the rewards in the training process (reward_processes=0)."
        ) from error


def _score_rows(reward_index: int, inputs: dict[str, Any]) -> list[float]:
    return list(_worker_rewards[reward_index](**inputs))


class RewardProcesses:
    """
    Worker processes that call reward functions on shares of the rows of a call.

    The functions are copied (pickled) into every process when the processes start, with their state at that time
    (prepare them first: CIDEr-D's document frequencies of the training set, ...). The processes come from a fork
    server (spawned where there is none), so that a training process's CUDA context and threads are never copied; as
    with a `DataLoader`'s workers, a training script then needs the `if __name__ == "__main__":` guard.

    The processes start in the background, which takes seconds (the fork server imports the library): until all of
    them have started, calls are scored in this process, with the same values, and training does not wait.

    Args:
        funcs (`Sequence`): per-caption reward functions that [`scores_captions_independently`], picklable.
        num_processes (`int`): the worker processes; a call is split into at most this many shares.
    """

    def __init__(self, funcs: Sequence[Any], num_processes: int):
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # this is a worker process importing a training script that creates the processes at its top level: it
            # must neither start processes of its own nor go on to train
            raise RuntimeError(
                "Reward worker processes were asked for while a worker process was starting: the training script "
                'needs the `if __name__ == "__main__":` guard around the training, as for DataLoader workers.'
            )
        self.funcs = list(funcs)
        self.num_processes = num_processes
        self._executor = ProcessPoolExecutor(
            num_processes,
            mp_context=_process_context(),
            initializer=_start_worker,
            # pickled here, so that every process gets the functions as they are now, not as they are (perhaps in
            # the middle of a call) when the background thread starts it
            initargs=([_pickled(func) for func in self.funcs],),
        )
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        # the executor starts a process when a task finds none idle, and waits for it to read its functions: started
        # from this thread, that wait would hold up training
        threading.Thread(target=self._start_processes, name="reward-processes-start", daemon=True).start()
        # the processes end with this object, or at exit
        self._finalizer = weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)

    def _start_processes(self) -> None:
        try:
            started: set[int] = set()
            while len(started) < self.num_processes:
                if started:  # the processes already up took every task: give the others time to start
                    time.sleep(0.01)
                # one task per process, until each process has answered one
                started.update(
                    future.result() for future in [self._executor.submit(os.getpid) for _ in range(self.num_processes)]
                )
        except CancelledError:  # closed while starting
            pass
        except Exception as error:  # a process could not start: the next call says so
            self._start_error = error
        finally:
            self._started.set()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Waits until every process has started (or one has failed to: the next call raises); returns whether that
        happened within `timeout` seconds (`None`: no limit)."""
        return self._started.wait(timeout)

    def _stopped(self, func_index: int, error: BaseException) -> RuntimeError:
        return RuntimeError(
            f"The worker processes computing reward {reward_name(self.funcs[func_index])!r} stopped or could not "
            f"start ({type(error).__name__}: {error}); compute the rewards in the training process "
            "(reward_processes=0) to see the reward's own error."
        )

    def submit(
        self, func_index: int, completions: Sequence[Any], references: Sequence[Any] | None, **columns: Any
    ) -> Pending[list[float]]:
        """
        Starts `funcs[func_index](completions=completions, references=references, **columns)`, its rows split over the
        processes in shares of at least `MIN_ROWS_PER_SHARE`: list columns are split with the rows, any other value
        goes to every share unchanged. A smaller call, or one made before the processes have started, is scored in
        this process, now.

        Returns:
            the values of every row, in the order of `completions`, once computed.
        """
        if self._start_error is not None:
            raise self._stopped(func_index, self._start_error) from self._start_error
        num_rows = len(completions)
        num_shares = min(self.num_processes, num_rows // MIN_ROWS_PER_SHARE)
        if num_shares <= 1 or not self._started.is_set():  # sending the rows would cost more, or wait
            return Pending.done(
                list(self.funcs[func_index](completions=completions, references=references, **columns))
            )
        bounds = np.linspace(0, num_rows, num_shares + 1).round().astype(int)
        futures = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            share = {
                "completions": list(completions[start:end]),
                "references": None if references is None else list(references[start:end]),
                **{name: value[start:end] if isinstance(value, list) else value for name, value in columns.items()},
            }
            futures.append(self._executor.submit(_score_rows, func_index, share))

        def collect() -> list[float]:
            try:
                return [value for future in futures for value in future.result()]
            except BrokenProcessPool as error:
                raise self._stopped(func_index, error) from error

        return Pending(collect)

    def close(self) -> None:
        """Stops the worker processes."""
        self._finalizer.detach()
        self._executor.shutdown(wait=True, cancel_futures=True)
