"""An array dataset's Compose as one gather per sample: pads, crops and flips as row and column maps, the draws of a
whole batch in one native call, ToTensor and Normalize as one table (``csrc/array_gather.c``).

The steps it takes, each only as its stock class (a subclass may draw or render its own way), with stock's PIL
semantics on an image whose size every sample shares (an array dataset's):

- ``Pad`` and ``RandomCrop``'s ``padding`` / ``pad_if_needed``: numpy's ``np.pad`` per axis for ``edge``, ``reflect``
  and ``symmetric`` (what torchvision's PIL pad calls), PIL's ``ImageOps.expand`` for ``constant`` (the fill around
  the image); non-negative paddings, a fill of plain integers 0-255, one fill for the whole pipeline;
- ``RandomCrop``'s draws (``get_params``: none where the image is the crop's size, else two ``torch.randint``) and
  its crop; ``CenterCrop`` (its zero padding where the crop is larger, then its rounded offsets);
- ``RandomHorizontalFlip`` / ``RandomVerticalFlip``: ``torch.rand(1) < p``, then the flip;
- the tail, last: ``ToTensor`` [``Normalize``], stock's float results as a table per channel
  (``tensor_tail.Tail``), in the default float dtype (float32 or float64) as ToTensor makes it.

Every one of these only chooses, for each output pixel, which source pixel it copies (or the fill): a sample is its
source read through one row map and one column map. Anything else (another step, a parameter stock would reject, a
crop larger than the image) has no plan: stock's code runs, and raises where stock raises.

A plan is made per batch from the transform's parameters as they are then (a user may edit them between batches),
and its maps are kept per set of draws while those parameters stay the same.
"""

from __future__ import annotations

import numbers
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import tensor_tail

#: ``np.pad``'s modes that torchvision's PIL pad takes (``constant`` is PIL's expand)
PAD_MODES = ("constant", "edge", "reflect", "symmetric")
#: draw kinds of the native batch draw (``torch_draws.TorchDraws.batch``)
RANDINT, BELOW = 0.0, 1.0


class NoPlan(Exception):
    """The pipeline, or its parameters now, are not one the gather reproduces: stock's code runs."""


