"""From a file path to a transformed sample: decode (or the decoded-image cache), then the pipeline.

Functions of the path, the transform objects and the dataset (which decides whether the decoded-
image cache is used for it, under ``--fast``); the dataset patch routes to them. With the cache on,
a hit is a read-only view into the store and a miss is decoded in full and added; with it off (or
full), a first ``Resize`` may scale the JPEG down while decoding (``scaled_decode``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ... import config
from ...vision.images import cache, decode, file_index, source
from ...vision.images.image import FastImage, plain
from ...vision.kernels import functional as K
from ...vision.kernels import native
from ...vision.plans import compose_call, compose_plan

# Opt-in only (``scaled_decode``): libjpeg-turbo's scaled IDCT is not an antialiased bilinear
# filter. On real photos at native resolution, a 1/2-scale decode before the resize measured max
# abs diff 2-83 and mean 0.1-3.9 against stock, outside the bilinear bar (max 1, mean 0.5) at every
# output size tried (32-200 px). Decode at least DCT_MARGIN times the output size, at most 1/2 down.
#: torchvision's built-in datasets that open their files with PIL and convert them to RGB themselves: the vision patch
#: routes their ``__getitem__`` through the RGB loader here (Caltech101, whose grey photos stay "L", is not one).
RGB_DATASETS = ("Flowers102", "Food101", "DTD", "StanfordCars", "OxfordIIITPet")
DCT_MARGIN = 2.0
DCT_MIN_SCALE = 0.5


def load_pil(path: str | os.PathLike[str]) -> Any:
    """``pil_loader``: the decoded file as an RGB PIL image (a ``FastImage``: no copy into PIL until used)."""
    store = cache.store_for(None)
    a = cached(store, path) if store is not None else None
    a = decode.decode_rgb(path) if a is None else a
    return FastImage.wrap(a, decode.image_info(path))


def needs_info(transform: Any, plan: compose_plan.Plan | None = None) -> bool:
    """Whether the image's ``info`` (stock's ``Image.open``'s) can show in a sample of ``transform``: False only for
    a Compose whose every step is planned and that ends in a tensor tail (no image leaves it, no stock code sees
    one). ``plan``: its plan, where the caller has it."""
    from torchvision.transforms import Compose

    if transform is None or not compose_call.behaves_as(transform, Compose):
        return True
    p = plan or compose_plan.plan_for(transform)
    n = len(p.items)
    covered = {i for j, tail in p.tails.items() for i in range(j, j + len(tail))}
    return not (n and n - 1 in covered and all(i in covered or p.runners[i] is not None for i in range(n)))


def cached(store: cache.Store, path: str | os.PathLike[str], native_mode: bool = False,
           dataset: Any = None) -> np.ndarray | None:
    """The full decode of ``path`` through ``store``: a hit's view, or a miss decoded and added
    (:func:`source.load`, through ``dataset``'s index of its files).

    ``native_mode``: the JPEG's own mode (grey stays H x W), as :func:`decode.decode_jpeg_native`.
    None when the store missed and takes no more entries (full, or no disk space), or the file is
    not one this decoder handles (``native_mode``): the caller decodes as it would without a cache.
    """
    return source.load(store, path, native_mode, file_index.for_dataset(dataset))


def default_loader(path: str | os.PathLike[str]) -> Any:
    """``default_loader``: accimage when that is torchvision's image backend, else :func:`load_pil`."""
    import torchvision

    if torchvision.get_image_backend() == "accimage":
        from torchvision.datasets.folder import accimage_loader

        return accimage_loader(path)
    return load_pil(path)


class LoadFailed(Exception):
    """The file could not be read or decoded: ``error`` is what stock's own loader raised (or would have)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def load_transformed(path: str | os.PathLike[str], transform: Any, dataset: Any = None, *,
                     wrap_load_errors: bool = False) -> Any:
    """Decode ``path`` and apply ``transform`` the way a stock dataset would after ``pil_loader``.

    The decoded image travels as a ``FastImage``; an image result comes out as a plain PIL image.
    ``dataset``: the dataset the file belongs to (it decides whether the decoded-image cache is used).
    ``wrap_load_errors``: a failure to read or decode the file raises :class:`LoadFailed` around
    stock's error, so that a caller can tell it from an error of the transform (timm's datasets skip
    files they cannot load, and only those).
    """
    from torchvision.transforms import Compose

    compose = transform if transform is not None and compose_call.behaves_as(transform, Compose) else None
    try:
        a, done, deferred = _load(path, compose, dataset)
    except Exception as exc:
        if wrap_load_errors:
            raise LoadFailed(exc) from exc
        raise
    info = decode.image_info(path) if done == 0 and needs_info(transform) else None
    if compose is None:
        return transform_decoded(a, transform, info)
    if deferred is not None:
        if info:
            deferred.info = info
        return plain(_run_deferred(compose, deferred, wrap_load_errors))
    return plain(compose_call.run_compose(compose, FastImage.wrap(a, info), skip=done))


def _load(path: str | os.PathLike[str], compose: Any, dataset: Any) -> tuple[Any, int, compose_plan.JpegPixels | None]:
    """The image for ``compose``: (array, leading steps it already applied, None), or (None, 0, pixels not
    decoded yet) when the plan starts with a crop and a JPEG need only decode its window."""
    store = cache.store_for(dataset)
    a = cached(store, path, dataset=dataset) if store is not None else None
    if a is not None or compose is None:
        return (decode.decode_rgb(path) if a is None else a), 0, None
    data = None
    if compose_plan.plan_for(compose).crop_first and native.available("crop_decode"):
        data = decode.read_bytes(path)
        size = decode.jpeg_size(data)
        # Stock's open-stage checks (decompression bomb, EXIF warnings) before the crop is drawn from
        # the header: stock raises or warns inside Image.open, before the transform draws anything.
        if size is not None and decode.check_open(data, *size, path=path):
            return None, 0, compose_plan.JpegPixels(data, size, path)
    arr, done = _decode_with_first_resize(path, compose.transforms, data)
    return arr, done, None


def _run_deferred(compose: Any, px: compose_plan.JpegPixels, wrap_load_errors: bool) -> Any:
    """Run the plan on a JPEG decoded only where its first crop lands (crop-region decode).

    Stock decodes before it draws; here the first crop is drawn from the header's size, then decoded.
    If the file turns out not to decode, the random state is put back as it was, and stock's error is
    raised, so that a caller that skips bad files (timm's datasets do) draws as stock would.
    """
    from . import generator_states

    states = generator_states.take(beyond_torch=compose_plan.draws_from_python(compose))
    try:
        return compose_call.run_compose(compose, px)
    except compose_plan.DecodeFailed as failed:
        generator_states.put_back(states)
        if wrap_load_errors:
            raise LoadFailed(failed.error) from failed.error
        raise failed.error from None


def load_native_transformed(path: str | os.PathLike[str], transform: Any, dataset: Any = None) -> Any:
    """A JPEG in its own mode (grey stays "L"), transformed; None if it is not a JPEG this decoder takes."""
    store = cache.store_for(dataset)
    a = cached(store, path, native_mode=True, dataset=dataset) if store is not None else None
    if a is None:
        a = decode.decode_jpeg_native(path)
        if a is None:
            return None
    return transform_decoded(a, transform, decode.image_info(path) if needs_info(transform) else None)


def transform_decoded(arr: np.ndarray, transform: Any, info: dict[Any, Any] | None = None) -> Any:
    """Apply ``transform`` to an already decoded image, as stock code would to its PIL image (``info``: the
    ``info`` stock's ``Image.open`` gives it)."""
    from torchvision.transforms import Compose

    img = FastImage.wrap(arr, info)
    if transform is not None and compose_call.behaves_as(transform, Compose):
        return plain(compose_call.run_compose(transform, img))
    # The sample leaves the dataset here: an image result is an ordinary PIL image, as stock's.
    return plain(img if transform is None else transform(img))


def _decode_with_first_resize(path: str | os.PathLike[str], transforms: list[Any],
                              data: bytes | None = None) -> tuple[np.ndarray, int]:
    """Decode; with ``scaled_decode`` on and a first plain ``Resize`` far below the JPEG's size, fuse them.

    Returns the image and how many leading ``transforms`` it already applied: 1 when the Resize was
    fused (the image then has the stock Resize's output size exactly, computed from the full-size
    header), else 0.
    """
    from torchvision.transforms import InterpolationMode, Resize
    from torchvision.transforms.functional import _compute_resized_output_size

    first = transforms[0] if transforms else None
    if (
        not config.current().scaled_decode
        or type(first) is not Resize
        or first.interpolation not in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    ):
        return decode.decode_rgb(path, data=data), 0
    data = decode.read_bytes(path) if data is None else data
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
