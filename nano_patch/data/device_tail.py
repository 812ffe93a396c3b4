"""The tensor tail of a pipeline, split off: uint8 images cross the host, the tail runs where the batch goes.

A pipeline that ends in the *tensor tail* turns a uint8 image into a normalised float tensor, elementwise:

- v1 (and timm's ``MaybeToTensor``): ``ToTensor`` [``Normalize``]: ``x.to(float32).div(255)``, ``sub_(mean)``,
  ``div_(std)``;
- v2: ``ToImage`` or ``PILToTensor``, ``ToDtype(float32, scale=True)`` [``Normalize``]:
  ``x.to(float32).mul_(1 / 255)``, ``sub(mean)``, ``div_(std)``;
- any of these followed by ``RandomErasing`` (v1 or v2), once or more.

Where the tail is split off (:func:`run_uint8`), the sample is the uint8 C x H x W image the tail would have
started from, and each ``RandomErasing``'s draws are made right there, in stock's order, from stock's generators,
on a stand-in of the image's shape (its draws read the shape only): the rectangle and, for ``value="random"``,
the normal values. :func:`apply_tail` later makes the same float32 operations on the whole batch, in stock's order,
on the CPU (``data/uint8_batches.py``, the main process) or on the device after the transfer (:class:`DeferredImages`,
which ``train/device_tail.py`` lets through to Lightning's transfer).

Bits: every operation is one correctly rounded float32 ``/``, ``*`` or ``-`` per element, as stock makes it per
image. One trap: CUDA's ``div`` by a *CPU scalar* multiplies by the reciprocal (``BinaryDivTrueKernel.cu``), which
is not ``x / 255``; so the divisors here are always tensors on the batch's device, where CUDA divides.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The tail's scaling step: v1 ``ToTensor`` (``div(255)``) or v2 ``ToDtype(float32, scale=True)`` (``mul_(1/255)``).
V1_DIV, V2_MUL = "ToTensor", "ToDtype"


@dataclass(frozen=True)
class TailSpec:
    """How to finish a uint8 image batch: the tail's steps as data, and the memory format wanted."""

    scale: str = V1_DIV
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    #: where the tail starts in the Compose
    start: int = -1
    #: how many ``RandomErasing`` steps follow the tail (their draws travel with each sample)
    erasers: int = 0
    channels_last: bool = False
    #: the steps' names, for the run report
    names: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        return " + ".join(self.names)


# --- recognising the tail --------------------------------------------------------------------


def _v1() -> Any:
    return sys.modules.get("torchvision.transforms")


def _v2() -> Any:
    return sys.modules.get("torchvision.transforms.v2")


def _is(t: Any, module: Any, name: str) -> bool:
    return module is not None and type(t) is getattr(module, name, None)


def _is_eraser(t: Any) -> bool:
    return _is(t, _v1(), "RandomErasing") or _is(t, _v2(), "RandomErasing")


def _to_tensor(t: Any) -> bool:
    timm = sys.modules.get("timm.data.transforms")
    return _is(t, _v1(), "ToTensor") or _is(t, timm, "MaybeToTensor")


