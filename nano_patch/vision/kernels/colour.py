"""Colour, point and filter operations on arrays, as PIL makes them: grey, the ColorJitter blends, hue, sharpness,
gamma, the point and histogram operations, and torchvision's Gaussian blur.

Each function mirrors the torchvision PIL backend function of the same name (``_functional_pil``): same arguments,
same meaning, and the same pixels as PIL gives. Grey, saturation, contrast, brightness, hue and sharpness run the
native kernels (``native_kernels``: PIL's arithmetic in C, checked against the installed PIL), else PIL's own code;
the other point operations are lookup tables in PIL's arithmetic. Every function accepts non-contiguous input and
raises on any argument it does not handle (the patch then runs stock code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import ImageEnhance

from . import native, native_kernels
from .native_checks import pil_hue_shift
from .opencv import contiguous, cv2
from .pil_arrays import blend_factor, integer, ran_pil_code, real_number, to_pil
from .tensors import from_numpy


def lut(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    return cv2().LUT(contiguous(a), table.astype(np.uint8))


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
        ran_pil_code("grayscale", exc)
    return np.asarray(to_pil(a).convert("L"))


def to_grayscale(a: np.ndarray, num_output_channels: int) -> np.ndarray:
    """torchvision's ``to_grayscale``: ``convert("L")``, the grey plane three times for 3 channels."""
    if num_output_channels not in (1, 3) or isinstance(num_output_channels, bool):
        raise ValueError("num_output_channels should be either 1 or 3")
    g = _gray(a)
    return g if num_output_channels == 1 else np.repeat(g[:, :, None], 3, axis=2)


def adjust_saturation(a: np.ndarray, saturation_factor: float) -> np.ndarray:
    """``ImageEnhance.Color``: PIL's float blend of the image with its grey; a grey image is unchanged."""
    factor = blend_factor(saturation_factor)
    if a.ndim == 2:
        return a  # PIL blends the image with itself: a copy, and these arrays are never written to
    try:
        return native_kernels.saturation(a, factor)
    except native.NativeUnavailable as exc:
        ran_pil_code("saturation", exc)
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
        ran_pil_code("hue", exc)
    return pil_hue_shift(a, shift)


