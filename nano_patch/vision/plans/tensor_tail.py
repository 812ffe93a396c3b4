"""A Compose's tensor tail, recognised in one place: where it starts, what it is made of, and the sample it leaves
where it is split off.

The *tensor tail* turns a uint8 image into a float tensor, elementwise, per channel:

- ``ToTensor`` (v1; timm's ``MaybeToTensor``) [``Normalize``];
- ``PILToTensor`` (v1, v2, v2's ``ToImage``; timm's ``MaybePILToTensor``) alone (a uint8 tensor), or followed by
  its scaling, v1's ``ConvertImageDtype`` or v2's ``ToDtype``, [``Normalize``].

:func:`tail_kinds` reads that grammar at any place of a Compose's list of transforms, given which classes count as
each step (:data:`STEPS`). It has two users:

- the plan (``compose_plan.py``) counts exactly stock's v1 and timm classes, and runs a tail it finds anywhere in a
  Compose as one table lookup per channel, the tables being stock's own arithmetic run once on the 256 values
  (:class:`Tail`);
- a DataLoader that finishes the tail itself, on the whole batch (``data/tail/finish_tail.py``), splits off the float
  tail a Compose ends in, then only ``RandomErasing`` (v1 or v2), once or more (:func:`find_tail`, a
  :class:`TailSpec`): v1 ``ToTensor`` (``x.to(float32).div(255)``) or v2 ``ToImage``/``PILToTensor`` +
  ``ToDtype(float32, scale=True)`` (``x.to(float32).mul_(1 / 255)``), then ``Normalize`` (``sub``, ``div_``).

Where the tail is split off, the sample is the uint8 C x H x W image the tail would have started from, and each
``RandomErasing``'s draws are made right there, in stock's order, from stock's generators, on a stand-in of the
image's shape (its draws read the shape only): the rectangle and, for ``value="random"``, the normal values
(:func:`uint8_sample`, :class:`ErasedImage`).

A v2 Compose's end, ``[PILToTensor | ToImage,] ToDtype(float, scale=True)[, Normalize]`` on the patch's image or a
uint8 tensor, is one table lookup the same way (:class:`V2Tail`, for ``compose_v2.py``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from ..images.image import FastImage
from ..kernels import functional as K

#: The steps of a tensor tail, by kind.
TO_TENSOR, PIL_TO_TENSOR, CONVERT, TO_DTYPE, NORMALIZE = (
    "ToTensor", "PILToTensor", "ConvertImageDtype", "ToDtype", "Normalize")
#: Every kind, for the predicates that say which classes count as each.
STEPS = (TO_TENSOR, PIL_TO_TENSOR, CONVERT, TO_DTYPE, NORMALIZE)

#: ``is_step(transform, kind)``: whether ``transform`` counts as a tail step of that kind.
StepTest = Callable[[Any, str], bool]


def tail_kinds(items: list[Any], i: int, is_step: StepTest) -> tuple[str, ...]:
    """The kinds of the tensor tail that starts at ``items[i]``, each step's in order, or () where none does."""
    n = len(items)

    def at(k: int, kind: str) -> bool:
        return i + k < n and is_step(items[i + k], kind)

    if at(0, TO_TENSOR):
        return (TO_TENSOR, NORMALIZE) if at(1, NORMALIZE) else (TO_TENSOR,)
    if at(0, PIL_TO_TENSOR):
        for scale in (CONVERT, TO_DTYPE):
            if at(1, scale):
                return (PIL_TO_TENSOR, scale, NORMALIZE) if at(2, NORMALIZE) else (PIL_TO_TENSOR, scale)
        return (PIL_TO_TENSOR,)
    return ()


def value_probe(channels: int) -> Any:
    """Every uint8 value once per channel: the C x 1 x 256 uint8 tensor a tail's steps run on to make its table."""
    import torch

    return torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(channels, 1, 256).contiguous()


def probe_table(probe: Any) -> np.ndarray:
    """The C x 256 table the steps made of :func:`value_probe`'s values (``probe``, their output)."""
    import torch

    return probe.as_subclass(torch.Tensor)[:, 0, :].contiguous().numpy()


