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

import contextlib
import copy
import functools
import itertools
import os
import queue
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import forks, report, sysinfo
from . import stand_in, worker_state

#: Start methods whose workers virtual workers reproduce: a fork of this process (its state frozen when the iterator
#: starts), or a fresh interpreter (forkserver, spawn: the defaults, the dataset a pickle round trip).
_START_METHODS = ("fork", "forkserver", "spawn")
#: DataLoader methods that make its iterator: a subclass that overrides one keeps stock's path, where it runs.
_LOADER_METHODS = ("__iter__", "_get_iterator", "_index_sampler", "check_worker_number_rationality",
                   "_auto_collation")
#: Path suffixes of the JPEGs the fast path loads (another file keeps real worker processes).
_JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


@dataclass
class Seeds:
    """What a worker's generators start from: torch's seed, ``random``'s, and NumPy's (its ``np.random.seed``
    argument, or None where NumPy is not seeded)."""

    torch_seed: int
    random_seed: int
    numpy_seed: Any


def stock_seeds(base_seed: int, worker_id: int) -> Seeds:
    """Stock's worker seeding (``torch.utils.data._utils.worker._worker_loop``)."""
    from torch.utils.data._utils import worker

    seed = base_seed + worker_id
    return Seeds(seed, seed, worker._generate_state(base_seed, worker_id))


def lightning_seeds(base_seed: int, worker_id: int, rank: int, generate: Callable[..., list[int]]) -> Seeds:
    """``pl_worker_init_function``'s seeding after stock's (Lightning's ``seed_everything(workers=True)``): its seed
    sequence from the base seed, the worker's id and the rank (``generate``: Lightning's own function)."""
    seq = generate(base_seed, worker_id, rank, count=4)
    numpy_seed = np.random.SeedSequence([base_seed, worker_id, rank]).generate_state(4)
    return Seeds(seq[0], (seq[1] << 32) | seq[2], numpy_seed)


def _lightning_init(fn: Any) -> tuple[Callable[..., list[int]], int | None] | None:
    """Lightning's seed-sequence function and the rank (None: its default) where ``fn`` is Lightning's
    ``pl_worker_init_function`` (as ``seed_everything(workers=True)`` injects it: bare, or with ``rank=``); else
    None."""
    import sys

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if type(fn) is functools.partial:
        fn, args, kwargs = fn.func, fn.args, dict(fn.keywords)
    if args or set(kwargs) - {"rank"}:
        return None
    for name in ("lightning_fabric.utilities.seed", "lightning.fabric.utilities.seed"):
        module = sys.modules.get(name)
        if module is not None and fn is getattr(module, "pl_worker_init_function", None):
            generate = getattr(module, "_generate_seed_sequence", None)
            if generate is None:
                return None
            return generate, kwargs.get("rank")
    return None


def _default_rank(generate: Any) -> int:
    """``rank_zero_only.rank``, as ``pl_worker_init_function`` reads it without a ``rank``."""
    import sys

    module = sys.modules[generate.__module__]
    return int(getattr(getattr(module, "rank_zero_only", None), "rank", 0) or 0)


def why_not(loader: Any, loader_threads: int | str) -> str | None:
    """Why ``loader``'s workers stay processes (None: they can run here). Decided from types and stock objects
    alone: nothing of a user's class runs."""
    import sys

    import torch.utils.data as data

    from . import fetch

    if loader_threads == "off":
        return "loader_threads is off"
    method = start_method(loader)
    if method not in _START_METHODS:
        return f"the start method {method!r}"
    if method != "fork":
        differs = worker_state.differs_from_fresh()
        if differs:
            return f"a fresh {method} worker would not see this process's {differs}"
    overridden = [name for name in _LOADER_METHODS if _defined_by(type(loader), name) is not data.DataLoader]
    if overridden:
        return f"{type(loader).__name__} overrides DataLoader.{overridden[0]} (stock's path runs it)"
    if loader.batch_sampler is None:
        return "batch_size=None (samples one by one)"
    if loader.collate_fn is not data.default_collate:
        return "the loader's own collate_fn"
    if loader.worker_init_fn is not None and _lightning_init(loader.worker_init_fn) is None:
        return "a worker_init_fn of the user's (it may draw, or read get_worker_info())"
    if not isinstance(loader.dataset, data.Dataset) or isinstance(loader.dataset, data.IterableDataset):
        return "not a map-style dataset"
    root, chain = _root(loader.dataset)
    if root is None:
        return chain  # type: ignore[return-value]
    if not fetch.patched_dataset(loader.dataset):
        return f"a {type(root).__name__} is not a dataset the patch loads"
    folder = sys.modules.get("torchvision.datasets.folder")
    if folder is None or not isinstance(root, folder.DatasetFolder):
        return f"a {type(root).__name__} is not an ImageFolder or DatasetFolder"
    from . import batch_loader

    why = batch_loader.why_not_drawn_apart(root)
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


