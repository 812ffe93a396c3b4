"""The typed pixel operations: what a draw writes down, for a render to make later.

A batch's draw (``recording.Recording``) writes each pixel operation down as a typed :class:`Op`: a small object
with its parameters, which makes it on :class:`pixels.Pixels` (``apply``, the Python path), and the native op
runner's record for it (``csrc/oplist.c``), or why it has none.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import forks
from ..kernels import functional as K
from ..kernels.pil_filters import FILTERS
from .pixels import Pixels, grey_by_position


class RenderFailed(Exception):
    """A written-down step could not be made on the pixels as the draw expected (its caller redoes the batch)."""


#: Codes of the native op runner (``csrc/oplist.c``): one record per op, ``(code, a, b, c, d, factor, table)``.
OP_CROP, OP_RESIZE, OP_HFLIP, OP_VFLIP, OP_BRIGHTNESS, OP_CONTRAST, OP_SATURATION, OP_HUE, OP_GREY, OP_LUT, \
    OP_SHARPNESS = range(1, 12)
#: The checked kernels (``native.KERNELS``) each op code runs.
OP_KERNELS = {OP_CROP: (), OP_RESIZE: ("resample",), OP_HFLIP: ("resample",), OP_VFLIP: ("resample",),
              OP_BRIGHTNESS: ("blend",), OP_CONTRAST: ("blend", "grayscale"), OP_SATURATION: ("saturation",),
              OP_HUE: ("hue",), OP_GREY: ("grayscale",), OP_LUT: ("tables",), OP_SHARPNESS: ("sharpness",)}
_COLOUR_CODES = {"adjust_brightness": OP_BRIGHTNESS, "adjust_contrast": OP_CONTRAST,
                 "adjust_saturation": OP_SATURATION, "adjust_hue": OP_HUE}

Record = tuple[int, int, int, int, int, float, "bytes | None"]


class Op:
    """One pixel operation with its parameters, as a draw wrote it down.

    ``apply(px)`` makes it on :class:`Pixels` (the Python path) and returns the pixels to carry on with;
    ``record`` is the native op runner's record for it, or None, with ``why`` saying what keeps it in Python.
    """

    __slots__ = ("record", "why")

    def apply(self, px: Pixels) -> Pixels:
        raise NotImplementedError

    def _native(self, record: Record | None, why: str = "") -> None:
        self.record, self.why = record, why

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self._key()!r}"

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, s) for s in type(self).__slots__)


class Crop(Op):
    """``crop(top, left, height, width)`` of the image as it is then (a view where it lies inside)."""

    __slots__ = ("top", "left", "height", "width")

    def __init__(self, top: int, left: int, height: int, width: int, inside: bool) -> None:
        self.top, self.left, self.height, self.width = top, left, height, width
        self._native((OP_CROP, top, left, height, width, 0.0, None) if inside else None,
                     "" if inside else "a crop reaching outside the image (PIL's zero fill)")

    def apply(self, px: Pixels) -> Pixels:
        px.crop(self.top, self.left, self.height, self.width)
        return px


class Resize(Op):
    """PIL's convolution resize (or nearest) to ``height`` x ``width`` with PIL's filter number ``pil_filter``."""

    __slots__ = ("height", "width", "pil_filter")

    def __init__(self, height: int, width: int, pil_filter: int) -> None:
        self.height, self.width, self.pil_filter = height, width, pil_filter
        ok = pil_filter in FILTERS
        self._native((OP_RESIZE, height, width, pil_filter, 0, 0.0, None) if ok else None,
                     "" if ok else "a nearest-neighbour resize (OpenCV's)")

    def apply(self, px: Pixels) -> Pixels:
        px.resize_to(self.height, self.width, self.pil_filter)
        return px


class Flip(Op):
    """A mirror: left-right, or top-bottom where ``vertical``."""

    __slots__ = ("vertical",)

    def __init__(self, vertical: bool) -> None:
        self.vertical = vertical
        self._native((OP_VFLIP if vertical else OP_HFLIP, 0, 0, 0, 0, 0.0, None))

    def apply(self, px: Pixels) -> Pixels:
        if self.vertical:
            px.vflip()
        else:
            px.hflip()
        return px


#: The flips have no parameters: every recording shares one of each (an op is never changed once made).
HFLIP, VFLIP = Flip(False), Flip(True)


def plain_factor(factor: Any) -> float | None:
    """A factor the kernels take as they are (``functional._factor``), else None (Python decides)."""
    t = type(factor)
    if (t is not float and t is not int) or not math.isfinite(factor) or abs(factor) > 1e30:
        return None
    return float(factor)


def hue_record(factor: float) -> Record | None:
    """The op runner's record of ``adjust_hue`` by the plain ``factor``; None where stock raises (outside
    [-0.5, 0.5])."""
    if not -0.5 <= factor <= 0.5:
        return None
    # torchvision's own expression, np.int32(f * 255).astype(np.uint8), in integers: a float32 truncated toward
    # zero, then wrapped to a byte (|f * 255| <= 127.5 here)
    return (OP_HUE, int(factor * 255) & 0xFF, 0, 0, 0, 0.0, None)


class Colour(Op):
    """One of ColorJitter's operations (``JITTER``: brightness, contrast, saturation, hue) with its factor."""

    __slots__ = ("op", "factor")

    def __init__(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> None:
        self.op, self.factor = op, factor
        code = _COLOUR_CODES[op[1]]
        f = plain_factor(factor)
        if f is None:
            self._native(None, f"{op[1]} with factor {factor!r} (stock's own checks)")
        elif code in (OP_CONTRAST, OP_SATURATION) and grey_by_position():
            self._native(None, f"{op[1]} under pillow-simd (its grey depends on the pixel's place)")
        elif code == OP_HUE:
            record = hue_record(f)
            self._native(record, "" if record is not None else f"adjust_hue with factor {factor!r} (stock raises)")
        else:
            self._native((code, 0, 0, 0, 0, f, None))

    def apply(self, px: Pixels) -> Pixels:
        return px.colour(self.op, self.factor)


class Grey(Op):
    """``to_grayscale`` with ``channels`` (1 or 3) output channels."""

    __slots__ = ("channels",)

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self._native(None if grey_by_position() else (OP_GREY, channels, 0, 0, 0, 0.0, None),
                     "grey under pillow-simd (its grey depends on the pixel's place)")

    def apply(self, px: Pixels) -> Pixels:
        return px.grey(self.channels)


#: Point tables by kernel and arguments (a policy's magnitudes repeat): worked out once.
_POINT_TABLES: dict[tuple[Any, ...], bytes | None] = {}
_point_tables_lock = threading.Lock()


def _point_table(kernel: Callable[..., np.ndarray], args: tuple[Any, ...]) -> bytes | None:
    """The 256-entry table of a per-value point kernel with these arguments (the kernel's own arithmetic, run
    once on the 256 values), or None where the kernel is not one (a histogram op) or refuses them."""
    if kernel not in (K.posterize, K.solarize, K.invert, K.lut):
        return None  # autocontrast, equalize: their tables depend on the image's histogram
    key = (kernel, *((type(a), a) for a in args)) if all(type(a) in (int, float) for a in args) else None
    if key is not None:
        with _point_tables_lock:  # loaders in several threads
            if key in _POINT_TABLES:
                return _POINT_TABLES[key]
    table = _point_table_of(kernel, args)
    if key is not None:
        with _point_tables_lock:
            if len(_POINT_TABLES) < 4096:
                _POINT_TABLES[key] = table
    return table


def _point_table_of(kernel: Callable[..., np.ndarray], args: tuple[Any, ...]) -> bytes | None:
    try:
        table = kernel(np.arange(256, dtype=np.uint8).reshape(1, 256), *args)
    except Exception:  # noqa: BLE001 - the Python path raises it again, where it did
        return None
    table = np.asarray(table)
    if table.shape != (1, 256) or table.dtype != np.uint8:
        return None
    return table.tobytes()


class Point(Op):
    """A per-pixel ``kernel(array, *args)``; a pending flip may wait through it."""

    __slots__ = ("kernel", "args")

    def __init__(self, kernel: Callable[..., np.ndarray], args: tuple[Any, ...]) -> None:
        self.kernel, self.args = kernel, args
        table = _point_table(kernel, args)
        self._native(None if table is None else (OP_LUT, 0, 0, 0, 0, 0.0, table),
                     f"{getattr(kernel, '__name__', 'a point kernel')} (its table depends on the image)")

    def apply(self, px: Pixels) -> Pixels:
        return px.point(self.kernel, *self.args)


class Whole(Op):
    """A ``kernel(array, *args)`` that depends on where pixels are (warps, sharpness): flips applied first."""

    __slots__ = ("kernel", "args")

    def __init__(self, kernel: Callable[..., np.ndarray], args: tuple[Any, ...]) -> None:
        self.kernel, self.args = kernel, args
        f = plain_factor(args[0]) if kernel is K.adjust_sharpness and len(args) == 1 else None
        self._native(None if f is None else (OP_SHARPNESS, 0, 0, 0, 0, f, None),
                     f"{getattr(kernel, '__name__', 'a kernel')} (no native op)")

    def apply(self, px: Pixels) -> Pixels:
        return px.whole(self.kernel, *self.args)


class TensorTail(Op):
    """The plan's tensor tail (``plan.Tail``): the end of the run, a tensor in stock's layout.

    ``channels``: the image's channels when it gets there; ``table``: the tail's C x 256 float table for them
    (None for a uint8 tensor).
    """

    __slots__ = ("tail", "uint8", "channels", "table", "planes", "to_bytes", "runner_tail")

    def __init__(self, tail: Any, uint8: bool, channels: int) -> None:
        self.tail, self.uint8, self.channels = tail, uint8, channels
        #: the op runner's (kind, table) for this tail, or why it has none: worked out once (``oprunner.prepare``)
        self.runner_tail: tuple[int, Any] | str | None = None
        #: ToTensor's layout (C x H x W planes), else PILToTensor's (a view of H x W x C pixels)
        self.planes = bool(tail.to_tensor)
        #: the pixels as a uint8 tensor: PILToTensor alone, or the uint8 stand-in for ToTensor
        self.to_bytes = uint8 or (len(tail) == 1 and not self.planes)
        self.table = None if self.to_bytes else tail.table(channels)
        if self.to_bytes or self.table is not None and (self.planes or self.table.shape[0] == channels):
            self._native((0, 0, 0, 0, 0, 0.0, None))
        else:
            self._native(None, "the tensor tail runs stock code" if self.table is None else
                         "a grey image normalised to three channels after PILToTensor")

    def _key(self) -> tuple[Any, ...]:
        return (self.tail, self.uint8, self.channels)

    def apply(self, px: Pixels) -> Any:
        out = self.tail.tensor_from(px, self.uint8)
        if out is None:
            raise RenderFailed("the tensor tail left to stock")
        return out


class ImageEnd(Op):
    """The end of a run with no tensor tail: the image (a ``FastImage`` if one came in, else a plain one)."""

    __slots__ = ("fast_in",)

    def __init__(self, fast_in: bool) -> None:
        self.fast_in = fast_in
        self._native(None, "the Compose ends in an image, not a tensor")

    def apply(self, px: Pixels) -> Any:
        img = px.image()
        return img if self.fast_in else img.to_plain()


forks.fresh_in_child(globals(), _point_tables_lock=threading.Lock)
