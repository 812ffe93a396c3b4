"""From a file path to a transformed sample: decode, optionally DCT-scaled, then the pipeline.

Pure functions of the path and the transform objects; the dataset patch routes to them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import decode
from . import functional as K
from . import pipeline

# Decode at least this many times the first Resize's output size, so the DCT-domain downscale
# leaves the final antialiased resize enough pixels to stay within the parity bar.
DCT_MARGIN = 2.0


def load_pil(path: str | os.PathLike[str]) -> Any:
    """``pil_loader``: the decoded file as an RGB PIL image."""
    return K.to_pil(decode.decode_rgb(path))


def load_transformed(path: str | os.PathLike[str], transform: Any) -> Any:
    """Decode ``path`` and apply ``transform`` the way a stock dataset would after ``pil_loader``."""
    from torchvision.transforms import Compose

    if transform is None:
        return load_pil(path)
    if isinstance(transform, Compose) and type(transform).__call__ is Compose.__call__:
        transforms = list(transform.transforms)
        arr = _decode_with_first_resize(path, transforms)
        return pipeline.run(transforms, arr, stands_for_pil=True)
    return transform(load_pil(path))


def _decode_with_first_resize(path: str | os.PathLike[str], transforms: list[Any]) -> np.ndarray:
    """Decode; when the first transform is a plain ``Resize`` far below the JPEG's size, fuse them.

    On success the fused Resize is removed from ``transforms``; the output is the stock Resize's
    output size exactly, computed from the full-size header.
    """
    from torchvision.transforms import InterpolationMode, Resize
    from torchvision.transforms.functional import _compute_resized_output_size

    first = transforms[0] if transforms else None
    if (
        type(first) is not Resize
        or first.interpolation not in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    ):
        return decode.decode_rgb(path)
    data = decode.read_bytes(path)
    size = decode.jpeg_size(data)
    if size is None:
        return decode.decode_rgb(path)
    h, w = size
    requested = [first.size] if isinstance(first.size, int) else list(first.size)
    out_h, out_w = _compute_resized_output_size((h, w), requested, first.max_size)
    min_h, min_w = int(out_h * DCT_MARGIN), int(out_w * DCT_MARGIN)
    if min_h * 2 > h or min_w * 2 > w:
        return decode.decode_rgb(path)  # not even a 1/2 DCT scale fits
    arr = decode.decode_rgb(path, min_size=(min_h, min_w))
    if arr.shape[:2] == (h, w):
        return arr
    from PIL import Image

    pil_mode = Image.BILINEAR if first.interpolation == InterpolationMode.BILINEAR else Image.BICUBIC
    transforms.pop(0)
    return K.resize(arr, [out_h, out_w], pil_mode)
