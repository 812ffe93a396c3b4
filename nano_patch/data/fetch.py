"""Which batches the loader's threads take: those whose samples stock would load with a patched ``__getitem__``.

Torch's map-style fetcher (``torch.utils.data._utils.fetch._MapDatasetFetcher.fetch``) calls
``dataset.__getitems__(indices)`` when ``hasattr(dataset, "__getitems__")``, else ``dataset[i]`` per index. A
``__getitems__`` on the patched dataset classes would be found through any wrapper that forwards attributes
with ``__getattr__``, and the batch would then skip the wrapper's own ``__getitem__``. So the patched classes get
no ``__getitems__`` (``hasattr`` answers as on stock); instead :func:`fetch` is stock's ``fetch`` line for line,
with one change: where stock would call ``dataset[i]`` for each index and ``type(dataset).__getitem__`` is the
one a dataset patch wrapped (:func:`register`), that patch's batch route loads the batch (and returns None,
having run nothing, where stock's loop must). A ``Subset`` (torch's own ``__getitems__``) whose dataset has no
``__getitems__`` is followed to it, with the indices mapped as ``Subset`` maps them. Everything else (wrappers,
``ConcatDataset``, ``StackDataset``, subclasses that override ``__getitem__``, user ``__getitems__``) runs
stock's code. The same ``fetch`` runs in DataLoader worker processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import forks
from ..vision.images.subsets import under_subsets

#: class whose ``__getitem__`` a dataset patch wrapped -> its batch route ``(dataset, indices) -> list | None``
#: (None: the class loads one by one)
_routes: dict[type, Callable[[Any, list[Any]], list[Any] | None] | None] = {}
_lock = threading.Lock()


def register(cls: type, loader: Callable[[Any, list[Any]], list[Any] | None] | None) -> None:
    with _lock:
        _routes[cls] = loader


def unregister(cls: type) -> None:
    with _lock:
        _routes.pop(cls, None)


def _getitem_owner(cls: type) -> type | None:
    """The class whose ``__getitem__`` ``dataset[i]`` runs for an instance of ``cls`` (as Python resolves it)."""
    for klass in cls.__mro__:
        if "__getitem__" in vars(klass):
            return klass
    return None


def patched_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` (or the dataset of the ``Subset`` chain it is) loads through a patched ``__getitem__``.
    Decided from types alone: nothing of a user's class (its ``__getattr__``, its properties) runs."""
    return _getitem_owner(type(under_subsets(dataset))) in _routes


def _load_by_route(dataset: Any, indices: list[Any]) -> list[Any] | None:
    """The batch ``[dataset[i] for i in indices]`` by the patch's batch route, or None (nothing ran)."""
    if not _routes:
        return None
    loader = _routes.get(_getitem_owner(type(dataset)))  # type: ignore[arg-type]
    if loader is None:
        return None
    return loader(dataset, indices)


def _subset_getitems(subset: Any, indices: list[Any]) -> list[Any]:
    """torch's ``Subset.__getitems__``, line for line, its one-by-one branch through :func:`_load_by_route`."""
    if callable(getattr(subset.dataset, "__getitems__", None)):
        return subset.dataset.__getitems__([subset.indices[idx] for idx in indices])
    try:
        mapped = [subset.indices[idx] for idx in indices]
    except Exception:  # noqa: BLE001 - stock raises it after the samples before it: its own loop
        mapped = None
    data = _load_by_route(subset.dataset, mapped) if mapped is not None else None
    if data is not None:
        return data
    return [subset.dataset[subset.indices[idx]] for idx in indices]


def make_fetch(stock_fetch: Callable[..., Any], subset_cls: type) -> Callable[..., Any]:
    """The ``_MapDatasetFetcher.fetch`` to install: stock's, with the batch routes (see the module)."""
    from torch.utils.data._utils.collate import default_collate as stock_default_collate

    from . import collate
    from .datasets import lazy_samples

    stock_subset_getitems = vars(subset_cls).get("__getitems__")
    stock_subset_getitem = vars(subset_cls).get("__getitem__")

    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        if self.auto_collation:
            if hasattr(self.dataset, "__getitems__") and self.dataset.__getitems__:
                cls = type(self.dataset)
                if (stock_subset_getitems is not None and getattr(cls, "__getitems__", None) is stock_subset_getitems
                        and _getitem_owner(cls) is subset_cls and subset_cls.__getitem__ is stock_subset_getitem
                        and "__getitems__" not in getattr(self.dataset, "__dict__", ())):  # (not the instance's own)
                    data = lazy_samples.fetched(lambda: _subset_getitems(self.dataset, possibly_batched_index),
                                                self.dataset)
                else:
                    data = lazy_samples.fetched(lambda: self.dataset.__getitems__(possibly_batched_index),
                                                self.dataset)
            else:
                data = _load_by_route(self.dataset, possibly_batched_index)
                if data is None:
                    data = lazy_samples.fetched(
                        lambda: [self.dataset[idx] for idx in possibly_batched_index], self.dataset)
        else:
            data = lazy_samples.fetched(lambda: self.dataset[possibly_batched_index], self.dataset)
        handed = collate.take_handed()  # (taken in every case: a note never outlives its fetch)
        if self.collate_fn is stock_default_collate:  # the common batch without stock's walk (same result)
            batch = collate.collate_pairs(data, handed)
            if batch is not None:
                return batch
        return self.collate_fn(data)

    fetch.__wrapped__ = stock_fetch  # type: ignore[attr-defined]
    fetch.__qualname__ = getattr(stock_fetch, "__qualname__", "fetch")
    return fetch


forks.fresh_in_child(globals(), _lock=threading.Lock)