def _normalize_constants(t: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    try:
        mean, std = tuple(float(m) for m in t.mean), tuple(float(s) for s in t.std)
    except (TypeError, ValueError):
        return None
    # RGB images (three channels): constants stock broadcasts as it would per image; std 0 raises in stock
    if len(mean) not in (1, 3) or len(std) not in (1, 3) or 0.0 in std:
        return None
    return mean, std


def find_tail(compose: Any) -> TailSpec | None:
    """The tensor tail ``compose`` ends in (then only ``RandomErasing``), or None."""
    import torch

    if torch.get_default_dtype() != torch.float32:
        return None
    items = list(getattr(compose, "transforms", ()))
    erasers = 0
    while items and _is_eraser(items[-1]):
        items.pop()
        erasers += 1
    v1, v2 = _v1(), _v2()
    mean = std = None
    if items and (_is(items[-1], v1, "Normalize") or _is(items[-1], v2, "Normalize")):
        # v1's normalize (clone, sub_, div_) and v2's (sub, div_) make the same float32 operations
        constants = _normalize_constants(items[-1])
        if constants is None:
            return None
        mean, std = constants
        items.pop()
    if items and _to_tensor(items[-1]):
        scale = V1_DIV
        items.pop()
    elif (len(items) >= 2 and _is(items[-1], v2, "ToDtype")
          and (_is(items[-2], v2, "ToImage") or _is(items[-2], v2, "PILToTensor"))):
        to_dtype = items[-1]
        if to_dtype.dtype is not torch.float32 or to_dtype.scale is not True:
            return None
        scale = V2_MUL
        del items[-2:]
    else:
        return None
    if scale == V2_MUL and v1 is not None and isinstance(compose, v1.Compose):
        return None  # the v1 Compose's plan knows v1's tail only
    names = tuple(type(t).__name__ for t in list(compose.transforms)[len(items):])
    return TailSpec(scale, mean, std, len(items), erasers, names=names)


# --- the sample side: a uint8 image, and the erasers' draws ------------------------------------


@dataclass
class Erasure:
    """One ``RandomErasing``'s draw for one sample: ``img[..., i:i+h, j:j+w] = v``, or nothing (``None`` draws)."""

    i: int
    j: int
    h: int
    w: int
    #: float32 tensor, C x h x w (random) or K x 1 x 1 (the value); None once collated: then ``values[at:...]``
    #: of the batch, in ``shape`` (one tensor per batch crosses the worker queue, not one per sample)
    v: Any
    at: int = 0
    shape: tuple[int, ...] = ()


@dataclass
class ErasedImage:
    """A sample's uint8 image and its erasers' draws (one entry per ``RandomErasing``, None where it drew none)."""

    image: Any
    erasures: list[Erasure | None]


@dataclass
class ErasedBatch:
    """A collated batch of :class:`ErasedImage`: N x C x H x W uint8 and, per sample, its erasures."""

    images: Any
    erasures: list[list[Erasure | None]]
    #: every erasure's values, flat, in order (float32), or None
    values: Any = None

    def pin_memory(self, device: Any = None) -> ErasedBatch:  # the loader's pin thread calls it
        values = None if self.values is None else self.values.pin_memory()
        return ErasedBatch(self.images.pin_memory(), self.erasures, values)


def collate_erased(batch: list[ErasedImage], *, collate_fn_map: Any = None) -> ErasedBatch:
    """``default_collate`` for :class:`ErasedImage`: the images as stock stacks tensors, the draws listed, their
    values in one flat tensor."""
    import torch
    from torch.utils.data._utils.collate import collate_tensor_fn

    flat: list[Any] = []
    at = 0
    rows: list[list[Erasure | None]] = []
    for sample in batch:
        row: list[Erasure | None] = []
        for e in sample.erasures:
            if e is None:
                row.append(None)
                continue
            v = e.v.to(torch.float32)  # what the assignment into the float32 image makes of it (already float32)
            flat.append(v.reshape(-1))
            row.append(Erasure(e.i, e.j, e.h, e.w, None, at, tuple(v.shape)))
            at += v.numel()
        rows.append(row)
    return ErasedBatch(collate_tensor_fn([s.image for s in batch]), rows, torch.cat(flat) if flat else None)


def register_collate() -> None:
    """Let ``default_collate`` stack :class:`ErasedImage` (in a worker process: only this private type is added)."""
    from torch.utils.data._utils import collate

    collate.default_collate_fn_map.setdefault(ErasedImage, collate_erased)


def _draw_v1(t: Any, shape: tuple[int, int, int]) -> Erasure | None:
    """Stock v1 ``RandomErasing.forward``'s draws on an image of ``shape``, in its order, with its errors."""
    import torch

    if torch.rand(1) < t.p:
        if isinstance(t.value, (int, float)):
            value = [float(t.value)]
        elif isinstance(t.value, str):
            value = None
        elif isinstance(t.value, (list, tuple)):
            value = [float(v) for v in t.value]
        else:
            value = t.value
        if value is not None and len(value) not in (1, shape[-3]):
            raise ValueError(
                "If value is a sequence, it should have either a single value or "
                f"{shape[-3]} (number of input channels)"
            )
        stand_in = torch.empty(shape, dtype=torch.float32, device="meta")
        i, j, h, w, v = t.get_params(stand_in, scale=t.scale, ratio=t.ratio, value=value)
        return None if v is stand_in else Erasure(i, j, h, w, v)
    return None


def _draw_v2(t: Any, shape: tuple[int, int, int]) -> Erasure | None:
    """Stock v2 ``RandomErasing``'s draws (``_RandomApplyTransform.forward`` and ``make_params``) on ``shape``."""
    import torch

    if torch.rand(1) >= t.p:
        return None
    params = t.make_params([torch.empty(shape, dtype=torch.float32, device="meta")])
    if params["v"] is None:
        return None
    return Erasure(params["i"], params["j"], params["h"], params["w"], params["v"])


def draw_erasures(compose: Any, spec: TailSpec, shape: tuple[int, int, int]) -> list[Erasure | None]:
    steps = list(compose.transforms)[len(compose.transforms) - spec.erasers:] if spec.erasers else []
    return [(_draw_v1 if _is(t, _v1(), "RandomErasing") else _draw_v2)(t, shape) for t in steps]


def uint8_sample(compose: Any, spec: TailSpec, image: Any) -> Any:
    """The sample a split-off tail leaves: ``image`` (uint8 C x H x W), with the erasers' draws where there are any."""
    if not spec.erasers:
        return image
    return ErasedImage(image, draw_erasures(compose, spec, tuple(image.shape)))


_prefixes: weakref.WeakKeyDictionary[Any, tuple[list[Any], Any]] = weakref.WeakKeyDictionary()


def prefix_compose(compose: Any, spec: TailSpec) -> Any:
    """``compose`` without its erasers (same class; kept while its list of transforms stays the same)."""
    items = list(compose.transforms)
    kept = _prefixes.get(compose)
    if kept is None or len(kept[0]) != len(items) or any(a is not b for a, b in zip(kept[0], items)):
        kept = (items, type(compose)(items[:len(items) - spec.erasers]))
        _prefixes[compose] = kept
    return kept[1]


# --- the batch side: the tail on the whole batch -------------------------------------------------


def memory_format(images: Any, spec: TailSpec) -> Any:
    """The memory format of stock's float batch: ``ToTensor`` makes each sample contiguous; v2 keeps
    ``PILToTensor``'s channels-last strides, so its float batch is laid out as the uint8 one (stacked alike)."""
    import torch

    if spec.channels_last:
        return torch.channels_last
    if (spec.scale == V2_MUL and not images.is_contiguous()
            and images.is_contiguous(memory_format=torch.channels_last)):
        return torch.channels_last
    return torch.contiguous_format


def apply_tail(images: Any, spec: TailSpec, erasures: list[list[Erasure | None]] | None = None,
               out: Any = None, values: Any = None) -> Any:
    """The float32 N x C x H x W batch stock makes from these uint8 images: its operations, in its order,
    on ``images``' device (``out``: where to write it, else a new tensor)."""
    import torch

    device = images.device
    if out is None:
        out = torch.empty(images.shape, dtype=torch.float32, device=device,
                          memory_format=memory_format(images, spec))
    out.copy_(images)  # uint8 -> float32: exact
    scale, mean, std = _constants(spec, device)
    if spec.scale == V1_DIV:
        out.div_(scale)
    else:
        out.mul_(scale)
    if mean is not None:
        out.sub_(mean)
        out.div_(std)
    if erasures:
        _erase(out, erasures, values)
    return out


_constants_lock = threading.Lock()
_constants_cache: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}


