"""Finishing a uint8 batch: the tensor tail's float32 operations on the whole batch, in stock's order.

Where a DataLoader splits the tensor tail off its samples (``vision/plans/tensor_tail.py``: the sample is the uint8
image the tail starts from, with ``RandomErasing``'s draws), :func:`apply_tail` makes, on the collated batch, the very
operations stock makes per image: on the CPU (``data/tail/uint8_batches.py``, the main process) or on the device after
the transfer (:class:`DeferredImages`, which ``train/tail_deferral.py`` lets through to Lightning's transfer).

Bits: every operation is one correctly rounded float32 ``/``, ``*`` or ``-`` per element, as stock makes it per
image. One trap: CUDA's ``div`` by a *CPU scalar* multiplies by the reciprocal (``BinaryDivTrueKernel.cu``), which
is not ``x / 255``; so the divisors here are always tensors on the batch's device, where CUDA divides.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import forks
from ...registry import AttributeRecord
from ...vision.plans.tensor_tail import V1_DIV, V2_MUL, ErasedImage, Erasure, TailSpec


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


def register_collate(record: AttributeRecord | None = None) -> None:
    """Let ``default_collate`` stack :class:`ErasedImage` (only this private type is added). ``record``: the
    patch's record, which takes it out again at revert; without one (a DataLoader worker process, which ends with
    its loader) it stays."""
    from torch.utils.data._utils import collate

    fn_map = collate.default_collate_fn_map
    if fn_map.get(ErasedImage) is collate_erased:
        return
    if record is not None:
        record.replace_item(fn_map, ErasedImage, collate_erased)
    else:
        fn_map.setdefault(ErasedImage, collate_erased)


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
    defers only where no user hook runs before the transfer, ``train/tail_deferral.py``).
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


forks.fresh_in_child(globals(), _constants_lock=threading.Lock)
