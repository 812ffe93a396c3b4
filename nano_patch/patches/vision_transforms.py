"""Patch torchvision.transforms (v1) in place.

Where the patch goes in:
- ``torchvision.transforms._functional_pil``: the PIL backend every stock ``functional`` function
  (v1, and v2's PIL kernels) dispatches to. A ``FastImage`` (``vision/images/image.py``, a PIL image only
  the patch makes) runs the kernels on its array; the hot ones run for plain RGB and L PIL images
  too. Anything else, a user's ``np.ndarray`` included, is stock's to accept or reject. Argument
  parsing, matrices and random draws stay in the stock code above it.
- ``functional.to_tensor``, ``pil_to_tensor`` and ``gaussian_blur``, which do not dispatch there.
- ``Compose.__call__``: carries images as ``FastImage`` between steps (``vision/plans/compose_call.py``).

Functions are redirected in place (``AttributeRecord.redirect``): each stays the same object, so
``from torchvision.transforms.functional import to_tensor`` done earlier sees the patch and
``Lambda(F.hflip)`` still pickles by reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from .. import report
from ..config import Options
from ..registry import Patch, stock_copy

# PIL backend function -> accelerate PIL RGB/L input as well (else only arrays take the kernel).
# PIL backend function -> (policy, also run the kernel for plain PIL RGB/L input).
# A FastImage holds its pixels either as an array (after decoding or an array kernel) or as a PIL
# core (after a PIL operation); each function takes the representation it is fastest on, so the
# pixels are copied between the two only where that pays:
#   "pil": PIL's own code always (PIL-exact arithmetic that no array kernel beats here);
#   "kernel": the array kernel, copying the pixels out of PIL first if PIL holds them;
#   "either": the array kernel on an array, PIL's own (cheap) operation on a PIL core.
_PIL_BACKEND: dict[str, tuple[str, bool]] = {
    "get_dimensions": ("pil", False),
    "get_image_size": ("pil", False),
    "get_image_num_channels": ("pil", False),
    "hflip": ("either", False),
    "vflip": ("either", False),
    "crop": ("either", False),
    "pad": ("either", False),
    "resize": ("kernel", True),  # the native resample (exact), or nearest through OpenCV's exact kernel
    "adjust_brightness": ("kernel", True),
    "adjust_contrast": ("kernel", True),
    "adjust_saturation": ("kernel", True),
    "adjust_hue": ("kernel", True),  # the compiled kernel; PIL's code where it cannot be built
    "adjust_sharpness": ("kernel", False),  # PIL's filter and blend, native; PIL-held pixels copied out once
    "adjust_gamma": ("either", False),
    "to_grayscale": ("kernel", True),
    "invert": ("either", False),
    "posterize": ("either", False),
    "solarize": ("either", False),
    "autocontrast": ("either", False),
    "equalize": ("either", False),
    "affine": ("kernel", True),  # the native warp (exact); nearest on pixels PIL holds stays PIL's (as fast)
    "rotate": ("kernel", True),
    "perspective": ("kernel", True),
}


# Stock's result of these has an empty ``info`` (PIL builds it from a new image); every other
# function copies the source image's ``info``, as PIL's operations do.
_DROPS_INFO = frozenset({"pad", "adjust_brightness", "adjust_contrast", "adjust_hue"})


def _keeps_info(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if name == "to_grayscale":  # three channels: stock builds a new image from an array
        return kwargs.get("num_output_channels", args[0] if args else None) == 1
    return name not in _DROPS_INFO


def _backend_wrapper(original: Callable[..., Any], kernel: Callable[..., Any] | None, policy: str,
                     pil_too: bool) -> Callable[..., Any]:
    import numpy as np
    from PIL import Image

    from ..vision.images.image import FastImage
    from ..vision.kernels import functional as K

    name = original.__name__
    counted = not name.startswith("get_")  # size queries do no pixel work

    def declines(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name not in K.MAY_DECLINE:
            return False
        try:
            return K.declines(name, *args, **kwargs)
        except Exception:  # noqa: BLE001 - odd arguments: let the kernel or stock code judge them
            return False

    def route(img: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Only the patch's own images and PIL RGB/L take a kernel; everything else, a user's
        # ndarray included, is stock's to accept or reject. A kernel that raises hands the call to
        # stock code, which returns its own result or raises its own exception.
        if isinstance(img, FastImage):
            a = img.array
            if kernel is None or (a is None and policy == "either") or (a is None and declines(args, kwargs)):
                return FastImage.keep(original(img, *args, **kwargs))
            try:
                out = kernel(np.asarray(img) if a is None else a, *args, **kwargs)
            except Exception:  # noqa: BLE001
                return FastImage.keep(original(img, *args, **kwargs))
            if not isinstance(out, np.ndarray):
                return out
            return FastImage.wrap(out, img.info if _keeps_info(name, args, kwargs) else None)
        if (pil_too and kernel is not None and isinstance(img, Image.Image) and img.mode in ("RGB", "L")
                and not declines(args, kwargs)):
            try:
                out = kernel(np.asarray(img), *args, **kwargs)
            except Exception:  # noqa: BLE001
                return original(img, *args, **kwargs)
            if isinstance(out, np.ndarray):
                result = K.to_pil(out)
                if _keeps_info(name, args, kwargs):
                    result.info = img.info.copy()
                return result
            return out
        return original(img, *args, **kwargs)

    def patched(img: Any, *args: Any, **kwargs: Any) -> Any:
        stats = report.stats
        if stats is None:
            return route(img, args, kwargs)
        # The run report: resizes are timed, images the kernels do not take are counted.
        start = time.perf_counter()
        if counted and isinstance(img, Image.Image) and img.mode not in ("RGB", "L"):
            stats.count("vision_transforms", False, f"PIL images of mode {img.mode!r}: stock PIL code")
        try:
            return route(img, args, kwargs)
        finally:
            if name == "resize":
                stats.add_seconds("resize", time.perf_counter() - start)

    return patched


def _fast_array(pic: Any) -> Any:
    """The pixels of a patch-made image, else None (stock code handles everything else)."""
    from ..vision.images.image import FastImage

    return pic.array if isinstance(pic, FastImage) else None


def _to_tensor_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    import numpy as np
    from PIL import Image

    from ..vision.kernels import functional as K

    def to_tensor(pic: Any) -> Any:
        a = _fast_array(pic)
        if a is None and isinstance(pic, Image.Image) and pic.mode in ("RGB", "L"):
            a = np.asarray(pic)
        return original(pic) if a is None else K.to_tensor(a)

    return to_tensor


def _pil_to_tensor_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    from ..vision.kernels import functional as K

    def pil_to_tensor(pic: Any) -> Any:
        a = _fast_array(pic)
        return original(pic) if a is None else K.pil_to_tensor(a)

    return pil_to_tensor


def _gaussian_blur_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    import numpy as np
    from PIL import Image

    from ..vision.images.image import FastImage
    from ..vision.kernels import functional as K

    def gaussian_blur(img: Any, kernel_size: Any, sigma: Any = None) -> Any:
        a = _fast_array(img)
        if a is None and not (isinstance(img, Image.Image) and img.mode in ("RGB", "L")):
            return original(img, kernel_size, sigma)
        ks, sg = _blur_args(kernel_size, sigma)
        if isinstance(img, FastImage):  # stock's blurred image has an empty info, as this one
            return FastImage.wrap(K.gaussian_blur(np.asarray(img) if a is None else a, ks, sg))
        return K.to_pil(K.gaussian_blur(np.asarray(img), ks, sg))

    return gaussian_blur


def _blur_args(kernel_size: Any, sigma: Any) -> tuple[list[int], list[float]]:
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


class VisionTransformsPatch(Patch):
    name: ClassVar[str] = "vision_transforms"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.transforms"
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.26,<0.30", "opencv-python-headless": ">=4.8,<6"}

    def check_internals(self, module: ModuleType) -> str | None:
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        missing = [n for n in _PIL_BACKEND if not callable(getattr(F_pil, n, None))]
        missing += [n for n in ("to_tensor", "pil_to_tensor", "gaussian_blur") if not callable(getattr(F, n, None))]
        missing += [n for n in ("_compute_resized_output_size", "_interpolation_modes_from_int", "pil_modes_mapping",
                                "InterpolationMode") if not hasattr(F, n)]
        classes = ("Compose", "ToTensor", "Normalize", "PILToTensor", "ConvertImageDtype", "Resize", "CenterCrop",
                   "RandomCrop", "RandomResizedCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter",
                   "Grayscale", "RandomGrayscale")
        missing += [n for n in classes if not isinstance(getattr(module, n, None), type)]
        return f"torchvision internals changed: missing {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from PIL import Image
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        from ..vision.kernels import functional as K
        from ..vision.plans import compose_call

        compose_call.configure(module)
        for name, (policy, pil_too) in _PIL_BACKEND.items():
            func = getattr(F_pil, name)
            kernel = None if policy == "pil" else getattr(K, name)
            self.record.redirect(func, _backend_wrapper(stock_copy(func), kernel, policy, pil_too))
        self.record.redirect(F.to_tensor, _to_tensor_wrapper(stock_copy(F.to_tensor)))
        self.record.redirect(F.pil_to_tensor, _pil_to_tensor_wrapper(stock_copy(F.pil_to_tensor)))
        self.record.redirect(F.gaussian_blur, _gaussian_blur_wrapper(stock_copy(F.gaussian_blur)))

        def compose_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if len(args) == 1 and not kwargs:
                img = args[0]
                if compose_call.takes(img):
                    return compose_call.run_compose(instance, img)
                if report.stats is not None:
                    kind = f"PIL {img.mode!r}" if isinstance(img, Image.Image) else type(img).__name__
                    report.count("vision_transforms", False, f"Compose on {kind} input: stock torchvision code")
            return wrapped(*args, **kwargs)

        self.record.wrap(module.Compose, "__call__", compose_wrapper)

    def _revert(self) -> None:
        from ..vision.kernels import functional as K
        from ..vision.plans import compose_call

        compose_call.deactivate()
        K.release_cv2()
