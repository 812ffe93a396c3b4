"""Epochs of an ImageFolder loader, with the generators' states after each, and their comparison with stock's."""

from __future__ import annotations

from typing import Any

import torch
from _rng import rng_differences, rng_state, seed_all
from torch.utils.data import DataLoader


def loader_epochs(folder: Any, make: Any, seed: int, epochs: int = 2) -> list[Any]:
    """Per epoch, its batches (copied) and then the three generators' states, from ``seed``."""
    from torchvision.datasets import ImageFolder

    seed_all(seed)
    loader = DataLoader(ImageFolder(str(folder), transform=make()), batch_size=4, shuffle=True, num_workers=0)
    out: list[Any] = []
    for _ in range(epochs):
        out.append([(x.clone(), y.clone()) for x, y in loader])
        out.append(rng_state())
    return out


def assert_same_epochs(stock: list[Any], patched: list[Any]) -> None:
    """Equal batches (values, dtypes, strides) and generator states."""
    for want, got in zip(stock, patched, strict=True):
        if isinstance(want, tuple):
            assert rng_differences(got, want) == []
            continue
        for (wx, wy), (gx, gy) in zip(want, got, strict=True):
            assert wx.dtype == gx.dtype and wx.stride() == gx.stride() and torch.equal(wx, gx) and torch.equal(wy, gy)
