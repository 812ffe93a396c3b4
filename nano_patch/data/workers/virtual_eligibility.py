"""Whether a DataLoader's ``num_workers=N`` may run as virtual workers (``virtual_workers.py``): decided from types and
stock objects alone, so nothing of a user's class runs; each reason to keep worker processes is a sentence the run
report gives."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from ... import forks
from . import worker_seeds, worker_state

#: Start methods whose workers virtual workers reproduce: a fork of this process (its state frozen when the iterator
#: starts), or a fresh interpreter (forkserver, spawn: the defaults, the dataset a pickle round trip).
_START_METHODS = ("fork", "forkserver", "spawn")
#: DataLoader methods that make its iterator: a subclass that overrides one keeps stock's path, where it runs.
_LOADER_METHODS = ("__iter__", "_get_iterator", "_index_sampler", "check_worker_number_rationality",
                   "_auto_collation")
#: Path suffixes of the JPEGs the fast path loads (another file keeps real worker processes).
_JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


def why_not(loader: Any, loader_threads: int | str) -> str | None:
    """Why ``loader``'s workers stay processes (None: they can run here). Decided from types and stock objects
    alone: nothing of a user's class runs."""



    if loader_threads == "off":
        return "loader_threads is off"
    method = start_method(loader)
    if method not in _START_METHODS:
        return f"the start method {method!r}"
    if method != "fork":
        differs = worker_state.differs_from_fresh()
        if differs:
            return f"a fresh {method} worker would not see this process's {differs}"
    if loader.worker_init_fn is not None and worker_seeds.lightning_init(loader.worker_init_fn) is None:
        return "a worker_init_fn of the user's (it may draw, or read get_worker_info())"
    return why_not_made_apart(loader)


def why_not_made_apart(loader: Any) -> str | None:
    """Why ``loader``'s batches cannot be made apart from the code that asks for them, from a generator state of
    their own (a virtual worker's, or the next batch made ahead at ``num_workers=0``), with no code of the user's
    run (None: they can). Decided from types and stock objects alone: nothing of a user's class runs."""
    import sys

    import torch.utils.data as data

    from .. import fetch

    overridden = [name for name in _LOADER_METHODS if _defined_by(type(loader), name) is not data.DataLoader]
    if overridden:
        return f"{type(loader).__name__} overrides DataLoader.{overridden[0]} (stock's path runs it)"
    if loader.batch_sampler is None:
        return "batch_size=None (samples one by one)"
    if loader.collate_fn is not data.default_collate:
        return "the loader's own collate_fn"
    if not isinstance(loader.dataset, data.Dataset) or isinstance(loader.dataset, data.IterableDataset):
        return "not a map-style dataset"
    root, chain = root_of(loader.dataset)
    if root is None:
        return chain  # type: ignore[return-value]
    if not fetch.patched_dataset(loader.dataset):
        return f"a {type(root).__name__} is not a dataset the patch loads"
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is None or not isinstance(root, folder.DatasetFolder):
        return f"a {type(root).__name__} is not an ImageFolder or DatasetFolder"
    from ..batches import drawn_batches

    why = drawn_batches.why_not_drawn_apart(root)
    if why is not None:
        return why
    if not _all_jpegs(root.samples):
        return "some of its files are not JPEGs (they decode through PIL, which may warn in the worker)"
    return None


def _defined_by(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose own namespace holds ``name``."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def start_method(loader: Any) -> str:
    """The start method of ``loader``'s workers: its ``multiprocessing_context``'s, else the interpreter's (which
    Python 3.14 makes forkserver on Linux), read without fixing it."""
    context = loader.multiprocessing_context
    if context is not None:
        return str(context.get_start_method())
    import torch.multiprocessing as mp

    return mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]


def fresh_context(loader: Any) -> Any:
    """The context that starts ``loader``'s workers, where they are fresh interpreters; None where they fork."""
    if start_method(loader) == "fork":
        return None
    import torch.multiprocessing as mp

    return loader.multiprocessing_context or mp.get_context(start_method(loader))


def root_of(dataset: Any) -> tuple[Any, Any]:
    """The dataset under a chain of stock ``Subset``s, and the chain (outermost first); or (None, why)."""
    import torch.utils.data as data

    chain = []
    while type(dataset) is data.Subset:
        if not isinstance(dataset.indices, (list, tuple, range)):
            return None, "a Subset whose indices are not a list, tuple or range"
        chain.append(dataset)
        dataset = dataset.dataset
    return dataset, chain


#: samples lists found to be all JPEGs: by identity, with their length then (a list changed since is checked again)
_jpeg_lists: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_jpeg_lengths: dict[int, int] = {}
_jpeg_lock = threading.Lock()


def _all_jpegs(samples: Any) -> bool:
    if not isinstance(samples, list):
        return False
    with _jpeg_lock:
        if _jpeg_lists.get(id(samples)) is samples and _jpeg_lengths.get(id(samples)) == len(samples):
            return True
    for s in samples:
        if type(s) is not tuple or len(s) != 2 or not isinstance(s[0], str) or \
                not s[0].lower().endswith(_JPEG_SUFFIXES):
            return False
    with _jpeg_lock, contextlib.suppress(TypeError):
        _jpeg_lists[id(samples)] = samples
        _jpeg_lengths[id(samples)] = len(samples)
    return True


forks.fresh_in_child(globals(), _jpeg_lock=threading.Lock)
