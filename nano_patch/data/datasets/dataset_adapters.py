"""The torchvision datasets' adapters, which the dataset patch (``patches/vision_datasets.py``) installs.

- ``__getitem__`` of ``DatasetFolder`` (and so ``ImageFolder``) with the stock PIL loader, and of the built-in
  datasets that open their files with PIL themselves (Flowers102, Food101, OxfordIIITPet, StanfordCars, DTD;
  Country211 is an ImageFolder): the file decodes straight to an array through libjpeg-turbo and goes to a patched
  ``Compose`` as one (``data/batches/sample_loading.py``), reading and filling the decoded-image cache where it is on.
  Caltech101 keeps each photo's own mode (grayscale stays "L").
- The batch routes (:func:`getitems_of`): the patched fetch (``data/fetch.py``) hands them a batch's indices
  where stock's loop would call the class's ``__getitem__`` for each; the batch loads on the loader's threads
  (``data/batches/batch_loader.py``) where it can, else stock's loop loads it, and ``--report`` says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ... import report


def folder_sample(dataset: Any, index: int) -> tuple[Any, Any]:
    return dataset.samples[index]


def why_not_loader(known: tuple[Callable[..., Any], ...]) -> Callable[[Any], str | None]:
    """Why a dataset that calls ``self.loader(path)`` cannot load a batch in parallel (None: it can)."""
    import torchvision

    def why(dataset: Any) -> str | None:
        if getattr(dataset, "loader", None) not in known:
            return "the dataset's own loader"
        if torchvision.get_image_backend() != "PIL":
            return "torchvision's image backend is not PIL"
        return None

    return why


def getitems_of(cls: type, why_not: Callable[[Any], str | None],
                sample_of: Callable[[Any, int], tuple[Any, Any]],
                transforms_of: Callable[[Any], tuple[Any, Any]] | None = None) -> Callable[..., Any]:
    """The batch route of ``cls`` (``data/fetch.py``): the patched fetch hands it a batch's indices where stock's
    loop would call ``cls.__getitem__`` for each. The batch loads on the loader's threads where it can
    (``data/batches/batch_loader.py``); None, having run nothing, where stock's loop must load it."""
    from ..batches import batch_loader
    from ..tail.uint8_batches import inherits_getitem
    from ..threads import loader_threads

    def transforms(dataset: Any) -> tuple[Any, Any]:
        return dataset.transform, dataset.target_transform

    transforms_of = transforms_of or transforms

    def getitems(self: Any, indices: list[int]) -> list[Any] | None:
        return loader_threads.load_batch(load, self, indices)

    def load(self: Any, indices: list[int], n_threads: int) -> list[Any]:
        why = None
        if n_threads <= 1 and not (loader_threads.in_worker_process() and loader_threads.batch_path_on()):
            return None  # one loader thread: stock's loop (a worker process takes its batches whole)
        why = f"{type(self).__name__} overrides __getitem__" if not inherits_getitem(type(self), cls) else why_not(self)
        if why is None:
            try:
                entries = [sample_of(self, i) for i in indices]
                transform, target_transform = transforms_of(self)
            except Exception:  # noqa: BLE001 - a bad index: stock's loop raises stock's error at stock's point
                return None
            out = batch_loader.load_samples(self, entries, transform, target_transform, n_threads,
                                     lambda k: self[indices[k]])
            if out is not None:
                return out
            why = batch_loader.why_not_split(transform) or batch_loader.why_one_by_one(self)
        if why is not None and report.stats is not None:
            report.stats.count("dataloader", False, f"batch loaded one by one: {why}")
        return None

    return getitems


