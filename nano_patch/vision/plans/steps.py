"""The v1 step runners: ``(transform, pixels) -> None or pixels``, one per torchvision transform the plan knows.

Each runs the transform's own draws (its ``get_params``, ``torch.rand``) in stock's order, checks what it takes
before any draw (``UseStock`` otherwise: the transform then runs stock code), and makes its pixel operations on
:class:`pixels.Pixels` (or writes them down on a :class:`recording.Recording`). As torchvision's ``get_params``
is to its ``functional``, these are to ``pixels.py``: what to do, drawn; not how.
"""

from __future__ import annotations

import contextlib
import numbers
import random
from collections.abc import Callable
from typing import Any

from ..kernels import functional as K
from . import stock
from .pixels import JITTER, Pixels, UseStock


def _drawn(px: Pixels, native: Callable[[Any], Any], stock: Callable[[], Any]) -> Any:
    """A step's draws: made natively where the pixels carry native draws and they can make these (``native``
    gives None where they cannot), else by stock's own code (``stock``), on torch's generator where the native
    draws have brought it."""
    draws = px.draws
    if draws is not None:
        got = native(draws)
        if got is not None:
            return got
    with draws.lent() if draws is not None else contextlib.nullcontext():
        return stock()


def pil_filter(interpolation: Any) -> int:
    """PIL's filter number for a transform's ``interpolation``, as ``F.resize`` maps it."""
    F = stock.functional()
    mode = interpolation
    if not isinstance(mode, F.InterpolationMode):
        if isinstance(mode, int) and not isinstance(mode, bool):
            try:
                mode = F._interpolation_modes_from_int(mode)
            except (KeyError, ValueError) as exc:
                raise UseStock from exc
        else:
            raise UseStock
    f = F.pil_modes_mapping.get(mode)
    if f not in K.ARRAY_RESIZE_FILTERS:
        raise UseStock
    return int(f)


def size_request(size: Any) -> list[int]:
    if type(size) is tuple and len(size) == 2 and type(size[0]) is int and type(size[1]) is int:
        return list(size)  # (the common case, as RandomResizedCrop keeps its size: checked first)
    if isinstance(size, int) and not isinstance(size, bool):
        return [size]
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in size):
        return list(size)
    raise UseStock


# --- a step's argument checks, made before any draw (here and by the draw program, ``draw_program.py``) ---------


def resize_arguments(size: Any, interpolation: Any, max_size: Any, antialias: Any) -> tuple[int, list[int]]:
    """``F.resize``'s arguments as the plan takes them (PIL's filter number, the size request), where stock takes
    them without a warning or an error; else ``UseStock``."""
    f = pil_filter(interpolation)
    if antialias is False:
        raise UseStock  # stock warns that PIL always antialiases
    request = size_request(size)
    if max_size is not None and (len(request) != 1 or not isinstance(max_size, int) or max_size <= request[0]):
        raise UseStock
    return f, request


def center_crop_size(size: Any) -> tuple[int, int]:
    """``CenterCrop``'s (height, width), where the plan takes its ``size``; else ``UseStock``."""
    if isinstance(size, numbers.Number):
        size = (int(size), int(size))  # type: ignore[call-overload]
    elif isinstance(size, (tuple, list)) and len(size) == 1:
        size = (size[0], size[0])
    if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise UseStock
    return size[0], size[1]


