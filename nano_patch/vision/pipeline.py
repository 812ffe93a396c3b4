"""Run a torchvision ``Compose`` with images carried as ``FastImage`` between its steps.

The transforms themselves are stock: their ``forward`` draws the random numbers exactly as always
and calls ``torchvision.transforms.functional``, whose patched PIL backend runs the kernels on a
``FastImage``'s array. A ``FastImage`` is a PIL image, so any step the patch does not know (a
``Lambda``, a user's function, ``ElasticTransform``) gets what stock would give it: the first PIL
call there copies the pixels into PIL once. A caller's plain PIL image comes back as a plain PIL
image; an image the patch decoded stays a ``FastImage``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from .. import report
from . import functional as K
from .image import FastImage, fast, plain

_to_tensor_cls: type | None = None
_normalize_cls: type | None = None
_compose_cls: type | None = None
#: Compose objects (a DataLoader worker's own copies) that end in a uint8 tensor instead of ToTensor.
_uint8_out: weakref.WeakSet[Any] = weakref.WeakSet()


def configure(to_tensor: type, normalize: type, compose: type) -> None:
    """Name the stock classes the pipeline treats specially (set by the patch)."""
    global _to_tensor_cls, _normalize_cls, _compose_cls
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


def behaves_as(t: Any, base: type) -> bool:
    """``t`` is a ``base``, and no class between its own and ``base`` overrides ``__call__`` or ``forward``."""
    for klass in type(t).__mro__:
        if klass is base:
            return True
        if "__call__" in vars(klass) or "forward" in vars(klass):
            return False
    return False


def takes(img: Any) -> bool:
    """Images a pipeline carries as ``FastImage``: the patch's own, and PIL ``RGB``/``L``."""
    return isinstance(img, Image.Image) and img.mode in ("RGB", "L")


def run(transforms: Sequence[Callable[..., Any]], img: Any, *,
        uint8_tail: Sequence[Callable[..., Any]] = ()) -> Any:
    """Apply ``transforms`` in order, as ``Compose.__call__`` does, with ``img`` carried as a ``FastImage``.

    ``uint8_tail``: the ToTensor (+ Normalize) steps cut off the end of ``transforms``; an image
    comes out as a uint8 C x H x W tensor instead, and anything else goes through them as stock.
    """
    plain_out = not isinstance(img, FastImage)
    x = fast(img)
    items = list(transforms)
    if uint8_tail:
        x = run(items, x)
        if takes(x):
            return _uint8_chw(x)
        return plain(run(uint8_tail, x)) if plain_out else run(uint8_tail, x)
    stats = report.stats
    i = 0
    while i < len(items):
        t = items[i]
        carried = isinstance(x, FastImage)
        if (
            carried
            and type(t) is _to_tensor_cls
            and i + 1 < len(items)
            and type(items[i + 1]) is _normalize_cls
        ):
            # ToTensor then Normalize: one table lookup per channel, stock's arithmetic bit for bit.
            norm = items[i + 1]
            x = K.to_tensor_normalized(K.from_pil(x), norm.mean, norm.std)
            i += 2
            continue
        x = t(x)
        if carried and not isinstance(x, FastImage) and takes(x):
            if stats is not None:
                _count(stats, t, i, left=True)
            x = fast(x)  # a step that returned plain PIL: carried on, its pixels not copied
        elif carried and stats is not None:
            _count(stats, t, i, left=False)
        i += 1
    return plain(x) if plain_out else x


def _count(stats: report.Stats, t: Any, position: int, left: bool) -> None:
    name = type(t).__name__
    if left:
        stats.count("vision_transforms", False,
                    f"`{name}` at position {position} of the Compose: PIL code took the pixels there")
    else:
        stats.count("vision_transforms", True, name)


def _uint8_chw(x: Any) -> Any:
    import torch

    arr = x.array if isinstance(x, FastImage) else None
    if arr is None or arr.base is not None or not arr.flags.c_contiguous:
        arr = np.array(x)  # a private copy: the tensor must not share pixels with other images
    t = torch.from_numpy(arr)
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)


def run_compose(compose: Any, img: Any, *, skip: int = 0) -> Any:
    """:func:`run` for a ``Compose``, honouring :func:`emit_uint8`; ``skip``: leading steps already applied."""
    items = list(compose.transforms)[skip:]
    if _uint8_out and compose in _uint8_out:
        tail = tensor_tail(compose)
        if tail and len(tail) <= len(items):
            return run(items[: -len(tail)], img, uint8_tail=tail)
    return run(items, img)
