"""A stand-in worker: one batch of a virtual worker (``virtual_workers.py``) loaded by stock's code in a process of
its own, in that worker's exact state.

A virtual worker's fast path takes only what it can prove stock's: where a batch needs stock's own code (a file
PIL must decode or warn about, a draw the draw program gives back, a render that fails, an error stock raises at
sample k), a forked child of this process becomes that worker for one batch: ``get_worker_info()`` says so, its
generators are where the worker's stand (torch's, ``random``'s, NumPy's), torch runs on one thread, and it runs
stock's fetch of the batch, as the worker process would (with the patch, which gives stock's batch). It sends back
the batch, or the error wrapped as stock's worker wraps it (raised at the batch in the main process, with stock's
message), and the generators' states after it, which the virtual worker continues from. The child waits for the
parent to have the batch before it exits (its tensors' shared memory goes with their file descriptors).
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Loaded:
    """A stand-in's batch (or a ``torch._utils.ExceptionWrapper``) and the worker's generator states after it."""

    data: Any
    torch_state: Any
    random_state: Any
    numpy_state: Any


def load(dataset: Any, indices: list[Any], worker_id: int, num_workers: int, base_seed: int, torch_state: Any,
         random_state: Any, numpy_state: Any, collate_fn: Any, drop_last: bool, uint8: bool) -> Loaded:
    """Worker ``worker_id``'s batch of ``indices`` from ``dataset``, by stock's code in a forked child whose
    generators stand at the given states."""
    import multiprocessing

    import torch.multiprocessing  # noqa: F401 - its reductions: the batch's tensors cross as shared memory

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, name=f"nano-patch-stand-in-{worker_id}", daemon=True,
                       args=(child, dataset, indices, worker_id, num_workers, base_seed, torch_state, random_state,
                             numpy_state, collate_fn, drop_last, uint8))
    proc.start()
    child.close()
    try:
        got = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"DataLoader worker (pid(s) {proc.pid}) exited unexpectedly") from None
    finally:
        with contextlib.suppress(OSError):
            parent.send(True)  # the batch is here: the child may end
    proc.join()
    parent.close()
    return Loaded(*got)


def _serve(conn: Any, dataset: Any, indices: list[Any], worker_id: int, num_workers: int, base_seed: int,
           torch_state: Any, random_state: Any, numpy_state: Any, collate_fn: Any, drop_last: bool,
           uint8: bool) -> None:
    """The child: worker ``worker_id`` for one batch (stock's ``_worker_loop`` set-up, then its fetch)."""
    import torch
    from torch._utils import ExceptionWrapper
    from torch.utils.data import _DatasetKind
    from torch.utils.data._utils import signal_handling, worker

    from .workers import cap_threads

    signal_handling._set_worker_signal_handlers()
    cap_threads(1)
    torch.set_rng_state(torch_state)
    random.setstate(random_state)
    if numpy_state is not None:
        np.random.set_state(numpy_state)
    worker._worker_info = worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=base_seed + worker_id,
                                            dataset=dataset)
    try:
        if uint8:
            from .uint8_batches import mark_worker_dataset

            mark_worker_dataset(dataset)
        fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, dataset, True, collate_fn, drop_last)
        data = fetcher.fetch(indices)
    except Exception:  # noqa: BLE001 - stock's worker sends its error, wrapped, to be raised at the batch
        data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
    conn.send((data, torch.get_rng_state(), random.getstate(),
               np.random.get_state() if numpy_state is not None else None))
    with contextlib.suppress(EOFError):
        conn.recv()  # the parent has the batch: its shared memory may go
