"""Run a torchvision ``Compose`` with images kept as uint8 arrays between accelerated steps.

The transforms themselves are stock: their ``forward`` draws the random numbers exactly as always
and calls ``torchvision.transforms.functional``, whose PIL backend accepts arrays once patched. This
module only decides where the array/PIL boundary lies: an array is materialised as a PIL image in
front of any callable that is not known to accept arrays (a user's function, a ``Lambda``,
``ElasticTransform``, ``AugMix``), and at the end when the caller gave a PIL image.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from .. import report
from . import functional as K

_capable: tuple[type, ...] = ()
_containers: tuple[type, ...] = ()
_to_tensor_cls: type | None = None
_normalize_cls: type | None = None


_compose_cls: type | None = None
#: Compose objects (a DataLoader worker's own copies) that end in a uint8 tensor instead of ToTensor.
_uint8_out: weakref.WeakSet[Any] = weakref.WeakSet()


def configure(capable: Sequence[type], containers: Sequence[type], to_tensor: type, normalize: type,
              compose: type) -> None:
    """Name the stock transform classes whose ``forward`` works on arrays (set by the patch)."""
    global _capable, _containers, _to_tensor_cls, _normalize_cls, _compose_cls
    _capable, _containers = tuple(capable), tuple(containers)
    _kinds.clear()
    _to_tensor_cls, _normalize_cls, _compose_cls = to_tensor, normalize, compose


def deactivate() -> None:
    """The transforms patch was reverted: nothing routes through :func:`run` any more."""
    global _compose_cls
    _compose_cls = None
    _uint8_out.clear()


def active() -> bool:
    return _compose_cls is not None


def tensor_tail(compose: Any) -> list[Any] | None:
    """``[ToTensor]`` or ``[ToTensor, Normalize]`` if a stock ``Compose`` ends so, else None."""
    if _compose_cls is None or not behaves_as(compose, _compose_cls):
        return None
    items = list(compose.transforms)
    if len(items) >= 2 and type(items[-2]) is _to_tensor_cls and type(items[-1]) is _normalize_cls:
        return items[-2:]
    if items and type(items[-1]) is _to_tensor_cls:
        return items[-1:]
    return None


def emit_uint8(compose: Any) -> None:
    """Make ``compose`` stop before its ToTensor tail and return uint8 C x H x W tensors."""
    _uint8_out.add(compose)


def wants_uint8(compose: Any) -> bool:
    return compose in _uint8_out


def behaves_as(t: Any, base: type) -> bool:
    """``t`` is a ``base``, and no class between its own and ``base`` overrides ``__call__`` or ``forward``."""
    return _type_behaves_as(type(t), base)


def _type_behaves_as(cls: type, base: type) -> bool:
    for klass in cls.__mro__:
        if klass is base:
            return True
        if "__call__" in vars(klass) or "forward" in vars(klass):
            return False
    return False


def accepts_arrays(t: Callable[..., Any]) -> bool:
    """True if ``t`` is a stock transform (or a subclass that changes no behaviour) that works on arrays."""
    kind = _kind(type(t))
    if kind == "container":
        return all(accepts_arrays(c) for c in t.transforms)
    return kind == "capable"


#: type -> "container" | "capable" | "other"; a per-configuration cache (every image asks it per step).
_kinds: dict[type, str] = {}


def _kind(klass: type) -> str:
    kind = _kinds.get(klass)
    if kind is None:
        if any(_type_behaves_as(klass, base) for base in _containers):
            kind = "container"
        elif any(_type_behaves_as(klass, base) for base in _capable):
            kind = "capable"
        else:
            kind = "other"
        _kinds[klass] = kind
    return kind


def _is_pil_rgb_or_l(x: Any) -> bool:
    return isinstance(x, Image.Image) and x.mode in ("RGB", "L")


def _materialise(x: Any) -> Any:
    if K.is_image_array(x):
        return K.to_pil(x)
    if isinstance(x, (tuple, list)) and x and all(K.is_image_array(i) for i in x):
        return type(x)(K.to_pil(i) for i in x)
    return x


def run(transforms: Sequence[Callable[..., Any]], img: Any, *, stands_for_pil: bool = False,
        uint8_tail: Sequence[Callable[..., Any]] = ()) -> Any:
    """Apply ``transforms`` in order, as ``Compose.__call__`` does, keeping images as arrays where possible.

    ``stands_for_pil``: ``img`` is an array standing in for the PIL image stock code would have had
    (a dataset's decoded file), so an image result goes back out as PIL.
    ``uint8_tail``: the ToTensor (+ Normalize) steps cut off the end of ``transforms``; a uint8 image
    comes out as a uint8 C x H x W tensor instead, and anything else goes through them as stock.
    """
    pil_out = stands_for_pil or _is_pil_rgb_or_l(img)
    array_out = K.is_image_array(img) and not stands_for_pil
    x = img
    items = list(transforms)
    if uint8_tail:
        x = run(items, img)
        if K.is_image_array(x) or _is_pil_rgb_or_l(x):
            return _uint8_chw(x)
        return run(uint8_tail, x)
    stats = report.stats
    i = 0
    while i < len(items):
        t = items[i]
        if stats is not None:
            _count(stats, t, i)
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
                x = K.to_tensor_normalized(x, norm.mean, norm.std)
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


def _count(stats: report.Stats, t: Any, position: int) -> None:
    name = type(t).__name__
    if accepts_arrays(t):
        stats.count("vision_transforms", True, name)
    else:
        stats.count("vision_transforms", False,
                    f"`{name}` at position {position} of the Compose: images left the fast path there")


def _uint8_chw(x: Any) -> Any:
    import torch

    arr = np.asarray(x)
    if not arr.flags.writeable:
        arr = arr.copy()
    t = torch.from_numpy(arr)
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)


def run_compose(compose: Any, img: Any, *, stands_for_pil: bool = False, skip: int = 0) -> Any:
    """:func:`run` for a ``Compose``, honouring :func:`emit_uint8`; ``skip``: leading steps already applied."""
    items = list(compose.transforms)[skip:]
    if _uint8_out and compose in _uint8_out:
        tail = tensor_tail(compose)
        if tail and len(tail) <= len(items):
            return run(items[: -len(tail)], img, stands_for_pil=stands_for_pil, uint8_tail=tail)
    return run(items, img, stands_for_pil=stands_for_pil)
