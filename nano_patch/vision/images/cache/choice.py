"""Which store a dataset's images go through: the store the options ask for, or under ``--fast``
(``cache_decoded="auto"``) the decision made once per dataset from its estimated decoded size."""

from __future__ import annotations

import math
import os
import sys
import weakref
from typing import Any

from ..subsets import under_subsets
from .disk import free_space, human_bytes, store_bytes
from .entries import MIN_CAP
from .fill import FillBudget
from .process import Setting, open_store, opened_store, setting
from .store import Store

#: ``--fast`` caches a dataset only when its estimated decoded size is at most this share of the
#: machine's memory (so that epochs read the store from the page cache, not the disk) and of the
#: free disk space (the store's own size counted as free).
AUTO_MEMORY_SHARE = 0.5
AUTO_DISK_SHARE = 0.5
#: Files whose JPEG header is read to estimate a dataset's decoded size (evenly spaced).
AUTO_SAMPLE = 200

#: --fast's decision per dataset: cache it or not, kept with the dataset.
_decisions: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_decisions_by_id: dict[int, bool] = {}
#: the store of the last setting asked for (``process.setting`` gives the same object while nothing changed)
_last_store: tuple[Setting, Store] | None = None


def store_for(dataset: Any = None) -> Store | None:
    """The store to use for images of ``dataset`` (None: a loader call outside a dataset), or None."""
    s = setting()
    if s.mode == "off":
        return None
    if s.mode == "auto" and (dataset is None or not decide(dataset, s)):
        return None
    return _store_of(s)


def store_for_own(dataset: Any) -> Store | None:
    """The store for the lazy images of ``dataset``, a class of the user's own whose ``__getitem__`` opens its
    images (``data/datasets/lazy_samples.py``), or None. Its files cannot be listed without running its code, so
    ``--fast`` does not estimate them: the cache is on, within the fill budget (``fill.py``) and the budget's cap
    (what fits is stored), as :func:`announce_own` said where the loader was made."""
    s = setting()
    return None if s.mode == "off" else _store_of(s)


def _store_of(s: Setting) -> Store | None:
    global _last_store
    last = _last_store
    if last is not None and last[0] is s:  # (asked once per batch; a process's stores are never dropped)
        store = last[1]
    else:
        if s.mode == "auto":
            # the budget, fixed when the first dataset is cached in this process (measured only then)
            store = opened_store(s.folder) or open_store(s.folder, max(MIN_CAP, _budget(s.folder)), explicit=False)
        else:
            store = open_store(s.folder, s.cap)
        if s.mode == "auto" and store.fill_budget is None:
            store.fill_budget = FillBudget()  # --fast: the first epochs fill it within a budget (fill.py)
        _last_store = (s, store)
    return None if store.off else store


#: datasets of the user's own class :func:`announce_own` spoke of (by id: such a class may not be weak-referenceable)
_announced: set[int] = set()


def announce_own(dataset: Any) -> None:
    """Where a DataLoader over a dataset of the user's own class is made (the main process), under ``--fast``: the
    one line that says the JPEGs its ``__getitem__`` opens, if it opens any, are cached, and up to what size. torch's
    own datasets (``TensorDataset``, ``ConcatDataset``...) open no image: nothing is said for them."""
    s = setting()
    module = getattr(type(dataset), "__module__", "") or ""
    if s.mode != "auto" or module.split(".")[0] == "torch" or id(dataset) in _announced or not _is_main_process():
        return
    _announced.add(id(dataset))
    store = _store_of(s)
    if store is None:
        return
    print(f"nano-patch --fast: decoded-image cache on for the JPEGs {type(dataset).__name__}'s __getitem__ opens "
          f"(Image.open(...).convert(\"RGB\")), if it opens any: stored as they are loaded, up to "
          f"{human_bytes(store.cap)} in {s.folder} (--cache-decoded=off to switch it off)", file=sys.stderr)


