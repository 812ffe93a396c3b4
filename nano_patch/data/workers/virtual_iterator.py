"""The virtual workers' iterator (``virtual_workers.py``): stock's multi-process iterator, every method that reaches
a worker process replaced by the streams'. Imported on first use, so that importing the package does not import
torch."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.data import _utils
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from ..stock_lines import base_init
from . import stand_in, worker_seeds
from .virtual_streams import Context, Snapshot, Stream, Task, as_inference, producers_for


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
        seeds = worker_seeds.for_workers(self._base_seed, self._num_workers, loader.worker_init_fn)
        self._streams = [Stream(k, s, kernel) for k, s in enumerate(seeds)]
        self._ctx = Context(loader, snapshot, self._base_seed, render_threads, fresh)
        if self._pin_memory:  # pinned by the producers, where stock's pin-memory thread pins
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
                "stand_in_batches": self._ctx.stand_ins, "stand_in_reasons": dict(self._ctx.stand_in_reasons),
                "stand_in_processes": self._ctx.stand_ins_procs.started}

    def __del__(self) -> None:
        ctx = getattr(self, "_ctx", None)
        if ctx is not None:
            ctx.closed = True
            try:  # noqa: SIM105 - (contextlib may be gone at interpreter exit)
                ctx.stand_ins_procs.close()
            except Exception:  # noqa: BLE001, S110 - at interpreter exit, where modules are going
                pass
