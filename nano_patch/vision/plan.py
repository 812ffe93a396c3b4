"""One plan per ``Compose``: its steps run as kernels on the decoded array, worked out once.

The first time a stock ``Compose`` runs, :func:`plan_for` gives each of its transforms a runner.
The transforms the plan knows (exactly stock's classes, with stock's ``forward`` and
``get_params``) run on :class:`Pixels`: the image's array and the geometry not yet applied to it.
Any other transform, and any call whose arguments the plan does not handle, gets a ``FastImage``
(a PIL image, no copy) exactly as stock would give it its image, and splits the plan there. The
plan is kept per ``Compose`` and rebuilt when its list of transforms changes; parameters are read
from the transforms on every call, never cached.

Per image, what remains is what stock does that matters: each transform's own random draws
(``get_params``, ``torch.rand``), in stock's order, and one kernel call per operation. Geometry is
deferred where that stays exact: a crop is a view; a resize waits so that a horizontal flip drawn
after it is written into its output; a flip waits through colour operations (they act per pixel
and on the grey mean, which a flip does not change; not under pillow-simd, whose grey depends on
where a pixel is in its row). The tail ``ToTensor [+ Normalize]`` or
``PILToTensor [+ ConvertImageDtype(float) [+ Normalize]]`` is one table lookup per channel, the
tables being stock's own arithmetic run once on the 256 values.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .. import report
from . import functional as K
from .image import FastImage


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
        """One of ColorJitter's operations (``_JITTER``) by its kernel, or by stock's function where the kernel
        leaves an argument to stock."""
        return _colour(self, op, factor)

    def grey(self, channels: int) -> Pixels:
        """``to_grayscale`` with ``channels`` (1 or 3) output channels."""
        before = self.array() if _GREY_BY_POSITION else self.unflipped()
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
            from . import native

            try:
                region = native.decode_jpeg_region(self.data, top, left, height, width)
            except (native.NativeUnavailable, native.JpegRegionError):
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


class Recording(Pixels):
    """The draw half of a plan run: sizes and mode only, no pixels.

    It stands in for :class:`Pixels` while a plan runs its steps: every random draw happens as stock makes
    it (from the size and mode alone), and every pixel operation is written down as the method call a
    :class:`Pixels` would have received. :func:`render` later makes those calls, in the same order, on the
    real pixels (in any thread: it draws nothing). Whatever needs the pixels while drawing (a stock step, a
    stock fallback inside a step) raises :class:`NotSplittable` instead.
    """

    __slots__ = ("ops", "_hw", "_mode")

    def __init__(self, hw: tuple[int, int], mode: str = "RGB") -> None:
        self.ops: list[tuple[str, tuple[Any, ...]]] = []
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
        self.ops.append(("crop", (top, left, height, width)))
        self._hw = (height, width)

    def resize_to(self, height: int, width: int, pil_filter: int) -> None:
        self.ops.append(("resize_to", (height, width, pil_filter)))
        self._hw = (height, width)

    def hflip(self) -> None:
        self.ops.append(("hflip", ()))

    def vflip(self) -> None:
        self.ops.append(("vflip", ()))

    def point(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(("point", (kernel, *args)))
        return self

    def whole(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(("whole", (kernel, *args)))
        return self

    def colour(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
        self.ops.append(("colour", (op, factor)))
        return self

    def grey(self, channels: int) -> Pixels:
        self.ops.append(("grey", (channels,)))
        self._mode = "L" if channels == 1 else "RGB"
        return self


class RenderFailed(Exception):
    """A written-down step could not be made on the pixels as the draw expected (its caller redoes the batch)."""


def render(recording: Recording, px: Pixels) -> Any:
    """Make the pixel operations ``recording`` wrote down on ``px``, in order: the plan's result for it.

    Draws nothing, so it may run in any thread. The result is what :func:`run` would have returned.
    """
    for name, args in recording.ops:
        if name == "tail":
            out = _tensor_from(px, *args)
            if out is None:
                raise RenderFailed("the tensor tail left to stock")
            return out
        if name == "image":
            img = px.image()
            return img if args[0] else img.to_plain()
        out = getattr(px, name)(*args)
        if out is not None:
            px = out
    raise RenderFailed("a recording with no end")


# --- runners: (transform, pixels) -> None, pixels changed in place -------------------------------

_F: Any = None  # torchvision.transforms.functional, set by configure()


def _pil_filter(interpolation: Any) -> int:
    """PIL's filter number for a transform's ``interpolation``, as ``F.resize`` maps it."""
    mode = interpolation
    if not isinstance(mode, _F.InterpolationMode):
        if isinstance(mode, int) and not isinstance(mode, bool):
            try:
                mode = _F._interpolation_modes_from_int(mode)
            except (KeyError, ValueError) as exc:
                raise UseStock from exc
        else:
            raise UseStock
    f = _F.pil_modes_mapping.get(mode)
    if f not in K.ARRAY_RESIZE_FILTERS:
        raise UseStock
    return int(f)


def _size_request(size: Any) -> list[int]:
    if isinstance(size, int) and not isinstance(size, bool):
        return [size]
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in size):
        return list(size)
    raise UseStock


def _resize_to(px: Pixels, size: Any, interpolation: Any, max_size: Any, antialias: Any) -> None:
    """``F.resize`` of the current image, for the arguments it takes without a warning or an error."""
    f = _pil_filter(interpolation)
    if antialias is False:
        raise UseStock  # stock warns that PIL always antialiases
    request = _size_request(size)
    if max_size is not None and (len(request) != 1 or not isinstance(max_size, int) or max_size <= request[0]):
        raise UseStock
    h, w = px.hw
    out = _F._compute_resized_output_size((h, w), request, max_size)
    if [h, w] == out:
        return
    if out[0] <= 0 or out[1] <= 0:
        raise UseStock
    px.resize_to(out[0], out[1], f)


def _run_resize(t: Any, px: Pixels) -> None:
    _resize_to(px, t.size, t.interpolation, t.max_size, t.antialias)


def _run_random_resized_crop(t: Any, px: Pixels) -> None:
    _pil_filter(t.interpolation)  # checked before the draws
    _size_request(t.size)
    if t.antialias is False:
        raise UseStock
    i, j, h, w = t.get_params(px.proxy(), t.scale, t.ratio)
    px.crop(i, j, h, w)
    _resize_to(px, t.size, t.interpolation, None, t.antialias)


def _run_timm_random_resized_crop(t: Any, px: Pixels) -> None:
    """timm's RandomResizedCropAndInterpolation: its own draws (Python's ``random``), then F.resized_crop."""
    modes = t.interpolation if isinstance(t.interpolation, (tuple, list)) else (t.interpolation,)
    for mode in modes:
        _pil_filter(mode)  # checked before the draws
    _size_request(t.size)
    i, j, h, w = t.get_params(px.proxy(), t.scale, t.ratio)
    mode = random.choice(t.interpolation) if isinstance(t.interpolation, (tuple, list)) else t.interpolation
    px.crop(i, j, h, w)
    _resize_to(px, t.size, mode, None, True)


def _run_center_crop(t: Any, px: Pixels) -> None:
    size = t.size
    if isinstance(size, numbers.Number):
        size = (int(size), int(size))
    elif isinstance(size, (tuple, list)) and len(size) == 1:
        size = (size[0], size[0])
    if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise UseStock
    crop_h, crop_w = size
    h, w = px.hw
    if crop_w > w or crop_h > h:
        raise UseStock  # stock pads first
    px.crop(int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0)), crop_h, crop_w)


def _run_random_crop(t: Any, px: Pixels) -> None:
    size = t.size
    if t.padding is not None or not (isinstance(size, (tuple, list)) and len(size) == 2
                                     and all(type(v) is int for v in size)):
        raise UseStock
    h, w = px.hw
    if t.pad_if_needed and (w < size[1] or h < size[0]):
        raise UseStock
    i, j, ch, cw = t.get_params(px.proxy(), t.size)
    px.crop(i, j, ch, cw)


def _run_hflip(t: Any, px: Pixels) -> None:
    if _torch.rand(1) < t.p:
        px.hflip()


def _run_vflip(t: Any, px: Pixels) -> None:
    if _torch.rand(1) < t.p:
        px.vflip()


def _hue(a: np.ndarray, factor: float) -> np.ndarray:
    if a.ndim == 2:  # stock checks the range, then returns a grey image unchanged
        if not (-0.5 <= factor <= 0.5):
            raise ValueError(f"hue_factor ({factor}) is not in [-0.5, 0.5].")
        return a
    return K.adjust_hue(a, factor)


#: ColorJitter's operations by its fn_idx: (array kernel, stock functional name, result keeps info).
_JITTER = ((K.adjust_brightness, "adjust_brightness", False), (K.adjust_contrast, "adjust_contrast", False),
           (K.adjust_saturation, "adjust_saturation", True), (_hue, "adjust_hue", False))
#: pillow-simd's grey depends on a pixel's place in its row (its SIMD loop leaves the last width % 4
#: pixels to Pillow's formula), so under it a flip must not wait through the grey-based operations.
_GREY_BY_POSITION = False


def _colour(px: Pixels, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
    kernel, name, keeps_info = op
    grey_based = name in ("adjust_contrast", "adjust_saturation")
    try:
        out = kernel(px.array() if grey_based and _GREY_BY_POSITION else px.unflipped(), factor)
    except (TypeError, ValueError):
        # an argument the kernel leaves to stock: stock's function, on stock's image
        result = getattr(_F, name)(px.image(), factor)
        if not (isinstance(result, Image.Image) and result.mode == px.mode):
            raise _Left(result) from None
        return Pixels.of(result)
    if out is not px.base:
        px.owned = True
        if not keeps_info:  # (stock's hue returns a grey image itself, info and all)
            px.info = {}
    px.base = out
    return px


class _Left(Exception):
    """A stock function inside a planned step returned something the plan does not carry on."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _run_color_jitter(t: Any, px: Pixels) -> Pixels:
    fn_idx, b, c, s, h = t.get_params(t.brightness, t.contrast, t.saturation, t.hue)
    for fn_id in fn_idx:
        factor = (b, c, s, h)[int(fn_id)] if 0 <= int(fn_id) < 4 else None
        if factor is not None:
            px = px.colour(_JITTER[int(fn_id)], factor)
    return px


