"""One plan per ``Compose``: its steps run as kernels on the decoded array, worked out once.

The first time a stock ``Compose`` runs, :func:`plan_for` gives each of its transforms a runner.
The transforms the plan knows (exactly stock's classes, with stock's ``forward`` and
``get_params``) run on :class:`Pixels`: the image's array and the geometry not yet applied to it.
Any other transform, and any call whose arguments the plan does not handle, gets a ``FastImage``
(a PIL image, no copy) exactly as stock would give it its image, and splits the plan there. The
plan is kept per ``Compose`` and rebuilt when its list of transforms changes; parameters are read
from the transforms on every call, never cached.

Per image, what remains is what stock does that matters: each transform's own random draws
(``get_params``, ``torch.rand``), in stock's order, and one kernel call per operation. The tail
``ToTensor [+ Normalize]`` or ``PILToTensor [+ ConvertImageDtype(float) [+ Normalize]]`` is one table
lookup per channel, the tables being stock's own arithmetic run once on the 256 values.

The code is split as torchvision splits ``get_params`` from ``functional``:

- ``pixels.py``: the pixel types (:class:`Pixels`, :class:`JpegPixels`, :class:`Recording`) and the typed
  operations a draw writes down;
- ``steps.py``: the v1 step runners (crops, resizes, flips, ColorJitter, greys);
- ``policies.py``: the augmentation policies (v1, v2, timm);
- ``tensor_tail.py``: the tensor tail, recognised (the plan runs it as one table lookup per channel);
- this module: the plan that ties them to a ``Compose``;
- ``oprunner.py``: a recording's operations as one native call (``csrc/oplist.c``).
"""

from __future__ import annotations

import contextlib
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

from PIL import Image

from ... import forks, report
from ..images.image import FastImage
from . import tensor_tail
from .pixel_ops import RenderFailed, TensorTail  # noqa: F401 - (RenderFailed) where the batch loader finds it
from .pixels import DecodeFailed, JpegPixels, LeftPlan, Pixels, UseStock  # noqa: F401 - the same
from .policies import (
    POLICY_METHODS,
    run_augmix,
    run_auto_augment,
    run_rand_augment,
    run_timm_auto_augment,
    run_timm_rand_augment,
    run_trivial_augment_wide,
)
from .recording import NotSplittable, Recording, render  # noqa: F401 - (render) the same
from .steps import (
    NATIVE_DRAWS,
    run_center_crop,
    run_color_jitter,
    run_grayscale,
    run_hflip,
    run_random_crop,
    run_random_grayscale,
    run_random_resized_crop,
    run_resize,
    run_timm_random_resized_crop,
    run_vflip,
)
from .tensor_tail import PIL_TO_TENSOR, TO_TENSOR, Tail

_RUNNERS: dict[str, Callable[[Any, Pixels], Any]] = {
    "Resize": run_resize,
    "RandomResizedCrop": run_random_resized_crop,
    "CenterCrop": run_center_crop,
    "RandomCrop": run_random_crop,
    "RandomHorizontalFlip": run_hflip,
    "RandomVerticalFlip": run_vflip,
    "ColorJitter": run_color_jitter,
    "Grayscale": run_grayscale,
    "RandomGrayscale": run_random_grayscale,
    "RandomResizedCropAndInterpolation": run_timm_random_resized_crop,
    "AutoAugment": run_auto_augment,
    "RandAugment": run_rand_augment,
    "TrivialAugmentWide": run_trivial_augment_wide,
    "AugMix": run_augmix,
    "timm.RandAugment": run_timm_rand_augment,
    "timm.AutoAugment": run_timm_auto_augment,
}
#: Classes of other libraries the plan knows, recorded the first time a plan meets them:
#: (module, name). timm's transforms call torchvision's functional kernels with its own draws.
_OTHERS = {("timm.data.transforms", "RandomResizedCropAndInterpolation"), ("timm.data.transforms", "MaybeToTensor"),
           ("timm.data.transforms", "MaybePILToTensor"), ("timm.data.auto_augment", "RandAugment"),
           ("timm.data.auto_augment", "AutoAugment")}
#: The methods a known class must still have (stock's), or its instances run stock code.
_STOCK_METHODS: dict[type, dict[str, Any]] = {}
_CLASSES: dict[str, type] = {}


def configure(transforms: Any) -> None:
    """Record torchvision's classes and their stock methods (called by the patch when it applies)."""
    _STOCK_METHODS.clear()
    _CLASSES.clear()
    others = {name for module, name in _OTHERS if module != "timm.data.auto_augment"} | {
        "timm.RandAugment", "timm.AutoAugment"}
    for name in (*(n for n in _RUNNERS if n not in others), "ToTensor", "PILToTensor", "ConvertImageDtype",
                 "Normalize"):
        cls = getattr(transforms, name)
        _CLASSES[name] = cls
        _STOCK_METHODS[cls] = {m: vars(cls)[m] for m in ("forward", "__call__", "get_params", *POLICY_METHODS)
                               if m in vars(cls)}
    _plans.clear()


