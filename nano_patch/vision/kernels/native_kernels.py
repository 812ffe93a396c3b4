"""The compiled kernels' typed wrappers: NumPy uint8 arrays in, new arrays out, each kernel as its check passed it.

The functions here are pure: H x W x 3 RGB or H x W L uint8 arrays (any row stride) in, new arrays out. Each
runs its kernel only once it has passed its check against the installed PIL (``native.kernel``), with the
arithmetic that check found (``native_checks.found``); else it raises ``native.NativeUnavailable`` and the caller
(``geometry.py``, ``colour.py``, ``tensors.py``) runs PIL's own code, exact and slower.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import native
from . import native_checks as checks
from .pil_filters import FILTERS, WARP_FILTERS


class JpegRegionError(ValueError):
    """This JPEG cannot be region-decoded (damaged, truncated, CMYK, an unusual layout...): decode it whole.

    The full decode then applies its own rules (libjpeg-turbo, or PIL for what that refuses), so pixels
    and errors stay stock.
    """


class NotReproducible(ValueError):
    """PIL's own result for these arguments is undefined behaviour in its C code (a NaN coordinate, a
    fixed-point overflow): only PIL's code can give it, so run that."""


def _image(a: np.ndarray, what: str = "image") -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)):
        raise ValueError(f"{what} must be an H x W or H x W x 3 uint8 array, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} of shape {getattr(a, 'shape', None)}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{what} is empty: shape {a.shape}")
    if a.strides[-1] != 1 or (a.ndim == 3 and a.strides[1] != 3):
        a = np.ascontiguousarray(a)  # the kernels take any row stride, but packed pixels
    return a


def _checked_call(name: str, a: np.ndarray, size: tuple[int, int], resample_filter: int, filters: dict[int, str]
                  ) -> tuple[ModuleType, np.ndarray, int, int]:
    """The checked kernel ``name``, the image ``a`` as it takes it and the output's (height, width), once the filter
    and the size are ones it takes."""
    mod = native.kernel(name)
    a = _image(a)
    h, w = int(size[0]), int(size[1])
    if resample_filter not in filters:
        raise ValueError(f"the {name} kernel takes filters {sorted(filters)} (PIL's numbers), got {resample_filter!r}")
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, got {size}")
    return mod, a, h, w