def _root(dataset: Any) -> tuple[Any, Any]:
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
    with _jpeg_lock, _suppress_type_error():
        _jpeg_lists[id(samples)] = samples
        _jpeg_lengths[id(samples)] = len(samples)
    return True


class _suppress_type_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is TypeError


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

        root, _ = _root(dataset)
        copied = pickle.loads(ForkingPickler.dumps(dataset))  # noqa: S301 - our own bytes, made just now
        snap_root, subsets = _root(copied)
        chain = [tuple(s.indices) if not isinstance(s.indices, range) else s.indices for s in subsets]
        return cls(snap_root, root, chain)

    @classmethod
    def of(cls, dataset: Any) -> Snapshot:
        root, subsets = _root(dataset)
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

        from ..vision import torch_draws

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


class _Context:
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
        self._queue: queue.SimpleQueue[tuple[_Context, Task]] = queue.SimpleQueue()
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
                t = threading.Thread(target=self._serve, name=f"nano-patch-virtual-worker-{len(self._threads)}",
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def submit(self, ctx: _Context, task: Task) -> None:
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
        while True:
            _load_task(self, *self._queue.get())


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


def _producers_for(num_workers: int) -> _Producers:
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


def _load_task(pool: _Producers, ctx: _Context, task: Task) -> None:
    """Load ``task``'s batch in its stream's turn: the fast path, else the stream's stand-in."""
    stream = task.stream
    with stream.turn:
        while stream.drawn != task.turn:
            stream.turn.wait()
    try:
        if not ctx.closed:  # (a dropped iterator's batch: nothing reads it)
            with pool.fast_path():
                task.data = _fast_batch(ctx, stream, task.index)
            if task.data is None:
                task.data = _stand_in_batch(ctx, stream, task.index)
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
    if ctx.pin is not None and not ctx.closed and task.died is None:
        task.data = _pinned(task.data, *ctx.pin)
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


def _fast_batch(ctx: _Context, stream: Stream, indices: Any) -> Any:
    """The collated batch of ``indices`` as worker ``stream.worker_id`` would send it, by the fast path; or None
    where a stand-in must load it (the stream's draws are then where they were)."""
    from ..vision import oprunner
    from . import batch_loader, collate

    snap = ctx.snapshot
    start = stream.draws.words.copy()
    data = None
    if ctx.state.is_live():  # (else the script changed what a worker froze: the stand-in has it)
        try:
            entries = snap.entries(list(indices))
        except Exception:  # noqa: BLE001 - a bad index: the stand-in raises stock's error at stock's sample
            entries = None
        if entries is not None:
            try:
                with oprunner.batches_in_shared_memory(ctx.pin is None):
                    data = batch_loader.load_drawn(snap.dataset, snap.owner, entries, stream.draws,
                                                   ctx.render_threads, ctx.uint8)
            except Exception:  # noqa: BLE001 - never the user's error: the stand-in loads it with stock's code
                data = None
    handed = collate.take_handed()
    if data is not None and not (ctx.state.is_live() and _floats_are(data, ctx.state.default_dtype)):
        data = None  # (the state changed while the batch loaded)
    if data is None:
        stream.draws.words[:] = start  # (what the fast path drew is drawn again by the stand-in, with stock's code)
        return None
    batch = collate.collate_pairs(data, handed) if ctx.collate_fn is _default_collate() else None
    return batch if batch is not None else ctx.collate_fn(data)


def _stand_in_batch(ctx: _Context, stream: Stream, indices: Any) -> Any:
    """The batch of ``indices`` from the stream's stand-in (stock's code, the worker's frozen state), the stream's
    generators moved on as it left them."""
    with ctx.lock:
        ctx.stand_ins += 1
    report.count("dataloader", False, "a virtual worker's batch loaded by its stand-in process (stock's code: a file "
                                      "PIL must open, a draw the program gives back, a state changed since the "
                                      "iterator started, or an error)")
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


def _as_inference(data: Any) -> Any:
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
    from ..vision import native

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
    return _stock_get_iterator(lambda loader: cls(loader, kernel, max(1, threads), uint8, snapshot, fresh))(loader)


_get_iterators: dict[Any, Callable[[Any], Any]] = {}


def _stock_get_iterator(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Stock's ``DataLoader._get_iterator`` (its own code: the worker-number check and its warning come from its
    line, in its module's warning registry), its multi-process iterator made by ``make`` instead."""
    import types

    import torch.utils.data.dataloader as module

    stock = vars(module.DataLoader)["_get_iterator"]
    stock = getattr(stock, "__wrapped__", stock)
    fn = _get_iterators.get(stock)
    if fn is None:
        made = threading.local()
        namespace = dict(vars(module))
        namespace["__warningregistry__"] = vars(module).setdefault("__warningregistry__", {})
        namespace["_MultiProcessingDataLoaderIter"] = lambda loader: made.make(loader)
        code = types.FunctionType(stock.__code__, namespace, stock.__name__, stock.__defaults__, stock.__closure__)

        def fn(loader: Any, made: Any = made, code: Any = code) -> Any:
            return code(loader)

        fn.made = made  # type: ignore[attr-defined]
        _get_iterators[stock] = fn
    fn.made.make = make  # type: ignore[attr-defined]
    return fn


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
            _base_init()(self, loader)
            self._profile_name = f"enumerate(DataLoader)#{_MultiProcessingDataLoaderIter.__name__}.__next__"
            self._shutdown = False
            self._workers: list[Any] = []
            self._prefetch_factor = loader.prefetch_factor
            self._kernel = kernel
            found = _lightning_init(loader.worker_init_fn)
            if found is None:
                seeds = [stock_seeds(self._base_seed, k) for k in range(self._num_workers)]
            else:
                generate, rank = found
                rank = _default_rank(generate) if rank is None else rank
                seeds = [lightning_seeds(self._base_seed, k, rank, generate) for k in range(self._num_workers)]
            if not _numpy_seeded():
                for s in seeds:
                    s.numpy_seed = None
            self._streams = [Stream(k, s, kernel) for k, s in enumerate(seeds)]
            self._ctx = _Context(loader, snapshot, self._base_seed, render_threads, fresh)
            if self._pin_memory:  # pinned by the producers, where stock's pin-memory thread pins
                import torch

                self._ctx.pin = (getattr(self, "_pin_memory_device", None), torch.accelerator.current_device_index())
            self._producers = _producers_for(self._num_workers)
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
                data = _as_inference(data)  # (stock rebuilds a worker's batch in this thread's mode)
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


_base_inits: list[Callable[[Any, Any], None]] = []


def _base_init() -> Callable[[Any, Any], None]:
    """``_BaseDataLoaderIter.__init__`` called from the line where stock's ``_MultiProcessingDataLoaderIter.__init__``
    calls it: the warnings it gives (``pin_memory`` without an accelerator) name stock's file and line, and go
    through its module's warning registry, as stock's do."""
    if _base_inits:
        return _base_inits[0]
    import inspect

    import torch.utils.data.dataloader as module

    fn = None
    try:
        lines, first = inspect.getsourcelines(module._MultiProcessingDataLoaderIter.__init__)
        at = next(first + k for k, line in enumerate(lines) if line.strip() == "super().__init__(loader)")
        namespace = dict(vars(module))
        namespace["__warningregistry__"] = vars(module).setdefault("__warningregistry__", {})
        source = "\n" * (at - 1) + "def _base_init(self, loader): _BaseDataLoaderIter.__init__(self, loader)\n"
        exec(compile(source, module.__file__, "exec"), namespace)  # noqa: S102 - a fixed line of our own
        fn = namespace["_base_init"]
    except (OSError, TypeError, StopIteration, SyntaxError):  # no source to point at: called from here
        fn = module._BaseDataLoaderIter.__init__
    _base_inits.append(fn)
    return fn


def _numpy_seeded() -> bool:
    """Whether stock's workers seed NumPy (they do where torch found it importable)."""
    from torch.utils.data._utils import worker

    return bool(getattr(worker, "HAS_NUMPY", True))


forks.fresh_in_child(globals(), _jpeg_lock=threading.Lock, _producers_lock=threading.Lock)