def _class_key(cls: type) -> str:
    """The name the plan knows a class by: timm's policies share torchvision's class names."""
    return f"timm.{cls.__name__}" if cls.__module__ == "timm.data.auto_augment" else cls.__name__


def _record_other(cls: type) -> None:
    if (cls.__module__, cls.__name__) in _OTHERS and _class_key(cls) not in _CLASSES:
        _CLASSES[_class_key(cls)] = cls
        _STOCK_METHODS[cls] = {m: vars(cls)[m] for m in ("forward", "__call__", "get_params") if m in vars(cls)}


def _is_stock(t: Any, name: str) -> bool:
    cls = _CLASSES.get(name)
    if cls is None or type(t) is not cls:
        return False
    own = vars(cls)
    for m, f in _STOCK_METHODS[cls].items():  # noqa: SIM110 - a loop, not all(genexpr): it runs per step per sample
        if own.get(m) is not f:
            return False
    return True


def _plan_step(t: Any, kind: str) -> bool:
    """The classes the plan counts as each tensor tail step (``tensor_tail.tail_kinds``): stock's, v1's and timm's."""
    if kind == TO_TENSOR:
        return _is_stock(t, "ToTensor") or _is_stock(t, "MaybeToTensor")
    if kind == PIL_TO_TENSOR:
        return _is_stock(t, "PILToTensor") or _is_stock(t, "MaybePILToTensor")
    return _is_stock(t, kind)  # ConvertImageDtype, Normalize (v2's ToDtype is no class of the plan)


def planned_tail(items: list[Any], i: int) -> Tail | None:
    """The tensor tail the plan runs from ``items[i]``, or None."""
    kinds = tensor_tail.tail_kinds(items, i, _plan_step)
    return Tail(items[i:i + len(kinds)], kinds) if kinds else None


# --- plans ----------------------------------------------------------------------------------


class Plan:
    """Per transform of a ``Compose``: its runner, a :class:`Tail` starting there, or None (stock)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        #: why a batch of this plan cannot draw apart from its pixels (set by ``data/batches/batch_loader.py``), or None
        self.unsplittable: str | None = None
        #: some samples' draws need their pixels (``data/batches/batch_loader.py`` then loads those one by one)
        self.sometimes_unsplittable: str | None = None
        self.runners: list[Callable[[Any, Pixels], Any] | None] = []
        self.tails: dict[int, Tail] = {}
        for i, t in enumerate(items):
            _record_other(type(t))
            name = _class_key(type(t))
            self.runners.append(_RUNNERS[name] if name in _RUNNERS and _is_stock(t, name) else None)
            if i not in self.tails and not any(i in range(j, j + len(tail)) for j, tail in self.tails.items()):
                tail = planned_tail(items, i)
                if tail is not None:
                    self.tails[i] = tail

    @property
    def crop_first(self) -> bool:
        """The first transform is a crop drawn from the image size alone: a JPEG need only decode its window."""
        return bool(self.runners) and 0 not in self.tails and self.runners[0] in _CROPS

    @property
    def draws_natively(self) -> bool:
        """Every step either draws nothing or draws what ``torch_draws`` makes natively (the tail included), so a
        batch's draw step may carry native draws through the plan."""
        return self.not_drawn_natively() is None

    def not_drawn_natively(self) -> str | None:
        """Why :attr:`draws_natively` is False: the first step whose draws are not made natively (None: none)."""
        covered = {k for j, tail in self.tails.items() for k in range(j, j + len(tail))}
        for i, r in enumerate(self.runners):
            if i not in covered and r not in NATIVE_DRAWS:
                kind = "stock code" if r is None else "draws not made natively"
                return f"`{type(self.items[i]).__name__}` at position {i} of the Compose ({kind})"
        return None if self.runners else "an empty Compose"

    def matches(self, items: list[Any]) -> bool:
        return len(items) == len(self.items) and all(map(operator.is_, items, self.items))

    def describe(self) -> list[str]:
        """What runs where, one entry per transform (for tests and the docs)."""
        out = []
        for i, t in enumerate(self.items):
            covering = [j for j, tail in self.tails.items() if j <= i < j + len(tail)]
            kind = "tail" if covering else ("native" if self.runners[i] else "stock")
            out.append(f"{type(t).__name__}: {kind}")
        return out