def _constants(spec: TailSpec, device: Any) -> tuple[Any, Any, Any]:
    """The tail's constants as float32 tensors on ``device``, made once per device: a fresh ``torch.tensor(...,
    device="cuda")`` per batch would be a blocking copy that waits for the GPU to finish the previous step."""
    import torch

    key = (str(device), spec.scale, spec.mean, spec.std)
    with _constants_lock:
        found = _constants_cache.get(key)
        if found is None:
            with torch.inference_mode(False):  # usable in training after a validation loop made them
                scale = torch.tensor(255.0 if spec.scale == V1_DIV else 1.0 / 255, dtype=torch.float32,
                                     device=device)
                mean = std = None
                if spec.mean is not None and spec.std is not None:
                    mean = torch.tensor(spec.mean, dtype=torch.float32, device=device).view(-1, 1, 1)
                    std = torch.tensor(spec.std, dtype=torch.float32, device=device).view(-1, 1, 1)
            found = _constants_cache[key] = (scale, mean, std)
            if len(_constants_cache) > 64:
                _constants_cache.pop(next(iter(_constants_cache)))
        return found


def _erase(out: Any, erasures: list[list[Erasure | None]], values: Any = None) -> None:
    """Each sample's erasures, in order; the values cross to the device in one copy."""
    import torch

    drawn = [(n, e) for n, sample in enumerate(erasures) for e in sample if e is not None]
    if not drawn:
        return
    if values is None:  # not collated by collate_erased: the values, flat, here
        flat, at, placed = [], 0, []
        for n, e in drawn:
            v = e.v.to(torch.float32)
            flat.append(v.reshape(-1))
            placed.append((n, Erasure(e.i, e.j, e.h, e.w, None, at, tuple(v.shape))))
            at += v.numel()
        drawn, values = placed, torch.cat(flat)
    values = values.to(out.device, non_blocking=bool(values.is_pinned()))
    for n, e in drawn:
        v = values[e.at:e.at + math.prod(e.shape)].view(e.shape)
        out[n, :, e.i:e.i + e.h, e.j:e.j + e.w] = v


