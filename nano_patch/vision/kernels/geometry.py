"""Geometry on arrays: flips, crops, pads, resizes and warps (affine, perspective, rotate), as PIL makes them.

Each function mirrors the torchvision PIL backend function of the same name (``_functional_pil``) or the PIL
method it calls: same arguments, same meaning, and the same pixels as PIL gives. Resize and the warps run the native
kernels (``native_kernels``: PIL's arithmetic in C, checked against the installed PIL), else PIL's own code; crops,
flips and pads are exact. Arrays may be views (a crop inside the image is free); every function accepts
non-contiguous input. A function raises on any argument it does not handle (the patch then runs stock code).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from . import native, native_kernels
from .native_checks import rotate_data
from .opencv import contiguous, cv2
from .pil_arrays import get_image_num_channels, integer, ran_pil_code, to_pil, via_pil
from .pil_filters import FILTERS, WARP_FILTERS


def hflip(a: np.ndarray) -> np.ndarray:
    # A real copy: negative-stride views cost far more later (torch cannot wrap them).
    return cv2().flip(contiguous(a), 1)


def vflip(a: np.ndarray) -> np.ndarray:
    return cv2().flip(contiguous(a), 0)


def crop_checked(hw: tuple[int, int], top: int, left: int, height: int, width: int) -> bool:
    """Whether PIL's ``Image.crop`` of this box (``top``, ``left``, ``height``, ``width``, none negative) from an
    image of ``hw`` makes its decompression-bomb check act: warn, or raise.

    PIL checks every crop box's area against ``Image.MAX_IMAGE_PIXELS`` (read now, so that a limit the user
    changes acts at once; None: no check), except a box that is the whole image, which it copies unchecked.
    True also where the limit is not a plain int: PIL's own check then decides. Below the limit this is one
    multiply and compare, so every planned crop can afford it.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None:
        return False
    if type(limit) is int and height > 0 and width > 0 and height * width <= limit:
        return False
    return not (top == 0 and left == 0 and height == hw[0] and width == hw[1])


def check_crop_box(hw: tuple[int, int], top: int, left: int, height: int, width: int) -> None:
    """PIL's own check of a crop box, as ``Image.crop`` makes it (its warning, from its line, or its error);
    nothing where it cannot act. For the thread that draws, at the point where stock crops."""
    if crop_checked(hw, top, left, height, width):
        Image._decompression_bomb_check((abs(width), abs(height)))