_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
#: Runners whose first act is a crop of a window drawn from the size (after checks made before any draw).
_CROPS = (run_random_resized_crop, run_timm_random_resized_crop, run_random_crop, run_center_crop)


def draws_from_python(compose: Any) -> bool:
    """The plan's first step draws from Python's ``random`` (timm's crops), not only from torch."""
    p = plan_for(compose)
    return bool(p.runners) and p.runners[0] is run_timm_random_resized_crop


def plan_for(compose: Any) -> Plan:
    """The plan of ``compose``, made on first use and kept while its list of transforms stays the same."""
    items = list(compose.transforms)
    with _plans_lock:  # loaders in several threads: a WeakKeyDictionary is not safe without the GIL
        plan = _plans.get(compose)
        if plan is None or not plan.matches(items):
            plan = Plan(items)
            with contextlib.suppress(TypeError):  # not weak-referenceable: planned on every call
                _plans[compose] = plan
    return plan


def run(compose: Any, img: Image.Image | Pixels, *, skip: int = 0, uint8_tail: bool = False) -> Any:
    """Apply ``compose`` (after its first ``skip`` transforms) to the PIL ``RGB``/``L`` image ``img``.

    ``uint8_tail``: the Compose ends in ``ToTensor [+ Normalize]`` and a DataLoader worker wants a
    uint8 C x H x W tensor in its place. A ``FastImage`` in gives a ``FastImage`` out; a plain PIL
    image gives a plain PIL image; a tail gives stock's tensor. ``img`` may also be :class:`Pixels`
    (a :class:`JpegPixels` not decoded yet): an image result is then a ``FastImage``.
    """
    recording = isinstance(img, Recording)
    shared = img.shared if recording else None
    if shared is not None:  # the run's recordings: no user code runs between their draws to change the Compose
        known = shared.get(id(compose))  # (the entry holds the Compose: its id is not reused during the run)
        if known is None or known[0] is not compose:
            known = shared[id(compose)] = (compose, plan_for(compose))
        plan = known[1]
    else:
        plan = plan_for(compose)
    items = plan.items
    stats = report.stats
    fast_in = isinstance(img, (FastImage, Pixels))
    x: Any = img if isinstance(img, Pixels) else Pixels.of(img)
    i = skip
    n = len(items)
    while i < n:
        t = items[i]
        if not isinstance(x, Pixels):
            x = t(x)
            i += 1
            continue
        tail = plan.tails.get(i)
        if tail is not None and (not uint8_tail or i + len(tail) == n):
            if recording:
                return _record_tail(x, tail, uint8_tail, i + len(tail) == n)
            out = tail.tensor_from(x, uint8_tail)
            if out is not None:
                if stats is not None:
                    stats.count("vision_transforms", True, " + ".join(type(s).__name__ for s in tail.steps))
                x = out
                i += len(tail)
                continue
        runner = plan.runners[i]
        if runner is not None:
            try:
                out = runner(t, x)
            except UseStock:
                pass
            except LeftPlan as left:
                x = left.value
                i += 1
                continue
            else:
                if isinstance(out, Pixels):
                    x = out
                if stats is not None:
                    stats.count("vision_transforms", True, type(t).__name__)
                i += 1
                continue
        # a stock step: it gets the image as stock would give it, and the plan resumes after it
        if recording:
            raise NotSplittable(f"`{type(t).__name__}` at position {i} of the Compose runs stock code", True)
        if stats is not None:
            stats.count("vision_transforms", False,
                        f"`{type(t).__name__}` at position {i} of the Compose: stock code (not in the plan)")
        result = t(x.image())
        x = Pixels.of(result) if isinstance(result, Image.Image) and result.mode in ("RGB", "L") else result
        i += 1
    if recording:
        x.end_in_image(fast_in)
        return x
    if isinstance(x, Pixels):
        out_img = x.image()
        return out_img if fast_in else out_img.to_plain()
    return x


def _record_tail(x: Recording, tail: Tail, uint8: bool, last: bool) -> Recording:
    """Write down the tensor tail, where the render can make it as :meth:`Tail.tensor_from` would."""
    if not last:
        raise NotSplittable("steps after the tensor tail run stock code on the tensor", True)
    key = (tail, uint8, 1 if x.mode == "L" else 3)
    shared = x.shared
    end = shared.get(key) if shared is not None else None
    if end is None:
        end = TensorTail(*key)
        if shared is not None:
            shared[key] = end
    if not end.to_bytes and end.table is None:
        raise NotSplittable("the tensor tail runs stock code", True)
    if report.stats is not None:
        report.stats.count("vision_transforms", True, " + ".join(type(s).__name__ for s in tail.steps))
    x.ops.append(end)
    return x


forks.fresh_in_child(globals(), _plans_lock=threading.Lock)
