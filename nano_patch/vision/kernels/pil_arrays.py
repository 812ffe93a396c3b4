"""Arrays standing in for PIL images, as every kernel on arrays takes them.

An H x W x 3 uint8 array stands in for a PIL image of mode ``RGB``, an H x W one for mode ``L``. Here: the way
between the two, the number checks a kernel makes before it takes an argument (anything else raises, and the patch
runs stock code, which returns stock's result or raises stock's exception), and the run report's count of a kernel
that ran PIL's own code because its native kernel could not.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ... import report


def from_pil(img: Image.Image) -> np.ndarray:
    """The pixels of a PIL ``RGB``/``L`` image (no copy for a ``FastImage``)."""
    a = getattr(img, "array", None)
    return a if a is not None else np.asarray(img)


def to_pil(a: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(a))


def via_pil(a: np.ndarray, fn: Callable[..., Image.Image], *args: Any, **kwargs: Any) -> np.ndarray:
    """Run a PIL operation on an array: exact stock behaviour for the rarely hot operations."""
    return np.asarray(fn(to_pil(a), *args, **kwargs))


def get_image_num_channels(a: np.ndarray) -> int:
    return 1 if a.ndim == 2 else a.shape[2]


def real_number(x: Any) -> float:
    """A plain real number, else TypeError: the wrapper then gives the call to stock code."""
    if isinstance(x, (str, bytes)) or not isinstance(x, numbers.Real):
        raise TypeError(f"expected a real number, got {type(x).__name__}")
    return float(x)


def blend_factor(x: Any) -> float:
    """A finite blend factor of a sane size; anything else is left to PIL's own code."""
    f = real_number(x)
    if not math.isfinite(f) or abs(f) > 1e30:
        raise ValueError(f"factor {f!r}: PIL's own code decides")
    return f


def integer(x: Any) -> int:
    """A plain integer (not a bool), else TypeError: stock code decides."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    return int(x)


def ran_pil_code(kernel: str, exc: Exception) -> None:
    """Count, for the run report, an operation that ran PIL's code because its native kernel could not."""
    if report.stats is not None:
        report.stats.count("vision_transforms", False, f"{kernel} ran PIL's code: {exc}")