def _grey(px: Pixels, channels: Any) -> None:
    if channels not in (1, 3) or isinstance(channels, bool):
        raise UseStock
    px.grey(channels)


def _run_grayscale(t: Any, px: Pixels) -> None:
    _grey(px, t.num_output_channels)


def _run_random_grayscale(t: Any, px: Pixels) -> None:
    channels = 1 if px.mode == "L" else 3
    if _torch.rand(1) < t.p:
        _grey(px, channels)


# --- the augmentation policies: stock's draws, in stock's order; each op a kernel on the array ---------

#: Methods a policy class must still have (stock's) to be planned, besides forward/__call__/get_params.
_POLICY_METHODS = ("_augmentation_space", "_pil_to_tensor", "_tensor_to_pil", "_sample_dirichlet")
#: Per policy class and arguments of ``_augmentation_space``: [(op name, magnitudes as floats or None,
#: signed)] in stock's order. ``_augmentation_space`` is a pure function of its arguments (linspaces),
#: so its floats are computed once, with stock's own code, instead of per image.
_spaces: dict[tuple[Any, ...], list[tuple[str, list[float] | None, bool]]] = {}


def _space(t: Any, *args: Any) -> list[tuple[str, list[float] | None, bool]]:
    key = (type(t), *args)
    space = _spaces.get(key)
    if space is None:
        space = [(name, m.tolist() if m.ndim > 0 else None, bool(signed))
                 for name, (m, signed) in t._augmentation_space(*args).items()]
        _spaces[key] = space
    return space


