"""Which kernel each function of torchvision's PIL backend (``_functional_pil``) runs, and on which pixels.

A ``FastImage`` (the patch's PIL image) holds its pixels either as an array (after decoding or an array kernel) or
as a PIL core (after a PIL operation); each function takes the representation it is fastest on, so the pixels are
copied between the two only where that pays. Its policy says which:

- ``PIL``: PIL's own code always (size queries: no pixel work);
- ``KERNEL``: the array kernel, copying the pixels out of PIL first if PIL holds them;
- ``EITHER``: the array kernel on an array, PIL's own (cheap) operation on a PIL core.

The hot functions run their kernel for plain PIL ``RGB`` and ``L`` images too (``pil_too``); anything else is stock's.
The routing itself, which needs the patch's image, is ``vision/plans/pil_backend.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PIL import Image

PIL, KERNEL, EITHER = "pil", "kernel", "either"

#: PIL backend function -> (policy, also run the kernel for plain PIL RGB/L input), in torchvision's order.
#: ``resize``: the native resample (exact), or nearest through OpenCV's exact kernel; ``adjust_hue``: the compiled
#: kernel, PIL's code where it cannot be built; ``adjust_sharpness``: PIL's filter and blend, native, pixels PIL holds
#: copied out once; the warps: the native warp (exact), nearest on pixels PIL holds staying PIL's (:func:`declines`).
PIL_BACKEND: dict[str, tuple[str, bool]] = {
    **dict.fromkeys(("get_dimensions", "get_image_size", "get_image_num_channels"), (PIL, False)),
    **dict.fromkeys(("hflip", "vflip", "crop", "pad"), (EITHER, False)),
    **dict.fromkeys(("resize", "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue"),
                    (KERNEL, True)),
    "adjust_sharpness": (KERNEL, False),
    "adjust_gamma": (EITHER, False),
    "to_grayscale": (KERNEL, True),
    **dict.fromkeys(("invert", "posterize", "solarize", "autocontrast", "equalize"), (EITHER, False)),
    **dict.fromkeys(("affine", "rotate", "perspective"), (KERNEL, True)),
}


def kernel_of(name: str) -> Callable[..., Any] | None:
    """The array kernel of the PIL backend function ``name``, or None where PIL's own code always runs."""
    from . import functional  # (the kernels' modules, imported once the patch goes in)

    return None if PIL_BACKEND[name][0] == PIL else getattr(functional, name)


# Stock's result of these has an empty ``info`` (PIL builds it from a new image); every other
# function copies the source image's ``info``, as PIL's operations do.
_DROPS_INFO = frozenset({"pad", "adjust_brightness", "adjust_contrast", "adjust_hue"})


def keeps_info(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether stock's result of ``name(img, *args, **kwargs)`` carries the source image's ``info``."""
    if name == "to_grayscale":  # three channels: stock builds a new image from an array
        return kwargs.get("num_output_channels", args[0] if args else None) == 1
    return name not in _DROPS_INFO


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
