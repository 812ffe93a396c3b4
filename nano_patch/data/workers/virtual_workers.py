"""Virtual workers: a DataLoader's ``num_workers=N`` as N streams in this process, with stock's batches.

Stock's ``num_workers=N`` forks N processes. Worker ``k`` seeds torch and ``random`` with ``base_seed + k`` (NumPy
as torch seeds it), runs the ``worker_init_fn``, and loads the batches the main process sends it: batch ``i`` of an
epoch goes to worker ``i % N``, at most ``prefetch_factor`` per worker ahead, and the batches come back in order.
Where the patch can tell that no code of the user's runs inside a worker and every draw of the pipeline is one the
draw program reproduces (:func:`why_not`), the N workers run here instead, as N streams:

- stream ``k`` draws from its own copy of a generator seeded as stock seeds worker ``k`` (``torch_draws``), for the
  batches stock sends to worker ``k``, in that worker's order; no draw touches a generator of this process;
- its batches load ahead on this process's loader threads (draws in a producer thread, renders on the native
  helpers), as stock's workers prefetch, so loading overlaps the training step;
- nothing is started per epoch, and the dataset is not copied per worker: one snapshot per iterator (the dataset's
  samples and transform as they are when the iterator starts: a worker process sees its parent's objects as they
  were at its fork, and a persistent worker keeps them).

The main process does exactly what stock's does: the same warnings, the base seed drawn from the loader's
generator, the sampler advanced at the same moments (``prefetch_factor * N`` indices at the epoch's start, one per
batch taken), persistent iterators reset as stock resets its workers (the batches sent and not taken are loaded, as
stock's workers load them, before the next epoch starts).

A batch the fast path cannot load as a whole (a file that is not a plain JPEG, a size PIL warns about, a draw the
program gives back, a failed render, a process state changed since the iterator started) is loaded by that worker's
stand-in (``stand_in.py``): a process forked when the iterator started, as stock forks its workers, running stock's
code in the worker's state (``worker_state.py``); its batch, or its error raised at stock's batch, comes back with
the generators' states, which the stream continues from.

Nothing waits forever: the producer pool is shared by every iterator and only grows (an iterator never loses the
threads that serve it), and the main process's wait for a batch watches the producers.
"""

from __future__ import annotations

from typing import Any

from ... import sysinfo
from ..stock_lines import stock_get_iterator
from .virtual_eligibility import fresh_context
from .virtual_streams import Snapshot

_iterator_cls: type | None = None


def iterator_class() -> type:
    """The virtual workers' iterator class: a subclass of torch's ``_BaseDataLoaderIter`` (made on first use, so that
    importing this module does not import torch)."""
    global _iterator_cls
    if _iterator_cls is None:
        from .virtual_iterator import VirtualWorkersIter

        _iterator_cls = VirtualWorkersIter
    return _iterator_cls


def start(loader: Any, loader_threads: int | str, uint8: bool = False) -> Any:
    """A virtual-worker iterator over ``loader`` (whose workers :func:`why_not` said may run here), started where
    stock's ``_get_iterator`` starts its worker processes (its checks and warnings, from its own line); ``uint8``:
    its batches stop before the tensor tail, which the device finishes. None where the dataset does not pickle
    for a fresh worker (stock's workers then raise stock's error, where they start)."""
    from ...vision.kernels import native

    fresh = fresh_context(loader)
    if fresh is None:
        snapshot = Snapshot.of(loader.dataset)
    else:
        try:
            snapshot = Snapshot.fresh(loader.dataset)
        except Exception:  # noqa: BLE001 - stock's start raises it, from its own line
            return None
    kernel = native.kernel("torch_draws")
    cores = sysinfo.usable_cores()
    threads = min(int(loader_threads), cores) if isinstance(loader_threads, int) else min(loader.num_workers, cores)
    cls = iterator_class()
    return stock_get_iterator(lambda loader: cls(loader, kernel, max(1, threads), uint8, snapshot, fresh))(loader)
