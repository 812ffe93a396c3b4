"""Pure image kernels on uint8 NumPy arrays (HxWx3 RGB or HxW grayscale).

Each function mirrors the torchvision PIL backend function of the same name
(``torchvision.transforms._functional_pil``): same arguments, same meaning, and the same pixels as
PIL gives. Resize, rotate, affine, perspective, grey, saturation, contrast and hue run the native
kernels (``native``: PIL's arithmetic in C, checked against the installed PIL), or PIL's own code
where a kernel is not available here; other colour and point ops are lookup tables in PIL's
arithmetic; crops, flips and pads are exact. An array stands in for a PIL image of mode ``RGB`` or
``L``. A kernel raises on any argument it does not handle; the patch then runs stock code, which
returns stock's result or raises stock's exception. Nothing here patches anything or keeps global
state beyond the per-process thread cap and a small cache of fill colours.

Arrays may be views (a crop inside the image is free); every kernel accepts non-contiguous input.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from ... import report
from . import native, native_kernels
from .native_checks import pil_hue_shift, rotate_data

_cv2 = None
#: OpenCV's thread count before the first kernel call, restored by :func:`release_cv2`.
_cv2_threads_before: int | None = None


def cv2():
    """OpenCV, imported on first use and kept single-threaded.

    A forked DataLoader worker deadlocks in OpenCV if the parent had already started OpenCV's
    thread pool. Per-image kernels gain little from threads; the parallelism is the workers'.
    """
    global _cv2, _cv2_threads_before
    if _cv2 is None:
        import cv2 as _m

        _cv2_threads_before = _m.getNumThreads()
        _m.setNumThreads(1)
        _cv2 = _m
    return _cv2


def release_cv2() -> None:
    """Give OpenCV back the thread count it had before the kernels used it."""
    global _cv2, _cv2_threads_before
    if _cv2 is not None and _cv2_threads_before is not None:
        _cv2.setNumThreads(_cv2_threads_before)
    _cv2, _cv2_threads_before = None, None


def from_pil(img: Image.Image) -> np.ndarray:
    """The pixels of a PIL ``RGB``/``L`` image (no copy for a ``FastImage``)."""
    a = getattr(img, "array", None)
    return a if a is not None else np.asarray(img)


def to_pil(a: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(a))


def _real(x: Any) -> float:
    """A plain real number, else TypeError: the wrapper then gives the call to stock code."""
    if isinstance(x, (str, bytes)) or not isinstance(x, numbers.Real):
        raise TypeError(f"expected a real number, got {type(x).__name__}")
    return float(x)


def _factor(x: Any) -> float:
    """A finite blend factor of a sane size; anything else is left to PIL's own code."""
    f = _real(x)
    if not math.isfinite(f) or abs(f) > 1e30:
        raise ValueError(f"factor {f!r}: PIL's own code decides")
    return f


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    return int(x)


def _contig(a: np.ndarray) -> np.ndarray:
    if a.flags.c_contiguous:
        return a
    if a.ndim == 3 and a.strides[2] != a.itemsize and all(a[:, :, i].flags.c_contiguous for i in range(a.shape[2])):
        # Planes (torch's CHW output seen as HWC): OpenCV interleaves them about 15x faster than NumPy.
        return cv2().merge([a[:, :, i] for i in range(a.shape[2])])
    return np.ascontiguousarray(a)


def _via_pil(a: np.ndarray, fn, *args: Any, **kwargs: Any) -> np.ndarray:
    """Run a PIL operation on an array: exact stock behaviour for the rarely hot operations."""
    return np.asarray(fn(to_pil(a), *args, **kwargs))


# --- size and geometry -------------------------------------------------------------------


def get_image_num_channels(a: np.ndarray) -> int:
    return 1 if a.ndim == 2 else a.shape[2]


def hflip(a: np.ndarray) -> np.ndarray:
    # A real copy: negative-stride views cost far more later (torch cannot wrap them).
    return cv2().flip(_contig(a), 1)


