"""Pure image kernels on uint8 NumPy arrays (H x W x 3 RGB or H x W grayscale), by torchvision's names.

Each function mirrors the torchvision PIL backend function of the same name
(``torchvision.transforms._functional_pil``): same arguments, same meaning, and the same pixels as
PIL gives. An array stands in for a PIL image of mode ``RGB`` or ``L``. A kernel raises on any
argument it does not handle; the patch then runs stock code, which returns stock's result or raises
stock's exception. Nothing here patches anything or keeps global state beyond the per-process
thread cap and small caches of fill colours and tables.

This module is where the PIL backend's dispatch (``pil_dispatch.py``) and the plans look the kernels up;
the code is split by job:

- ``geometry.py``: flips, crops, pads, resize and the warps (affine, perspective, rotate);
- ``colour.py``: grey, the colour blends, hue, sharpness, the point and histogram operations, Gaussian blur;
- ``tensors.py``: ``ToTensor`` and ``PILToTensor``, and the tensor tail's table lookups;
- ``pil_arrays.py``: an array as a PIL image (``from_pil``, ``to_pil``), ``opencv.py``: OpenCV as the kernels use it.

Arrays may be views (a crop inside the image is free); every kernel accepts non-contiguous input.
"""

from __future__ import annotations

from .colour import (
    adjust_brightness,
    adjust_contrast,
    adjust_gamma,
    adjust_hue,
    adjust_saturation,
    adjust_sharpness,
    autocontrast,
    contrast_mean,
    equalize,
    gaussian_blur,
    invert,
    lut,
    posterize,
    solarize,
    to_grayscale,
)
from .geometry import (
    ARRAY_RESIZE_FILTERS,
    affine,
    check_crop_box,
    crop,
    crop_checked,
    crop_pixels,
    fill_bytes,
    hflip,
    pad,
    perspective,
    pil_fillcolor,
    pil_rotate,
    resize,
    rotate,
    vflip,
    warp,
)
from .pil_arrays import from_pil, get_image_num_channels, to_pil
from .tensors import (
    image_through_tables,
    pil_to_tensor,
    pixels_through_tables,
    planes,
    planes_through_tables,
    to_tensor,
)

__all__ = [
    "ARRAY_RESIZE_FILTERS",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_gamma",
    "adjust_hue",
    "adjust_saturation",
    "adjust_sharpness",
    "affine",
    "autocontrast",
    "check_crop_box",
    "contrast_mean",
    "crop",
    "crop_checked",
    "crop_pixels",
    "equalize",
    "fill_bytes",
    "from_pil",
    "gaussian_blur",
    "get_image_num_channels",
    "hflip",
    "image_through_tables",
    "invert",
    "lut",
    "pad",
    "perspective",
    "pil_fillcolor",
    "pil_rotate",
    "pil_to_tensor",
    "pixels_through_tables",
    "planes",
    "planes_through_tables",
    "posterize",
    "resize",
    "rotate",
    "solarize",
    "to_grayscale",
    "to_pil",
    "to_tensor",
    "vflip",
    "warp",
]
