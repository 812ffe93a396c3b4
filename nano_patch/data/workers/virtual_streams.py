"""The virtual workers' streams and the threads that load their batches (``virtual_workers.py`` is the iterator):
each stream is worker ``k``, its batches drawn from its own generator copy in its order, loaded by the fast path or
by its stand-in (``stand_in.py``), ahead of the training step, on a pool of producer threads every iterator of the
process shares."""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import forks, report, sysinfo
from ..threads import exit_gate
from . import stand_in, worker_state
from .virtual_eligibility import root_of
from .worker_seeds import Seeds


@dataclass
class Snapshot:
    """The dataset as the iterator saw it when it started: the root's samples and transform, copied, and each
    ``Subset``'s indices. ``owner``: the dataset itself, whose per-dataset tables (the header index, the cache's
    choice) the snapshot shares."""

    dataset: Any
    owner: Any
    chain: list[tuple[Any, ...]]

    @classmethod
    def fresh(cls, dataset: Any) -> Snapshot:
        """The dataset as a fresh worker gets it: a pickle round trip (as the start method pickles it for each
        worker). Raises where it does not pickle (stock's workers then raise it, starting)."""
        import pickle
        from multiprocessing.reduction import ForkingPickler

        root, _ = root_of(dataset)
        copied = pickle.loads(ForkingPickler.dumps(dataset))  # noqa: S301 - our own bytes, made just now
        snap_root, subsets = root_of(copied)
        chain = [tuple(s.indices) if not isinstance(s.indices, range) else s.indices for s in subsets]
        return cls(snap_root, root, chain)

    @classmethod
    def of(cls, dataset: Any) -> Snapshot:
        root, subsets = root_of(dataset)
        snap = copy.copy(root)
        snap.samples = list(root.samples)
        if getattr(root, "imgs", None) is root.samples:
            snap.imgs = snap.samples
        snap.transform = copy.deepcopy(root.transform)
        chain = [tuple(s.indices) if not isinstance(s.indices, range) else s.indices for s in subsets]
        return cls(snap, root, chain)

    def entries(self, indices: list[Any]) -> list[tuple[Any, Any]]:
        """The samples ``(path, target)`` of a batch's indices, mapped through the ``Subset``s as they map them."""
        for mapping in self.chain:
            indices = [mapping[i] for i in indices]
        samples = self.dataset.samples
        return [samples[i] for i in indices]

    def stock_dataset(self) -> Any:
        """The dataset a stand-in loads from: the snapshot under copies of the ``Subset``s."""
        import torch.utils.data as data

        dataset = self.dataset
        for mapping in reversed(self.chain):
            dataset = data.Subset(dataset, list(mapping) if not isinstance(mapping, range) else mapping)
        return dataset


class Stream:
    """One virtual worker: its id, its seeds, its torch generator copy (advanced by its batches' draws), and the
    ``random`` and NumPy states a stand-in last left (None: as seeded)."""

    def __init__(self, worker_id: int, seeds: Seeds, kernel: Any) -> None:
        import torch

        from ...vision.kernels import torch_draws

        self.worker_id = worker_id
        self.seeds = seeds
        self.draws = torch_draws.TorchDraws.from_state(kernel, torch.Generator().manual_seed(seeds.torch_seed)
                                                       .get_state())
        self.random_state: Any = None
        self.numpy_state: Any = None
        #: the stream's batches are drawn in its order: how many were sent to it, and how many are drawn
        self.sent = 0
        self.drawn = 0
        self.turn = threading.Condition()

    def python_states(self) -> tuple[Any, Any]:
        """``random``'s and NumPy's states as a worker in this stream's place has them."""
        r = self.random_state
        if r is None:
            r = random.Random(self.seeds.random_seed).getstate()
        n = self.numpy_state
        if n is None and self.seeds.numpy_seed is not None:
            n = np.random.RandomState(self.seeds.numpy_seed).get_state()
        return r, n


