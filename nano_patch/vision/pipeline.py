"""Run a torchvision ``Compose`` with images kept as uint8 arrays between accelerated steps.

The transforms themselves are stock: their ``forward`` draws the random numbers exactly as always
and calls ``torchvision.transforms.functional``, whose PIL backend accepts arrays once patched. This
module only decides where the array/PIL boundary lies: an array is materialised as a PIL image in
front of any callable that is not known to accept arrays (a user's function, a ``Lambda``,
``ElasticTransform``, ``AugMix``), and at the end when the caller gave a PIL image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from . import functional as K

_capable: tuple[type, ...] = ()
_containers: tuple[type, ...] = ()
_to_tensor_cls: type | None = None
_normalize_cls: type | None = None


def configure(capable: Sequence[type], containers: Sequence[type], to_tensor: type, normalize: type) -> None:
    """Name the stock transform classes whose ``forward`` works on arrays (set by the patch)."""
    global _capable, _containers, _to_tensor_cls, _normalize_cls
    _capable, _containers = tuple(capable), tuple(containers)
    _to_tensor_cls, _normalize_cls = to_tensor, normalize


def behaves_as(t: Any, base: type) -> bool:
    """``t`` is a ``base``, and no class between its own and ``base`` overrides ``__call__`` or ``forward``."""
    for klass in type(t).__mro__:
        if klass is base:
            return True
        if "__call__" in vars(klass) or "forward" in vars(klass):
            return False
    return False


def accepts_arrays(t: Callable[..., Any]) -> bool:
    """True if ``t`` is a stock transform (or a subclass that changes no behaviour) that works on arrays."""
    for base in _containers:
        if behaves_as(t, base):
            return all(accepts_arrays(c) for c in t.transforms)
    return any(behaves_as(t, base) for base in _capable)


def _is_pil_rgb_or_l(x: Any) -> bool:
    return isinstance(x, Image.Image) and x.mode in ("RGB", "L")


def _materialise(x: Any) -> Any:
    if K.is_image_array(x):
        return K.to_pil(x)
    if isinstance(x, (tuple, list)) and x and all(K.is_image_array(i) for i in x):
        return type(x)(K.to_pil(i) for i in x)
    return x


def run(transforms: Sequence[Callable[..., Any]], img: Any, *, stands_for_pil: bool = False) -> Any:
    """Apply ``transforms`` in order, as ``Compose.__call__`` does, keeping images as arrays where possible.

    ``stands_for_pil``: ``img`` is an array standing in for the PIL image stock code would have had
    (a dataset's decoded file), so an image result goes back out as PIL.
    """
    from torchvision.transforms import functional as F

    pil_out = stands_for_pil or _is_pil_rgb_or_l(img)
    array_out = K.is_image_array(img) and not stands_for_pil
    x = img
    items = list(transforms)
    i = 0
    while i < len(items):
        t = items[i]
        if accepts_arrays(t):
            if _is_pil_rgb_or_l(x):
                x = K.from_pil(x)
            if (
                K.is_image_array(x)
                and type(t) is _to_tensor_cls
                and i + 1 < len(items)
                and type(items[i + 1]) is _normalize_cls
            ):
                # ToTensor then Normalize: normalise the fresh tensor in place, skipping Normalize's copy.
                norm = items[i + 1]
                x = F.normalize(K.to_tensor(x), norm.mean, norm.std, inplace=True)
                i += 2
                continue
            x = t(x)
        else:
            x = t(_materialise(x))
        i += 1
    if pil_out:
        return _materialise(x)
    if array_out and _is_pil_rgb_or_l(x):
        return np.asarray(x)
    return x