@dataclass
class ArrayPlan:
    """A Compose's pipeline on images of one size: the geometry's steps (with their parameters as read), the draw
    program of one sample, the output's size and the tail's table."""

    #: the steps: ("pad", top, bottom, left, right, mode) | ("crop", draw slot or None, th, tw) |
    #: ("center", top, left, th, tw) | ("hflip", draw slot) | ("vflip", draw slot)
    steps: tuple[tuple[Any, ...], ...]
    #: per sample, the draws in stock's order: float64 triples (kind, a, b)
    program: np.ndarray
    out_hw: tuple[int, int]
    #: the constant pads' fill, per source channel (uint8)
    fill: bytes
    table: np.ndarray
    #: stock's strides of one sample's tensor (ToTensor's on a one-channel image differ on the size-1 dimension)
    sample_strides: tuple[int, ...]
    #: the maps of the source image itself: every row, every column
    start_maps: tuple[np.ndarray, np.ndarray]
    #: the largest box PIL's ``Image.crop`` checks against ``MAX_IMAGE_PIXELS`` (a crop that is not the whole image),
    #: as its check counts it; 0 where no step crops
    crop_pixels: int
    #: maps made so far: draws -> (row map offset, column map offset) into ``maps``
    offsets: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)
    maps: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def draws_per_sample(self) -> int:
        return len(self.program) // 3

    def offsets_of(self, draws: np.ndarray) -> np.ndarray:
        """Per sample (a row of ``draws``), the offsets of its row and column maps in :attr:`maps` (made where new)."""
        keys = list(map(tuple, draws.tolist())) if draws.shape[1] else [()] * len(draws)
        offsets = self.offsets
        missing = [k for k in dict.fromkeys(keys) if k not in offsets]
        if missing:
            with self.lock:
                parts, start = [self.maps], len(self.maps)
                for key in missing:
                    rows, cols = self.geometry(key)
                    offsets[key] = (start, start + len(rows))
                    parts += [rows, cols]
                    start += len(rows) + len(cols)
                self.maps = np.concatenate(parts).astype(np.int32, copy=False)
        return np.array([offsets[k] for k in keys], np.int64).reshape(len(keys), 2)

    def geometry(self, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The row and column maps of a sample whose draws are ``key``."""
        rows, cols = self.start_maps
        for step in self.steps:
            kind = step[0]
            if kind == "pad":
                _, top, bottom, left, right, mode = step
                rows, cols = pad_map(rows, top, bottom, mode), pad_map(cols, left, right, mode)
            elif kind == "crop":
                _, slot, th, tw = step
                i, j = (0, 0) if slot is None else (key[slot], key[slot + 1])
                rows, cols = rows[i:i + th], cols[j:j + tw]
            elif kind == "center":
                _, top, left, th, tw = step
                rows, cols = rows[top:top + th], cols[left:left + tw]
            elif kind == "hflip":
                cols = cols[::-1] if key[step[1]] else cols
            else:
                rows = rows[::-1] if key[step[1]] else rows
        return np.ascontiguousarray(rows, np.int32), np.ascontiguousarray(cols, np.int32)


def pad_map(index: np.ndarray, before: int, after: int, mode: str) -> np.ndarray:
    """``index`` (source rows or columns, -1 the fill) padded as ``np.pad`` pads an axis of pixels in ``mode`` (the
    fill for ``constant``): padding the map is padding the pixels, one gather per axis."""
    if before == 0 and after == 0:
        return index
    if mode == "constant":
        return np.concatenate([np.full(before, -1, np.int32), index, np.full(after, -1, np.int32)])
    return index[np.pad(np.arange(len(index)), (before, after), mode)]


def _plain_int(v: Any) -> bool:
    return type(v) is int


def _pad_sides(padding: Any) -> tuple[int, int, int, int]:
    """torchvision's PIL pad's reading of ``padding``: (top, bottom, left, right); NoPlan for anything else (negative
    sides crop there, which the plan leaves to stock)."""
    if isinstance(padding, list):
        padding = tuple(padding)
    if _plain_int(padding):
        sides = (padding,) * 4
    elif isinstance(padding, tuple) and len(padding) == 1 and _plain_int(padding[0]):
        sides = (padding[0],) * 4
    elif isinstance(padding, tuple) and len(padding) == 2 and all(map(_plain_int, padding)):
        sides = (padding[1], padding[1], padding[0], padding[0])
    elif isinstance(padding, tuple) and len(padding) == 4 and all(map(_plain_int, padding)):
        sides = (padding[1], padding[3], padding[0], padding[2])
    else:
        raise NoPlan("a padding that is not plain non-negative integers")
    if min(sides) < 0:
        raise NoPlan("a negative padding")
    return sides  # type: ignore[return-value]


def _fill_of(fill: Any, channels: int) -> bytes:
    """torchvision's ``_parse_fill`` of a plain number or sequence, as the uint8 value per channel."""
    if isinstance(fill, bool) or fill is None:
        raise NoPlan("a fill that is not a plain number")
    values = (fill,) * channels if isinstance(fill, numbers.Number) else tuple(fill) \
        if isinstance(fill, (tuple, list)) else None
    if values is not None and len(values) == 1:
        values = values * channels
    if values is None or len(values) != channels or not all(type(v) in (int, float) for v in values):
        raise NoPlan("a fill that is not one plain number per channel")
    ints = [int(v) for v in values]  # (the PIL pad takes int() of each, as PIL's expand does)
    if not all(0 <= v <= 255 for v in ints):
        raise NoPlan("a fill outside 0-255")
    return bytes(ints)


class _Geometry:
    """The pipeline's geometric steps read one by one, with the image's size as it goes."""

    def __init__(self, hw: tuple[int, int], channels: int) -> None:
        self.h, self.w = hw
        self.channels = channels
        self.steps: list[tuple[Any, ...]] = []
        self.program: list[float] = []
        self.fills: set[bytes] = set()
        self.crop_pixels = 0

    def cropped(self, th: int, tw: int) -> None:
        """A crop of ``th`` x ``tw`` from the image as it is now: PIL's ``crop`` checks its box's size against
        ``MAX_IMAGE_PIXELS`` unless the box is the whole image."""
        if (th, tw) != (self.h, self.w):
            self.crop_pixels = max(self.crop_pixels, max(1, th) * max(1, tw))

    def pad(self, padding: Any, fill: Any, mode: Any) -> None:
        if type(mode) is not str or mode not in PAD_MODES:
            raise NoPlan(f"padding_mode {mode!r}")
        top, bottom, left, right = _pad_sides(padding)
        if mode == "constant":
            self.fills.add(_fill_of(fill, self.channels))
        elif mode == "reflect" and (self.h < 2 and top + bottom or self.w < 2 and left + right):
            raise NoPlan("reflect padding of a side one pixel long")  # (numpy's own rule: leave it to stock)
        self.steps.append(("pad", top, bottom, left, right, mode))
        self.h, self.w = self.h + top + bottom, self.w + left + right

    def random_crop(self, t: Any) -> None:
        size = t.size
        if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(map(_plain_int, size))):
            raise NoPlan("a crop size that is not two plain integers")
        th, tw = size
        if t.padding is not None:
            self.pad(t.padding, t.fill, t.padding_mode)
        if t.pad_if_needed is True and self.w < tw:
            self.pad([tw - self.w, 0], t.fill, t.padding_mode)
        elif t.pad_if_needed not in (True, False):
            raise NoPlan("pad_if_needed that is not a bool")
        if t.pad_if_needed and self.h < th:
            self.pad([0, th - self.h], t.fill, t.padding_mode)
        if self.h < th or self.w < tw or th < 1 or tw < 1:
            raise NoPlan("a crop larger than the image")  # (stock raises ValueError)
        self.cropped(th, tw)
        if self.h == th and self.w == tw:
            self.steps.append(("crop", None, th, tw))
        else:
            slot = len(self.program) // 3
            self.program += [RANDINT, 0, self.h - th + 1, RANDINT, 0, self.w - tw + 1]
            self.steps.append(("crop", slot, th, tw))
        self.h, self.w = th, tw

    def center_crop(self, t: Any) -> None:
        size = t.size
        if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(map(_plain_int, size))):
            raise NoPlan("a crop size that is not two plain integers")
        th, tw = size
        if th < 1 or tw < 1:
            raise NoPlan("an empty crop")
        if tw > self.w or th > self.h:  # F.center_crop pads with 0 first
            pads = [(tw - self.w) // 2 if tw > self.w else 0, (th - self.h) // 2 if th > self.h else 0,
                    (tw - self.w + 1) // 2 if tw > self.w else 0, (th - self.h + 1) // 2 if th > self.h else 0]
            self.pad(pads, 0, "constant")
            if self.h == th and self.w == tw:
                return
        top, left = int(round((self.h - th) / 2.0)), int(round((self.w - tw) / 2.0))
        self.cropped(th, tw)
        self.steps.append(("center", top, left, th, tw))
        self.h, self.w = th, tw

    def flip(self, t: Any, kind: str) -> None:
        p = t.p
        if type(p) not in (int, float) or not 0 <= p <= 1:
            raise NoPlan("a flip probability that is not a plain number in [0, 1]")
        slot = len(self.program) // 3
        self.program += [BELOW, float(p), 0]
        self.steps.append((kind, slot))


def plan_of(transforms: Any, compose: Any, hw: tuple[int, int], channels: int,
            tails: weakref.WeakKeyDictionary[Any, tensor_tail.Tail]) -> ArrayPlan:
    """The plan of ``compose`` (a stock v1 Compose) on images of ``hw`` with ``channels``, from its parameters as
    they are now; NoPlan where there is none. ``transforms``: torchvision.transforms; ``tails``: the caller's kept
    ``tensor_tail.Tail`` per Compose (its tables are kept there)."""
    steps = compose.transforms
    if not isinstance(steps, list) or not steps:
        raise NoPlan("a Compose whose transforms are not a list")
    geometry = _Geometry(hw, channels)
    cut = len(steps) - 2 if len(steps) >= 2 and type(steps[-1]) is transforms.Normalize else len(steps) - 1
    if cut < 0 or type(steps[cut]) is not transforms.ToTensor:
        raise NoPlan("a pipeline that does not end in ToTensor [Normalize]")
    for t in steps[:cut]:
        kind = type(t)
        if kind is transforms.RandomCrop:
            geometry.random_crop(t)
        elif kind is transforms.Pad:
            geometry.pad(t.padding, t.fill, t.padding_mode)
        elif kind is transforms.CenterCrop:
            geometry.center_crop(t)
        elif kind is transforms.RandomHorizontalFlip:
            geometry.flip(t, "hflip")
        elif kind is transforms.RandomVerticalFlip:
            geometry.flip(t, "vflip")
        else:
            raise NoPlan(f"a {kind.__name__} step")
    if len(geometry.fills) > 1:
        raise NoPlan("constant pads of different fills")
    tail_steps = steps[cut:]
    tail = tails.get(compose)
    if tail is None or len(tail.steps) != len(tail_steps) or any(a is not b for a, b in zip(tail.steps, tail_steps)):
        kinds = (tensor_tail.TO_TENSOR, tensor_tail.NORMALIZE)[:len(tail_steps)]
        tail = tails[compose] = tensor_tail.Tail(list(tail_steps), kinds)
    table = tail.table(channels)
    if table is None:
        raise NoPlan("a tail stock's own code must run (its constants, or the default dtype)")
    fill = geometry.fills.pop() if geometry.fills else bytes(channels)
    steps_read = tuple(geometry.steps)
    program = tuple(geometry.program)
    signature = (hw, channels, steps_read, program, fill, id(table), table.dtype, geometry.crop_pixels)
    with _plans_lock:
        found = _plans.get(signature)
        if found is not None and found[0] is table:  # (the table itself: its id is not reused while it is kept)
            return found[1]
    plan = ArrayPlan(steps_read, np.array(program, np.float64), (geometry.h, geometry.w), fill,
                     np.ascontiguousarray(table), _sample_strides(geometry.h, geometry.w, channels),
                     (np.arange(hw[0], dtype=np.int32), np.arange(hw[1], dtype=np.int32)), geometry.crop_pixels)
    with _plans_lock:
        if len(_plans) >= _PLANS_KEPT:  # (parameters drawn anew each batch: unusual; keep the table small)
            _plans.clear()
        _plans[signature] = (table, plan)
    return plan


#: plans by what they were made from: a pipeline's maps are made once, not per batch
_plans: dict[tuple[Any, ...], tuple[np.ndarray, ArrayPlan]] = {}
_plans_lock = threading.Lock()
_PLANS_KEPT = 64


_strides_made: dict[tuple[int, int, int], tuple[int, ...]] = {}


def _sample_strides(h: int, w: int, channels: int) -> tuple[int, ...]:
    """The strides of ToTensor's output (then Normalize's, which keeps them) for this shape, as stock makes it: its
    ``permute(2, 0, 1).contiguous()`` leaves a one-channel image's size-1 dimension with the stride it had."""
    key = (h, w, channels)
    found = _strides_made.get(key)
    if found is None:
        import torch

        x = torch.zeros((h, w, channels), dtype=torch.uint8).permute(2, 0, 1).contiguous()
        found = _strides_made[key] = tuple(x.stride())
    return found
