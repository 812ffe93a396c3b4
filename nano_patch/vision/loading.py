"""From a file path to a transformed sample: decode, optionally DCT-scaled, then the pipeline.

Pure functions of the path and the transform objects; the dataset patch routes to them.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from . import decode, pipeline
from . import functional as K
from .image import FastImage, plain

# Opt-in only (``scaled_decode``): libjpeg-turbo's scaled IDCT is not an antialiased bilinear
# filter. On real photos at native resolution, a 1/2-scale decode before the resize measured max
# abs diff 2-83 and mean 0.1-3.9 against stock, outside the bilinear bar (max 1, mean 0.5) at every
# output size tried (32-200 px). Decode at least DCT_MARGIN times the output size, at most 1/2 down.
DCT_MARGIN = 2.0
DCT_MIN_SCALE = 0.5


def load_pil(path: str | os.PathLike[str]) -> Any:
    """``pil_loader``: the decoded file as an RGB PIL image (a ``FastImage``: no copy into PIL until used)."""
    return FastImage.wrap(decode.decode_rgb(path))


def default_loader(path: str | os.PathLike[str]) -> Any:
    """``default_loader``: accimage when that is torchvision's image backend, else :func:`load_pil`."""
    import torchvision

    if torchvision.get_image_backend() == "accimage":
        from torchvision.datasets.folder import accimage_loader

        return accimage_loader(path)
    return load_pil(path)


def load_transformed(path: str | os.PathLike[str], transform: Any) -> Any:
    """Decode ``path`` and apply ``transform`` the way a stock dataset would after ``pil_loader``.

    The decoded image travels as a ``FastImage``; an image result comes out as a plain PIL image.
    """
    from torchvision.transforms import Compose

    if transform is not None and pipeline.behaves_as(transform, Compose):
        arr, done = _decode_with_first_resize(path, transform.transforms)
        return plain(pipeline.run_compose(transform, FastImage.wrap(arr), skip=done))
    return transform_decoded(decode.decode_rgb(path), transform)


def transform_decoded(arr: np.ndarray, transform: Any) -> Any:
    """Apply ``transform`` to an already decoded image, as stock code would to its PIL image."""
    from torchvision.transforms import Compose

    img = FastImage.wrap(arr)
    if transform is not None and pipeline.behaves_as(transform, Compose):
        return plain(pipeline.run_compose(transform, img))
    # The sample leaves the dataset here: an image result is an ordinary PIL image, as stock's.
    return plain(img if transform is None else transform(img))


def _decode_with_first_resize(path: str | os.PathLike[str], transforms: list[Any]) -> tuple[np.ndarray, int]:
    """Decode; with ``scaled_decode`` on and a first plain ``Resize`` far below the JPEG's size, fuse them.

    Returns the image and how many leading ``transforms`` it already applied: 1 when the Resize was
    fused (the image then has the stock Resize's output size exactly, computed from the full-size
    header), else 0.
    """
    from torchvision.transforms import InterpolationMode, Resize
    from torchvision.transforms.functional import _compute_resized_output_size

    import nano_patch

    first = transforms[0] if transforms else None
    if (
        not nano_patch.options().scaled_decode
        or type(first) is not Resize
        or first.interpolation not in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    ):
        return decode.decode_rgb(path), 0
    data = decode.read_bytes(path)
    size = decode.jpeg_size(data)
    if size is None:
        return decode.decode_rgb(path, data=data), 0
    h, w = size
    requested = [first.size] if isinstance(first.size, int) else list(first.size)
    out_h, out_w = _compute_resized_output_size((h, w), requested, first.max_size)
    min_h = max(int(out_h * DCT_MARGIN), math.ceil(h * DCT_MIN_SCALE))
    min_w = max(int(out_w * DCT_MARGIN), math.ceil(w * DCT_MIN_SCALE))
    if min_h * 2 > h or min_w * 2 > w:
        return decode.decode_rgb(path, data=data), 0  # not even a 1/2 DCT scale fits
    arr = decode.decode_rgb(path, min_size=(min_h, min_w), data=data)
    if arr.shape[:2] == (h, w):
        return arr, 0
    from PIL import Image

    pil_mode = Image.BILINEAR if first.interpolation == InterpolationMode.BILINEAR else Image.BICUBIC
    return K.resize(arr, [out_h, out_w], pil_mode), 1