def center_crop_box(hw: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The (top, left, height, width) ``CenterCrop`` cuts from an image of ``hw``; None where stock pads first."""
    (h, w), (crop_h, crop_w) = hw, size
    if crop_w > w or crop_h > h:
        return None
    return int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0)), crop_h, crop_w


def random_crop_size(t: Any) -> Any:
    """``RandomCrop``'s ``size``, where the plan takes the transform (no padding, two ints); else ``UseStock``."""
    size = t.size
    if t.padding is not None or not (isinstance(size, (tuple, list)) and len(size) == 2
                                     and all(type(v) is int for v in size)):
        raise UseStock
    return size


def random_crop_pads(t: Any, hw: tuple[int, int]) -> bool:
    """``RandomCrop`` pads an image of ``hw`` before its draw (``pad_if_needed``, the image smaller than the crop)."""
    size = t.size
    return bool(t.pad_if_needed) and (hw[1] < size[1] or hw[0] < size[0])


# --- the runners -----------------------------------------------------------------------------------------------


def _resize_to(px: Pixels, checked: tuple[int, list[int]], max_size: Any) -> None:
    """``F.resize`` of the current image, with the filter and size request :func:`resize_arguments` checked."""
    f, request = checked
    h, w = px.hw
    # both sides given: stock's _compute_resized_output_size returns them as they are
    out = request if len(request) == 2 and max_size is None else stock.functional()._compute_resized_output_size(
        (h, w), request, max_size)
    if [h, w] == out:
        return
    if out[0] <= 0 or out[1] <= 0:
        raise UseStock
    px.resize_to(out[0], out[1], f)


def run_resize(t: Any, px: Pixels) -> None:
    _resize_to(px, resize_arguments(t.size, t.interpolation, t.max_size, t.antialias), t.max_size)


def run_random_resized_crop(t: Any, px: Pixels) -> None:
    checked = resize_arguments(t.size, t.interpolation, None, t.antialias)  # checked before the draws
    i, j, h, w = _drawn(px, lambda d: d.resized_crop(px.hw, t.scale, t.ratio),
                        lambda: t.get_params(px.proxy(), t.scale, t.ratio))
    px.check_crop(i, j, h, w)  # F.resized_crop crops through PIL, which checks the box, before any later draw
    px.crop(i, j, h, w)
    _resize_to(px, checked, None)


def run_timm_random_resized_crop(t: Any, px: Pixels) -> None:
    """timm's RandomResizedCropAndInterpolation: its own draws (Python's ``random``), then F.resized_crop."""
    modes = t.interpolation if isinstance(t.interpolation, (tuple, list)) else (t.interpolation,)
    for mode in modes:
        pil_filter(mode)  # checked before the draws
    size_request(t.size)
    i, j, h, w = t.get_params(px.proxy(), t.scale, t.ratio)
    mode = random.choice(t.interpolation) if isinstance(t.interpolation, (tuple, list)) else t.interpolation
    px.check_crop(i, j, h, w)  # after the filter's draw: timm crops (PIL's check) in F.resized_crop
    px.crop(i, j, h, w)
    _resize_to(px, resize_arguments(t.size, mode, None, True), None)


def run_center_crop(t: Any, px: Pixels) -> None:
    box = center_crop_box(px.hw, center_crop_size(t.size))
    if box is None:
        raise UseStock  # stock pads first
    px.check_crop(*box)
    px.crop(*box)


def run_random_crop(t: Any, px: Pixels) -> None:
    random_crop_size(t)
    if random_crop_pads(t, px.hw):
        raise UseStock
    i, j, ch, cw = _drawn(px, lambda d: d.crop(px.hw, t.size), lambda: t.get_params(px.proxy(), t.size))
    px.check_crop(i, j, ch, cw)
    px.crop(i, j, ch, cw)


def _below(px: Pixels, p: Any) -> bool:
    """Stock's ``torch.rand(1) < p``."""
    return bool(_drawn(px, lambda d: d.below(p), lambda: stock.torch().rand(1) < p))


def run_hflip(t: Any, px: Pixels) -> None:
    if _below(px, t.p):
        px.hflip()


def run_vflip(t: Any, px: Pixels) -> None:
    if _below(px, t.p):
        px.vflip()


def run_color_jitter(t: Any, px: Pixels) -> Pixels:
    fn_idx, b, c, s, h = _drawn(px, lambda d: d.jitter(t),
                                lambda: t.get_params(t.brightness, t.contrast, t.saturation, t.hue))
    for fn_id in fn_idx:
        factor = (b, c, s, h)[int(fn_id)] if 0 <= int(fn_id) < 4 else None
        if factor is not None:
            px = px.colour(JITTER[int(fn_id)], factor)
    return px


def _grey(px: Pixels, channels: Any) -> None:
    if channels not in (1, 3) or isinstance(channels, bool):
        raise UseStock
    px.grey(channels)


def run_grayscale(t: Any, px: Pixels) -> None:
    _grey(px, t.num_output_channels)


def run_random_grayscale(t: Any, px: Pixels) -> None:
    channels = 1 if px.mode == "L" else 3
    if _below(px, t.p):
        _grey(px, channels)



#: The runners whose torch draws the native draws make (or that draw nothing): a plan of these alone may carry
#: a ``torch_draws.TorchDraws`` through its steps; any other step draws from torch's generator itself.
NATIVE_DRAWS = frozenset({run_resize, run_random_resized_crop, run_center_crop, run_random_crop, run_hflip, run_vflip,
                          run_color_jitter, run_grayscale, run_random_grayscale})
