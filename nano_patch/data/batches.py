"""uint8 batches: workers hand back uint8 images, the main process converts whole batches to float.

A dataset qualifies when its transform is a stock ``Compose`` ending in ``ToTensor`` (optionally
followed by ``Normalize``) and its images come from the stock RGB loader. In each worker, that
``Compose`` (the worker's own copy) stops before the tail and returns a uint8 CHW tensor: a quarter
of the bytes of float32 through shared memory. After collation, the main process does ``/255`` and
``Normalize``'s ``sub_``/``div_`` on the whole batch, the very operations stock does per image, so the
values are equal. ``dataset[i]`` in the main process is untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Built-in datasets whose ``__getitem__`` the vision patch routes through the RGB loader.
_ADAPTED = ("Flowers102", "Food101", "DTD", "StanfordCars", "OxfordIIITPet")


@dataclass(frozen=True)
class BatchSpec:
    """How to finish a uint8 image batch: the Normalize constants, and the memory format."""

    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    channels_last: bool = False


def _root_dataset(dataset: Any) -> Any:
    data = sys.modules.get("torch.utils.data")
    while data is not None and isinstance(dataset, data.Subset):
        dataset = dataset.dataset
    return dataset


def _rgb_loading(dataset: Any) -> bool:
    datasets = sys.modules.get("torchvision.datasets")
    if datasets is None:
        return False
    folder = datasets.folder
    if isinstance(dataset, folder.DatasetFolder):
        return _inherits_getitem(type(dataset), folder.DatasetFolder) and dataset.loader in (
            folder.default_loader, folder.pil_loader)
    return any(type(dataset) is getattr(datasets, name, None) for name in _ADAPTED)


def _inherits_getitem(cls: type, base: type) -> bool:
    for klass in cls.__mro__:
        if klass is base:
            return True
        if "__getitem__" in vars(klass):
            return False
    return False


def uint8_transform(dataset: Any) -> tuple[Any, BatchSpec] | None:
    """The dataset's ``Compose`` and how to finish its batches, if the dataset qualifies; else None."""
    from ..vision import pipeline

    if not pipeline.active():
        return None
    dataset = _root_dataset(dataset)
    if not _rgb_loading(dataset):  # first: a dataset of the user's own class is never asked for attributes
        return None
    compose = getattr(dataset, "transform", None)
    if compose is None:
        return None
    tail = pipeline.tensor_tail(compose)
    if tail is None:
        return None
    normalize = tail[1] if len(tail) == 2 else None
    if normalize is None:
        return compose, BatchSpec(None, None)
    mean, std = _floats(normalize.mean), _floats(normalize.std)
    if mean is None or std is None or 0.0 in std:
        return None  # stock raises for std 0, or broadcasts odd shapes: leave it to stock
    return compose, BatchSpec(mean, std)


def _floats(value: Any) -> tuple[float, ...] | None:
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return None


def mark_worker_dataset(dataset: Any) -> None:
    """In a worker: make this worker's copy of the dataset's ``Compose`` return uint8 tensors."""
    from ..vision import pipeline

    found = uint8_transform(dataset)
    if found is not None:
        pipeline.emit_uint8(found[0])


def to_float(images: Any, spec: BatchSpec) -> Any:
    """A uint8 N x C x H x W batch as stock ``ToTensor`` (+ ``Normalize``) would have made it, image by image."""
    import torch

    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    # With pin_memory the loader pinned the uint8 batch; stock's float batch would have been pinned
    # too, so the float batch is born pinned and `.to("cuda", non_blocking=True)` stays asynchronous.
    out = torch.empty(images.shape, dtype=torch.get_default_dtype(), memory_format=fmt,
                      pin_memory=bool(images.is_pinned()))
    out.copy_(images)
    out.div_(255)
    if spec.mean is not None and spec.std is not None:
        mean = torch.as_tensor(spec.mean, dtype=out.dtype).view(1, -1, 1, 1)
        std = torch.as_tensor(spec.std, dtype=out.dtype).view(1, -1, 1, 1)
        out.sub_(mean).div_(std)
    return out


def finish(batch: Any, spec: BatchSpec) -> tuple[Any, int]:
    """Convert the image slot of a collated batch; also return the bytes that crossed from the workers."""
    import torch

    def is_u8(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 4

    if isinstance(batch, (list, tuple)) and batch and is_u8(batch[0]):
        nbytes = batch[0].nbytes
        items = [to_float(batch[0], spec), *batch[1:]]
        return (type(batch)(items) if not hasattr(batch, "_fields") else type(batch)(*items)), nbytes
    if is_u8(batch):
        return to_float(batch, spec), batch.nbytes
    return batch, 0


class Uint8Batches(Iterator[Any]):
    """Wraps a DataLoader iterator and finishes each uint8 batch in the main process."""

    def __init__(self, iterator: Any, spec: BatchSpec) -> None:
        self._iterator = iterator
        self._spec = spec
        #: image bytes the last batch carried from the workers (uint8), for benchmarks.
        self.last_image_bytes = 0

    def __next__(self) -> Any:
        batch, self.last_image_bytes = finish(next(self._iterator), self._spec)
        return batch

    def __iter__(self) -> Uint8Batches:
        return self

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)