def crop(a: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """torchvision's PIL ``crop`` (the patched backend's kernel): :func:`crop_pixels`, where PIL's crop would
    neither check the box's size (:func:`crop_checked`) nor refuse it (a negative side). Else it raises, and the
    backend runs stock's crop, which makes PIL's check itself: its warning or error, from PIL, where stock's is."""
    whole = numbers.Integral
    if not (isinstance(top, whole) and isinstance(left, whole) and isinstance(height, whole)
            and isinstance(width, whole)):
        raise TypeError("a crop box of other numbers: PIL rounds them, its own crop decides")
    if height < 0 or width < 0 or crop_checked(a.shape[:2], top, left, height, width):
        raise ValueError("a crop box PIL checks or refuses: PIL's own crop decides")
    return crop_pixels(a, top, left, height, width)


def crop_pixels(a: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """PIL's crop: a view when the box is inside the image, zero fill outside it. No size check: a plan's
    renders call this on any thread, its draw having made the check (``pixels.Pixels.check_crop``)."""
    h, w = a.shape[:2]
    top, left, height, width = int(top), int(left), int(height), int(width)
    if top >= 0 and left >= 0 and top + height <= h and left + width <= w:
        return a[top : top + height, left : left + width]
    out = np.zeros((max(height, 0), max(width, 0)) + a.shape[2:], dtype=a.dtype)
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + height, h), min(left + width, w)
    if y1 > y0 and x1 > x0:
        out[y0 - top : y1 - top, x0 - left : x1 - left] = a[y0:y1, x0:x1]
    return out


def _fill_tuple(fill: Any, channels: int) -> tuple[int, ...]:
    """torchvision's ``_parse_fill`` for uint8 images."""
    if fill is None:
        fill = 0
    if isinstance(fill, (int, float)):
        fill = [fill] * channels
    return _fill_per_channel(list(fill), channels)


def _fill_per_channel(fill: list[Any] | tuple[Any, ...], channels: int) -> tuple[int, ...]:
    """``_parse_fill``'s rule for a sequence: one value for every channel, or one per channel (else its error)."""
    if len(fill) == 1:
        fill = fill * channels
    elif len(fill) != channels:
        raise ValueError(
            "The number of elements in 'fill' does not match the number of channels of the image "
            f"({len(fill)} != {channels})"
        )
    return tuple(int(x) for x in fill)


def pad(a: np.ndarray, padding: Any, fill: Any = 0, padding_mode: str = "constant") -> np.ndarray:
    if padding_mode == "constant":
        if isinstance(padding, (list, tuple)) and len(padding) == 1:
            padding = padding[0]
        f = _fill_tuple(fill, get_image_num_channels(a))
        return via_pil(a, ImageOps.expand, border=tuple(padding) if isinstance(padding, list) else padding,
                       fill=f[0] if a.ndim == 2 else f)
    if isinstance(padding, (list, tuple)):
        padding = tuple(padding)
        if len(padding) == 1:
            padding = padding[0]
    if isinstance(padding, int):
        p = [padding] * 4
    elif len(padding) == 2:
        p = [padding[0], padding[1], padding[0], padding[1]]
    else:
        p = list(padding)
    left, top, right, bottom = p
    h, w = a.shape[:2]
    if min(p) < 0:
        # stock crops the negative sides off through PIL's crop, which checks the box (or refuses an inverted
        # one): stock's pad then decides
        cut_h, cut_w = h - max(-top, 0) - max(-bottom, 0), w - max(-left, 0) - max(-right, 0)
        if cut_h < 0 or cut_w < 0 or crop_checked((h, w), max(-top, 0), max(-left, 0), cut_h, cut_w):
            raise ValueError("a pad that crops a box PIL checks or refuses: stock's pad decides")
    a = a[max(-top, 0) : h - max(-bottom, 0), max(-left, 0) : w - max(-right, 0)]
    left, top, right, bottom = (max(v, 0) for v in p)
    widths = ((top, bottom), (left, right)) + (((0, 0),) if a.ndim == 3 else ())
    return np.pad(a, widths, padding_mode)


#: PIL filters :func:`resize` reproduces on arrays: nearest, and the convolutions of the native resample.
ARRAY_RESIZE_FILTERS = frozenset({0, *FILTERS})


def resize(a: np.ndarray, size: list[int], interpolation: int = Image.BILINEAR, flip: bool = False,
           window: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Resize to ``size`` = [height, width] exactly like ``PIL.Image.resize`` (always antialiased).

    ``flip``: mirror the result left to right as well (``hflip`` after the resize, at no cost).
    ``window``: (top, left, height, width) inside the result: the crop of it to return (only that part
    of the resize is computed).
    Nearest neighbour: OpenCV's exact nearest, which picks PIL's pixels. The convolution filters:
    the native resample (PIL's weights and fixed-point rounding, checked against the installed
    PIL), else PIL's own resize; bit-exact on whichever PIL is installed either way.
    """
    if not (isinstance(size, list) and len(size) == 2) or interpolation not in ARRAY_RESIZE_FILTERS:
        raise TypeError(f"size {size!r} or filter {interpolation!r}: stock code decides")
    oh, ow = integer(size[0]), integer(size[1])
    if oh <= 0 or ow <= 0:
        raise ValueError("empty size: stock code decides")
    if interpolation in FILTERS:
        try:
            return native_kernels.resample(a, (oh, ow), int(interpolation), flip=flip, window=window)
        except native.NativeUnavailable as exc:
            ran_pil_code("resize", exc)
    if interpolation == Image.NEAREST:
        out = cv2().resize(contiguous(a), (ow, oh), interpolation=cv2().INTER_NEAREST_EXACT)
    else:
        out = np.asarray(to_pil(a).resize((ow, oh), interpolation))
    if window is not None:
        out = out[window[0]:window[0] + window[2], window[1]:window[1] + window[3]]
    return hflip(out) if flip else out


def pil_fillcolor(fill: Any, channels: int) -> Any:
    """torchvision's ``_parse_fill`` for a PIL image of ``channels`` bands (not mode F): the
    ``fillcolor`` its PIL backend hands to ``Image.rotate`` and ``Image.transform``."""
    if fill is None:
        fill = 0
    if isinstance(fill, (int, float)) and channels > 1:
        fill = tuple([fill] * channels)
    if isinstance(fill, (list, tuple)):
        return _fill_per_channel(fill, channels)
    return int(fill)


_FILL_BYTES: dict[tuple[str, Any], bytes] = {}


def fill_bytes(mode: str, fillcolor: Any) -> bytes:
    """One pixel of ``Image.new(mode, size, fillcolor)``: PIL's own reading of a fill colour (values
    clipped, an int packed into RGB, colour names), and its errors."""
    plain = fillcolor is None or type(fillcolor) is int or (
        type(fillcolor) is tuple and all(type(v) is int for v in fillcolor))
    key = (mode, fillcolor)
    if plain and key in _FILL_BYTES:
        return _FILL_BYTES[key]
    out = Image.new(mode, (1, 1), fillcolor).tobytes()
    if plain and len(_FILL_BYTES) < 256:
        _FILL_BYTES[key] = out
    return out


def _transform_data(data: Any, n: int) -> list[float]:
    """PIL's reading of the transform data (its first ``n`` numbers as doubles); odd input is left to
    PIL, which raises its own error."""
    if not isinstance(data, (list, tuple)) or len(data) < n:
        raise TypeError("transform data: PIL's own code decides")
    out = []
    for v in data[:n]:
        if isinstance(v, (str, bytes, bool)) or not isinstance(v, numbers.Real):
            raise TypeError(f"transform data {v!r}: PIL's own code decides")
        out.append(float(v))
    return out


def warp(a: np.ndarray, size: Any, data: Any, perspective: bool, resample: Any, fillcolor: Any) -> np.ndarray:
    """``Image.transform(size, AFFINE or PERSPECTIVE, data, resample, fillcolor=fillcolor)`` of ``a`` (an
    ``RGB`` or ``L`` image), bit for bit: the native kernel, else PIL's own code. ``size`` is PIL's
    (width, height). Raises for anything PIL would not take, or that the kernel does not do."""
    if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise ValueError(f"size {size!r}: PIL's own code decides")
    if isinstance(resample, bool) or not isinstance(resample, numbers.Integral) or int(resample) not in WARP_FILTERS:
        raise ValueError(f"filter {resample!r}: PIL's own code decides")
    coeffs = _transform_data(data, 8 if perspective else 6)
    fill = fill_bytes("L" if a.ndim == 2 else "RGB", fillcolor)
    try:
        return native_kernels.warp(a, (size[1], size[0]), coeffs, perspective, int(resample), fill)
    except native.NativeUnavailable as exc:
        ran_pil_code("warp", exc)
    except native_kernels.NotReproducible:
        pass  # only PIL's code gives PIL's answer there
    method = Image.Transform.PERSPECTIVE if perspective else Image.Transform.AFFINE
    return np.asarray(to_pil(a).transform(tuple(size), method, coeffs, int(resample), fillcolor=fillcolor))


def pil_rotate(a: np.ndarray, angle: Any, resample: Any = Image.NEAREST, expand: Any = False, center: Any = None,
               translate: Any = None, fillcolor: Any = None) -> np.ndarray:
    """``Image.rotate`` of the array ``a``: PIL's exact shortcuts for quarter turns (whatever the
    filter, as PIL's), else its matrix and output size through :func:`warp`."""
    angle = angle % 360.0
    h, w = a.shape[:2]
    if not (center or translate):
        if angle == 0:
            return a
        if angle == 180:
            return cv2().flip(contiguous(a), -1)
        if angle in (90, 270) and (expand or w == h):
            turn = cv2().ROTATE_90_COUNTERCLOCKWISE if angle == 90 else cv2().ROTATE_90_CLOCKWISE
            return cv2().rotate(contiguous(a), turn)
    matrix, size = rotate_data(w, h, angle, expand, center, translate)
    return warp(a, size, matrix, False, resample, fillcolor)


def affine(a: np.ndarray, matrix: list[float], interpolation: int = Image.NEAREST, fill: Any = None) -> np.ndarray:
    """torchvision's PIL ``affine``: ``Image.transform(size, AFFINE, matrix, interpolation, fillcolor)``."""
    fillcolor = pil_fillcolor(fill, get_image_num_channels(a))
    return warp(a, (a.shape[1], a.shape[0]), matrix, False, interpolation, fillcolor)


def perspective(a: np.ndarray, perspective_coeffs: list[float], interpolation: int = Image.BICUBIC,
                fill: Any = None) -> np.ndarray:
    """torchvision's PIL ``perspective``: ``Image.transform(size, PERSPECTIVE, coeffs, interpolation, fillcolor)``."""
    fillcolor = pil_fillcolor(fill, get_image_num_channels(a))
    return warp(a, (a.shape[1], a.shape[0]), perspective_coeffs, True, interpolation, fillcolor)


def rotate(a: np.ndarray, angle: float, interpolation: int = Image.NEAREST, expand: bool = False,
           center: Any = None, fill: Any = None) -> np.ndarray:
    """torchvision's PIL ``rotate``: ``Image.rotate(angle, interpolation, expand, center, fillcolor)``."""
    fillcolor = pil_fillcolor(fill, get_image_num_channels(a))
    return pil_rotate(a, angle, interpolation, expand, center, None, fillcolor)
