"""The pixel types of a plan and the operations a draw writes down for its render.

:class:`Pixels` is the image between planned steps: an array, and geometry not yet applied to it (a crop is a
view; a resize waits so that a horizontal flip drawn after it is written into its output; a flip waits
through colour operations). :class:`JpegPixels` is a JPEG not decoded yet (a first crop decodes only its
window). :class:`Recording` stands in for the pixels while a batch's draws run: it writes each pixel operation
down as a typed :class:`Op` (a small object with its parameters, and the native op runner's record for it),
which :func:`render` (Python) or ``oprunner.run`` (one native call) makes later, on the real pixels.

The step runners that call these are in ``steps.py`` (torchvision's v1 transforms) and ``policies.py``
(AutoAugment and its kin, v1, v2 and timm's); ``compose_plan.py`` ties them to a ``Compose``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .. import report
from . import functional as K
from .image import FastImage

#: torchvision.transforms.functional and torch, set by ``plan.configure`` (stock's own functions and draws).
stock_F: Any = None
stock_torch: Any = None
#: pillow-simd's grey depends on a pixel's place in its row (its SIMD loop leaves the last width % 4
#: pixels to Pillow's formula), so under it a flip must not wait through the grey-based operations.
GREY_BY_POSITION = False


class UseStock(Exception):
    """This call's arguments are not the plan's: the transform runs stock code (before any draw)."""


class Pixels:
    """The image between planned steps: an array, and geometry still to apply to it.

    ``base`` is an H x W (L) or H x W x 3 (RGB) uint8 array, possibly a view; ``resize`` a pending
    ``(height, width, PIL filter)``; ``window`` a pending crop ``(top, left, height, width)`` of the
    resize's output, inside it (only that part is then computed); ``flip`` a pending left-right
    mirror, applied last. Arrays are never written to: every operation makes a new one. ``owned``:
    ``base`` (or what it is a view of) was made in this run, so a tensor may take it over as it is.
    """

    __slots__ = ("base", "resize", "window", "flip", "info", "owned")
    #: where a step's torch draws come from: None, torch's own generator; a recording may carry a
    #: ``torch_draws.TorchDraws`` (the draw step of a batch), which then makes them natively
    draws: Any = None

    def __init__(self, base: np.ndarray, info: dict[Any, Any] | None = None) -> None:
        self.base = base
        self._nothing_pending(info)

    def _nothing_pending(self, info: dict[Any, Any] | None = None) -> None:
        self.resize: tuple[int, int, int] | None = None
        self.window: tuple[int, int, int, int] | None = None
        self.flip = False
        self.info = info or {}
        self.owned = False

    @classmethod
    def of(cls, img: Image.Image) -> Pixels:
        """The pixels of a PIL ``RGB``/``L`` image (no copy for an array-held ``FastImage``)."""
        return cls(K.from_pil(img), img.info)

    @property
    def hw(self) -> tuple[int, int]:
        if self.window is not None:
            return self.window[2], self.window[3]
        return (self.resize[0], self.resize[1]) if self.resize is not None else self.base.shape[:2]

    @property
    def mode(self) -> str:
        return "L" if self.base.ndim == 2 else "RGB"

    def array(self) -> np.ndarray:
        """The image with everything applied."""
        if self.resize is not None:
            h, w, f = self.resize
            stats = report.stats
            start = time.perf_counter() if stats is not None else 0.0
            self.base = K.resize(self.base, [h, w], f, flip=self.flip, window=self.window)
            self.resize, self.window, self.flip, self.owned = None, None, False, True
            if stats is not None:
                stats.add_seconds("resize", time.perf_counter() - start)
        elif self.flip:
            self.base = K.hflip(self.base)
            self.flip, self.owned = False, True
        return self.base

    def unflipped(self) -> np.ndarray:
        """The image for a per-pixel operation: any resize applied, a flip may stay pending."""
        return self.array() if self.resize is not None else self.base

    def crop(self, top: int, left: int, height: int, width: int) -> None:
        h, w = self.hw
        if self.flip:  # the crop of the mirror is the mirror of the mirrored crop
            left = w - left - width
        if self.resize is not None:
            if top >= 0 and left >= 0 and height > 0 and width > 0 and top + height <= h and left + width <= w:
                wt, wl = (self.window[0], self.window[1]) if self.window is not None else (0, 0)
                self.window = (wt + top, wl + left, height, width)  # compute only what is kept
                return
            if self.flip:
                left = w - left - width
            self.array()
        self.base = K.crop(self.base, top, left, height, width)

    def resize_to(self, height: int, width: int, pil_filter: int) -> None:
        if self.resize is not None or self.flip:
            # resize(flip(x)) need not equal flip(resize(x)) to the bit: apply what came before
            self.array()
        self.resize = (height, width, pil_filter)

    def hflip(self) -> None:
        self.flip = not self.flip

    def vflip(self) -> None:
        self.base = self.array()[::-1]

    # Pixel operations are methods, so that a draw (:class:`Recording`) can write them down for a render
    # to call later in the same order: each returns the pixels to carry on with.

    def point(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        """A per-pixel ``kernel(array, *args)``: a pending flip may wait through it."""
        a = self.unflipped()
        out = kernel(a, *args)
        if out is not a:
            self.base, self.owned = out, True
        return self

    def whole(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        """A ``kernel(array, *args)`` that depends on where pixels are (warps, sharpness): flips applied first."""
        self.base, self.owned = kernel(self.array(), *args), True
        return self

    def colour(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
        """One of ColorJitter's operations (``JITTER``) by its kernel, or by stock's function where the kernel
        leaves an argument to stock."""
        return _colour(self, op, factor)

    def grey(self, channels: int) -> Pixels:
        """``to_grayscale`` with ``channels`` (1 or 3) output channels."""
        before = self.array() if GREY_BY_POSITION else self.unflipped()
        self.base = K.to_grayscale(before, channels)
        if self.base is not before:
            self.owned = True
        if channels == 3:
            self.info = {}
        return self

    def proxy(self) -> FastImage:
        """A pixel-less stand-in of the current size and mode, for stock ``get_params`` (size only)."""
        img = FastImage()
        img._mode = self.mode
        img._size = (self.hw[1], self.hw[0])
        return img

    def image(self) -> FastImage:
        return FastImage.wrap(self.array(), self.info)


class DecodeFailed(Exception):
    """The deferred decode of a :class:`JpegPixels` failed: ``error`` is what the full decode raised."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class JpegPixels(Pixels):
    """The pixels of a JPEG not decoded yet: its size comes from the header, so a first crop can be drawn
    (stock's own ``get_params`` on the size) and then only that window is decoded (``crop_decode``).

    Anything else that needs the pixels decodes the whole file, as :func:`decode.decode_rgb` would.
    Either way the pixels are those of the full decode; a decode that fails raises :class:`DecodeFailed`
    so that the caller can put the random state back and raise stock's error, as stock (which decodes
    before it draws) would.
    """

    __slots__ = ("data", "path", "shape")

    def __init__(self, data: bytes, shape: tuple[int, int], path: Any) -> None:
        self.data, self.shape, self.path = data, shape, path
        self._nothing_pending()

    @property  # type: ignore[override]
    def base(self) -> np.ndarray:
        try:
            return Pixels.base.__get__(self)  # type: ignore[attr-defined]
        except AttributeError:
            pass
        from . import decode

        try:
            a = decode.decode_rgb(self.path, data=self.data, checked=True)  # its maker ran decode.check_open
        except Exception as exc:  # noqa: BLE001 - stock's own error, raised again by the caller
            raise DecodeFailed(exc) from exc
        Pixels.base.__set__(self, a)  # type: ignore[attr-defined]
        self.owned = True
        return a

    @base.setter
    def base(self, value: np.ndarray) -> None:
        Pixels.base.__set__(self, value)  # type: ignore[attr-defined]

    def _decoded(self) -> bool:
        try:
            Pixels.base.__get__(self)  # type: ignore[attr-defined]
        except AttributeError:
            return False
        return True

    @property
    def hw(self) -> tuple[int, int]:
        if self.resize is None and self.window is None and not self._decoded():
            return self.shape
        return Pixels.hw.fget(self)  # type: ignore[attr-defined]

    @property
    def mode(self) -> str:
        return "RGB"

    def crop(self, top: int, left: int, height: int, width: int) -> None:
        h, w = self.shape
        if (not self._decoded() and self.resize is None and not self.flip and top >= 0 and left >= 0
                and height > 0 and width > 0 and top + height <= h and left + width <= w):
            from . import native, native_kernels

            try:
                region = native_kernels.decode_jpeg_region(self.data, top, left, height, width)
            except (native.NativeUnavailable, native_kernels.JpegRegionError):
                pass  # the whole file, as without crop decoding: its own rules, its own errors
            else:
                self.base, self.owned = region, True
                if report.stats is not None:
                    report.stats.count("vision_datasets", True, "JPEG window decoded by libjpeg-turbo (crop region)")
                return
        super().crop(top, left, height, width)