def normalize_constants(t: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A ``Normalize``'s mean and std as plain numbers; TypeError or ValueError where they are not numbers."""
    return tuple(float(m) for m in t.mean), tuple(float(s) for s in t.std)


# --- the plan's tail: a tensor tail anywhere in a Compose, as one table lookup ------------------------------------


class Tail:
    """A tensor tail at one position of a plan: its steps (stock's transforms) and their kinds."""

    def __init__(self, steps: list[Any], kinds: tuple[str, ...]) -> None:
        self.steps = steps
        self.kinds = kinds
        self.tables: dict[tuple[Any, ...], np.ndarray | None] = {}

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def to_tensor(self) -> bool:
        return self.kinds[0] == TO_TENSOR

    def _key(self, channels: int) -> tuple[Any, ...] | None:
        import torch

        key: list[Any] = [channels, torch.get_default_dtype() if self.to_tensor else None]
        for t, kind in zip(self.steps[1:], self.kinds[1:]):
            if kind == CONVERT:
                key.append(t.dtype)
            else:  # Normalize: the constants as plain numbers, or no table
                try:
                    key.append((*normalize_constants(t), t.inplace))
                except (TypeError, ValueError):
                    return None
        return tuple(key)

    def table(self, channels: int) -> np.ndarray | None:
        """The C x 256 float table of this tail for ``channels`` input channels, or None (run stock)."""
        key = self._key(channels)
        if key is None:
            return None
        if key not in self.tables:
            self.tables[key] = self._probe(channels)
        return self.tables[key]

    def _probe(self, channels: int) -> np.ndarray | None:
        import torch

        x = value_probe(channels)
        if self.to_tensor:
            x = x.to(dtype=torch.get_default_dtype()).div(255)  # ToTensor's own arithmetic on a uint8 image
        try:
            for t in self.steps[1:]:
                x = t(x)  # stock ConvertImageDtype / Normalize: their arithmetic, their errors
        except Exception:  # noqa: BLE001 - stock raises again, per image, in its own words
            return None
        if type(x) is not torch.Tensor or x.dtype not in (torch.float32, torch.float64) or x.dim() != 3:
            return None
        return probe_table(x)

    def tensor_from(self, px: Any, uint8: bool) -> Any:
        """This tail's tensor of the plan's pixels ``px``, in stock's layout, or None where stock must run it."""
        a = px.array()
        if uint8 or len(self) == 1 and not self.to_tensor:
            # PILToTensor (or the uint8 stand-in for ToTensor): a C x H x W view of H x W x C pixels
            return K.pil_to_tensor(a, owned=px.owned)
        table = self.table(1 if a.ndim == 2 else 3)
        if table is None:
            return None
        if self.to_tensor:
            return K.image_through_tables(a, table)  # ToTensor makes C x H x W contiguous
        return K.pixels_through_tables(a, table)  # after PILToTensor stock keeps the channels-last strides


# --- v2's tail: a v2 Compose's end on the patch's image or a uint8 tensor, as one lookup -------------------------


class V2Tail:
    """The end of a v2 pipeline that turns a uint8 image into a normalised float tensor, as one lookup.

    ``[PILToTensor | ToImage,] ToDtype(float, scale=True)[, Normalize]`` is elementwise and per
    channel, and a uint8 pixel has 256 values: the stock transforms themselves are run once on a
    C x 1 x 256 probe of every value, and each plane of the image is then one table lookup. The
    output is stock's, bit for bit, with stock's type (``tv_tensors.Image`` or a plain tensor).
    """

    def __init__(self, v2: ModuleType) -> None:
        from torchvision import tv_tensors

        self.v2 = v2
        self.image_type = tv_tensors.Image
        self.tables: dict[tuple[Any, ...], Any] = {}

    def takes_tensor(self, x: Any) -> bool:
        import torch

        return (
            type(x) in (torch.Tensor, self.image_type) and x.dtype == torch.uint8 and x.ndim == 3
            and x.shape[0] in (1, 3) and x.device.type == "cpu"
        )

    def run(self, steps: list[Any], x: Any) -> Any:
        """``steps`` (the rest of a Compose) on ``x`` as one lookup, where they are this tail; else None."""
        import torch

        v2 = self.v2
        if not steps:
            return None
        if isinstance(x, FastImage):
            if type(steps[0]) not in (v2.PILToTensor, v2.ToImage):
                return None
            probe_type = self.image_type if type(steps[0]) is v2.ToImage else None
            rest, planes = steps[1:], None  # stock keeps the image's channels-last strides here
            channels = 1 if x.mode == "L" else 3
        elif self.takes_tensor(x) and x.is_contiguous():
            probe_type = self.image_type if type(x) is self.image_type else None
            rest, channels = steps, int(x.shape[0])
            planes = lambda: [p.numpy() for p in x.as_subclass(torch.Tensor)]  # noqa: E731
        else:
            return None
        key = self._key(rest, channels, probe_type)
        if key is None:
            return None
        table, out_type = self.tables.get(key) or self._table(rest, channels, probe_type, key)
        if table.shape[0] != channels and channels != 1:
            return None
        if planes is None and table.shape[0] == channels:
            out = K.pixels_through_tables(K.from_pil(x), table)
        elif planes is None:  # a grey image normalised to three channels: stock broadcasts into a new tensor
            out = K.image_through_tables(K.from_pil(x), table)
        else:
            out = K.planes_through_tables(planes(), table)
        return out if out_type is None else out_type(out)

    def _key(self, rest: list[Any], channels: int, probe_type: Any) -> tuple[Any, ...] | None:
        import torch

        v2 = self.v2
        if not 1 <= len(rest) <= 2 or type(rest[0]) is not v2.ToDtype:
            return None
        to_dtype = rest[0]
        if to_dtype.dtype not in (torch.float32, torch.float64) or to_dtype.scale is not True:
            return None
        key: tuple[Any, ...] = (to_dtype.dtype, channels, probe_type)
        if len(rest) == 2:
            norm = rest[1]
            if type(norm) is not v2.Normalize:
                return None
            key += normalize_constants(norm)
        return key

    def _table(self, rest: list[Any], channels: int, probe_type: Any, key: tuple[Any, ...]) -> tuple[Any, Any]:
        import torch

        probe = value_probe(channels)
        if probe_type is not None:
            probe = probe_type(probe)
        for t in rest:
            probe = t(probe)  # stock code: its arithmetic, its errors
        out_type = type(probe) if type(probe) is not torch.Tensor else None
        table = probe_table(probe)
        if len(self.tables) > 64:
            self.tables.clear()
        self.tables[key] = (table, out_type)
        return table, out_type


# --- the tail split off a Compose: what finishes a uint8 batch ----------------------------------------------------

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


def _v1() -> Any:
    return sys.modules.get("torchvision.transforms")


def _v2() -> Any:
    return sys.modules.get("torchvision.transforms.v2")


def _is(t: Any, module: Any, name: str) -> bool:
    return module is not None and type(t) is getattr(module, name, None)


def _is_eraser(t: Any) -> bool:
    return _is(t, _v1(), "RandomErasing") or _is(t, _v2(), "RandomErasing")


def _split_step(t: Any, kind: str) -> bool:
    """The classes whose tail a DataLoader splits off: v1's ``ToTensor`` (timm's ``MaybeToTensor``), v2's
    ``ToImage``/``PILToTensor`` + ``ToDtype``, and either's ``Normalize``."""
    if kind == TO_TENSOR:
        return _is(t, _v1(), "ToTensor") or _is(t, sys.modules.get("timm.data.transforms"), "MaybeToTensor")
    if kind == PIL_TO_TENSOR:
        return _is(t, _v2(), "ToImage") or _is(t, _v2(), "PILToTensor")
    if kind == TO_DTYPE:
        return _is(t, _v2(), "ToDtype")
    if kind == NORMALIZE:
        # v1's normalize (clone, sub_, div_) and v2's (sub, div_) make the same float32 operations
        return _is(t, _v1(), "Normalize") or _is(t, _v2(), "Normalize")
    return False


def _normalize_constants(t: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    try:
        mean, std = normalize_constants(t)
    except (TypeError, ValueError):
        return None
    # RGB images (three channels): constants stock broadcasts as it would per image; std 0 raises in stock
    if len(mean) not in (1, 3) or len(std) not in (1, 3) or 0.0 in std:
        return None
    return mean, std


def find_tail(compose: Any) -> TailSpec | None:
    """The float tensor tail ``compose`` ends in (then only ``RandomErasing``), as a DataLoader splits it off; or
    None."""
    import torch

    if torch.get_default_dtype() != torch.float32:
        return None
    items = list(getattr(compose, "transforms", ()))
    erasers = 0
    while items and _is_eraser(items[-1]):
        items.pop()
        erasers += 1
    n = len(items)
    for start in range(max(0, n - 3), n):
        kinds = tail_kinds(items, start, _split_step)
        if start + len(kinds) == n:
            break
    else:
        return None
    mean = std = None
    if kinds[-1] == NORMALIZE:
        constants = _normalize_constants(items[-1])
        if constants is None:
            return None
        mean, std = constants
    if kinds[0] == TO_TENSOR:
        scale = V1_DIV
    elif kinds[1:2] == (TO_DTYPE,):
        to_dtype = items[start + 1]
        if to_dtype.dtype is not torch.float32 or to_dtype.scale is not True:
            return None
        scale = V2_MUL
        v1 = _v1()
        if v1 is not None and isinstance(compose, v1.Compose):
            return None  # the v1 Compose's plan knows v1's tail only
    else:
        return None  # a uint8 tail: nothing to finish
    names = tuple(type(t).__name__ for t in list(compose.transforms)[start:])
    return TailSpec(scale, mean, std, start, erasers, names=names)


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