def _warp_filter(interpolation: Any) -> int:
    """PIL's filter number for a policy's ``interpolation``, as ``F.affine``/``F.rotate`` map it."""
    mode = interpolation
    if isinstance(mode, int) and not isinstance(mode, bool):
        mode = _F._interpolation_modes_from_int(mode)
    elif not isinstance(mode, _F.InterpolationMode):
        raise UseStock
    return int(_F.pil_modes_mapping[mode])


def _policy_op(px: Pixels, name: str, magnitude: float, interpolation: Any, fill: Any) -> Pixels:
    """torchvision's ``autoaugment._apply_op`` on PIL input, with the kernels; stock's own ``_apply_op`` on
    the image for anything the kernels leave to stock."""
    try:
        return _policy_kernel(px, name, magnitude, interpolation, fill)
    except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: stock's op decides
        pass
    from torchvision.transforms import autoaugment

    result = autoaugment._apply_op(px.image(), name, magnitude, interpolation=interpolation, fill=fill)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise _Left(result)


def _affine_matrix(px: Pixels, angle: float, translate: list[Any], shear: list[float],
                   center: list[float] | None, v2: bool) -> list[float]:
    """The inverse matrix ``F.affine`` computes for PIL input: v1's function, or v2's (its own copy, with
    the centre made floats as its argument parsing does)."""
    h, w = px.hw
    if center is None:
        center = [w * 0.5, h * 0.5]
    if v2:
        return _v2_geometry()._get_inverse_affine_matrix([float(c) for c in center], angle, translate, 1.0, shear)
    return _F._get_inverse_affine_matrix(center, angle, translate, 1.0, shear)


def _v2_geometry() -> Any:
    from torchvision.transforms.v2.functional import _geometry

    return _geometry


def _policy_kernel(px: Pixels, name: str, magnitude: float, interpolation: Any, fill: Any,
                   v2: bool = False) -> Pixels:
    """One op of a policy on PIL input, as torchvision's v1 ``_apply_op`` (or v2's
    ``_apply_image_or_video_transform``) computes it, with the kernels; raises before changing ``px``
    for anything it does not reproduce."""
    if name in _GEOMETRY:
        if v2:
            f = int(_F.pil_modes_mapping[_v2_geometry()._check_interpolation(interpolation)])
        else:
            f = _warp_filter(interpolation)
        if name == "Rotate":
            return px.whole(K.rotate, magnitude, f, False, None, fill)
        else:
            if name == "ShearX":
                matrix = _affine_matrix(px, 0.0, [0, 0], [math.degrees(math.atan(magnitude)), 0.0], [0, 0], v2)
            elif name == "ShearY":
                matrix = _affine_matrix(px, 0.0, [0, 0], [0.0, math.degrees(math.atan(magnitude))], [0, 0], v2)
            elif name == "TranslateX":
                matrix = _affine_matrix(px, 0.0, [int(magnitude), 0], [0.0, 0.0], None, v2)
            else:
                matrix = _affine_matrix(px, 0.0, [0, int(magnitude)], [0.0, 0.0], None, v2)
            return px.whole(K.affine, matrix, f, fill)
    if name in _POLICY_COLOUR:
        if 1.0 + magnitude < 0:
            raise UseStock  # stock's own code decides
        return px.colour(_POLICY_COLOUR[name], 1.0 + magnitude)
    if name == "Sharpness":  # not per pixel: a pending flip is applied first
        return px.whole(K.adjust_sharpness, 1.0 + magnitude)
    if name == "Identity":
        return px
    kernel = _POLICY_POINT[name]
    if name == "Posterize":
        return px.point(kernel, int(magnitude))
    if name == "Solarize":
        return px.point(kernel, 255.0 * magnitude if v2 else magnitude)  # v2 scales by the dtype's bound
    return px.point(kernel)