@dataclass
class Task:
    """A batch sent to a stream: its place in the epoch, its stream, the stream's count of batches before it."""

    idx: int
    stream: Stream
    turn: int
    index: Any
    epoch: int
    done: threading.Event = field(default_factory=threading.Event)
    data: Any = None
    #: a stand-in that died with this batch: raised as it is, as stock raises a dead worker's error
    died: BaseException | None = None


class Context:
    """What an iterator's tasks share with the producers: the snapshot, how to load and collate a batch, and whether
    the iterator is still in use (a dropped iterator's tasks are skipped, as stock's shut-down workers drop theirs)."""

    def __init__(self, loader: Any, snapshot: Snapshot, base_seed: int, render_threads: int, fresh: Any) -> None:
        self.snapshot = snapshot
        self.base_seed = base_seed
        self.num_workers = loader.num_workers
        self.collate_fn = loader.collate_fn
        self.drop_last = loader.drop_last
        self.render_threads = render_threads
        #: the Compose to stop before its tensor tail (uint8 batches whose tail the device finishes), or None
        self.uint8: Any = None
        self.closed = False
        #: batches a stand-in loaded (for the run report), counted under the lock (two producers may count)
        self.stand_ins = 0
        #: why each of them went to a stand-in: {the fast path's reason: batches}
        self.stand_in_reasons: dict[str, int] = {}
        self.lock = threading.Lock()
        #: (device type, device index) to pin each batch for, as stock's pin-memory thread does, or None
        self.pin: tuple[Any, int] | None = None
        #: the process state a worker forked now keeps: the fast path loads only while it is still live
        self.state = worker_state.capture()
        #: the stand-in processes, forked now (as stock forks its workers)
        self.stand_ins_procs = stand_in.StandIns(snapshot.stock_dataset(), loader.num_workers, base_seed,
                                                 loader.collate_fn, loader.drop_last, fresh)


