"""Every random number generator a transform may draw from, seeded and compared together.

torchvision draws from torch's generator; timm and the auto-augment policies also from Python's
``random``, and timm from NumPy's global generator. A patched run that drew one number more or
less from any of them would change every later draw, so parity tests compare all three.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def rng_state() -> tuple[Any, Any, Any]:
    """(torch, Python ``random``, NumPy) states, copied."""
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def rng_differences(got: tuple[Any, Any, Any], want: tuple[Any, Any, Any]) -> list[str]:
    """The generators whose states differ: [] when all three drew the same."""
    out = []
    if not torch.equal(got[0], want[0]):
        out.append("torch")
    if got[1] != want[1]:
        out.append("python random")
    g, w = got[2], want[2]
    if not (g[0] == w[0] and np.array_equal(g[1], w[1]) and tuple(g[2:]) == tuple(w[2:])):
        out.append("numpy")
    return out