class NotSplittable(Exception):
    """A step needs pixels (or runs stock code) while it draws: no draw/render split.

    ``every_time``: the plan itself has such a step (a stock step at a fixed position), so every sample would
    raise it; otherwise it depends on what a sample drew (a policy op left to its library's own code).
    """

    def __init__(self, why: str, every_time: bool = False) -> None:
        super().__init__(why)
        self.every_time = every_time


# --- ColorJitter's operations on pixels --------------------------------------------------------


def _hue(a: np.ndarray, factor: float) -> np.ndarray:
    if a.ndim == 2:  # stock checks the range, then returns a grey image unchanged
        if not (-0.5 <= factor <= 0.5):
            raise ValueError(f"hue_factor ({factor}) is not in [-0.5, 0.5].")
        return a
    return K.adjust_hue(a, factor)


#: ColorJitter's operations by its fn_idx: (array kernel, stock functional name, result keeps info).
JITTER = ((K.adjust_brightness, "adjust_brightness", False), (K.adjust_contrast, "adjust_contrast", False),
           (K.adjust_saturation, "adjust_saturation", True), (_hue, "adjust_hue", False))


def _colour(px: Pixels, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
    kernel, name, keeps_info = op
    grey_based = name in ("adjust_contrast", "adjust_saturation")
    try:
        out = kernel(px.array() if grey_based and GREY_BY_POSITION else px.unflipped(), factor)
    except (TypeError, ValueError):
        # an argument the kernel leaves to stock: stock's function, on stock's image
        result = getattr(stock_F, name)(px.image(), factor)
        if not (isinstance(result, Image.Image) and result.mode == px.mode):
            raise LeftPlan(result) from None
        return Pixels.of(result)
    if out is not px.base:
        px.owned = True
        if not keeps_info:  # (stock's hue returns a grey image itself, info and all)
            px.info = {}
    px.base = out
    return px


class LeftPlan(Exception):
    """A stock function inside a planned step returned something the plan does not carry on."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


# --- the typed operations: what a draw writes down, for a render to make later ---------------------------

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


_filters: dict[int, str] | None = None


def native_filters() -> dict[int, str]:
    global _filters
    if _filters is None:
        from . import native_kernels

        _filters = native_kernels.FILTERS
    return _filters


class Resize(Op):
    """PIL's convolution resize (or nearest) to ``height`` x ``width`` with PIL's filter number ``pil_filter``."""

    __slots__ = ("height", "width", "pil_filter")

    def __init__(self, height: int, width: int, pil_filter: int) -> None:
        self.height, self.width, self.pil_filter = height, width, pil_filter
        ok = pil_filter in native_filters()
        self._native((OP_RESIZE, height, width, pil_filter, 0, 0.0, None) if ok else None,
                     "" if ok else "a nearest-neighbour resize (OpenCV's)")

    def apply(self, px: Pixels) -> Pixels:
        px.resize_to(self.height, self.width, self.pil_filter)
        return px


class HFlip(Op):
    __slots__ = ()

    def __init__(self) -> None:
        self._native((OP_HFLIP, 0, 0, 0, 0, 0.0, None))

    def apply(self, px: Pixels) -> Pixels:
        px.hflip()
        return px


class VFlip(Op):
    __slots__ = ()

    def __init__(self) -> None:
        self._native((OP_VFLIP, 0, 0, 0, 0, 0.0, None))

    def apply(self, px: Pixels) -> Pixels:
        px.vflip()
        return px


#: The flips have no parameters: every recording shares one of each (an op is never changed once made).
HFLIP, VFLIP = HFlip(), VFlip()


def plain_factor(factor: Any) -> float | None:
    """A factor the kernels take as they are (``functional._factor``), else None (Python decides)."""
    t = type(factor)
    if (t is not float and t is not int) or not math.isfinite(factor) or abs(factor) > 1e30:
        return None
    return float(factor)


class Colour(Op):
    """One of ColorJitter's operations (``JITTER``: brightness, contrast, saturation, hue) with its factor."""

    __slots__ = ("op", "factor")

    def __init__(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> None:
        self.op, self.factor = op, factor
        code = _COLOUR_CODES[op[1]]
        f = plain_factor(factor)
        if f is None:
            self._native(None, f"{op[1]} with factor {factor!r} (stock's own checks)")
        elif code in (OP_CONTRAST, OP_SATURATION) and GREY_BY_POSITION:
            self._native(None, f"{op[1]} under pillow-simd (its grey depends on the pixel's place)")
        elif code == OP_HUE:
            if not -0.5 <= f <= 0.5:
                self._native(None, f"adjust_hue with factor {factor!r} (stock raises)")
            else:  # torchvision's own expression, np.int32(f * 255).astype(np.uint8), in integers: a float32
                # truncated toward zero, then wrapped to a byte (|f * 255| <= 127.5 here)
                self._native((OP_HUE, int(f * 255) & 0xFF, 0, 0, 0, 0.0, None))
        else:
            self._native((code, 0, 0, 0, 0, f, None))

    def apply(self, px: Pixels) -> Pixels:
        return px.colour(self.op, self.factor)


class Grey(Op):
    """``to_grayscale`` with ``channels`` (1 or 3) output channels."""

    __slots__ = ("channels",)

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self._native(None if GREY_BY_POSITION else (OP_GREY, channels, 0, 0, 0, 0.0, None),
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


class Recording(Pixels):
    """The draw half of a plan run: sizes and mode only, no pixels.

    It stands in for :class:`Pixels` while a plan runs its steps: every random draw happens as stock makes
    it (from the size and mode alone), and every pixel operation is written down as a typed :class:`Op` with
    its parameters. :func:`render` later makes them, in the same order, on the real pixels (in any thread: it
    draws nothing), in Python or as one call of the native op runner (``vision/oprunner.py``). Whatever needs
    the pixels while drawing (a stock step, a stock fallback inside a step) raises :class:`NotSplittable`.
    """

    __slots__ = ("ops", "_hw", "_mode", "draws", "erasures", "shared")

    def __init__(self, hw: tuple[int, int], mode: str = "RGB", draws: Any = None,
                 shared: dict[Any, Any] | None = None) -> None:
        self.ops: list[Op] = []
        self.draws = draws
        #: what the recordings of one run of samples share (their tensor tail's op): no user code runs between
        #: their draws, so what it is made of (a Normalize's constants) cannot change among them
        self.shared = shared
        #: a deferred tail's RandomErasing draws (``tensor_tail.Erasure``), made with the others: the render's
        #: uint8 image goes out with them (``tensor_tail.ErasedImage``)
        self.erasures: list[Any] | None = None
        self._hw, self._mode = hw, mode
        self._nothing_pending()

    @property  # type: ignore[override]
    def base(self) -> np.ndarray:
        raise NotSplittable("a step reads the pixels while it draws")

    @base.setter
    def base(self, value: np.ndarray) -> None:
        raise NotSplittable("a step writes the pixels while it draws")

    @property
    def hw(self) -> tuple[int, int]:
        return self._hw

    @property
    def mode(self) -> str:
        return self._mode

    def array(self) -> np.ndarray:
        raise NotSplittable("a step reads the pixels while it draws")

    unflipped = array

    def image(self) -> FastImage:
        raise NotSplittable("a step runs stock code on the image while it draws")

    def crop(self, top: int, left: int, height: int, width: int) -> None:
        h, w = self._hw
        inside = top >= 0 and left >= 0 and height > 0 and width > 0 and top + height <= h and left + width <= w
        self.ops.append(Crop(top, left, height, width, inside))
        self._hw = (height, width)

    def resize_to(self, height: int, width: int, pil_filter: int) -> None:
        self.ops.append(Resize(height, width, pil_filter))
        self._hw = (height, width)

    def hflip(self) -> None:
        self.ops.append(HFLIP)

    def vflip(self) -> None:
        self.ops.append(VFLIP)

    def point(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(Point(kernel, args))
        return self

    def whole(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(Whole(kernel, args))
        return self

    def colour(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
        self.ops.append(Colour(op, factor))
        return self

    def grey(self, channels: int) -> Pixels:
        self.ops.append(Grey(channels))
        self._mode = "L" if channels == 1 else "RGB"
        return self

    def end_in_tensor(self, tail: Any, uint8: bool) -> None:
        self.ops.append(TensorTail(tail, uint8, 1 if self._mode == "L" else 3))

    def end_in_image(self, fast_in: bool) -> None:
        self.ops.append(ImageEnd(fast_in))


class RenderFailed(Exception):
    """A written-down step could not be made on the pixels as the draw expected (its caller redoes the batch)."""


def render(recording: Recording, px: Pixels) -> Any:
    """Make the pixel operations ``recording`` wrote down on ``px``, in order, in Python: the plan's result.

    Draws nothing, so it may run in any thread. The result is what the plan's ``run`` would have returned.
    """
    ops = recording.ops
    if not ops or not isinstance(ops[-1], (TensorTail, ImageEnd)):
        raise RenderFailed("a recording with no end")
    for op in ops:
        px = op.apply(px)
    return px
