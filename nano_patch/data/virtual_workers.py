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

import itertools
from typing import Any

from .. import sysinfo
from . import stand_in, worker_seeds
from .stock_lines import base_init, stock_get_iterator
from .virtual_eligibility import fresh_context
from .virtual_streams import Context, Snapshot, Stream, Task, as_inference, producers_for

_iterator_cls: type | None = None


def iterator_class() -> type:
    """The virtual workers' iterator class: a subclass of torch's ``_BaseDataLoaderIter`` (made on first use, so that
    importing this module does not import torch)."""
    global _iterator_cls
    if _iterator_cls is None:
        _iterator_cls = _make_iterator_class()
    return _iterator_cls


def start(loader: Any, loader_threads: int | str, uint8: bool = False) -> Any:
    """A virtual-worker iterator over ``loader`` (whose workers :func:`why_not` said may run here), started where
    stock's ``_get_iterator`` starts its worker processes (its checks and warnings, from its own line); ``uint8``:
    its batches stop before the tensor tail, which the device finishes. None where the dataset does not pickle
    for a fresh worker (stock's workers then raise stock's error, where they start)."""
    from ..vision.kernels import native

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


def _make_iterator_class() -> type:
    import torch
    from torch.utils.data import _utils
    from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

    class VirtualWorkersIter(_MultiProcessingDataLoaderIter):
        """``num_workers=N`` as N streams in this process (the module's docstring): the main process's side is
        stock's ``_MultiProcessingDataLoaderIter``'s, the workers' batches are loaded ahead by the producers.

        An instance of stock's class, as the iterator of a loader with workers is (Lightning shuts its workers down
        through ``isinstance``), with every method that reaches a worker process replaced; its profiler label is
        stock's."""

        def __init__(self, loader: Any, kernel: Any, render_threads: int, uint8: bool, snapshot: Snapshot,
                     fresh: Any) -> None:
            # stock's warnings (from its multi-process iterator's own line), the sampler's iterator, the base seed
            # (as stock draws it)
            base_init()(self, loader)
            self._profile_name = f"enumerate(DataLoader)#{_MultiProcessingDataLoaderIter.__name__}.__next__"
            self._shutdown = False
            self._workers: list[Any] = []
            self._prefetch_factor = loader.prefetch_factor
            self._kernel = kernel
            found = worker_seeds.lightning_init(loader.worker_init_fn)
            if found is None:
                seeds = [worker_seeds.stock_seeds(self._base_seed, k) for k in range(self._num_workers)]
            else:
                generate, rank = found
                rank = worker_seeds.default_rank(generate) if rank is None else rank
                seeds = [worker_seeds.lightning_seeds(self._base_seed, k, rank, generate)
                         for k in range(self._num_workers)]
            if not worker_seeds.numpy_seeded():
                for s in seeds:
                    s.numpy_seed = None
            self._streams = [Stream(k, s, kernel) for k, s in enumerate(seeds)]
            self._ctx = Context(loader, snapshot, self._base_seed, render_threads, fresh)
            if self._pin_memory:  # pinned by the producers, where stock's pin-memory thread pins
                import torch

                self._ctx.pin = (getattr(self, "_pin_memory_device", None), torch.accelerator.current_device_index())
            self._producers = producers_for(self._num_workers)
            self._tasks: dict[int, Task] = {}
            self._epoch = 0
            self.uint8 = uint8
            self._reset(loader, first_iter=True)

        @property
        def uint8(self) -> Any:
            """The snapshot's Compose, stopped before its tail (the device finishes it), or None: float batches."""
            return self._ctx.uint8

        @uint8.setter
        def uint8(self, on: bool) -> None:
            self._ctx.uint8 = self._ctx.snapshot.dataset.transform if on else None

        def _reset(self, loader: Any, first_iter: bool = False) -> None:
            if not first_iter:
                # stock's persistent workers load every batch sent to them before they resume: their generators
                # move on by those draws, whatever the last epoch took
                for task in self._tasks.values():
                    task.done.wait()
            _BaseDataLoaderIter._reset(self, loader, first_iter)  # (not the processes' reset: no worker is there)
            self._epoch += 1
            self._tasks = {}
            self._send_idx = 0
            self._rcvd_idx = 0
            self._cycle = itertools.cycle(range(self._num_workers))  # (stock resets it per epoch too)
            for _ in range(self._prefetch_factor * self._num_workers):
                self._try_put_index()

        def _try_put_index(self) -> None:
            try:
                index = self._next_index()
            except StopIteration:
                return
            stream = self._streams[next(self._cycle)]
            task = Task(self._send_idx, stream, stream.sent, index, self._epoch)
            stream.sent += 1
            self._tasks[self._send_idx] = task
            self._send_idx += 1
            self._producers.submit(self._ctx, task)

        def _next_data(self) -> Any:
            if self._rcvd_idx >= self._send_idx:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            task = self._tasks[self._rcvd_idx]
            if not self._wait(task):  # (the batch stays pending: a later call returns it, as stock's does)
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            del self._tasks[self._rcvd_idx]
            self._rcvd_idx += 1
            data = task.data
            self._try_put_index()
            if task.died is not None:
                raise task.died
            if isinstance(data, _utils.ExceptionWrapper):
                data.reraise()
            if torch.is_inference_mode_enabled() and not self._pin_memory:
                data = as_inference(data)  # (stock rebuilds a worker's batch in this thread's mode)
            return data

        def _wait(self, task: Task) -> bool:
            """Wait for ``task``: the loader's ``timeout``, else as long as the producers live."""
            if self._timeout > 0:
                return task.done.wait(self._timeout)
            while not task.done.wait(stand_in.WATCH_INTERVAL):
                if not self._producers.alive():
                    raise RuntimeError("DataLoader's virtual workers stopped: no thread loads its batches")
            return True

        def _shutdown_workers(self) -> None:
            """What stock's shutdown is to its workers: the tasks not loaded yet are dropped, the stand-ins end."""
            if getattr(self, "_shutdown", True):
                return
            self._shutdown = True
            self._ctx.closed = True
            self._ctx.stand_ins_procs.close()

        def describe(self) -> dict[str, Any]:
            return {"workers": self._num_workers, "render_threads": self._ctx.render_threads,
                    "stand_in_batches": self._ctx.stand_ins,
                    "stand_in_processes": self._ctx.stand_ins_procs.started}

        def __del__(self) -> None:
            ctx = getattr(self, "_ctx", None)
            if ctx is not None:
                ctx.closed = True
                try:  # noqa: SIM105 - (contextlib may be gone at interpreter exit)
                    ctx.stand_ins_procs.close()
                except Exception:  # noqa: BLE001, S110 - at interpreter exit, where modules are going
                    pass

    return VirtualWorkersIter