def loader_getitem(
    folder: ModuleType, known: tuple[Callable[..., Any], ...], sample_of: Callable[[Any, int], tuple[Any, Any]]
) -> Callable[..., Any]:
    """``__getitem__`` for datasets that call ``self.loader(path)``, then transform and target_transform."""
    import torchvision

    from ..batches import sample_loading as loading

    def getitem(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        loader = getattr(instance, "loader", None)
        if len(args) != 1 or kwargs or loader not in known or torchvision.get_image_backend() != "PIL":
            return wrapped(*args, **kwargs)
        path, target = sample_of(instance, args[0])
        stats = report.stats
        start = time.perf_counter() if stats is not None else 0.0
        sample = loading.load_transformed(path, instance.transform, instance)
        if stats is not None:
            stats.add_seconds("load", time.perf_counter() - start)
        if instance.target_transform is not None:
            target = instance.target_transform(target)
        return sample, target

    return getitem


def pet_getitem() -> Callable[..., Any]:
    """OxfordIIITPet opens with ``Image.open(...).convert("RGB")`` (its files include PNGs named .jpg)."""
    from torchvision.datasets.vision import StandardTransform

    from ..batches import sample_loading as loading

    def getitem(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        transforms = getattr(instance, "transforms", None)
        if len(args) != 1 or kwargs or not (transforms is None or isinstance(transforms, StandardTransform)):
            return wrapped(*args, **kwargs)
        from PIL import Image

        idx = args[0]
        target: Any = []
        for target_type in instance._target_types:
            if target_type == "category":
                target.append(instance._labels[idx])
            elif target_type == "binary-category":
                target.append(instance._bin_labels[idx])
            else:
                target.append(Image.open(instance._segs[idx]))
        target = None if not target else target[0] if len(target) == 1 else tuple(target)
        transform = transforms.transform if transforms is not None else None
        image = loading.load_transformed(instance._images[idx], transform, instance)
        if transforms is not None and transforms.target_transform is not None:
            target = transforms.target_transform(target)
        return image, target

    return getitem


def caltech_getitem() -> Callable[..., Any]:
    """Caltech101 opens with a bare ``Image.open`` (no RGB conversion): its grayscale photos stay "L"."""
    import os

    from ..batches import sample_loading as loading

    def getitem(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) != 1 or kwargs or list(instance.target_type) != ["category"]:
            return wrapped(*args, **kwargs)  # annotations need scipy: rare, left stock
        idx = args[0]
        path = os.path.join(instance.root, "101_ObjectCategories", instance.categories[instance.y[idx]],
                            f"image_{instance.index[idx]:04d}.jpg")
        image = loading.load_native_transformed(path, instance.transform, instance)
        if image is None:
            return wrapped(*args, **kwargs)  # not a plain JPEG: PIL, exactly as stock
        target = instance.y[idx]
        if instance.target_transform is not None:
            target = instance.target_transform(target)
        return image, target

    return getitem


def adapters(module: ModuleType, known: tuple[Callable[..., Any], ...]) -> dict[type, tuple[Any, Any]]:
    """class -> (its ``__getitem__`` wrapper, its batch loader or None) for ``DatasetFolder`` and the built-in
    datasets that open their files themselves; ``known``: the stock loaders (as the dataset holds them)."""
    from torchvision.datasets import folder

    found = {folder.DatasetFolder: (loader_getitem(folder, known, folder_sample),
                                    getitems_of(folder.DatasetFolder, why_not_loader(known), folder_sample))}
    found.update(builtin_adapters(module, known))
    return found


def builtin_adapters(module: ModuleType, known: tuple[Callable[..., Any], ...]) -> dict[type, tuple[Any, Any]]:
    from torchvision.datasets import folder

    from ..batches import sample_loading as loading

    def files(inst: Any, i: int) -> tuple[Any, Any]:
        return inst._image_files[i], inst._labels[i]

    def samples(inst: Any, i: int) -> tuple[Any, Any]:
        return inst._samples[i]

    getters = {"Flowers102": files, "Food101": files, "DTD": files, "StanfordCars": samples}
    adapters: dict[type, tuple[Callable[..., Any], Callable[..., Any] | None]] = {}
    for name in loading.RGB_DATASETS:  # (the uint8 batches' list too: data/tail/uint8_batches.py)
        cls = getattr(module, name, None)
        if not (isinstance(cls, type) and "__getitem__" in vars(cls)):
            continue
        if name == "OxfordIIITPet":
            adapters[cls] = (pet_getitem(), getitems_of(cls, why_not_pet_batch, pet_sample, pet_transforms))
        else:
            adapters[cls] = (loader_getitem(folder, known, getters[name]),
                             getitems_of(cls, why_not_loader(known), getters[name]))
    caltech = getattr(module, "Caltech101", None)
    if isinstance(caltech, type) and "__getitem__" in vars(caltech):
        adapters[caltech] = (caltech_getitem(), None)  # grey photos stay "L": one by one
    return adapters


def why_not_pet_batch(dataset: Any) -> str | None:
    from torchvision.datasets.vision import StandardTransform

    transforms = getattr(dataset, "transforms", None)
    if not (transforms is None or isinstance(transforms, StandardTransform)):
        return "a joint transforms callable"
    if any(t not in ("category", "binary-category") for t in dataset._target_types):
        return "segmentation targets"
    return None


def pet_sample(dataset: Any, idx: int) -> tuple[Any, Any]:
    target: Any = [dataset._labels[idx] if t == "category" else dataset._bin_labels[idx]
                   for t in dataset._target_types]
    target = None if not target else target[0] if len(target) == 1 else tuple(target)
    return dataset._images[idx], target


def pet_transforms(dataset: Any) -> tuple[Any, Any]:
    transforms = dataset.transforms
    if transforms is None:
        return None, None
    return transforms.transform, transforms.target_transform
