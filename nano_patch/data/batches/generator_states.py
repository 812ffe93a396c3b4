"""The global generators' states, taken and put back as one: torch's, and Python's and NumPy's where a step may
draw from them. The batch path keeps the state before a sample's draws, to load it one by one from there."""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def take(beyond_torch: bool = True) -> tuple[Any, Any, Any]:
    """The generators' states: torch's, and Python's and NumPy's unless ``beyond_torch`` is False (they are then
    None: a plan that draws from torch alone leaves them where they are)."""
    import torch

    if not beyond_torch:
        return torch.get_rng_state(), None, None
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def put_back(states: tuple[Any, Any, Any]) -> None:
    import torch

    torch.set_rng_state(states[0])
    if states[1] is not None:
        random.setstate(states[1])
    if states[2] is not None:
        np.random.set_state(states[2])


def same(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> bool:
    import torch

    if not torch.equal(a[0], b[0]) or a[1] != b[1]:
        return False
    if a[2] is None or b[2] is None:
        return a[2] is b[2]
    return a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and tuple(a[2][2:]) == tuple(b[2][2:])
