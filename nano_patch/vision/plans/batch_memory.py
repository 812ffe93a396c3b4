"""Where a batch tensor's memory comes from: the heap, or shared memory where the batch crosses to another process.

The op runner (``oprunner.batch_tensor``) renders a batch's samples straight into one tensor; its memory is what
stock's ``default_collate`` would have allocated: the heap in the main process, shared memory in a DataLoader worker
process (the batch crosses to the main process without a copy), and, for a virtual worker's batches
(:func:`batches_in_shared_memory`; stock's reach the main process in shared memory), shared memory used again once
nothing holds it (:class:`SharedBatchMemory`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from ... import forks
from .thread_setting import ThreadSetting

#: Whether this thread's batch tensors are made in shared memory used again (:func:`batches_in_shared_memory`).
_shared_here: ThreadSetting[bool] = ThreadSetting(False)


def batches_in_shared_memory(on: bool = True) -> contextlib.AbstractContextManager[None]:
    """While this runs, this thread's batch tensors are made in shared memory, as in a worker process (a virtual
    worker's batches: stock's reach the main process in shared memory), from :class:`SharedBatchMemory`."""
    return _shared_here.set(on)


class SharedBatchMemory:
    """Shared-memory storages for batch tensors, each used again once nothing holds it.

    A new shared-memory segment costs its creation, then a page fault per page written, where a heap allocation
    reuses pages already mapped: paid per batch, that weighs on a virtual worker's loading (docs/benchmarks.md,
    "Shared-memory batches"). A storage goes back into use only where the pool alone holds it (no tensor, view
    or array of the user's) and it was never pickled (sent to another process, which maps the same pages), as
    freed heap memory is used again. At most :attr:`KEPT` storages per size are kept."""

    KEPT = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[int, list[tuple[Any, Any]]] = {}

    def tensor(self, nbytes: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised tensor of this layout over a storage of ``nbytes`` that nothing else holds. It is made
        under the lock: until then the storage's only holder is the pool, and another thread would take it too."""
        import torch
        from torch.multiprocessing import reductions

        use_count = torch._C._storage_Use_Count
        with self._lock:
            kept = self._kept.setdefault(nbytes, [])
            found = None
            for k, (storage, key) in enumerate(kept):
                if use_count(storage._cdata) == 1:
                    if key in reductions.shared_cache:  # (pickled: another process may map it)
                        del kept[k]
                        break
                    found = storage
                    break
            if found is None:
                found = torch.UntypedStorage._new_shared(nbytes)
                if len(kept) < self.KEPT:
                    kept.append((found, reductions.fd_id(found._share_fd_cpu_()[0])))
            return torch.empty(0, dtype=dtype).set_(found, 0, shape, strides)


_shared_batches = SharedBatchMemory()


def batch_memory(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised batch tensor of this layout; in a DataLoader worker process, in shared memory, as stock's
    ``default_collate`` allocates a worker's batch (it crosses to the main process without a copy); for a virtual
    worker (:func:`batches_in_shared_memory`), in shared memory used again."""
    import torch

    pooled = _shared_here.get()
    if torch.utils.data.get_worker_info() is None and not pooled:
        return torch.empty_strided(shape, strides, dtype=dtype)
    numel = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
    nbytes = numel * dtype.itemsize
    if pooled:
        return _shared_batches.tensor(nbytes, shape, strides, dtype)
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape, strides)


forks.fresh_in_child(globals(), _shared_batches=SharedBatchMemory)
