"""Patch torchvision.transforms (v1) in place.

Where the patch goes in:
- ``torchvision.transforms._functional_pil``: the PIL backend every stock ``functional`` function
  dispatches to. Its functions also accept uint8 arrays, and the hot ones run OpenCV / torch /
  pillow-simd kernels for RGB and L PIL images too. Argument parsing, matrices and random draws stay
  in the stock code above it.
- ``functional.to_tensor``, ``pil_to_tensor`` and ``gaussian_blur``, which do not dispatch there.
- ``Compose.__call__``: keeps images as arrays between accelerated steps (``vision/pipeline.py``).

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
_PIL_BACKEND: dict[str, bool] = {
    "get_dimensions": False,
    "get_image_size": False,
    "get_image_num_channels": False,
    "hflip": False,
    "vflip": False,
    "crop": False,
    "pad": False,
    "resize": True,
    "adjust_brightness": True,
    "adjust_contrast": True,
    "adjust_saturation": True,
    "adjust_hue": True,
    "adjust_sharpness": True,
    "adjust_gamma": True,
    "to_grayscale": True,
    "invert": False,
    "posterize": False,
    "solarize": False,
    "autocontrast": False,
    "equalize": False,
    "affine": True,
    "rotate": True,
    "perspective": True,
}

# Stock transform classes whose forward() only calls the functional API on the image.
_ARRAY_CAPABLE = (
    "Resize", "CenterCrop", "Pad", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip",
    "RandomResizedCrop", "FiveCrop", "TenCrop", "ColorJitter", "RandomRotation", "RandomAffine",
    "Grayscale", "RandomGrayscale", "RandomPerspective", "GaussianBlur", "RandomInvert",
    "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "RandomAutocontrast",
    "RandomEqualize", "AutoAugment", "RandAugment", "TrivialAugmentWide", "ToTensor", "PILToTensor",
)
_CONTAINERS = ("Compose", "RandomApply", "RandomChoice", "RandomOrder")


def _backend_wrapper(original: Callable[..., Any], kernel: Callable[..., Any], pil_too: bool) -> Callable[..., Any]:
    from PIL import Image

    from ..vision import functional as K

    name = original.__name__
    counted = not name.startswith("get_")  # size queries do no pixel work

    def route(img: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if K.is_image_array(img):
            return kernel(img, *args, **kwargs)
        if pil_too and isinstance(img, Image.Image) and img.mode in ("RGB", "L"):
            if name == "resize" and not _resize_helps(args, kwargs):
                return original(img, *args, **kwargs)
            return K.to_pil(kernel(K.from_pil(img), *args, **kwargs))
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


def _resize_helps(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """PIL input: pillow-simd is already the fastest resize; torch's kernel wins over plain Pillow."""
    from PIL import Image

    from .. import sysinfo

    interpolation = args[1] if len(args) > 1 else kwargs.get("interpolation", Image.BILINEAR)
    return not sysinfo.pillow_is_simd() and interpolation in (Image.BILINEAR, Image.BICUBIC)


def _to_tensor_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    from PIL import Image

    from ..vision import functional as K

    def to_tensor(pic: Any) -> Any:
        if K.is_image_array(pic):
            return K.to_tensor(pic)
        if isinstance(pic, Image.Image) and pic.mode in ("RGB", "L"):
            return K.to_tensor(K.from_pil(pic))
        return original(pic)

    return to_tensor


def _pil_to_tensor_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    from ..vision import functional as K

    def pil_to_tensor(pic: Any) -> Any:
        if K.is_image_array(pic):
            return K.pil_to_tensor(pic)
        return original(pic)

    return pil_to_tensor


def _gaussian_blur_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    from PIL import Image

    from ..vision import functional as K

    def gaussian_blur(img: Any, kernel_size: Any, sigma: Any = None) -> Any:
        is_array = K.is_image_array(img)
        if not (is_array or (isinstance(img, Image.Image) and img.mode in ("RGB", "L"))):
            return original(img, kernel_size, sigma)
        ks, sg = _blur_args(kernel_size, sigma)
        if is_array:
            return K.gaussian_blur(img, ks, sg)
        return K.to_pil(K.gaussian_blur(K.from_pil(img), ks, sg))

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
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.19,<0.30", "opencv-python-headless": ">=4.8,<6"}

    def check_internals(self, module: ModuleType) -> str | None:
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        missing = [n for n in _PIL_BACKEND if not callable(getattr(F_pil, n, None))]
        missing += [n for n in ("to_tensor", "pil_to_tensor", "gaussian_blur") if not callable(getattr(F, n, None))]
        missing += [n for n in _ARRAY_CAPABLE + _CONTAINERS if not isinstance(getattr(module, n, None), type)]
        return f"torchvision internals changed: missing {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from PIL import Image
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        from ..vision import functional as K
        from ..vision import pipeline

        pipeline.configure(
            [getattr(module, n) for n in _ARRAY_CAPABLE],
            [getattr(module, n) for n in _CONTAINERS],
            module.ToTensor,
            module.Normalize,
            module.Compose,
        )
        for name, pil_too in _PIL_BACKEND.items():
            func = getattr(F_pil, name)
            self.record.redirect(func, _backend_wrapper(stock_copy(func), getattr(K, name), pil_too))
        self.record.redirect(F.to_tensor, _to_tensor_wrapper(stock_copy(F.to_tensor)))
        self.record.redirect(F.pil_to_tensor, _pil_to_tensor_wrapper(stock_copy(F.pil_to_tensor)))
        self.record.redirect(F.gaussian_blur, _gaussian_blur_wrapper(stock_copy(F.gaussian_blur)))

        def compose_call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if len(args) == 1 and not kwargs:
                img = args[0]
                if K.is_image_array(img) or (isinstance(img, Image.Image) and img.mode in ("RGB", "L")):
                    return pipeline.run_compose(instance, img)
                if report.stats is not None:
                    kind = f"PIL {img.mode!r}" if isinstance(img, Image.Image) else type(img).__name__
                    report.count("vision_transforms", False, f"Compose on {kind} input: stock torchvision code")
            return wrapped(*args, **kwargs)

        self.record.wrap(module.Compose, "__call__", compose_call)

    def _revert(self) -> None:
        from ..vision import functional as K
        from ..vision import pipeline

        pipeline.deactivate()
        K.release_cv2()
