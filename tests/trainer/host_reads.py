"""Watches where a computation reads tensor values on the host: on a GPU, each such read waits for the device to
finish all the work queued before it, so the host stops queueing ahead. On the CPU nothing waits, but the same
operators run, so a test here sees the places that would wait on a GPU. Copies from the host are seen where a tensor
is made from host values for a device (`torch.tensor(values, device=...)`, `torch.as_tensor(...)`): on a GPU such a
copy waits too, unless it comes from pinned memory without blocking, as
`rlcaption.objectives.base.to_device_without_waiting` copies. Not seen: other copies between host and device (`.cpu()`,
`.tolist()`, `.numpy()`, `.to(device)`), which on the CPU run no operator; and reads of tensors that stay on the host
anyway (a CPU generator's draws), which a GPU would not wait for either."""

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
        self._makers = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}

    def __enter__(self):
        for name, make in self._makers.items():
            setattr(torch, name, self._watching_copies(make))
        return super().__enter__()

    def __exit__(self, *exception):
        for name, make in self._makers.items():
            setattr(torch, name, make)
        return super().__exit__(*exception)

    def _watching_copies(self, make):
        def made(data, *args, **kwargs):
            if kwargs.get("device") is not None and not isinstance(data, torch.Tensor):
                self.seen["copy_from_host", self._where()] += 1
            return make(data, *args, **kwargs)

        return made

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
        for frame in reversed(traceback.extract_stack()):
            if "/torch/" not in frame.filename and frame.filename != __file__:
                return f"{frame.filename.split('/src/')[-1].split('/site-packages/')[-1]}:{frame.name}"
        return "?"

    def places(self) -> set[str]:
        return {where for _, where in self.seen}
