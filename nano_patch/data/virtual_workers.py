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
program gives back, a failed render) is loaded by a stand-in (``stand_in.py``): a short-lived worker process in
that stream's exact state, running stock's code; its batch, or its error raised at stock's batch, comes back with
the generators' states, which the stream continues from.
"""

from __future__ import annotations

import copy
import functools
import itertools
import queue
import random
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import report, sysinfo

#: Start methods under which a worker is a fork of this process (a spawned worker imports the script again: user
#: code runs there, and nothing of it can be reproduced here).
_FORKED = (None, "fork")
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
    if loader.multiprocessing_context is not None and \
            getattr(loader.multiprocessing_context, "_name", None) not in _FORKED:
        return "a multiprocessing_context that does not fork"
    if not _forks_by_default(loader):
        return "the start method does not fork"
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


def _forks_by_default(loader: Any) -> bool:
    if loader.multiprocessing_context is not None:
        return True
    import torch.multiprocessing as mp

    return mp.get_start_method(allow_none=True) in _FORKED


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


class _Context:
    """What an iterator's tasks share with the producers: the snapshot, how to load and collate a batch, and whether
    the iterator is still in use (a dropped iterator's tasks are skipped, as stock's shut-down workers drop theirs)."""

    def __init__(self, loader: Any, snapshot: Snapshot, base_seed: int, render_threads: int) -> None:
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


class _Producers:
    """The threads that load the tasks of every virtual-worker iterator of this process, in the order they were
    sent; each stream's batches are drawn in the stream's order (a task waits for its stream's turn)."""

    def __init__(self, threads: int) -> None:
        self._queue: queue.SimpleQueue[tuple[_Context, Task] | None] = queue.SimpleQueue()
        self.threads = threads
        for k in range(threads):
            threading.Thread(target=self._serve, name=f"nano-patch-virtual-worker-{k}", daemon=True).start()

    def submit(self, ctx: _Context, task: Task) -> None:
        self._queue.put((ctx, task))

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            _load_task(*item)

    def stop(self) -> None:
        for _ in range(self.threads):
            self._queue.put(None)


def producers(num_workers: int) -> int:
    """Producer threads for ``num_workers`` streams: two where there are cores to spare (one draws the next batch
    while the other's renders on the native helpers: on a 16-core Xeon, 16 virtual workers loaded 1.3x the rate of
    16 loader threads, whose draws and renders alternate), one on fewer than 4 usable cores, where a second drawing
    thread only takes a core from the renders (on 2 cores two producers gave 0.82x one producer's rate, medians of
    5 interleaved rounds)."""
    return min(2, num_workers) if sysinfo.usable_cores() >= 4 else 1


_producers: _Producers | None = None
_producers_pid = 0
_producers_lock = threading.Lock()


def _producers_for(threads: int) -> _Producers:
    import os

    global _producers, _producers_pid
    with _producers_lock:
        if _producers is None or _producers_pid != os.getpid() or _producers.threads < threads:
            if _producers is not None and _producers_pid == os.getpid():
                _producers.stop()
            _producers, _producers_pid = _Producers(threads), os.getpid()
        return _producers


def _wrapped(exc: BaseException, worker_id: int) -> Any:
    """``exc`` as stock's worker sends an error: an ``ExceptionWrapper`` the main process raises at the batch."""
    from torch._utils import ExceptionWrapper

    try:
        raise exc
    except BaseException:  # noqa: BLE001 - (ExceptionWrapper reads the exception being handled)
        return ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")


def _load_task(ctx: _Context, task: Task) -> None:
    """Load ``task``'s batch in its stream's turn: the fast path, else a stand-in in the stream's state."""
    stream = task.stream
    with stream.turn:
        while stream.drawn != task.turn:
            stream.turn.wait()
    try:
        if not ctx.closed:  # (a dropped iterator's batch: nothing reads it)
            task.data = _load_batch(ctx, stream, task.index)
    except BaseException as exc:  # noqa: BLE001 - never the producer's end: the batch's error, at its batch
        task.data = _wrapped(exc, stream.worker_id)
    finally:
        with stream.turn:
            stream.drawn += 1
            stream.turn.notify_all()
    if ctx.pin is not None and not ctx.closed:
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


def _load_batch(ctx: _Context, stream: Stream, indices: Any) -> Any:
    """The collated batch of ``indices`` as worker ``stream.worker_id`` would send it, or the error it would send."""
    from . import batch_loader, collate, stand_in

    snap = ctx.snapshot
    start = stream.draws.words.copy()
    data = None
    try:
        entries = snap.entries(list(indices))
    except Exception:  # noqa: BLE001 - a bad index: the stand-in raises stock's error at stock's sample
        entries = None
    if entries is not None:
        try:
            data = batch_loader.load_drawn(snap.dataset, snap.owner, entries, stream.draws, ctx.render_threads,
                                           ctx.uint8)
        except Exception:  # noqa: BLE001 - never the user's error: the stand-in loads it with stock's code
            data = None
    if data is not None:
        handed = collate.take_handed()
        batch = collate.collate_pairs(data, handed) if ctx.collate_fn is _default_collate() else None
        return batch if batch is not None else ctx.collate_fn(data)
    collate.take_handed()
    stream.draws.words[:] = start  # (what the fast path drew is drawn again by the stand-in, with stock's code)
    with ctx.lock:
        ctx.stand_ins += 1
    report.count("dataloader", False, "a virtual worker's batch loaded by a stand-in process (stock's code: a file "
                                      "PIL must open, a draw the program gives back, or an error)")
    random_state, numpy_state = stream.python_states()
    got = stand_in.load(snap.stock_dataset(), list(indices), stream.worker_id, ctx.num_workers, ctx.base_seed,
                        stream.draws.torch_state(), random_state, numpy_state, ctx.collate_fn, ctx.drop_last,
                        ctx.uint8 is not None)
    stream.draws.load(got.torch_state)
    stream.random_state, stream.numpy_state = got.random_state, got.numpy_state
    return got.data


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
    its batches stop before the tensor tail, which the device finishes."""
    from ..vision import native

    kernel = native.kernel("torch_draws")
    cores = sysinfo.usable_cores()
    threads = min(int(loader_threads), cores) if isinstance(loader_threads, int) else min(loader.num_workers, cores)
    cls = iterator_class()
    return _stock_get_iterator(lambda loader: cls(loader, kernel, max(1, threads), uint8))(loader)


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
    from torch.utils.data import _utils
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    class VirtualWorkersIter(_BaseDataLoaderIter):
        """``num_workers=N`` as N streams in this process (the module's docstring): the main process's side is
        stock's ``_MultiProcessingDataLoaderIter``'s, the workers' batches are loaded ahead by the producers."""

        def __init__(self, loader: Any, kernel: Any, render_threads: int, uint8: bool) -> None:
            # stock's warnings (from its multi-process iterator's own line), the sampler's iterator, the base seed
            # (as stock draws it)
            _base_init()(self, loader)
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
            self._ctx = _Context(loader, Snapshot.of(loader.dataset), self._base_seed, render_threads)
            if self._pin_memory:  # pinned by the producers, where stock's pin-memory thread pins
                import torch

                self._ctx.pin = (getattr(self, "_pin_memory_device", None), torch.accelerator.current_device_index())
            self._producers = _producers_for(producers(self._num_workers))
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
            super()._reset(loader, first_iter)
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
            task = self._tasks.pop(self._rcvd_idx)
            self._rcvd_idx += 1
            if not task.done.wait(self._timeout if self._timeout > 0 else None):
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            data = task.data
            self._try_put_index()
            if isinstance(data, _utils.ExceptionWrapper):
                data.reraise()
            return data

        def _shutdown_workers(self) -> None:
            """What stock's shutdown is to its workers: the tasks not loaded yet are dropped."""
            self._ctx.closed = True

        def describe(self) -> dict[str, Any]:
            return {"workers": self._num_workers, "render_threads": self._ctx.render_threads,
                    "stand_in_batches": self._ctx.stand_ins}

        def __del__(self) -> None:
            self._ctx.closed = True

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