class _Producers:
    """The threads that load the tasks of every virtual-worker iterator of this process, in the order they were
    sent; each stream's batches are drawn in the stream's order (a task waits for its stream's turn).

    The pool is shared and only grows: an iterator never loses the threads that serve its tasks. At most ``slots``
    threads take the fast path at once (its draws hold the GIL: more only take cores from the renders, see
    :func:`producers`); the others wait there, or on a stand-in, which holds no core: with one thread per stream,
    N stand-ins load at once, as N stock workers would."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Context, Task] | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._slots = 0
        self._busy = 0

    def grow(self, threads: int, slots: int) -> None:
        """At least ``threads`` threads, of which at least ``slots`` may take the fast path at once."""
        with self._cond:
            if slots > self._slots:
                self._slots = slots
                self._cond.notify_all()
            while len(self._threads) < threads:
                # (ended before the interpreter finalizes: exit_gate; one wake per thread, each takes one)
                t = exit_gate.start(self._serve, f"nano-patch-virtual-worker-{len(self._threads)}",
                                    wake=lambda: self._queue.put(None))
                if t is None:  # (the interpreter is exiting)
                    return
                self._threads.append(t)

    def submit(self, ctx: Context, task: Task) -> None:
        self._queue.put((ctx, task))

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    @contextlib.contextmanager
    def fast_path(self) -> Iterator[None]:
        """One of the ``slots`` the fast path may take at once (each taker ends in bounded time: CPU work)."""
        with self._cond:
            while self._busy >= self._slots:
                self._cond.wait()
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify()

    def _serve(self) -> None:
        sysinfo.lower_this_thread()  # (the training thread first: loading takes what the step leaves)
        while True:
            item = self._queue.get()
            if item is None:  # woken at exit
                return
            _load_task(self, *item)
            del item  # (what it held is freed here, not while it waits)


def producers(num_workers: int) -> int:
    """Threads that take the fast path at once for ``num_workers`` streams: two where there are cores to spare (one
    draws the next batch while the other's renders run on the native helpers), one on fewer than 4 usable cores,
    where a second drawing thread only takes a core from the renders (docs/benchmarks.md gives the measurements)."""
    return min(2, num_workers) if sysinfo.usable_cores() >= 4 else 1


#: threads the pool keeps at most (one per stream, for stand-ins that load at once)
_MAX_THREADS = 64
_producers: _Producers | None = None
_producers_pid = 0
_producers_lock = threading.Lock()


def producers_for(num_workers: int) -> _Producers:
    """This process's pool, grown for an iterator of ``num_workers`` streams (a forked child makes its own: the
    parent's threads are not in it)."""

    global _producers, _producers_pid
    with _producers_lock:
        if _producers is None or _producers_pid != os.getpid():
            _producers, _producers_pid = _Producers(), os.getpid()
        pool = _producers
    pool.grow(min(max(num_workers, 1), _MAX_THREADS), producers(num_workers))
    return pool


def _wrapped(exc: BaseException, worker_id: int) -> Any:
    """``exc`` as stock's worker sends an error: an ``ExceptionWrapper`` the main process raises at the batch."""
    from torch._utils import ExceptionWrapper

    try:
        raise exc
    except BaseException:  # noqa: BLE001 - (ExceptionWrapper reads the exception being handled)
        return ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")


def _load_task(pool: _Producers, ctx: Context, task: Task) -> None:
    """Load ``task``'s batch in its stream's turn: the fast path, else the stream's stand-in."""
    stream = task.stream
    with stream.turn:
        while stream.drawn != task.turn:
            stream.turn.wait()
    entered = not exit_gate.exiting()  # (no new work once the interpreter is exiting: see exit_gate)
    try:
        if not entered:
            raise RuntimeError("DataLoader's virtual worker: the interpreter is exiting")
        if not ctx.closed:  # (a dropped iterator's batch: nothing reads it)
            with pool.fast_path():
                task.data, why = _fast_batch(ctx, stream, task.index)
            if why is not None:
                task.data = _stand_in_batch(ctx, stream, task.index, why)
            elif ctx.pin is None:
                task.data = _in_shared_memory(task.data)
    except stand_in.WorkerDied as exc:
        task.died = exc
    except BaseException as exc:  # noqa: BLE001 - never the producer's end: the batch's error, at its batch
        task.data = _wrapped(exc, stream.worker_id)
    finally:
        with stream.turn:
            stream.drawn += 1
            stream.turn.notify_all()
    try:
        if entered and ctx.pin is not None and not ctx.closed and task.died is None:
            task.data = _pinned(task.data, *ctx.pin)
    finally:
        task.done.set()


def _pinned(data: Any, device: Any, index: int) -> Any:
    """``data`` pinned as stock's pin-memory thread pins a batch (its error wrapped as that thread wraps it)."""
    import torch
    from torch.utils.data import _utils

    if isinstance(data, _utils.ExceptionWrapper):
        return data
    try:
        torch.accelerator.set_device_index(index)
        return _utils.pin_memory.pin_memory(data, device)
    except Exception:  # noqa: BLE001 - raised at its batch, as stock's
        return _utils.ExceptionWrapper(where=f"in pin memory thread for device {index}")


def _fast_batch(ctx: Context, stream: Stream, indices: Any) -> tuple[Any, str | None]:
    """The collated batch of ``indices`` as worker ``stream.worker_id`` would send it, by the fast path, and None;
    or None and why a stand-in must load it (the stream's draws are then where they were)."""
    from ...vision.plans import batch_memory
    from .. import collate
    from ..batches import drawn_batches

    snap = ctx.snapshot
    start = stream.draws.words.copy()
    data: Any = None
    why = _state_changed(ctx)
    if why is None:
        try:
            entries = snap.entries(list(indices))
        except Exception as exc:  # noqa: BLE001 - a bad index: the stand-in raises stock's error at stock's sample
            why = f"an error at an index of the batch ({type(exc).__name__}: stock's, from stock's code)"
        else:
            try:
                with batch_memory.batches_in_shared_memory(ctx.pin is None):
                    data = drawn_batches.load_drawn(snap.dataset, snap.owner, entries, stream.draws,
                                                   ctx.render_threads, ctx.uint8)
            except Exception as exc:  # noqa: BLE001 - never the user's error: the stand-in loads it with stock's code
                why = f"an error on the fast path ({type(exc).__name__}: {exc})"
            else:
                if isinstance(data, drawn_batches.GivenBack):
                    why = data.why
    handed = collate.take_handed()
    if why is None:
        why = _state_changed(ctx)  # (while the batch loaded)
        if why is None and not _floats_are(data, ctx.state.default_dtype):
            why = "torch's default dtype changed while the batch loaded"
    if why is not None:
        stream.draws.words[:] = start  # (what the fast path drew is drawn again by the stand-in, with stock's code)
        return None, why
    batch = collate.collate_pairs(data, handed) if ctx.collate_fn is _default_collate() else None
    return (batch if batch is not None else ctx.collate_fn(data)), None


def _state_changed(ctx: Context) -> str | None:
    """What of the state a worker froze the script has changed since the iterator started (the stand-in has the
    frozen state), or None."""
    if ctx.state.is_live():
        return None
    return f"the script changed {worker_state.changed(ctx.state)} since the iterator started its workers"


def _stand_in_batch(ctx: Context, stream: Stream, indices: Any, why: str) -> Any:
    """The batch of ``indices`` from the stream's stand-in (stock's code, the worker's frozen state), the stream's
    generators moved on as it left them. ``why``: the fast path's reason to give it back, for the run report."""
    with ctx.lock:
        ctx.stand_ins += 1
        ctx.stand_in_reasons[why] = ctx.stand_in_reasons.get(why, 0) + 1
    report.count("dataloader", False, f"a virtual worker's batch loaded by its stand-in process (stock's code): "
                                      f"{why}")
    random_state, numpy_state = stream.python_states()
    got = ctx.stand_ins_procs.load(stream.worker_id, list(indices), stream.draws.torch_state(), random_state,
                                   numpy_state, ctx.uint8 is not None)
    stream.draws.load(got.torch_state)
    stream.random_state, stream.numpy_state = got.random_state, got.numpy_state
    return got.data


def _floats_are(data: list[tuple[Any, Any]], dtype: Any) -> bool:
    """Whether every floating tensor among the samples' images is of ``dtype`` (``ToTensor`` makes the default)."""
    import torch

    for sample in data:
        image = sample[0] if isinstance(sample, tuple) and sample else sample
        if isinstance(image, torch.Tensor) and image.is_floating_point() and image.dtype != dtype:
            return False
    return True


def _tensors_mapped(data: Any, fn: Callable[[Any], Any]) -> Any:
    """``data`` with ``fn`` applied to each tensor in it (lists, tuples, dicts walked as ``default_collate`` builds
    them; anything else kept)."""
    import torch

    if isinstance(data, torch.Tensor):
        return fn(data)
    if type(data) in (list, tuple):
        return type(data)(_tensors_mapped(x, fn) for x in data)
    if type(data) is dict:
        return {k: _tensors_mapped(v, fn) for k, v in data.items()}
    return data


def _in_shared_memory(data: Any) -> Any:
    """``data``'s tensors in shared memory, as a stock worker's batch reaches the main process (the batch tensor is
    made there; the small ones, such as the targets, are moved)."""
    def share(t: Any) -> Any:
        return t if t.is_shared() or t.device.type != "cpu" else t.share_memory_()

    return _tensors_mapped(data, share)


def as_inference(data: Any) -> Any:
    """``data``'s tensors as inference tensors over the same memory: what stock's main process rebuilds from a
    worker's batch under ``torch.inference_mode()``."""
    import torch

    def rebuild(t: Any) -> Any:
        if t.is_inference() or t.requires_grad:
            return t
        out = torch.empty((0,), dtype=t.dtype, device=t.device)
        return out.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())

    return _tensors_mapped(data, rebuild)


def _default_collate() -> Any:
    import torch.utils.data as data

    return data.default_collate


forks.fresh_in_child(globals(), _producers_lock=threading.Lock)
