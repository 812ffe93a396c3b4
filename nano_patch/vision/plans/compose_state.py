"""What a Compose's draws read, kept to tell later whether it is still the same: its list of transforms, each
transform's attributes (a deep copy), and torch's default dtype.

Draws made ahead of the moment stock makes them (a batch's draw program bound once for its samples, a batch made
ahead while the training step runs) are stock's only where user code run in between changed none of this: a
parameter set between two samples or two batches (a curriculum's crop size, a flip's probability), a transform
added, or the default dtype that ``ToTensor`` converts to.
"""

from __future__ import annotations

import copy
from typing import Any


class ComposeState:
    """A Compose as its draws read it, at one moment (:meth:`still`: nothing of it has changed since)."""

    __slots__ = ("compose", "items", "snapshot", "dtype")

    def __init__(self, compose: Any) -> None:
        import torch

        self.compose = compose
        self.items = list(compose.transforms)
        self.snapshot = [copy.deepcopy(vars(t)) for t in self.items]
        self.dtype = torch.get_default_dtype()

    def still(self, compose: Any) -> bool:
        """Whether ``compose`` is the same object, with the same transforms, each with the same attributes, under the
        same default dtype."""
        import torch

        if compose is not self.compose:
            return False
        items = compose.transforms
        if len(items) != len(self.items) or torch.get_default_dtype() != self.dtype:
            return False
        try:
            return all(t is u and vars(t) == snap for t, u, snap in zip(items, self.items, self.snapshot))
        except Exception:  # noqa: BLE001 - a value that does not compare (a tensor): taken as changed
            return False