class DeferredImages:
    """A uint8 image batch whose tail runs where it is moved: ``.to(device)`` is the finished float batch there.

    Lightning's transfer moves anything with a ``.to``; the user's code never sees this object (the patch
    defers only where no user hook runs before the transfer, ``train/device_tail.py``).
    """

    __slots__ = ("images", "spec", "erasures", "values")

    def __init__(self, images: Any, spec: TailSpec, erasures: list[list[Erasure | None]] | None = None,
                 values: Any = None) -> None:
        self.images, self.spec, self.erasures, self.values = images, spec, erasures, values

    def to(self, device: Any, *args: Any, **kwargs: Any) -> Any:
        # pinned (pin_memory=True): asynchronous, as Lightning moves stock's pinned float batch
        moved = self.images.to(device, non_blocking=bool(self.images.is_pinned()))
        return apply_tail(moved, self.spec, self.erasures, values=self.values)

    def pin_memory(self, device: Any = None) -> DeferredImages:
        values = None if self.values is None else self.values.pin_memory()
        return DeferredImages(self.images.pin_memory(), self.spec, self.erasures, values)

    @property
    def nbytes(self) -> int:
        return int(self.images.nbytes)

    def __repr__(self) -> str:
        return f"DeferredImages({tuple(self.images.shape)} uint8, tail {self.spec.describe()})"


def split_batch(batch: Any) -> tuple[Any, ErasedBatch | None, Callable[[Any], Any]] | None:
    """A recognised ``[images, labels...]`` batch: its uint8 images, their erasures (an :class:`ErasedBatch`, or
    None), and how to rebuild the batch with the images replaced; None for any other batch (left as it is)."""
    import torch

    def is_u8(t: Any) -> bool:
        return type(t) is torch.Tensor and t.dtype == torch.uint8 and t.dim() == 4

    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, ErasedBatch) and is_u8(first.images):
            images, erasures = first.images, first
        elif is_u8(first):
            images, erasures = first, None
        else:
            return None
        if hasattr(batch, "_fields"):
            return images, erasures, lambda x: type(batch)(x, *batch[1:])
        return images, erasures, lambda x: type(batch)([x, *batch[1:]])
    if is_u8(batch):
        return batch, None, lambda x: x
    return None
