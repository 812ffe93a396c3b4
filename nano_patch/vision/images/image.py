"""``FastImage``: a PIL image whose pixels stay in a uint8 NumPy array until PIL itself needs them.

Only the patch creates these: the decoder, and a ``Compose`` for the images it carries between
steps. Because a ``FastImage`` *is* a ``PIL.Image.Image``, every type check in torchvision (v1 and
v2), in PIL and in user code treats it as the PIL image stock code would have had, so stock's
acceptance and rejection rules hold unchanged; a user's own ``np.ndarray`` is never mistaken for an
image. The patched PIL backend reads :attr:`FastImage.array` and answers with a new ``FastImage``.

The pixels are held either as an array (after decoding, or an array kernel) or as a PIL core
(after a PIL operation, or adopted without a copy from a plain PIL image). The first time PIL code
touches an array-held image (``img.im``, ``load()``, ``convert()``, ``paste()``, saving...), the
array is copied into a PIL core once, and from then on the object holds a core: PIL may change it
in place, so the array is no longer used for pixels (it is kept only so that NumPy arrays made from
it earlier stay valid). Each patched operation uses whichever form it is fastest on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

_MODES = {2: "L", 3: "RGB"}


class FastImage(Image.Image):
    """A PIL ``RGB`` or ``L`` image whose pixels are an H x W x 3 (or H x W) uint8 array or a PIL core."""

    _array: np.ndarray | None = None  # the pixels, until PIL takes them over
    _anchor: np.ndarray | None = None  # keeps memory alive for arrays handed out by __array_interface__
    _core: Any = None

    @classmethod
    def wrap(cls, a: np.ndarray, info: dict[Any, Any] | None = None) -> FastImage:
        """An image over ``a`` (not copied; the caller gives up writing to it).

        ``info``: the source image's ``info``, copied as PIL copies it into an operation's result.
        """
        obj = cls()
        obj._mode = _MODES[a.ndim]
        obj._size = (int(a.shape[1]), int(a.shape[0]))
        obj._array = obj._anchor = a
        if info:
            obj.info = info.copy()
        return obj

    @classmethod
    def adopt(cls, img: Image.Image) -> FastImage:
        """An image over the PIL core of the plain, loaded RGB/L image ``img`` (not copied)."""
        obj = cls()
        obj._mode, obj._size = img.mode, img.size
        obj._im = img.im
        obj.info = img.info.copy()
        return obj

    @classmethod
    def keep(cls, out: Any) -> Any:
        """A stock operation's result: a plain PIL RGB/L image is carried on as a ``FastImage``."""
        if type(out) is Image.Image and out.mode in _MODES.values():
            return cls.adopt(out)
        return out

    @property
    def array(self) -> np.ndarray | None:
        """The pixels as an array, or None once PIL holds them (then ``np.asarray(img)`` copies)."""
        return self._array

    # PIL's own code reaches the pixels only through ``_im``: build the core on first use.
    @property
    def _im(self) -> Any:
        if self._core is None and self._array is not None:
            self._core = Image.fromarray(np.ascontiguousarray(self._array)).im
            self._array = None
        return self._core

    @_im.setter
    def _im(self, value: Any) -> None:
        self._core = value
        if value is not None:
            self._array = None

    @property
    def __array_interface__(self) -> dict[str, Any]:
        a = self._array
        if a is None:
            return Image.Image.__array_interface__.fget(self)  # type: ignore[attr-defined]
        # Read-only, like stock's: the pixels may be shared with other images made from this one.
        return {"version": 3, "shape": a.shape, "typestr": "|u1", "strides": a.strides,
                "data": (a.__array_interface__["data"][0], True)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Image.Image) or type(other) not in (Image.Image, FastImage):
            return False
        return (self.mode == other.mode and self.size == other.size and self.info == other.info
                and other.getpalette() is None and self.tobytes() == other.tobytes())

    __hash__ = None  # type: ignore[assignment]

    def tobytes(self, encoder_name: str = "raw", *args: Any) -> bytes:
        a = self._array
        if a is not None and encoder_name == "raw" and not args:
            return np.ascontiguousarray(a).tobytes()
        return super().tobytes(encoder_name, *args)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickles (DataLoader queues, deepcopy) as a plain PIL image: the receiver needs no nano_patch.
        return (_new_plain_image, (), self.__getstate__())

    def to_plain(self) -> Image.Image:
        """An ordinary ``PIL.Image.Image`` with the same pixels (what stock code would return)."""
        a = self._array
        if a is None:
            return self._new(self.im)  # the same PIL core, not copied: this object is done with it
        out = Image.fromarray(np.ascontiguousarray(a))
        out.info = self.info.copy()
        return out

    def resize(self, size: Any, resample: Any = None, box: Any = None, reducing_gap: Any = None) -> Image.Image:
        """``Image.resize`` through the exact array kernels (v2 and F_pil call this), else PIL's own."""
        from ..kernels import functional as K

        if (
            resample in K.ARRAY_RESIZE_FILTERS and box is None and reducing_gap is None
            and isinstance(size, (tuple, list)) and len(size) == 2
            and all(type(s) is int and s > 0 for s in size) and tuple(size) != self.size
        ):
            a = self._array if self._array is not None else np.asarray(self)
            return FastImage.wrap(K.resize(a, [size[1], size[0]], int(resample)), self.info)
        return FastImage.keep(super().resize(size, resample, box, reducing_gap))

    def _info_for_result(self) -> dict[Any, Any]:
        """The ``info`` PIL gives a transform's result: the source's, lists copied."""
        copy_info = getattr(self, "_copy_info", None)
        return copy_info() if copy_info is not None else self.info.copy()

    def _warps_natively(self, resample: Any) -> bool:
        # Nearest on pixels PIL already holds is PIL's own loop: as fast as the kernel, and no copies.
        return self._array is not None or resample != Image.Resampling.NEAREST

    def transform(self, size: Any, method: Any, data: Any = None, resample: Any = Image.Resampling.NEAREST,
                  fill: int = 1, fillcolor: Any = None) -> Image.Image:
        """``Image.transform`` through the exact native warp for ``AFFINE`` and ``PERSPECTIVE`` with
        nearest, bilinear or bicubic (timm's augmentations call it), else PIL's own."""
        from ..kernels import functional as K

        kinds = (Image.Transform.AFFINE, Image.Transform.PERSPECTIVE)
        if type(method) in (int, Image.Transform) and method in kinds and self._warps_natively(resample):
            a = self._array if self._array is not None else np.asarray(self)
            try:
                out = K.warp(a, size, data, method == Image.Transform.PERSPECTIVE, resample, fillcolor)
            except Exception:  # noqa: BLE001 - arguments the kernel does not take: PIL's code decides
                out = None
            if out is not None:
                return FastImage.wrap(out, self._info_for_result())
        return FastImage.keep(super().transform(size, method, data, resample, fill, fillcolor))

    def rotate(self, angle: float, resample: Any = Image.Resampling.NEAREST, expand: Any = False, center: Any = None,
               translate: Any = None, fillcolor: Any = None) -> Image.Image:
        """``Image.rotate`` through the exact native warp (timm's augmentations call it), else PIL's own."""
        from ..kernels import functional as K

        if self._warps_natively(resample):
            a = self._array if self._array is not None else np.asarray(self)
            try:
                out = K.pil_rotate(a, angle, resample, expand, center, translate, fillcolor)
            except Exception:  # noqa: BLE001 - arguments the kernel does not take: PIL's code decides
                out = None
            if out is not None:
                return FastImage.wrap(out, self._info_for_result())
        return FastImage.keep(super().rotate(angle, resample, expand, center, translate, fillcolor))


def _new_plain_image() -> Image.Image:
    return Image.Image.__new__(Image.Image)


def plain(x: Any) -> Any:
    """``x`` with any ``FastImage`` (alone, or in a tuple/list of images) turned into a plain PIL image."""
    if isinstance(x, FastImage):
        return x.to_plain()
    if isinstance(x, (tuple, list)) and x and any(isinstance(i, FastImage) for i in x):
        return type(x)(i.to_plain() if isinstance(i, FastImage) else i for i in x)
    return x


def fast(x: Any) -> Any:
    """A PIL ``RGB``/``L`` image as a ``FastImage`` (a plain one shares its PIL core; an image file
    that may still be loading is copied once); anything else unchanged."""
    if isinstance(x, FastImage) or not isinstance(x, Image.Image) or x.mode not in ("RGB", "L"):
        return x
    if type(x) is Image.Image:
        return FastImage.adopt(x)
    return FastImage.wrap(np.asarray(x))