def adjust_sharpness(a: np.ndarray, sharpness_factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness``: PIL's SMOOTH filter blended with the image, the native kernel, else PIL."""
    factor = blend_factor(sharpness_factor)
    try:
        return native_kernels.sharpness(a, factor)
    except native.NativeUnavailable as exc:
        ran_pil_code("sharpness", exc)
    return np.asarray(ImageEnhance.Sharpness(to_pil(a)).enhance(factor))


def _blend_const(a: np.ndarray, value: int, factor: float) -> np.ndarray:
    """PIL's blend of a constant grey with the image: the native kernel, else a table in PIL's arithmetic."""
    try:
        return native_kernels.blend_const(a, value, factor)
    except native.NativeUnavailable as exc:
        ran_pil_code("blend", exc)
    return lut(a, _blend_lut(float(value), factor))


def adjust_brightness(a: np.ndarray, brightness_factor: float) -> np.ndarray:
    return _blend_const(a, 0, blend_factor(brightness_factor))


def contrast_mean(a: np.ndarray) -> int:
    """ImageEnhance.Contrast's grey level: ``int(mean of convert("L") + 0.5)``, as ImageStat computes it."""
    if a.ndim == 3:
        try:
            return native_kernels.contrast_mean(a)
        except native.NativeUnavailable as exc:
            ran_pil_code("grayscale", exc)
    g = _gray(a)
    # the exact integer sum of the grey histogram over the pixel count, as ImageStat does it
    return int(int(g.sum(dtype=np.int64)) / g.size + 0.5)


def adjust_contrast(a: np.ndarray, contrast_factor: float) -> np.ndarray:
    factor = blend_factor(contrast_factor)
    return _blend_const(a, contrast_mean(a), factor)


def adjust_gamma(a: np.ndarray, gamma: float, gain: float = 1.0) -> np.ndarray:
    gamma, gain = real_number(gamma), real_number(gain)
    if gamma < 0:
        raise ValueError("Gamma should be a non-negative real number")
    table = np.array([int((255 + 1 - 1e-3) * gain * pow(ele / 255.0, gamma)) for ele in range(256)])
    return lut(a, np.clip(table, 0, 255))


def invert(a: np.ndarray) -> np.ndarray:
    return 255 - a


def posterize(a: np.ndarray, bits: int) -> np.ndarray:
    bits = integer(bits)
    if not 1 <= bits <= 8:
        raise ValueError("bits must be between or equal to 1 and 8")
    return a & np.uint8(~(2 ** (8 - bits) - 1) & 0xFF)


def solarize(a: np.ndarray, threshold: int) -> np.ndarray:
    threshold = real_number(threshold)
    v = np.arange(256)
    return lut(a, np.where(v < threshold, v, 255 - v))


def _per_channel_lut(a: np.ndarray, tables: list[np.ndarray]) -> np.ndarray:
    """Apply one 256-entry table per channel (PIL's ``point`` with a table per band)."""
    if a.ndim == 2:
        return lut(a, tables[0])
    return cv2().LUT(contiguous(a), np.stack(tables, axis=1).astype(np.uint8).reshape(256, 1, a.shape[2]))


def _histograms(a: np.ndarray) -> list[np.ndarray]:
    c = cv2()
    src = contiguous(a)
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

        t = from_numpy(contiguous(a))
        t = t[None] if a.ndim == 2 else t.permute(2, 0, 1)
        out = F_t.gaussian_blur(t.contiguous(), [kx, ky], [float(sigma[0]), float(sigma[1])])
        return out[0].numpy() if a.ndim == 2 else out.permute(1, 2, 0).numpy()
    kernel_x = _gauss1d(kx, float(sigma[0]))
    kernel_y = _gauss1d(ky, float(sigma[1]))
    return c.sepFilter2D(contiguous(a), -1, kernel_x, kernel_y, borderType=c.BORDER_REFLECT_101)


def _gauss1d(size: int, sigma: float) -> np.ndarray:
    half = (size - 1) * 0.5
    x = np.linspace(-half, half, size, dtype=np.float32)
    pdf = np.exp(-0.5 * (x / np.float32(sigma)) ** 2)
    return (pdf / pdf.sum()).astype(np.float32)


def blur_args(kernel_size: Any, sigma: Any) -> tuple[list[int], list[float]]:
    """The argument checks of torchvision's ``F.gaussian_blur``, with its messages."""
    if not isinstance(kernel_size, (int, list, tuple)):
        raise TypeError(f"kernel_size should be int or a sequence of integers. Got {type(kernel_size)}")
    if isinstance(kernel_size, int):
        kernel_size = [kernel_size, kernel_size]
    if len(kernel_size) != 2:
        raise ValueError(f"If kernel_size is a sequence its length should be 2. Got {len(kernel_size)}")
    for ksize in kernel_size:
        if ksize % 2 == 0 or ksize < 0:
            raise ValueError(f"kernel_size should have odd and positive integers. Got {kernel_size}")
    if sigma is None:
        sigma = [ksize * 0.15 + 0.35 for ksize in kernel_size]
    if not isinstance(sigma, (int, float, list, tuple)):
        raise TypeError(f"sigma should be either float or sequence of floats. Got {type(sigma)}")
    if isinstance(sigma, (int, float)):
        sigma = [float(sigma), float(sigma)]
    if isinstance(sigma, (list, tuple)) and len(sigma) == 1:
        sigma = [sigma[0], sigma[0]]
    if len(sigma) != 2:
        raise ValueError(f"If sigma is a sequence, its length should be 2. Got {len(sigma)}")
    for s in sigma:
        if s <= 0.0:
            raise ValueError(f"sigma should have positive values. Got {sigma}")
    return list(kernel_size), [float(s) for s in sigma]