def vflip(a: np.ndarray) -> np.ndarray:
    return cv2().flip(_contig(a), 0)


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
        return _via_pil(a, ImageOps.expand, border=tuple(padding) if isinstance(padding, list) else padding,
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
ARRAY_RESIZE_FILTERS = frozenset({0, *native_kernels.FILTERS})


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
    oh, ow = _int(size[0]), _int(size[1])
    if oh <= 0 or ow <= 0:
        raise ValueError("empty size: stock code decides")
    if interpolation in native_kernels.FILTERS:
        try:
            return native_kernels.resample(a, (oh, ow), int(interpolation), flip=flip, window=window)
        except native.NativeUnavailable as exc:
            _fell_back("resize", exc)
    if interpolation == Image.NEAREST:
        out = cv2().resize(_contig(a), (ow, oh), interpolation=cv2().INTER_NEAREST_EXACT)
    else:
        out = np.asarray(to_pil(a).resize((ow, oh), interpolation))
    if window is not None:
        out = out[window[0]:window[0] + window[2], window[1]:window[1] + window[3]]
    return hflip(out) if flip else out


def _fell_back(kernel: str, exc: Exception) -> None:
    """Count, for the run report, an operation that ran PIL's code because its native kernel could not."""
    if report.stats is not None:
        report.stats.count("vision_transforms", False, f"{kernel} ran PIL's code: {exc}")


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


#: PIL's filters for its transforms (nearest, bilinear, bicubic), all reproduced by the warp kernel.
WARP_FILTERS = frozenset(native_kernels.WARP_FILTERS)


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
        _fell_back("warp", exc)
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
            return cv2().flip(_contig(a), -1)
        if angle in (90, 270) and (expand or w == h):
            turn = cv2().ROTATE_90_COUNTERCLOCKWISE if angle == 90 else cv2().ROTATE_90_CLOCKWISE
            return cv2().rotate(_contig(a), turn)
    matrix, size = rotate_data(w, h, angle, expand, center, translate)
    return warp(a, size, matrix, False, resample, fillcolor)


#: The kernels that :func:`declines` can answer True for.
MAY_DECLINE = frozenset({"affine", "rotate", "perspective"})

#: Each warp's filter argument: its place after the image, and torchvision's default.
_FILTER_ARG = {"affine": (1, Image.NEAREST), "rotate": (1, Image.NEAREST), "perspective": (1, Image.BICUBIC)}


def declines(name: str, *args: Any, **kwargs: Any) -> bool:
    """True where the kernel ``name`` gains nothing on pixels PIL already holds: nearest-neighbour
    warps (PIL's own nearest loops are about as fast as the kernel, so copying the pixels out of PIL
    and back would cost more than it saves). The caller then runs stock code."""
    if name not in MAY_DECLINE:
        return False
    place, default = _FILTER_ARG[name]
    return kwargs.get("interpolation", args[place] if len(args) > place else default) == Image.NEAREST


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


# --- colour -------------------------------------------------------------------------------


def lut(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    return cv2().LUT(_contig(a), table.astype(np.uint8))


def _blend_lut(degenerate: float, factor: float) -> np.ndarray:
    """PIL's ``Image.blend(constant, img, factor)`` as a lookup table, in PIL's float32 arithmetic.

    PIL computes ``in1 + alpha * (in2 - in1)`` in float32 and truncates (clipping outside [0, 1]):
    a pure function of the pixel value, so a 256-entry table reproduces it bit for bit.
    """
    v = np.arange(256, dtype=np.float32)
    out = np.float32(degenerate) + np.float32(factor) * (v - np.float32(degenerate))
    return np.clip(out, 0, 255).astype(np.uint8)


def _gray(a: np.ndarray) -> np.ndarray:
    """PIL's ``convert("L")``: the native kernel, else PIL itself (pillow-simd's rounding differs)."""
    if a.ndim == 2:
        return a
    try:
        return native_kernels.rgb_to_l(a)
    except native.NativeUnavailable as exc:
        _fell_back("grayscale", exc)
    return np.asarray(to_pil(a).convert("L"))


def to_grayscale(a: np.ndarray, num_output_channels: int) -> np.ndarray:
    """torchvision's ``to_grayscale``: ``convert("L")``, the grey plane three times for 3 channels."""
    if num_output_channels not in (1, 3) or isinstance(num_output_channels, bool):
        raise ValueError("num_output_channels should be either 1 or 3")
    g = _gray(a)
    return g if num_output_channels == 1 else np.repeat(g[:, :, None], 3, axis=2)


def adjust_saturation(a: np.ndarray, saturation_factor: float) -> np.ndarray:
    """``ImageEnhance.Color``: PIL's float blend of the image with its grey; a grey image is unchanged."""
    factor = _factor(saturation_factor)
    if a.ndim == 2:
        return a  # PIL blends the image with itself: a copy, and these arrays are never written to
    try:
        return native_kernels.saturation(a, factor)
    except native.NativeUnavailable as exc:
        _fell_back("saturation", exc)
    return np.asarray(ImageEnhance.Color(to_pil(a)).enhance(factor))


def adjust_hue(a: np.ndarray, hue_factor: float) -> np.ndarray:
    """PIL's hue shift on an RGB array, bit-exact; raises (so that stock code runs) for anything else."""
    if a.ndim != 3 or a.shape[2] != 3:
        raise TypeError("the hue kernel takes RGB; stock returns other modes unchanged")
    if not (-0.5 <= hue_factor <= 0.5):
        raise ValueError(f"hue_factor ({hue_factor}) is not in [-0.5, 0.5].")
    # torchvision's own expression, so that a float32 or tensor factor truncates as in stock.
    shift = int(np.int32(hue_factor * 255).astype(np.uint8))
    try:
        return native_kernels.hue_shift(a, shift)
    except native.NativeUnavailable as exc:
        _fell_back("hue", exc)
    return pil_hue_shift(a, shift)


def adjust_sharpness(a: np.ndarray, sharpness_factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness``: PIL's SMOOTH filter blended with the image, the native kernel, else PIL."""
    factor = _factor(sharpness_factor)
    try:
        return native_kernels.sharpness(a, factor)
    except native.NativeUnavailable as exc:
        _fell_back("sharpness", exc)
    return np.asarray(ImageEnhance.Sharpness(to_pil(a)).enhance(factor))


def _blend_const(a: np.ndarray, value: int, factor: float) -> np.ndarray:
    """PIL's blend of a constant grey with the image: the native kernel, else a table in PIL's arithmetic."""
    try:
        return native_kernels.blend_const(a, value, factor)
    except native.NativeUnavailable as exc:
        _fell_back("blend", exc)
    return lut(a, _blend_lut(float(value), factor))


def adjust_brightness(a: np.ndarray, brightness_factor: float) -> np.ndarray:
    return _blend_const(a, 0, _factor(brightness_factor))


def contrast_mean(a: np.ndarray) -> int:
    """ImageEnhance.Contrast's grey level: ``int(mean of convert("L") + 0.5)``, as ImageStat computes it."""
    if a.ndim == 3:
        try:
            return native_kernels.contrast_mean(a)
        except native.NativeUnavailable as exc:
            _fell_back("grayscale", exc)
    g = _gray(a)
    # the exact integer sum of the grey histogram over the pixel count, as ImageStat does it
    return int(int(g.sum(dtype=np.int64)) / g.size + 0.5)


def adjust_contrast(a: np.ndarray, contrast_factor: float) -> np.ndarray:
    factor = _factor(contrast_factor)
    return _blend_const(a, contrast_mean(a), factor)


def adjust_gamma(a: np.ndarray, gamma: float, gain: float = 1.0) -> np.ndarray:
    gamma, gain = _real(gamma), _real(gain)
    if gamma < 0:
        raise ValueError("Gamma should be a non-negative real number")
    table = np.array([int((255 + 1 - 1e-3) * gain * pow(ele / 255.0, gamma)) for ele in range(256)])
    return lut(a, np.clip(table, 0, 255))


def invert(a: np.ndarray) -> np.ndarray:
    return 255 - a


def posterize(a: np.ndarray, bits: int) -> np.ndarray:
    bits = _int(bits)
    if not 1 <= bits <= 8:
        raise ValueError("bits must be between or equal to 1 and 8")
    return a & np.uint8(~(2 ** (8 - bits) - 1) & 0xFF)


def solarize(a: np.ndarray, threshold: int) -> np.ndarray:
    threshold = _real(threshold)
    v = np.arange(256)
    return lut(a, np.where(v < threshold, v, 255 - v))


def _per_channel_lut(a: np.ndarray, tables: list[np.ndarray]) -> np.ndarray:
    """Apply one 256-entry table per channel (PIL's ``point`` with a table per band)."""
    if a.ndim == 2:
        return lut(a, tables[0])
    return cv2().LUT(_contig(a), np.stack(tables, axis=1).astype(np.uint8).reshape(256, 1, a.shape[2]))


def _histograms(a: np.ndarray) -> list[np.ndarray]:
    c = cv2()
    src = _contig(a)
    channels = range(1 if a.ndim == 2 else a.shape[2])
    return [c.calcHist([src], [ch], None, [256], [0, 256]).ravel().astype(np.int64) for ch in channels]


def autocontrast(a: np.ndarray) -> np.ndarray:
    """``ImageOps.autocontrast(img)`` (cutoff 0): each channel stretched from its min..max to 0..255."""
    v = np.arange(256, dtype=np.float64)
    tables = []
    for hist in _histograms(a):
        used = np.flatnonzero(hist)
        lo, hi = (int(used[0]), int(used[-1])) if used.size else (0, 0)
        if hi <= lo:
            tables.append(v.astype(np.int64))
            continue
        scale = 255.0 / (hi - lo)
        # PIL computes int(ix * scale + offset) in Python floats, truncating toward zero, then clips.
        tables.append(np.clip(np.trunc(v * scale + (-lo * scale)), 0, 255).astype(np.int64))
    return _per_channel_lut(a, tables)


def equalize(a: np.ndarray) -> np.ndarray:
    """``ImageOps.equalize(img)``: PIL's integer histogram equalisation, channel by channel."""
    tables = []
    for hist in _histograms(a):
        used = hist[hist > 0]
        step = (int(used.sum()) - int(used[-1])) // 255 if used.size > 1 else 0
        if not step:
            tables.append(np.arange(256))
            continue
        before = np.concatenate(([0], np.cumsum(hist)[:-1]))  # pixels below each level
        tables.append(np.clip((step // 2 + before) // step, 0, 255))
    return _per_channel_lut(a, tables)


def gaussian_blur(a: np.ndarray, kernel_size: list[int], sigma: list[float]) -> np.ndarray:
    """torchvision's Gaussian blur (reflect padding, same kernel) on uint8, through OpenCV."""
    c = cv2()
    kx, ky = int(kernel_size[0]), int(kernel_size[1])
    if min(a.shape[:2]) <= max(kx, ky) // 2:
        # OpenCV's reflect border needs the image larger than half the kernel; use torchvision's own path.
        from torchvision.transforms import _functional_tensor as F_t

        t = _from_numpy(_contig(a))
        t = t[None] if a.ndim == 2 else t.permute(2, 0, 1)
        out = F_t.gaussian_blur(t.contiguous(), [kx, ky], [float(sigma[0]), float(sigma[1])])
        return out[0].numpy() if a.ndim == 2 else out.permute(1, 2, 0).numpy()
    kernel_x = _gauss1d(kx, float(sigma[0]))
    kernel_y = _gauss1d(ky, float(sigma[1]))
    return c.sepFilter2D(_contig(a), -1, kernel_x, kernel_y, borderType=c.BORDER_REFLECT_101)


def _gauss1d(size: int, sigma: float) -> np.ndarray:
    half = (size - 1) * 0.5
    x = np.linspace(-half, half, size, dtype=np.float32)
    pdf = np.exp(-0.5 * (x / np.float32(sigma)) ** 2)
    return (pdf / pdf.sum()).astype(np.float32)


# --- to tensor ------------------------------------------------------------------------------


def to_tensor(a: np.ndarray, dtype: Any = None):
    """``ToTensor``: CHW float in [0, 1], bit-identical to torchvision."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    if dtype in (torch.float32, torch.float64):
        return image_through_tables(a, _to_tensor_table(dtype, get_image_num_channels(a)))
    return _float_planes(a, dtype).div_(255)


_TABLES: dict[tuple[Any, ...], np.ndarray] = {}


def _to_tensor_table(dtype: Any, channels: int) -> np.ndarray:
    """A channels x 256 table: ToTensor's own arithmetic (``.to(dtype).div(255)``) on every uint8 value."""
    import torch

    key = (dtype, channels)
    table = _TABLES.get(key)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).to(dtype).div(255).expand(channels, 256).contiguous().numpy()
        _TABLES[key] = table
    return table


def planes(a: np.ndarray) -> list[np.ndarray]:
    """The image's channels as contiguous H x W planes."""
    return list(cv2().split(_contig(a))) if a.ndim == 3 else [_contig(a)]


def planes_through_tables(channels: list[np.ndarray], table: np.ndarray):
    """A C x H x W tensor: plane ``c`` looked up in row ``c`` of the C x 256 ``table``.

    One plane and several rows broadcast, as a 1-channel image normalised with 3 means does.
    """
    import torch

    h, w = channels[0].shape
    out = np.empty((table.shape[0], h, w), dtype=table.dtype)
    for c in range(table.shape[0]):
        cv2().LUT(channels[c if len(channels) > 1 else 0], table[c], dst=out[c])
    return torch.from_numpy(out)


def image_through_tables(a: np.ndarray, table: np.ndarray):
    """A C x H x W tensor from an H x W (x C) image: channel ``c`` through row ``c`` of ``table``.

    One pass in the native kernel (de-interleave and look up together), else OpenCV's split and LUT.
    """
    import torch

    try:
        out = torch.from_numpy(native_kernels.planes_lut(a, table))
    except native.NativeUnavailable:
        out = planes_through_tables(planes(a), table)
    if out.shape[0] == 1:  # stock's strides for one channel: a (H, W, 1) array seen as (1, H, W)
        out = out[0].unsqueeze(2).permute(2, 0, 1)
    return out


def _float_planes(a: np.ndarray, dtype: Any = None):
    """The image as a C x H x W float tensor of the same values (0-255)."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    if a.ndim == 3 and dtype == torch.float32:
        # OpenCV de-interleaves, NumPy widens each plane: about 2x faster than torch's strided copy.
        out = np.empty((a.shape[2], a.shape[0], a.shape[1]), dtype=np.float32)
        for plane, channel in zip(out, cv2().split(_contig(a))):
            plane[...] = channel
        return torch.from_numpy(out)
    hwc = a[:, :, None] if a.ndim == 2 else a
    out = torch.empty((hwc.shape[2], hwc.shape[0], hwc.shape[1]), dtype=dtype)
    out.copy_(_from_numpy(hwc).permute(2, 0, 1))
    return out


def pil_to_tensor(a: np.ndarray, owned: bool = False):
    """``PILToTensor``: a C x H x W uint8 view of an H x W x C copy, stock's layout (channels-last strides).

    ``owned``: ``a`` is private to the caller, so it is not copied again.
    """
    if not (owned and a.flags.writeable and a.flags.c_contiguous):
        a = np.array(a, copy=True, order="C")
    t = _from_numpy(a)
    return (t.unsqueeze(2) if a.ndim == 2 else t).permute(2, 0, 1)


def pixels_through_tables(a: np.ndarray, table: np.ndarray):
    """``PILToTensor`` + ``ConvertImageDtype`` (+ ``Normalize``) as stock lays it out: a C x H x W view of
    an H x W x C float array, channel ``c`` through row ``c`` of ``table``."""
    try:
        hwc = native_kernels.pixels_lut(a, table)
    except native.NativeUnavailable:
        src = a[:, :, None] if a.ndim == 2 else a
        hwc = np.stack([table[c][src[..., c]] for c in range(src.shape[2])], -1)
    t = _from_numpy(hwc)
    return (t.unsqueeze(2) if hwc.ndim == 2 else t).permute(2, 0, 1)


def _from_numpy(a: np.ndarray):
    import torch

    if any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        # torch warns about sharing a read-only array; silencing that needs ``catch_warnings``, which is
        # process-wide state and unsafe while loader threads run: a private copy instead (a rare path).
        a = np.array(a, copy=True)
    return torch.from_numpy(a)
