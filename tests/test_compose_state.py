"""``ComposeState``: a Compose's draws are reused only while nothing they read has changed; every change a script
can make between two samples or batches reads as a change, and nothing else does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from nano_patch.vision.plans.compose_state import ComposeState


def _pets() -> T.Compose:
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                      T.RandomApply([T.ColorJitter(0.2, 0.2)], p=0.8), T.ToTensor(),
                      T.Normalize(torch.tensor([0.5, 0.5, 0.5]), [0.25, 0.25, 0.25])])


CHANGES: dict[str, Callable[[Any], None]] = {
    "a crop's size": lambda c: setattr(c.transforms[0], "size", (32, 32)),
    "a crop's scale": lambda c: setattr(c.transforms[0], "scale", (0.5, 1.0)),
    "a flip's probability": lambda c: setattr(c.transforms[1], "p", 0.9),
    "a nested transform's parameter": lambda c: setattr(c.transforms[2].transforms[0], "brightness", (0.1, 2.0)),
    "a nested list changed in place": lambda c: c.transforms[2].transforms.append(T.Grayscale(3)),
    "a tensor changed in place": lambda c: c.transforms[4].mean.__setitem__(0, 0.1),
    "a tensor replaced by an equal one": lambda c: setattr(c.transforms[4], "mean", torch.tensor([0.5, 0.5, 0.5])),
    "a list changed in place": lambda c: c.transforms[4].std.__setitem__(0, 0.3),
    "a step added": lambda c: c.transforms.append(T.RandomErasing()),
    "a step replaced": lambda c: c.transforms.__setitem__(1, T.RandomVerticalFlip()),
    "a hook registered": lambda c: c.transforms[0].register_forward_hook(lambda *a: None),
    "an attribute added": lambda c: setattr(c.transforms[0], "extra", 1),
    "an attribute removed": lambda c: delattr(c.transforms[1], "p"),
    "the interpolation": lambda c: setattr(c.transforms[0], "interpolation", T.InterpolationMode.NEAREST),
    "the default dtype": lambda c: torch.set_default_dtype(torch.float64),
}


@pytest.fixture(autouse=True)
def _dtype():
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_reads_as_one(change):
    compose = _pets()
    state = ComposeState(compose)
    assert state.still(compose)
    CHANGES[change](compose)
    assert not state.still(compose)


def test_a_value_set_back_reads_as_unchanged_and_another_compose_as_changed():
    compose = _pets()
    state = ComposeState(compose)
    compose.transforms[0].size = (32, 32)
    compose.transforms[0].size = (64, 64)
    compose.transforms[4].std[0] = 0.3
    compose.transforms[4].std[0] = 0.25
    assert state.still(compose)
    assert not state.still(_pets())


@pytest.mark.parametrize("make", [
    lambda: v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.ToImage(),
                        v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)]),
    lambda: T.Compose([T.Lambda(lambda x: x), T.AutoAugment(), T.ToTensor()]),
])
def test_other_composes_are_unchanged_until_changed(make):
    compose = make()
    state = ComposeState(compose)
    assert state.still(compose)
    compose.transforms[0].extra = [1, 2]
    assert not state.still(compose)