_GEOMETRY = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})
_POLICY_COLOUR = {"Brightness": _JITTER[0], "Contrast": _JITTER[1], "Color": _JITTER[2]}
_POLICY_POINT: dict[str, Callable[..., np.ndarray]] = {
    "Posterize": K.posterize, "Solarize": K.solarize, "AutoContrast": K.autocontrast, "Equalize": K.equalize,
    "Invert": K.invert}


def _run_auto_augment(t: Any, px: Pixels) -> Pixels:
    transform_id, probs, signs = t.get_params(len(t.policies))
    space = dict((n, (m, s)) for n, m, s in _space(t, 10, px.hw))
    for i, (name, p, magnitude_id) in enumerate(t.policies[transform_id]):
        if probs[i] <= p:
            magnitudes, signed = space[name]
            magnitude = float(magnitudes[magnitude_id]) if magnitude_id is not None else 0.0
            if signed and signs[i] == 0:
                magnitude *= -1.0
            px = _policy_op(px, name, magnitude, t.interpolation, t.fill)
    return px


def _run_rand_augment(t: Any, px: Pixels) -> Pixels:
    space = _space(t, t.num_magnitude_bins, px.hw)
    for _ in range(t.num_ops):
        name, magnitudes, signed = space[int(_torch.randint(len(space), (1,)).item())]
        magnitude = float(magnitudes[t.magnitude]) if magnitudes is not None else 0.0
        if signed and _torch.randint(2, (1,)):
            magnitude *= -1.0
        px = _policy_op(px, name, magnitude, t.interpolation, t.fill)
    return px


def _run_augmix(t: Any, px: Pixels) -> Pixels:
    """AugMix mixes on tensors with torch's arithmetic: ``vision/augmix.py`` runs it as stock does, with its
    sampling grids and per-value ops computed once."""
    from . import augmix

    if isinstance(px, Recording):  # its draws come between tensor operations on the pixels
        raise NotSplittable("AugMix draws while it computes on the pixels", every_time=True)
    h, w = px.hw
    return Pixels.of(augmix.run(t, px.image(), _space(t, t._PARAMETER_MAX, (h, w))))


def _run_trivial_augment_wide(t: Any, px: Pixels) -> Pixels:
    space = _space(t, t.num_magnitude_bins)
    name, magnitudes, signed = space[int(_torch.randint(len(space), (1,)).item())]
    magnitude = (float(magnitudes[_torch.randint(len(magnitudes), (1,), dtype=_torch.long)])
                 if magnitudes is not None else 0.0)
    if signed and _torch.randint(2, (1,)):
        magnitude *= -1.0
    return _policy_op(px, name, magnitude, t.interpolation, t.fill)


# --- the v2 policies (transforms.v2, PIL input) ------------------------------------------------------

#: v2 policy class -> (runner, the stock methods and attributes it relies on, resolved through the MRO).
_V2_POLICIES: dict[type, tuple[Callable[[Any, Pixels], Pixels], dict[str, Any]]] = {}
_V2_METHODS = ("forward", "_apply_image_or_video_transform", "_get_random_item",
               "_flatten_and_extract_image_or_video", "_unflatten_and_insert_image_or_video")
_v2_spaces: dict[tuple[Any, ...], list[tuple[str, list[float] | None, bool]]] = {}


def configure_v2(v2: Any) -> None:
    """Record transforms.v2's policy classes and their stock methods (the v2 patch calls this)."""
    _V2_POLICIES.clear()
    for name, runner in (("AutoAugment", _run_v2_auto_augment), ("RandAugment", _run_v2_rand_augment),
                         ("TrivialAugmentWide", _run_v2_trivial_augment_wide)):
        cls = getattr(v2, name, None)
        if isinstance(cls, type):
            _V2_POLICIES[cls] = (runner, {m: getattr(cls, m, None) for m in (*_V2_METHODS, "_AUGMENTATION_SPACE")})


def run_v2_policy(t: Any, img: Image.Image) -> Any:
    """A v2 policy on a lone PIL image (a ``FastImage``) by its plan: stock's draws in stock's order, each
    op a kernel on the array. None when ``t`` is not exactly a stock v2 policy (run it as it is)."""
    entry = _V2_POLICIES.get(type(t))
    if entry is None or _torch is None or "_AUGMENTATION_SPACE" in vars(t):
        return None
    runner, stock = entry
    if any(getattr(type(t), m, None) is not f for m, f in stock.items()):
        return None
    x = runner(t, Pixels.of(img))
    if report.stats is not None:
        report.stats.count("vision_transforms", True, f"v2.{type(t).__name__}")
    return x.image()


