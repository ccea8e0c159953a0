"""Watches where a computation reads tensor values on the host: on a GPU, each such read waits for the device to
finish all the work queued before it, so the host stops queueing ahead. On the CPU nothing waits, but the same
operators run, so a test here sees the places that would wait on a GPU. Not seen: copies between host and device
(`.cpu()`, `.tolist()`, `.numpy()`; and `torch.tensor(values, device=...)`, which on a GPU waits too unless the values
come from pinned memory without blocking, as `rlcaption.objectives.base.reward_tensor` copies them), since on the CPU
they run no operator; and reads of tensors that stay on the host anyway (a CPU generator's draws), which a GPU would
not wait for either."""

from __future__ import annotations

import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operators whose result on the host (a Python number, or an output's size) needs the device's values
READING_OPERATORS = {
    "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
    "unique_dim", "equal", "is_nonzero", "bincount", "repeat_interleave",
}  # fmt: skip


class HostReads(TorchDispatchMode):
    """Counts, by operator and by the innermost function outside torch that led to it, the operators that read
    tensor values on the host. `repeat_interleave` with a known `output_size` and indexing with integer tensors do
    not read; indexing with a boolean mask does (it finds the mask's true positions)."""

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if self._reads(name, args, kwargs):
            self.seen[name, self._where()] += 1
        return func(*args, **kwargs)

    @staticmethod
    def _reads(name, args, kwargs) -> bool:
        if name == "repeat_interleave":
            return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
        if name in ("index", "index_put", "index_put_"):
            indices = args[1] if len(args) > 1 else []
            return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in indices or [])
        return name in READING_OPERATORS

    @staticmethod
    def _where() -> str:
        """`file:function` of the innermost caller outside torch (a path from the package's folder on)."""
        for frame in reversed(traceback.extract_stack()[:-3]):
            if "/torch/" not in frame.filename:
                return f"{frame.filename.split('/src/')[-1].split('/site-packages/')[-1]}:{frame.name}"
        return "?"

    def places(self) -> set[str]:
        return {where for _, where in self.seen}
