"""The pixels of a plan: the image between planned steps, and its pixel operations.

:class:`Pixels` is the image between planned steps: an array, and geometry not yet applied to it (a crop is a
view; a resize waits so that a horizontal flip drawn after it is written into its output; a flip waits
through colour operations). :class:`JpegPixels` is a JPEG not decoded yet (a first crop decodes only its
window). The pixel operations are methods, so that a draw (``recording.Recording``, the same interface without
pixels) can write them down as typed ops (``pixel_ops.py``) for a render to make later.

The step runners that call these are in ``steps.py`` (torchvision's v1 transforms) and ``policies.py``
(AutoAugment and its kin, v1, v2 and timm's); ``compose_plan.py`` ties them to a ``Compose``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ... import report, sysinfo
from ..images.image import FastImage
from ..kernels import functional as K
from ..kernels import native, native_kernels
from . import stock


def grey_by_position() -> bool:
    """pillow-simd's grey depends on a pixel's place in its row (its SIMD loop leaves the last width % 4 pixels to
    Pillow's formula), so under it a flip must not wait through the grey-based operations."""
    return sysinfo.pillow_is_simd()


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
        self.base = K.crop_pixels(self.base, top, left, height, width)

    def check_crop(self, top: int, left: int, height: int, width: int) -> None:
        """PIL's size check of the crop box that :meth:`crop` is about to cut, made as stock's crop makes it: a
        step calls this right after the crop's draws, before any later draw, in the thread that draws."""
        K.check_crop_box(self.hw, top, left, height, width)

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
        before = self.array() if grey_by_position() else self.unflipped()
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
        from ..images import decode

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

    def check_crop(self, top: int, left: int, height: int, width: int) -> None:
        if not self._decoded() and K.crop_checked(self.hw, top, left, height, width):
            # stock decodes before it draws: a file that fails to decode raises that, not the crop's check
            _ = self.base  # the full decode (or DecodeFailed), before PIL's check acts
        super().check_crop(top, left, height, width)

    def crop(self, top: int, left: int, height: int, width: int) -> None:
        h, w = self.shape
        if (not self._decoded() and self.resize is None and not self.flip and top >= 0 and left >= 0
                and height > 0 and width > 0 and top + height <= h and left + width <= w):
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
        out = kernel(px.array() if grey_based and grey_by_position() else px.unflipped(), factor)
    except (TypeError, ValueError):
        # an argument the kernel leaves to stock: stock's function, on stock's image
        result = getattr(stock.functional(), name)(px.image(), factor)
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