def _v2_space(t: Any, bins: int, h: int, w: int) -> list[tuple[str, list[float] | None, bool]]:
    key = (type(t), bins, h, w)
    space = _v2_spaces.get(key)
    if space is None:
        space = []
        for name, (fn, signed) in t._AUGMENTATION_SPACE.items():
            m = fn(bins, h, w)
            space.append((name, None if m is None else [float(v) for v in m.tolist()], bool(signed)))
        _v2_spaces[key] = space
    return space


def _v2_op(t: Any, px: Pixels, name: str, magnitude: float) -> Pixels:
    from PIL.Image import Image as PILImage
    from torchvision.transforms.v2._utils import _get_fill

    fill = _get_fill(t._fill, PILImage)  # as for a plain PIL image, which is what stock was given
    try:
        return _policy_kernel(px, name, magnitude, t.interpolation, fill, v2=True)
    except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: stock's op decides
        pass
    result = t._apply_image_or_video_transform(px.image(), name, magnitude, interpolation=t.interpolation,
                                               fill=t._fill)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise _Left(result)


def _v2_magnitude(magnitudes: list[float] | None, index: Any, signed: bool) -> float:
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[index() if callable(index) else index])
    if signed and _torch.rand(()) <= 0.5:
        magnitude *= -1
    return magnitude


def _run_v2_auto_augment(t: Any, px: Pixels) -> Pixels:
    h, w = px.hw
    policy = t._policies[int(_torch.randint(len(t._policies), ()))]
    space = {n: (m, s) for n, m, s in _v2_space(t, 10, h, w)}
    for name, probability, magnitude_idx in policy:
        if not _torch.rand(()) <= probability:
            continue
        magnitudes, signed = space[name]
        px = _v2_op(t, px, name, _v2_magnitude(magnitudes, magnitude_idx, signed))
    return px


def _run_v2_rand_augment(t: Any, px: Pixels) -> Pixels:
    h, w = px.hw
    space = _v2_space(t, t.num_magnitude_bins, h, w)
    for _ in range(t.num_ops):
        name, magnitudes, signed = space[int(_torch.randint(len(space), ()))]
        px = _v2_op(t, px, name, _v2_magnitude(magnitudes, t.magnitude, signed))
    return px


def _run_v2_trivial_augment_wide(t: Any, px: Pixels) -> Pixels:
    h, w = px.hw
    space = _v2_space(t, t.num_magnitude_bins, h, w)
    name, magnitudes, signed = space[int(_torch.randint(len(space), ()))]
    index = lambda: int(_torch.randint(t.num_magnitude_bins, ()))  # noqa: E731 - drawn only with magnitudes
    return _v2_op(t, px, name, _v2_magnitude(magnitudes, index, signed))


# --- timm's AutoAugment and RandAugment: timm's own draws (NumPy's and Python's random), in timm's order ---

#: timm.data.auto_augment, once a plan has met one of its policies; its AugmentOp.__call__ as first seen.
_timm_aa: Any = None
_timm_op_call: Any = None


def _timm_point(kernel: Callable[..., np.ndarray]) -> Callable[..., Pixels]:
    def run(px: Pixels, *args: Any, **_: Any) -> Pixels:
        return px.point(kernel, *args)
    return run


def _timm_colour(op: tuple[Callable[..., np.ndarray], str, bool]) -> Callable[..., Pixels]:
    def run(px: Pixels, factor: Any, **_: Any) -> Pixels:
        if not (isinstance(factor, (int, float)) and factor >= 0):
            raise UseStock  # ImageEnhance takes what torchvision's checks refuse: timm's own function decides
        return px.colour(op, float(factor))
    return run


def _timm_sharpness(px: Pixels, factor: Any, **_: Any) -> Pixels:
    if not (isinstance(factor, (int, float)) and factor >= 0):
        raise UseStock
    return px.whole(K.adjust_sharpness, float(factor))  # not per pixel: flip first


def _timm_solarize_add(px: Pixels, add: Any, thresh: Any = 128, **_: Any) -> Pixels:
    table = np.array([min(255, i + add) if i < thresh else i for i in range(256)])
    if table.dtype.kind not in "iu" or table.min() < 0 or table.max() > 255:
        raise UseStock  # PIL's point decides what it makes of such a table
    return px.point(K._lut, table)


def _timm_posterize(px: Pixels, bits: Any, **_: Any) -> Pixels:
    if isinstance(bits, (int, float)) and bits >= 8:
        return px  # timm returns the image as it is
    return _timm_point(K.posterize)(px, bits)


def _timm_kernels(aa: Any) -> dict[Any, Callable[..., Pixels]]:
    """timm's ImageOps and ImageEnhance ops as kernels on the array; its warps (``img.transform``,
    ``img.rotate``) reach the native warp through the patch's image, so they run timm's own function."""
    return {aa.auto_contrast: _timm_point(K.autocontrast), aa.equalize: _timm_point(K.equalize),
            aa.invert: _timm_point(K.invert), aa.solarize: _timm_point(K.solarize),
            aa.solarize_add: _timm_solarize_add, aa.posterize: _timm_posterize,
            aa.brightness: _timm_colour(_JITTER[0]), aa.contrast: _timm_colour(_JITTER[1]),
            aa.color: _timm_colour(_JITTER[2]), aa.sharpness: _timm_sharpness}