def _budget(folder: Any) -> int:
    import psutil

    memory = int(psutil.virtual_memory().total * AUTO_MEMORY_SHARE)
    disk = int((free_space(folder) + store_bytes(folder)) * AUTO_DISK_SHARE)
    return min(memory, disk)


def decide(dataset: Any, s: Setting | None = None) -> bool:
    """``--fast`` (``cache_decoded="auto"``): cache ``dataset`` if its decoded size fits the budget.

    Decided once per dataset and process; the main process of the run prints the one line that says
    what was chosen (DataLoader workers and other ranks decide the same, quietly).
    """
    dataset = under_subsets(dataset)
    try:
        return _decisions[dataset]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        if id(dataset) in _decisions_by_id:
            return _decisions_by_id[id(dataset)]
    s = s or setting()
    files = dataset_files(dataset)
    if not files:
        ok, line = False, ""
    else:
        estimate = estimate_decoded_bytes(files)
        budget = _budget(s.folder)
        name = f"{type(dataset).__name__} {getattr(dataset, 'root', '')}".strip()
        ok = estimate <= budget
        if ok:
            line = (f"nano-patch --fast: decoded-image cache on for {name}: about {human_bytes(estimate)} for "
                    f"{len(files)} images, in {s.folder} (--cache-decoded=off to switch it off)")
        else:
            line = (f"nano-patch --fast: decoded-image cache off for {name}: about {human_bytes(estimate)} decoded "
                    f"would not fit the budget of {human_bytes(budget)} (half the memory, half the free disk); "
                    "--cache-decoded=SIZE sets a cap and caches what fits")
    try:
        _decisions[dataset] = ok
    except TypeError:
        _decisions_by_id[id(dataset)] = ok
    if line and _is_main_process():
        print(line, file=sys.stderr)
    return ok


def prepare(dataset: Any) -> None:
    """Where a DataLoader is built (the main process): decide for ``dataset`` under ``--fast`` and check
    the store, so that the one line and any warning come from here, before the workers start."""
    if setting().mode == "off":
        return
    root = under_subsets(dataset)
    if not dataset_files(root):
        return
    store = store_for(root)
    if store is not None:
        store.env()




def _is_main_process() -> bool:
    import multiprocessing

    from .... import exit_notices

    if multiprocessing.parent_process() is not None:
        return False
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            return False
    except ImportError:  # pragma: no cover
        pass
    return exit_notices.is_rank_zero()


def dataset_files(dataset: Any) -> list[str]:
    """The image files of ``dataset`` (the datasets the patch decodes for), or [] where it cannot tell."""
    dataset = under_subsets(dataset)
    reader = getattr(dataset, "reader", None)  # timm's ImageDataset keeps its files in its reader
    for owner, attr in ((dataset, "samples"), (dataset, "_samples"), (reader, "samples")):
        items = getattr(owner, attr, None)
        if isinstance(items, list) and items and isinstance(items[0], tuple):
            return [os.fspath(p) for p, *_ in items]
    for attr in ("_image_files", "_images"):
        items = getattr(dataset, attr, None)
        if isinstance(items, list) and items:
            return [os.fspath(p) for p in items]
    return []


def estimate_decoded_bytes(files: list[str], sample: int = AUTO_SAMPLE) -> int:
    """The decoded size of ``files`` (RGB, 1 byte per channel), from the headers of an even sample."""
    from .. import decode

    step = max(1, len(files) // sample)
    sizes = []
    for p in files[::step][:sample]:
        size = None
        try:
            with open(p, "rb") as f:
                size = decode.jpeg_size(f.read())
        except OSError:
            continue
        if size is None:
            try:
                from PIL import Image

                with Image.open(p) as im:
                    size = (im.height, im.width)
            except Exception:  # noqa: BLE001 - a file stock would fail on counts as nothing
                continue
        sizes.append(size[0] * size[1] * 3 + 256)
    if not sizes:
        return 0
    return int(math.ceil(sum(sizes) / len(sizes) * len(files)))
