"""timm's ``ImageDataset`` adapters, which the timm patch (``patches/timm_datasets.py``) installs: its images
decode through the same path as torchvision's.

timm's ``ImageDataset`` asks its reader for an open file and decodes it with
``Image.open(f).convert(input_img_mode)`` itself, so the torchvision loader patch never sees it. For
the stock folder reader (``ReaderImageFolder``) and RGB images, ``__getitem__`` here takes the path
from the reader and hands it to the same loading path as torchvision's datasets: libjpeg-turbo, the
decoded-image cache, crop-region decode, and the transform's plan. timm's own behaviour is kept:
a file that cannot be opened or decoded is skipped with timm's warning and the next index is
tried, up to the dataset's retry limit; errors of the transform itself are raised. PIL's guards act as
in timm's own code (``decode.check_open``, before any pixel or draw): a DecompressionBombError, or a
warning the user's filters make an error, is no OSError, so it is raised, not skipped. Any other reader
(tar, Hugging Face, webdataset...), ``load_bytes``, another ``input_img_mode``, or a subclass that
overrides ``__getitem__`` runs timm's own code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ... import report

#: The report's row for timm's datasets (the patch's name).
REPORT_NAME = "timm_datasets"


def why_timm_code(instance: Any, reader_cls: type, stock_getitem: Any) -> str | None:
    """Why ``instance`` loads through timm's own code, or None when the patch's path takes it."""
    reader = getattr(instance, "reader", None)
    if type(reader) is not reader_cls or vars(reader_cls).get("__getitem__") is not stock_getitem:
        return "a reader other than timm's folder reader: timm code"
    if getattr(instance, "load_bytes", True):
        return "load_bytes=True: timm code"
    if getattr(instance, "input_img_mode", None) != "RGB":
        return "input_img_mode other than RGB: timm code"
    return None


def getitems_of(dataset_cls: type, reader_cls: type, reader_methods: dict[str, Any]) -> Callable[..., Any]:
    """The batch route (``data/fetch.py``): a batch on the loader's threads (``data/batches/batch_loader.py``), with
    timm's
    targets (-1 for none, else its ``target_transform``). A file that fails to load is loaded one by one through
    ``__getitem__`` at its place, which skips it as timm does."""
    from ..batches import batch_loader
    from ..tail.uint8_batches import inherits_getitem
    from ..threads import loader_threads

    stock_getitem = reader_methods["__getitem__"]

    def getitems(self: Any, indices: list[int]) -> list[Any] | None:
        return loader_threads.load_batch(load, self, indices)

    def load(self: Any, indices: list[int], n_threads: int) -> list[Any]:
        if n_threads > 1 and inherits_getitem(type(self), dataset_cls) and \
                why_timm_code(self, reader_cls, stock_getitem) is None:
            try:
                entries = [self.reader.samples[i] for i in indices]
            except Exception:  # noqa: BLE001 - a bad index: one by one raises timm's error at timm's point
                entries = None
            if entries is not None:
                target_transform = self.target_transform

                def target_of(target: Any) -> Any:
                    return -1 if target is None else target_transform(target)

                if target_transform is None:  # timm's -1 for none, no user code: mapped here
                    entries = [(path, -1 if target is None else target) for path, target in entries]
                out = batch_loader.load_samples(self, entries, self.transform,
                                         target_of if target_transform is not None else None, n_threads,
                                         lambda k: self[indices[k]])
                if out is not None:
                    report.count(REPORT_NAME, True, "sample decoded and transformed through the patch")
                    return out
        return None  # timm's own loop, through __getitem__

    return getitems


def getitem_of(reader_cls: type, reader_methods: dict[str, Any]) -> Callable[..., Any]:
    from ..batches import sample_loading as loading

    stock_getitem = reader_methods["__getitem__"]
    log = logging.getLogger("timm.data.dataset")  # timm's own logger, for timm's own warning

    def getitem(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        reader = getattr(instance, "reader", None)
        if len(args) != 1 or kwargs:
            why: str | None = "called with other arguments than an index: timm code"
        else:
            why = why_timm_code(instance, reader_cls, stock_getitem)
        if why is not None:
            report.count(REPORT_NAME, False, why)
            return wrapped(*args, **kwargs)
        index = args[0]
        stats = report.stats
        start = time.perf_counter() if stats is not None else 0.0
        for _ in range(instance._max_retries):
            path, target = reader.samples[index]
            try:
                img = loading.load_transformed(path, instance.transform, instance, wrap_load_errors=True)
                break
            except loading.LoadFailed as failed:
                if not isinstance(failed.error, OSError):  # timm catches IOError/OSError only
                    raise failed.error from None
                log.warning(f"Skipped sample (index {index}). {failed.error}")
                index = (index + 1) % len(reader)
        else:
            raise RuntimeError(f"Failed to load {instance._max_retries} consecutive samples")
        if stats is not None:
            stats.add_seconds("load", time.perf_counter() - start)
            stats.count(REPORT_NAME, True, "sample decoded and transformed through the patch")
        if target is None:
            target = -1
        elif instance.target_transform is not None:
            target = instance.target_transform(target)
        return img, target

    return getitem
