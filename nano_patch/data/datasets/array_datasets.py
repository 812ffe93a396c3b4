"""torchvision's array datasets (CIFAR10/100, SVHN, STL10, MNIST, FashionMNIST, KMNIST, EMNIST, QMNIST): a batch
in one native call where stock's loop runs ``__getitem__`` per index.

These datasets hold every image in one uint8 array; stock's ``__getitem__`` makes a PIL image of one
(``Image.fromarray``), runs the transform and the ``target_transform``. Their tutorials' transforms (pads, crops and
flips, ``ToTensor``, ``Normalize``) are ``vision/plans/array_plan.py``'s plan: the batch's draws in one native call,
its pixels gathered into the batch tensor in another (``csrc/array_gather.c``), the batch handed to the fetch's
collation as one tensor (``data/collate.py``). Per sample, Python reads the target only.

What stock's ``__getitem__`` reads per sample, and where the batch reads the same:

- the class's ``__getitem__``: the stock function (a subclass that overrides it, or a class whose function was
  replaced, is not routed here: ``data/fetch.py`` and :func:`route`);
- ``data`` (``labels`` / ``targets``), ``transform``, ``target_transform``, and QMNIST's ``compat``: plain instance
  attributes (no property or ``__getattribute__`` of a subclass runs: one read per batch would run it fewer times
  than stock's per sample), of the types stock's expressions read as this path assumes (a uint8 array of the
  class's layout; targets as below); anything else is stock's loop;
- each target by stock's own expression (``targets[i]``, ``int(targets[i])``, ``int(labels[i])``, QMNIST's
  ``int(targets[i][0])`` where ``compat``), or its exact vectorised equal (``tolist()`` of an integer array);
- the index: ints (Python's or NumPy's) within the data's length (a negative one counted from the end, as numpy
  does); any other index is stock's loop, which raises stock's error;
- the transform's steps and parameters, read once per batch when no user code runs in it (no ``target_transform``);
  with a ``target_transform``, everything above is read again before each sample, and the sample is drawn and
  gathered before its ``target_transform`` runs, so user code between samples sees, and may change, what stock's
  would;
- PIL's ``MAX_IMAGE_PIXELS`` (read per batch: a crop's box over it is stock's loop, which warns or raises);
- torch's default generator (the draws, from a native copy written back: another thread's draw meanwhile makes the
  batch draw again), the default dtype (ToTensor's output) and device (where torch's draws are not the CPU
  generator's, stock's loop runs).

No plan (another transform, a parameter stock rejects, labels of ``None``): stock's loop, and the run report says
why.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import report
from ...vision.kernels import native, torch_draws
from ...vision.plans import array_plan, batch_memory, compose_call
from ...vision.plans.batch_slots import mark_slot
from .. import collate
from ..threads import loader_threads

#: a batch's draws from torch's generator copy: tries before stock's loop draws instead (another thread drawing)
_DRAW_ATTEMPTS = 3


@dataclass(frozen=True)
class Layout:
    """How a class's ``__getitem__`` reads sample ``i``: its images as N x H x W [x C] uint8 (what
    ``Image.fromarray`` sees), its targets, and the instance attributes it reads."""

    images: Callable[[Any], np.ndarray | None]
    targets: Callable[[Any, list[int]], list[Any]]
    attributes: tuple[str, ...]


def _numpy_images(dataset: Any) -> np.ndarray | None:
    """CIFAR's ``data``: N x H x W x 3 uint8 (``Image.fromarray(data[i])``: RGB)."""
    d = dataset.data
    if type(d) is np.ndarray and d.dtype == np.uint8 and d.ndim == 4 and d.shape[3] == 3:
        return d
    return None


def _chw_images(dataset: Any) -> np.ndarray | None:
    """SVHN's and STL-10's ``data``: N x 3 x H x W uint8, read as ``np.transpose(data[i], (1, 2, 0))``."""
    d = dataset.data
    if type(d) is np.ndarray and d.dtype == np.uint8 and d.ndim == 4 and d.shape[1] == 3:
        return d.transpose(0, 2, 3, 1)
    return None


def _tensor_images(dataset: Any) -> np.ndarray | None:
    """The MNIST family's ``data``: an N x H x W uint8 CPU tensor (``data[i].numpy()``, mode "L")."""
    import torch

    d = dataset.data
    if type(d) is torch.Tensor and d.dtype == torch.uint8 and d.dim() == 3 and d.device.type == "cpu":
        return d.numpy()
    return None


def _listed(dataset: Any, indices: list[int]) -> list[Any]:
    """CIFAR: ``self.targets[index]``, as it is."""
    t = dataset.targets
    return [t[i] for i in indices]