def _timm_check(t: Any, ops: Any) -> dict[Any, Callable[..., Pixels]]:
    """Before any draw: timm's module as the plan knows it, and every op a stock ``AugmentOp``."""
    global _timm_aa, _timm_op_call
    import sys

    aa = sys.modules.get(type(t).__module__)
    if aa is None or not str(getattr(sys.modules.get("timm"), "__version__", "")).startswith("1."):
        raise UseStock  # AugmentOp's draws are reproduced as timm 1.x makes them
    if _timm_aa is not aa:
        _timm_aa, _timm_op_call = aa, vars(aa.AugmentOp).get("__call__")
        _timm_aa_kernels.clear()
        _timm_aa_kernels.update(_timm_kernels(aa))
    for op in ops:
        if type(op) is not aa.AugmentOp or vars(aa.AugmentOp).get("__call__") is not _timm_op_call:
            raise UseStock
    return _timm_aa_kernels


_timm_aa_kernels: dict[Any, Callable[..., Pixels]] = {}


def _timm_op(op: Any, px: Pixels, kernels: dict[Any, Callable[..., Pixels]]) -> Pixels:
    """timm's ``AugmentOp.__call__``: its draws (the probability, the magnitude's noise, the level's sign,
    the filter), then the op as a kernel, or timm's own function on the patch's image."""
    if op.prob < 1.0 and random.random() > op.prob:
        return px
    magnitude = op.magnitude
    if op.magnitude_std > 0:
        if op.magnitude_std == float("inf"):
            magnitude = random.uniform(0, magnitude)
        elif op.magnitude_std > 0:
            magnitude = random.gauss(magnitude, op.magnitude_std)
    upper_bound = op.magnitude_max or _timm_aa._LEVEL_DENOM
    magnitude = max(0., min(magnitude, upper_bound))
    level_args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else tuple()
    kernel = kernels.get(op.aug_fn)
    if kernel is not None:
        try:
            return kernel(px, *level_args, **op.kwargs)
        except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: timm's op decides
            pass
    result = op.aug_fn(px.image(), *level_args, **op.kwargs)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise _Left(result)


def _run_timm_rand_augment(t: Any, px: Pixels) -> Pixels:
    kernels = _timm_check(t, t.ops)
    ops = np.random.choice(t.ops, t.num_layers, replace=t.choice_weights is None, p=t.choice_weights)
    for op in ops:
        px = _timm_op(op, px, kernels)
    return px


def _run_timm_auto_augment(t: Any, px: Pixels) -> Pixels:
    kernels = _timm_check(t, [op for sub_policy in t.policy for op in sub_policy])
    for op in random.choice(t.policy):
        px = _timm_op(op, px, kernels)
    return px


_torch: Any = None
_RUNNERS: dict[str, Callable[[Any, Pixels], Any]] = {
    "Resize": _run_resize,
    "RandomResizedCrop": _run_random_resized_crop,
    "CenterCrop": _run_center_crop,
    "RandomCrop": _run_random_crop,
    "RandomHorizontalFlip": _run_hflip,
    "RandomVerticalFlip": _run_vflip,
    "ColorJitter": _run_color_jitter,
    "Grayscale": _run_grayscale,
    "RandomGrayscale": _run_random_grayscale,
    "RandomResizedCropAndInterpolation": _run_timm_random_resized_crop,
    "AutoAugment": _run_auto_augment,
    "RandAugment": _run_rand_augment,
    "TrivialAugmentWide": _run_trivial_augment_wide,
    "AugMix": _run_augmix,
    "timm.RandAugment": _run_timm_rand_augment,
    "timm.AutoAugment": _run_timm_auto_augment,
}
#: Classes of other libraries the plan knows, recorded the first time a plan meets them:
#: (module, name). timm's transforms call torchvision's functional kernels with its own draws.
_OTHERS = {("timm.data.transforms", "RandomResizedCropAndInterpolation"), ("timm.data.transforms", "MaybeToTensor"),
           ("timm.data.transforms", "MaybePILToTensor"), ("timm.data.auto_augment", "RandAugment"),
           ("timm.data.auto_augment", "AutoAugment")}
#: The methods a known class must still have (stock's), or its instances run stock code.
_STOCK_METHODS: dict[type, dict[str, Any]] = {}
_CLASSES: dict[str, type] = {}


def configure(transforms: Any) -> None:
    """Record torchvision's classes and their stock methods (called by the patch when it applies)."""
    global _F, _torch, _GREY_BY_POSITION
    import torch
    from torchvision.transforms import functional

    from .. import sysinfo

    _F, _torch = functional, torch
    _GREY_BY_POSITION = sysinfo.pillow_is_simd()
    _STOCK_METHODS.clear()
    _CLASSES.clear()
    others = {name for module, name in _OTHERS if module != "timm.data.auto_augment"} | {
        "timm.RandAugment", "timm.AutoAugment"}
    for name in (*(n for n in _RUNNERS if n not in others), "ToTensor", "PILToTensor", "ConvertImageDtype",
                 "Normalize"):
        cls = getattr(transforms, name)
        _CLASSES[name] = cls
        _STOCK_METHODS[cls] = {m: vars(cls)[m] for m in ("forward", "__call__", "get_params", *_POLICY_METHODS)
                               if m in vars(cls)}
    _plans.clear()


