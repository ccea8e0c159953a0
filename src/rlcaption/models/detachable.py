"""
Models that publish a second network beside their captioner (a `SpeakerListener`'s listener, a
`PolicyValueCaptioner`'s value network) which a training objective trains in its own optimizer group.

The trainer refuses an auxiliary network that shares parameters with the model, so the objective takes the network out
of the model's module tree for the run ([`DetachableNetworkMixin.detach_network`]): it is then in no `parameters()`,
`state_dict()` nor DDP replica of the model. The model keeps owning it: it still reads it, moves it with `to()` and
`train()`, and writes and loads it in `save_pretrained` and `load_state_dict`, so that training checkpoints, the final
save and a published checkpoint all hold the trained network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["DetachableNetworkMixin"]


class DetachableNetworkMixin:
    """For a `PreTrainedModel` whose attribute named `detachable_network_name` is the network an objective trains."""

    detachable_network_name: str

    @property
    def network_is_detached(self) -> bool:
        """Whether [`detach_network`] took the network out of the model's module tree."""
        return self.detachable_network_name not in self._modules

    def detach_network(self) -> nn.Module:
        """
        Takes the network out of the model's parameters, `state_dict()` and DDP replica, and returns it; the model
        keeps using, moving, saving and loading it. Calling it again returns the same network.
        """
        name = self.detachable_network_name
        if not self.network_is_detached:
            # kept as a plain attribute: found by `self.<name>`, unseen by the module tree
            self.__dict__[name] = self._modules.pop(name)
        return getattr(self, name)

    def attach_network(self) -> None:
        """Puts a [`detach_network`]-ed network back among the model's parameters."""
        if self.network_is_detached:
            name = self.detachable_network_name
            setattr(self, name, self.__dict__.pop(name))

    @contextmanager
    def _network_attached(self) -> Iterator[None]:
        detached = self.network_is_detached
        self.attach_network()
        try:
            yield
        finally:
            if detached:
                self.detach_network()

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        # device and dtype moves reach it too, but not an emptying to the meta device: FSDP's memory-efficient loading
        # empties the model on all processes but one and loads the model's own weights back, which the detached
        # network, trained beside the model, is not among
        if recurse and self.network_is_detached and fn(torch.empty(0)).device.type != "meta":
            getattr(self, self.detachable_network_name)._apply(fn)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        if self.network_is_detached:
            getattr(self, self.detachable_network_name).train(mode)
        return self

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        # a detached network is loaded too where the state dict holds it: resuming a run or loading its best
        # checkpoint restores it. One without it is the model's own while detached (FSDP reloads its shards so).
        prefix = f"{self.detachable_network_name}."
        if not any(key.startswith(prefix) for key in state_dict):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        with self._network_attached():
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def detached_network_state_dict(self) -> dict[str, object]:
        """The detached network's weights under the names the attached model gives them (empty when attached):
        what a state dict of the model taken while detached lacks to be saved whole."""
        if not self.network_is_detached:
            return {}
        network = getattr(self, self.detachable_network_name)
        return {f"{self.detachable_network_name}.{key}": value for key, value in network.state_dict().items()}

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, with the network even while it is detached for training."""
        with self._network_attached():
            super().save_pretrained(save_directory, *args, **kwargs)