def _as_ints(values: Any, indices: list[int]) -> list[int]:
    """``int(values[i])`` per index; an integer array's ``tolist()`` where it gives the same ints."""
    import torch

    if type(values) is torch.Tensor and values.dim() == 1 and values.device.type == "cpu" and values.dtype in (
            torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        return values[indices].tolist()
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind in "iu":
        return values[indices].tolist()
    return [int(values[i]) for i in indices]


def _int_targets(dataset: Any, indices: list[int]) -> list[int]:
    """MNIST: ``int(self.targets[index])``."""
    return _as_ints(dataset.targets, indices)


def _int_labels(dataset: Any, indices: list[int]) -> list[int]:
    """SVHN, STL-10: ``int(self.labels[index])`` (STL-10's unlabeled split, labels None: stock's loop)."""
    labels = dataset.labels
    if labels is None:
        raise array_plan.NoPlan("labels of None")
    return _as_ints(labels, indices)


def _qmnist_targets(dataset: Any, indices: list[int]) -> list[Any]:
    """QMNIST: ``self.targets[index]``, then ``int(target[0])`` where ``self.compat``."""
    t = dataset.targets
    if dataset.compat:
        return [int(t[i][0]) for i in indices]
    return [t[i] for i in indices]


#: class name -> how its stock ``__getitem__`` reads a sample (the MNIST family's subclasses inherit MNIST's)
LAYOUTS = {
    "CIFAR10": Layout(_numpy_images, _listed, ("data", "targets")),
    "SVHN": Layout(_chw_images, _int_labels, ("data", "labels")),
    "STL10": Layout(_chw_images, _int_labels, ("data", "labels")),
    "MNIST": Layout(_tensor_images, _int_targets, ("data", "targets")),
    "QMNIST": Layout(_tensor_images, _qmnist_targets, ("data", "targets", "compat")),
}
_COMMON = ("transform", "target_transform")

#: per Compose, its tensor tail (the tables are kept there)
_tails: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
#: per class: whether its instances' attributes are read plainly (no descriptor or __getattribute__ of its own)
_plain_classes: dict[tuple[type, tuple[str, ...]], bool] = {}
_lock = threading.Lock()


def _plain_reads(dataset: Any, names: tuple[str, ...]) -> bool:
    """Whether reading ``names`` on ``dataset`` runs no code of a class: each is in the instance's ``__dict__``, no
    class of its MRO defines it, and ``__getattribute__`` is object's."""
    cls = type(dataset)
    key = (cls, names)
    plain = _plain_classes.get(key)
    if plain is None:
        plain = cls.__getattribute__ is object.__getattribute__ and not any(
            name in vars(klass) for klass in cls.__mro__ for name in names)
        with _lock:
            _plain_classes[key] = plain
    if not plain:
        return False
    own = getattr(dataset, "__dict__", None)
    return own is not None and all(name in own for name in names)


def route(cls: type, layout: Layout) -> Callable[[Any, list[Any]], list[Any] | None]:
    """The batch route of ``cls`` (``data/fetch.py``): the batch made here, or None (nothing ran: stock's loop)."""
    stock_getitem = vars(cls)["__getitem__"]
    names = layout.attributes + _COMMON

    def getitems(dataset: Any, indices: list[Any]) -> list[Any] | None:
        if type(dataset).__getitem__ is not stock_getitem or not loader_threads.batch_path_on():
            return None
        why = _why_not(dataset, names)
        if why is None:
            try:
                return _load(dataset, indices, layout, names)
            except array_plan.NoPlan as exc:
                why = str(exc)
        if report.stats is not None:
            report.count("dataloader", False, f"{type(dataset).__name__}: batch loaded one by one: {why}")
        return None

    return getitems


def _why_not(dataset: Any, names: tuple[str, ...]) -> str | None:
    if not _plain_reads(dataset, names):
        return "its attributes are not plain instance attributes"
    if not native.available("array_gather") or not native.available("torch_draws"):
        return "the native array kernels are not in use"
    from torchvision import transforms

    if not compose_call.behaves_as(dataset.transform, transforms.Compose):
        return "the transform is not a torchvision Compose"
    return None


def _indices(indices: list[Any], n: int) -> list[int]:
    """The batch's indices as ints in [0, n), read as numpy and a list read them (a negative one from the end);
    NoPlan for anything else (a bool, a tensor, a slice, one out of range: stock's loop meets it)."""
    out = []
    for i in indices:
        if type(i) is not int:
            if not isinstance(i, np.integer):  # (a sampler over a NumPy array yields its integers)
                raise array_plan.NoPlan("an index that is not an integer")
            i = int(i)
        if not -n <= i < n:
            raise array_plan.NoPlan("an index outside the data")
        out.append(i + n if i < 0 else i)
    return out


def _load(dataset: Any, indices: list[Any], layout: Layout, names: tuple[str, ...]) -> list[Any]:
    if dataset.target_transform is not None:
        return _load_one_at_a_time(dataset, indices, layout, names)
    images, plan, draws = _read(dataset, layout)
    idx = _indices(indices, len(images))
    targets = _targets(dataset, layout, idx)
    drawn = _draw(draws, plan, len(idx))
    base, slots = _gather(images, plan, idx, drawn, whole=True)
    collate.hand_over(base, slots)
    if report.stats is not None:
        report.count("dataloader", True, f"{type(dataset).__name__}: a batch in one native call")
    return list(zip(slots, targets))


def _targets(dataset: Any, layout: Layout, idx: list[int]) -> list[Any]:
    try:
        return layout.targets(dataset, idx)
    except array_plan.NoPlan:
        raise
    except Exception as exc:  # noqa: BLE001 - stock's loop raises it, at its sample, after the samples before it
        raise array_plan.NoPlan(f"a target stock's loop must read ({type(exc).__name__})") from exc


def _draw(draws: torch_draws.TorchDraws, plan: array_plan.ArrayPlan, n: int) -> np.ndarray:
    """``n`` samples' draws from torch's generator (written back), as stock's loop would make them now."""
    for _ in range(_DRAW_ATTEMPTS):
        drawn = draws.batch(plan.program, n)
        if draws.to_torch_unless_moved():
            return drawn
        draws.from_torch()  # (another thread drew meanwhile: again, from where torch's generator stands now)
    raise array_plan.NoPlan("other threads kept drawing from torch's generator")


def _read(dataset: Any, layout: Layout) -> tuple[np.ndarray, array_plan.ArrayPlan, torch_draws.TorchDraws]:
    """The dataset's images and the transform's plan, as they are now, and a copy of torch's generator."""
    from PIL import Image
    from torchvision import transforms

    images = layout.images(dataset)
    if images is None:
        raise array_plan.NoPlan("its data is not the uint8 array its class makes")
    channels = 1 if images.ndim == 3 else 3
    plan = array_plan.plan_of(transforms, dataset.transform, images.shape[1:3], channels, _tails)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and plan.crop_pixels > limit:
        raise array_plan.NoPlan("a crop PIL's size rule warns or raises for")  # (stock's crop gives it)
    draws = torch_draws.start(native.kernel("torch_draws"))
    if draws is None:
        raise array_plan.NoPlan("torch's default dtype or device is not float32 on the CPU")
    return images, plan, draws


def _gather(images: np.ndarray, plan: array_plan.ArrayPlan, idx: list[int], drawn: np.ndarray,
            whole: bool) -> tuple[Any, tuple[Any, ...]]:
    """The batch tensor of these samples, and each sample's tensor, a view of its slot. ``whole``: the samples are
    the batch (its memory is the collation's: shared in a worker process), each slot marked for the fetch's
    collation; else each is a sample of its own (heap memory, as stock's sample tensor)."""
    import torch

    rows, (th, tw) = plan.table.shape[0], plan.out_hw
    offsets = plan.offsets_of(drawn)
    samples = np.empty((len(idx), 3), np.int64)
    samples[:, 0] = idx
    samples[:, 1:] = offsets
    dtype = torch.from_numpy(plan.table[:0]).dtype
    shape, strides = (len(idx), rows, th, tw), (rows * th * tw, th * tw, tw, 1)
    base = batch_memory.batch_memory(shape, strides, dtype) if whole else torch.empty(shape, dtype=dtype)
    native.kernel("array_gather").gather_batch(images, samples, plan.maps, th, tw, plan.fill, plan.table,
                                               base.numpy())
    slots = base.unbind(0)
    if tuple(slots[0].stride()) != plan.sample_strides:  # (a one-channel sample's own strides)
        slots = tuple(slot.as_strided((rows, th, tw), plan.sample_strides) for slot in slots)
    if not whole:
        return base, slots
    return base, tuple(mark_slot(slot, base, k) for k, slot in enumerate(slots))


def _load_one_at_a_time(dataset: Any, indices: list[Any], layout: Layout, names: tuple[str, ...]) -> list[Any]:
    """With a ``target_transform`` (user code between samples): per sample, everything read again, the sample drawn
    and gathered, then its ``target_transform`` called, as stock's loop does. Where the user's code changed what the
    path reads, the samples left are stock's loop's (``dataset[i]``)."""
    out: list[Any] = []
    for k, index in enumerate(indices):
        try:
            if k and (_why_not(dataset, names) is not None or dataset.target_transform is None):
                raise array_plan.NoPlan("changed by the target_transform")
            images, plan, draws = _read(dataset, layout)
            (i,) = _indices([index], len(images))
            (target,) = _targets(dataset, layout, [i])
            drawn = _draw(draws, plan, 1)
        except array_plan.NoPlan:
            if not k:
                raise  # (nothing ran: stock's loop loads the batch)
            out.extend(dataset[i] for i in indices[k:])
            break
        _, (sample,) = _gather(images, plan, [i], drawn, whole=False)
        out.append((sample, dataset.target_transform(target)))
    return out


def routes(module: Any) -> dict[type, Callable[[Any, list[Any]], list[Any] | None]]:
    """class -> its batch route, for the array datasets of ``module`` (torchvision.datasets) whose own
    ``__getitem__`` is the one a :class:`Layout` describes."""
    found = {}
    for name, layout in LAYOUTS.items():
        cls = getattr(module, name, None)
        if isinstance(cls, type) and "__getitem__" in vars(cls):
            found[cls] = route(cls, layout)
    return found