def _class_key(cls: type) -> str:
    """The name the plan knows a class by: timm's policies share torchvision's class names."""
    return f"timm.{cls.__name__}" if cls.__module__ == "timm.data.auto_augment" else cls.__name__


def _record_other(cls: type) -> None:
    if (cls.__module__, cls.__name__) in _OTHERS and _class_key(cls) not in _CLASSES:
        _CLASSES[_class_key(cls)] = cls
        _STOCK_METHODS[cls] = {m: vars(cls)[m] for m in ("forward", "__call__", "get_params") if m in vars(cls)}


def _is_stock(t: Any, name: str) -> bool:
    cls = _CLASSES.get(name)
    if cls is None or type(t) is not cls:
        return False
    return all(vars(cls).get(m) is f for m, f in _STOCK_METHODS[cls].items())


# --- the tensor tail ---------------------------------------------------------------------------


class Tail:
    """``ToTensor [+ Normalize]`` or ``PILToTensor [+ ConvertImageDtype(float) [+ Normalize]]`` at one position."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self.tables: dict[tuple[Any, ...], np.ndarray | None] = {}

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def to_tensor(self) -> bool:
        return _is_stock(self.steps[0], "ToTensor") or _is_stock(self.steps[0], "MaybeToTensor")

    def _key(self, channels: int) -> tuple[Any, ...] | None:
        key: list[Any] = [channels, _torch.get_default_dtype() if self.to_tensor else None]
        for t in self.steps[1:]:
            if _is_stock(t, "ConvertImageDtype"):
                key.append(t.dtype)
            else:  # Normalize: the constants as plain numbers, or no table
                try:
                    key.append((tuple(float(m) for m in t.mean), tuple(float(s) for s in t.std), t.inplace))
                except (TypeError, ValueError):
                    return None
        return tuple(key)

    def table(self, channels: int) -> np.ndarray | None:
        """The C x 256 float table of this tail for ``channels`` input channels, or None (run stock)."""
        key = self._key(channels)
        if key is None:
            return None
        if key not in self.tables:
            self.tables[key] = self._probe(channels)
        return self.tables[key]

    def _probe(self, channels: int) -> np.ndarray | None:
        torch = _torch
        x = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(channels, 1, 256).contiguous()
        if self.to_tensor:
            x = x.to(dtype=torch.get_default_dtype()).div(255)  # ToTensor's own arithmetic on a uint8 image
        try:
            for t in self.steps[1:]:
                x = t(x)  # stock ConvertImageDtype / Normalize: their arithmetic, their errors
        except Exception:  # noqa: BLE001 - stock raises again, per image, in its own words
            return None
        if type(x) is not torch.Tensor or x.dtype not in (torch.float32, torch.float64) or x.dim() != 3:
            return None
        return x[:, 0, :].contiguous().numpy()


def _find_tail(items: list[Any], i: int) -> Tail | None:
    if _is_stock(items[i], "ToTensor") or _is_stock(items[i], "MaybeToTensor"):
        n = 2 if i + 1 < len(items) and _is_stock(items[i + 1], "Normalize") else 1
        return Tail(items[i:i + n])
    if _is_stock(items[i], "PILToTensor") or _is_stock(items[i], "MaybePILToTensor"):
        n = 1
        if i + 1 < len(items) and _is_stock(items[i + 1], "ConvertImageDtype"):
            n = 2
            if i + 2 < len(items) and _is_stock(items[i + 2], "Normalize"):
                n = 3
        return Tail(items[i:i + n])
    return None


# --- plans ----------------------------------------------------------------------------------


class Plan:
    """Per transform of a ``Compose``: its runner, a :class:`Tail` starting there, or None (stock)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        #: why a batch of this plan cannot draw apart from its pixels (set by ``vision/batch.py``), or None
        self.unsplittable: str | None = None
        #: some samples' draws need their pixels (``vision/batch.py`` then loads those one by one)
        self.sometimes_unsplittable: str | None = None
        self.runners: list[Callable[[Any, Pixels], Any] | None] = []
        self.tails: dict[int, Tail] = {}
        for i, t in enumerate(items):
            _record_other(type(t))
            name = _class_key(type(t))
            self.runners.append(_RUNNERS[name] if name in _RUNNERS and _is_stock(t, name) else None)
            if i not in self.tails and not any(i in range(j, j + len(tail)) for j, tail in self.tails.items()):
                tail = _find_tail(items, i)
                if tail is not None:
                    self.tails[i] = tail

    @property
    def crop_first(self) -> bool:
        """The first transform is a crop drawn from the image size alone: a JPEG need only decode its window."""
        return bool(self.runners) and 0 not in self.tails and self.runners[0] in _CROPS

    def matches(self, items: list[Any]) -> bool:
        return len(items) == len(self.items) and all(a is b for a, b in zip(items, self.items))

    def describe(self) -> list[str]:
        """What runs where, one entry per transform (for tests and the docs)."""
        out = []
        for i, t in enumerate(self.items):
            covering = [j for j, tail in self.tails.items() if j <= i < j + len(tail)]
            kind = "tail" if covering else ("native" if self.runners[i] else "stock")
            out.append(f"{type(t).__name__}: {kind}")
        return out