def resample(a: np.ndarray, size: tuple[int, int], resample_filter: int,
             box: tuple[float, float, float, float] | None = None, flip: bool = False,
             window: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """``Image.resize((w, h), filter, box)`` on ``a``, then cropped to ``window``, then mirrored if ``flip``.

    ``size`` is (height, width); ``filter`` one of PIL's numbers in :data:`FILTERS`; ``box`` PIL's
    (left, upper, right, lower) source box in float, the whole image by default; ``window``
    (top, left, height, width) a crop of the result that lies inside it: only that part is computed.
    A crop of the source is a view: pass ``a[top:bottom, left:right]`` to resize a crop the way
    stock crops, then resizes.
    """
    mod, a, h, w = _checked_call("resample", a, size, resample_filter, FILTERS)
    box = (0.0, 0.0, float(a.shape[1]), float(a.shape[0])) if box is None else tuple(float(b) for b in box)
    top, left, wh, ww = (0, 0, h, w) if window is None else (int(v) for v in window)
    out = np.empty((wh, ww) + a.shape[2:], np.uint8)
    mod.resample(a, out, int(resample_filter), box, bool(flip), checks.found.resample, (w, h), (left, top))
    return out


def warp(a: np.ndarray, size: tuple[int, int], coeffs: Any, perspective: bool, resample_filter: int,
         fill: bytes | tuple[int, ...]) -> np.ndarray:
    """``Image.transform((w, h), AFFINE or PERSPECTIVE, coeffs, resample_filter)`` of ``a``, where pixels
    mapped outside ``a`` take ``fill``.

    ``size`` is (height, width); ``coeffs`` PIL's 6 (affine) or 8 (perspective) numbers, taken as
    doubles; ``resample_filter`` one of :data:`WARP_FILTERS` (PIL's numbers); ``fill`` one value
    0..255 per channel: the fill colour as PIL stores it (``Image.new(mode, (1, 1), fillcolor).tobytes()``).
    Raises :class:`NotReproducible` where PIL's own result is undefined in C (a NaN coordinate, say).
    """
    mod, a, h, w = _checked_call("warp", a, size, resample_filter, WARP_FILTERS)
    n = 8 if perspective else 6
    c = tuple(float(v) for v in coeffs)
    if len(c) != n:
        raise ValueError(f"{'perspective' if perspective else 'affine'} coefficients: {n} numbers, got {len(c)}")
    channels = 1 if a.ndim == 2 else 3
    fill = bytes(fill)
    if len(fill) != channels:
        raise ValueError(f"fill needs {channels} values, got {len(fill)}")
    out = np.empty((h, w) + a.shape[2:], np.uint8)
    if not mod.warp(a, out, c + (0.0,) * (8 - n), bool(perspective), int(resample_filter), fill):
        raise NotReproducible("PIL's result is undefined in C for these coefficients (NaN or overflowing coordinates)")
    return out


def rgb_to_l(a: np.ndarray) -> np.ndarray:
    """``img.convert("L")`` of an RGB array."""
    mod = native.kernel("grayscale")
    a = _image(a)
    if a.ndim != 3:
        raise ValueError("rgb_to_l takes an H x W x 3 array")
    out = np.empty(a.shape[:2], np.uint8)
    mod.rgb_to_l(a, out, checks.found.grey)
    return out


def contrast_mean(a: np.ndarray) -> int:
    """ImageEnhance.Contrast's grey level: the mean of ``convert("L")``, rounded as ImageStat and int() do."""
    mod = native.kernel("grayscale")
    a = _image(a)
    total = mod.gray_sum(a, checks.found.grey)
    return int(total / (a.shape[0] * a.shape[1]) + 0.5)


def saturation(a: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Color(img).enhance(factor)`` of an RGB array (PIL's float blend with its grey)."""
    mod = native.kernel("saturation")
    a = _image(a)
    if a.ndim != 3:
        raise ValueError("saturation takes an H x W x 3 array")
    out = np.empty_like(a, order="C")
    mod.blend_gray(a, out, float(factor), checks.found.saturation)
    return out


def sharpness(a: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness(img).enhance(factor)``: PIL's 3x3 SMOOTH filter blended with the image."""
    mod = native.kernel("sharpness")
    a = _image(a)
    out = np.empty(a.shape, np.uint8)
    mod.sharpness(a, out, float(factor))
    return out


def blend_const(a: np.ndarray, value: int, factor: float) -> np.ndarray:
    """``Image.blend(Image.new(mode, size, value), img, factor)``: brightness (value 0) and contrast
    (value the grey mean) as ImageEnhance computes them, in PIL's float arithmetic."""
    mod = native.kernel("blend")
    a = _image(a)
    out = np.empty(a.shape, np.uint8)
    mod.blend_const(a, out, int(value), float(factor))
    return out


def hue_shift(a: np.ndarray, shift: int) -> np.ndarray:
    """PIL's hue shift of an RGB array by ``shift`` levels of its 8-bit H (torchvision's adjust_hue)."""
    mod = native.kernel("hue")
    a = _image(a)
    if a.ndim != 3:
        raise ValueError("hue_shift takes an H x W x 3 array")
    out = np.empty(a.shape, np.uint8)
    mod.hue_shift(a, out, int(shift))
    return out


def lut(a: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """One 256-entry uint8 table per channel (``tables``: C x 256, or 256 for every channel)."""
    mod = native.kernel("tables")
    a = _image(a)
    channels = 1 if a.ndim == 2 else 3
    t = np.asarray(tables, dtype=np.uint8).reshape(-1, 256)
    if t.shape[0] == 1 and channels == 3:
        t = np.repeat(t, 3, axis=0)
    if t.shape[0] != channels:
        raise ValueError(f"lut needs 1 or {channels} tables of 256, got {t.shape[0]}")
    out = np.empty(a.shape, np.uint8)
    mod.lut(a, out, np.ascontiguousarray(t).tobytes())
    return out


def planes_lut(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    """A C x H x W float array: channel ``c`` of ``a`` through row ``c`` of the C x 256 ``table``."""
    mod = native.kernel("tables")
    a = _image(a)
    table = np.ascontiguousarray(table)
    out = np.empty((table.shape[0],) + a.shape[:2], dtype=table.dtype)
    mod.planes_lut(a, table, out)
    return out


def pixels_lut(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    """An H x W x C float array: channel ``c`` of ``a`` through row ``c`` of the C x 256 ``table``."""
    mod = native.kernel("tables")
    a = _image(a)
    table = np.ascontiguousarray(table)
    out = np.empty(a.shape, dtype=table.dtype)
    mod.pixels_lut(a, table, out)
    return out


def crop_multiscan() -> bool:
    """Whether progressive (and other multi-scan) JPEGs are region-decoded here (their check may say no)."""
    return checks.found.crop_multiscan


def decode_jpeg_region(data: bytes, top: int, left: int, height: int, width: int, *,
                       check_rest: bool = True) -> np.ndarray:
    """The ``height`` x ``width`` window at (``top``, ``left``) of a JPEG, decoded to RGB: exactly
    ``simplejpeg.decode_jpeg(data, colorspace="RGB")[top:top + height, left:left + width]`` (and so PIL's
    ``Image.open(f).convert("RGB")`` cropped), without decoding the rest of the image to pixels. Call it
    for the files the full decode sends to simplejpeg (``decode.jpeg_size(data)`` is not None), with a
    window drawn from that size; it refuses some of those too (see below).

    The result is a writable H x W x 3 uint8 view, like a slice of the full decode: its rows are
    ``strides[0]`` bytes apart (more than ``3 * width``) in a private buffer a little larger than the
    window, which it keeps alive. ``np.ascontiguousarray`` it where packed rows are needed.

    ``check_rest`` (default): the rows below the window are entropy-decoded to the end-of-image marker
    too, so that the call fails exactly where the strict full decode would (a truncated or corrupt file
    fails even when the damage is outside the window). With ``check_rest=False`` the decode stops after
    the window's rows: quicker, the same pixels, but damage below the window goes unnoticed.

    Raises :class:`NativeUnavailable` where crop decoding is not usable in this process (not built,
    switched off, refused by its check), :class:`JpegRegionError` (a ValueError) for a file it cannot
    region-decode: damaged or truncated, not a JPEG, CMYK/YCCK/RGB colour, 12-bit, arithmetic-coded,
    chroma sampling other than 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 and grey (what the check covers), or
    progressive where the check refused those. In both cases decode the whole file instead. A plain
    ValueError means a window that is empty or not inside the image (a caller's bug).
    """
    mod = native.kernel("crop_decode")
    try:
        buf, stride, oy, ox = mod.decode_region(data, top, left, height, width, check_rest=bool(check_rest),
                                                allow_multiscan=checks.found.crop_multiscan)
    except mod.Error as exc:
        raise JpegRegionError(str(exc)) from None
    block = np.frombuffer(buf, np.uint8).reshape(len(buf) // stride, stride // 3, 3)
    return block[oy:oy + height, ox:ox + width]
