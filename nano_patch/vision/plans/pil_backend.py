"""torchvision's PIL functions run by the kernels on the images they take: the patch's own (``FastImage``) and
plain PIL ``RGB``/``L``.

- Each function of the PIL backend (``_functional_pil``) that stock's ``functional`` dispatches to (v1, and v2's
  PIL kernels), by its policy (``kernels/pil_dispatch.py``): :func:`with_kernel`.
- ``functional.to_tensor``, ``pil_to_tensor`` and ``gaussian_blur``, which do not dispatch there.

Anything else, a user's ``np.ndarray`` included, is stock's to accept or reject. Argument parsing, matrices and
random draws stay in the stock code above them. A kernel that raises hands the call to stock code, which returns its
own result or raises its own exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ... import report
from ..images.image import FastImage
from ..kernels import functional as K
from ..kernels import pil_dispatch
from ..kernels.colour import blur_args


def with_kernel(original: Callable[..., Any], kernel: Callable[..., Any] | None, policy: str,
                pil_too: bool) -> Callable[..., Any]:
    """``original`` (a PIL backend function, stock's copy) running ``kernel`` on the images it takes, by ``policy``
    (``pil_dispatch.PIL_BACKEND``); ``pil_too``: plain PIL ``RGB``/``L`` images take the kernel as well."""
    name = original.__name__
    counted = not name.startswith("get_")  # size queries do no pixel work
    pil_on_core = policy == pil_dispatch.EITHER  # pixels PIL holds: its own (cheap) operation

    def declines(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name not in pil_dispatch.MAY_DECLINE:
            return False
        try:
            return pil_dispatch.declines(name, *args, **kwargs)
        except Exception:  # noqa: BLE001 - odd arguments: let the kernel or stock code judge them
            return False

    def route(img: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Only the patch's own images and PIL RGB/L take a kernel; everything else, a user's
        # ndarray included, is stock's to accept or reject.
        if isinstance(img, FastImage):
            a = img.array
            if kernel is None or (a is None and pil_on_core) or (a is None and declines(args, kwargs)):
                return FastImage.keep(original(img, *args, **kwargs))
            try:
                out = kernel(np.asarray(img) if a is None else a, *args, **kwargs)
            except Exception:  # noqa: BLE001
                return FastImage.keep(original(img, *args, **kwargs))
            if not isinstance(out, np.ndarray):
                return out
            return FastImage.wrap(out, img.info if pil_dispatch.keeps_info(name, args, kwargs) else None)
        if (pil_too and kernel is not None and isinstance(img, Image.Image) and img.mode in ("RGB", "L")
                and not declines(args, kwargs)):
            try:
                out = kernel(np.asarray(img), *args, **kwargs)
            except Exception:  # noqa: BLE001
                return original(img, *args, **kwargs)
            if isinstance(out, np.ndarray):
                result = K.to_pil(out)
                if pil_dispatch.keeps_info(name, args, kwargs):
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
    return pic.array if isinstance(pic, FastImage) else None


def to_tensor_with_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    """``functional.to_tensor`` (stock's copy ``original``) by the kernel on the patch's images and PIL RGB/L."""

    def to_tensor(pic: Any) -> Any:
        a = _fast_array(pic)
        if a is None and isinstance(pic, Image.Image) and pic.mode in ("RGB", "L"):
            a = np.asarray(pic)
        return original(pic) if a is None else K.to_tensor(a)

    return to_tensor


def pil_to_tensor_with_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    """``functional.pil_to_tensor`` (stock's copy ``original``) by the kernel on the patch's images."""

    def pil_to_tensor(pic: Any) -> Any:
        a = _fast_array(pic)
        return original(pic) if a is None else K.pil_to_tensor(a)

    return pil_to_tensor


def gaussian_blur_with_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    """``functional.gaussian_blur`` (stock's copy ``original``) by the kernel on the patch's images and PIL RGB/L,
    with stock's argument checks."""

    def gaussian_blur(img: Any, kernel_size: Any, sigma: Any = None) -> Any:
        a = _fast_array(img)
        if a is None and not (isinstance(img, Image.Image) and img.mode in ("RGB", "L")):
            return original(img, kernel_size, sigma)
        ks, sg = blur_args(kernel_size, sigma)
        if isinstance(img, FastImage):  # stock's blurred image has an empty info, as this one
            return FastImage.wrap(K.gaussian_blur(np.asarray(img) if a is None else a, ks, sg))
        return K.to_pil(K.gaussian_blur(np.asarray(img), ks, sg))

    return gaussian_blur