_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
#: Runners whose first act is a crop of a window drawn from the size (after checks made before any draw).
_CROPS = (_run_random_resized_crop, _run_timm_random_resized_crop, _run_random_crop, _run_center_crop)


def draws_from_python(compose: Any) -> bool:
    """The plan's first step draws from Python's ``random`` (timm's crops), not only from torch."""
    p = plan_for(compose)
    return bool(p.runners) and p.runners[0] is _run_timm_random_resized_crop


def plan_for(compose: Any) -> Plan:
    """The plan of ``compose``, made on first use and kept while its list of transforms stays the same."""
    items = list(compose.transforms)
    with _plans_lock:  # loaders in several threads: a WeakKeyDictionary is not safe without the GIL
        plan = _plans.get(compose)
        if plan is None or not plan.matches(items):
            plan = Plan(items)
            with contextlib.suppress(TypeError):  # not weak-referenceable: planned on every call
                _plans[compose] = plan
    return plan


def _tensor_from(px: Pixels, tail: Tail, uint8: bool) -> Any:
    """The tail's tensor, in stock's layout, or None where stock must run it."""
    a = px.array()
    if uint8 or len(tail) == 1 and not tail.to_tensor:
        # PILToTensor (or the uint8 stand-in for ToTensor): a C x H x W view of H x W x C pixels
        return K.pil_to_tensor(a, owned=px.owned)
    table = tail.table(1 if a.ndim == 2 else 3)
    if table is None:
        return None
    if tail.to_tensor:
        return K.image_through_tables(a, table)  # ToTensor makes C x H x W contiguous
    return K.pixels_through_tables(a, table)  # after PILToTensor stock keeps the channels-last strides


def run(compose: Any, img: Image.Image | Pixels, *, skip: int = 0, uint8_tail: bool = False) -> Any:
    """Apply ``compose`` (after its first ``skip`` transforms) to the PIL ``RGB``/``L`` image ``img``.

    ``uint8_tail``: the Compose ends in ``ToTensor [+ Normalize]`` and a DataLoader worker wants a
    uint8 C x H x W tensor in its place. A ``FastImage`` in gives a ``FastImage`` out; a plain PIL
    image gives a plain PIL image; a tail gives stock's tensor. ``img`` may also be :class:`Pixels`
    (a :class:`JpegPixels` not decoded yet): an image result is then a ``FastImage``.
    """
    plan = plan_for(compose)
    items = plan.items
    stats = report.stats
    recording = isinstance(img, Recording)
    fast_in = isinstance(img, (FastImage, Pixels))
    x: Any = img if isinstance(img, Pixels) else Pixels.of(img)
    i = skip
    n = len(items)
    while i < n:
        t = items[i]
        if not isinstance(x, Pixels):
            x = t(x)
            i += 1
            continue
        tail = plan.tails.get(i)
        if tail is not None and (not uint8_tail or i + len(tail) == n):
            if recording:
                return _record_tail(x, tail, uint8_tail, i + len(tail) == n)
            out = _tensor_from(x, tail, uint8_tail)
            if out is not None:
                if stats is not None:
                    stats.count("vision_transforms", True, " + ".join(type(s).__name__ for s in tail.steps))
                x = out
                i += len(tail)
                continue
        runner = plan.runners[i]
        if runner is not None:
            try:
                out = runner(t, x)
            except UseStock:
                pass
            except _Left as left:
                x = left.value
                i += 1
                continue
            else:
                if isinstance(out, Pixels):
                    x = out
                if stats is not None:
                    stats.count("vision_transforms", True, type(t).__name__)
                i += 1
                continue
        # a stock step: it gets the image as stock would give it, and the plan resumes after it
        if recording:
            raise NotSplittable(f"`{type(t).__name__}` at position {i} of the Compose runs stock code", True)
        if stats is not None:
            stats.count("vision_transforms", False,
                        f"`{type(t).__name__}` at position {i} of the Compose: stock code (not in the plan)")
        result = t(x.image())
        x = Pixels.of(result) if isinstance(result, Image.Image) and result.mode in ("RGB", "L") else result
        i += 1
    if recording:
        x.ops.append(("image", (fast_in,)))
        return x
    if isinstance(x, Pixels):
        out_img = x.image()
        return out_img if fast_in else out_img.to_plain()
    return x


def _record_tail(x: Recording, tail: Tail, uint8: bool, last: bool) -> Recording:
    """Write down the tensor tail, where the render can make it as :func:`_tensor_from` would."""
    if not last:
        raise NotSplittable("steps after the tensor tail run stock code on the tensor", True)
    if not (uint8 or len(tail) == 1 and not tail.to_tensor) and tail.table(1 if x.mode == "L" else 3) is None:
        raise NotSplittable("the tensor tail runs stock code", True)
    if report.stats is not None:
        report.stats.count("vision_transforms", True, " + ".join(type(s).__name__ for s in tail.steps))
    x.ops.append(("tail", (tail, uint8)))
    return x
