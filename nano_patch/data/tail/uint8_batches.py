"""uint8 batches: workers hand back uint8 images, the batch is finished as a whole, in the main process or on the
device.

A dataset qualifies when its transform is a stock ``Compose`` (v1 or v2) ending in the tensor tail
(``vision/plans/tensor_tail.py``: ``ToTensor``/``MaybeToTensor`` or ``ToImage``/``PILToTensor`` + ``ToDtype``,
optionally ``Normalize``, optionally ``RandomErasing``) and its images come from the stock RGB loader. In each
worker, that ``Compose`` (the worker's own copy) stops before the tail and returns a uint8 CHW tensor (with the
erasers' draws): a quarter of the bytes of float32 through shared memory. After collation, the main process makes
the tail's operations on the whole batch, the very operations stock makes per image (``data/tail/finish_tail.py``), so
the values are equal; or, where the Trainer defers the tail (``train/tail_deferral.py``), hands the uint8 batch on
as a :class:`DeferredImages` that Lightning's transfer finishes on the device. ``dataset[i]`` in the main process is
untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ...vision.images.subsets import under_subsets
from ...vision.plans.tensor_tail import TailSpec, find_tail
from .finish_tail import DeferredImages, apply_tail, memory_format, register_collate, split_batch


def _rgb_loading(dataset: Any) -> bool:
    datasets = sys.modules.get("torchvision.datasets")
    if datasets is None:
        return False
    from ..batches import sample_loading as loading

    folder = datasets.folder
    if isinstance(dataset, folder.DatasetFolder):
        return inherits_getitem(type(dataset), folder.DatasetFolder) and dataset.loader in (
            folder.default_loader, folder.pil_loader)
    return any(type(dataset) is getattr(datasets, name, None) for name in loading.RGB_DATASETS)


def inherits_getitem(cls: type, base: type) -> bool:
    for klass in cls.__mro__:
        if klass is base:
            return True
        if "__getitem__" in vars(klass):
            return False
    return False


def uint8_transform(dataset: Any) -> tuple[Any, TailSpec] | None:
    """The dataset's ``Compose`` and how to finish its batches, if the dataset qualifies; else None."""
    found = _uint8_transform(dataset)
    return found if isinstance(found, tuple) else None


def why_not_uint8(dataset: Any) -> str | None:
    """Why ``dataset``'s batches cannot be uint8 batches (for ``--report``), or None where they can."""
    found = _uint8_transform(dataset)
    return None if isinstance(found, tuple) else found


def _uint8_transform(dataset: Any) -> tuple[Any, TailSpec] | str:
    from ...vision.plans import compose_call

    if not compose_call.active():
        return "the transforms patch is off"
    root = under_subsets(dataset)
    if not _rgb_loading(root):  # first: a dataset of the user's own class is never asked for attributes
        return f"a {type(root).__name__} is not an image dataset the patch loads (ImageFolder and its kin)"
    compose = getattr(root, "transform", None)
    if compose is None:
        return "the dataset has no transform"
    if not compose_call.splits_tail(compose):
        return f"its transform is a {type(compose).__name__}, not a stock Compose"
    spec = find_tail(compose)
    if spec is None:
        return ("its Compose does not end in a tensor tail the patch knows (ToTensor or ToImage/PILToTensor + "
                "ToDtype(float32, scale=True), then Normalize, RandomErasing)")
    return compose, spec


def mark_worker_dataset(dataset: Any) -> None:
    """In a worker: make this worker's copy of the dataset's ``Compose`` return uint8 tensors."""
    from ...vision.plans import compose_call

    found = uint8_transform(dataset)
    if found is not None:
        if found[1].erasers:
            register_collate()
        compose_call.emit_uint8(found[0])


def to_float(images: Any, spec: TailSpec, erased: Any = None) -> Any:
    """A uint8 N x C x H x W batch as stock's tail would have made it, image by image, on the CPU."""
    import torch

    # With pin_memory the loader pinned the uint8 batch; stock's float batch would have been pinned
    # too, so the float batch is born pinned and `.to("cuda", non_blocking=True)` stays asynchronous.
    out = torch.empty(images.shape, dtype=torch.float32, memory_format=memory_format(images, spec),
                      pin_memory=bool(images.is_pinned()))
    if erased is None:
        return apply_tail(images, spec, out=out)
    return apply_tail(images, spec, erased.erasures, out=out, values=erased.values)


def finish(batch: Any, spec: TailSpec, defer: bool = False) -> tuple[Any, int]:
    """Finish the image slot of a collated batch (on the CPU, or ``defer``: as a :class:`DeferredImages` for the
    transfer to finish); also return the bytes that crossed from the workers."""
    found = split_batch(batch)
    if found is None:
        return batch, 0
    images, erased, rebuild = found
    if defer:
        done = DeferredImages(images, spec, *((erased.erasures, erased.values) if erased is not None else ()))
    else:
        done = to_float(images, spec, erased)
    return rebuild(done), images.nbytes


class Uint8Batches(Iterator[Any]):
    """Wraps a DataLoader iterator and finishes each uint8 batch (in the main process, or ``defer``: after the
    transfer). ``here``: a Compose to stop before its tail in this thread while a batch loads (``num_workers=0``)."""

    def __init__(self, iterator: Any, spec: TailSpec, defer: bool = False, here: Any = None) -> None:
        self._iterator = iterator
        self._spec = spec
        self._defer = defer
        self._here = here
        #: image bytes the last batch carried from the workers (uint8), for benchmarks.
        self.last_image_bytes = 0

    def __next__(self) -> Any:
        if self._here is None:
            raw = next(self._iterator)
        else:
            from ...vision.plans import compose_call

            with compose_call.uint8_here(self._here):
                raw = next(self._iterator)
        batch, self.last_image_bytes = finish(raw, self._spec, self._defer)
        return batch

    def __iter__(self) -> Uint8Batches:
        return self

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)
