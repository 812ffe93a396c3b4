"""The draw half of a plan run: a stand-in for the pixels that writes the pixel operations down.

:class:`Recording` stands in for :class:`pixels.Pixels` while a batch's draws run: every random draw happens as
stock makes it (from the size and mode alone), and every pixel operation is written down as a typed op
(``pixel_ops.py``). :func:`render` (Python) or ``oprunner.run`` (one native call) makes them later, on the real
pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..images.image import FastImage
from ..kernels import functional as K
from .pixel_ops import HFLIP, VFLIP, Colour, Crop, Grey, ImageEnd, Op, Point, RenderFailed, Resize, TensorTail, Whole
from .pixels import Pixels


class NotSplittable(Exception):
    """A step needs pixels (or runs stock code) while it draws: no draw/render split.

    ``every_time``: the plan itself has such a step (a stock step at a fixed position), so every sample would
    raise it; otherwise it depends on what a sample drew (a policy op left to its library's own code).
    """

    def __init__(self, why: str, every_time: bool = False) -> None:
        super().__init__(why)
        self.every_time = every_time


class Recording(Pixels):
    """The draw half of a plan run: sizes and mode only, no pixels.

    It stands in for :class:`Pixels` while a plan runs its steps: every random draw happens as stock makes
    it (from the size and mode alone), and every pixel operation is written down as a typed :class:`Op` with
    its parameters. :func:`render` later makes them, in the same order, on the real pixels (in any thread: it
    draws nothing), in Python or as one call of the native op runner (``vision/plans/oprunner.py``). Whatever needs
    the pixels while drawing (a stock step, a stock fallback inside a step) raises :class:`NotSplittable`.
    """

    __slots__ = ("ops", "_hw", "_mode", "draws", "erasures", "shared")

    def __init__(self, hw: tuple[int, int], mode: str = "RGB", draws: Any = None,
                 shared: dict[Any, Any] | None = None) -> None:
        self.ops: list[Op] = []
        self.draws = draws
        #: what the recordings of one run of samples share (their tensor tail's op): no user code runs between
        #: their draws, so what it is made of (a Normalize's constants) cannot change among them
        self.shared = shared
        #: a deferred tail's RandomErasing draws (``tensor_tail.Erasure``), made with the others: the render's
        #: uint8 image goes out with them (``tensor_tail.ErasedImage``)
        self.erasures: list[Any] | None = None
        self._hw, self._mode = hw, mode
        self._nothing_pending()

    @property  # type: ignore[override]
    def base(self) -> np.ndarray:
        raise NotSplittable("a step reads the pixels while it draws")

    @base.setter
    def base(self, value: np.ndarray) -> None:
        raise NotSplittable("a step writes the pixels while it draws")

    @property
    def hw(self) -> tuple[int, int]:
        return self._hw

    @property
    def mode(self) -> str:
        return self._mode

    def array(self) -> np.ndarray:
        raise NotSplittable("a step reads the pixels while it draws")

    unflipped = array

    def image(self) -> FastImage:
        raise NotSplittable("a step runs stock code on the image while it draws")

    def check_crop(self, top: int, left: int, height: int, width: int) -> None:
        """Where PIL's check of this crop box would warn or raise, the sample goes to stock's one-by-one code,
        which makes that check itself: a warning given here could be given again (a draw made twice, or a
        sample reloaded one by one after a failed render), and an error must come with stock's generators."""
        if K.crop_checked(self._hw, top, left, height, width):
            raise NotSplittable("a crop box above PIL's size limit (PIL's check warns or raises)")

    def crop(self, top: int, left: int, height: int, width: int) -> None:
        h, w = self._hw
        inside = top >= 0 and left >= 0 and height > 0 and width > 0 and top + height <= h and left + width <= w
        self.ops.append(Crop(top, left, height, width, inside))
        self._hw = (height, width)

    def resize_to(self, height: int, width: int, pil_filter: int) -> None:
        self.ops.append(Resize(height, width, pil_filter))
        self._hw = (height, width)

    def hflip(self) -> None:
        self.ops.append(HFLIP)

    def vflip(self) -> None:
        self.ops.append(VFLIP)

    def point(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(Point(kernel, args))
        return self

    def whole(self, kernel: Callable[..., np.ndarray], *args: Any) -> Pixels:
        self.ops.append(Whole(kernel, args))
        return self

    def colour(self, op: tuple[Callable[..., np.ndarray], str, bool], factor: float) -> Pixels:
        self.ops.append(Colour(op, factor))
        return self

    def grey(self, channels: int) -> Pixels:
        self.ops.append(Grey(channels))
        self._mode = "L" if channels == 1 else "RGB"
        return self

    def end_in_tensor(self, tail: Any, uint8: bool) -> None:
        self.ops.append(TensorTail(tail, uint8, 1 if self._mode == "L" else 3))

    def end_in_image(self, fast_in: bool) -> None:
        self.ops.append(ImageEnd(fast_in))


def render(recording: Recording, px: Pixels) -> Any:
    """Make the pixel operations ``recording`` wrote down on ``px``, in order, in Python: the plan's result.

    Draws nothing, so it may run in any thread. The result is what the plan's ``run`` would have returned.
    """
    ops = recording.ops
    if not ops or not isinstance(ops[-1], (TensorTail, ImageEnd)):
        raise RenderFailed("a recording with no end")
    for op in ops:
        px = op.apply(px)
    return px
