"""``num_workers=0`` made ahead, exactly: the next batch drawn and rendered while the training step runs, and used at
``next()`` only where everything stock's fetch would read then is still as it was (speculate, then check).

Stock's single-process iterator makes a batch when ``next()`` is called: the sampler's indices, then each sample's
draws from torch's global generator, in the calling thread. So the step and the loading add up. Here, once a batch
is handed over, the next one is made on a loader thread from a copy of torch's generator as it stands then (the
virtual workers' fast path, ``drawn_batches.load_drawn``: native draws from a private state, no generator of
torch's, Python's or NumPy's read or moved, nothing warned or called).

What stock's fetch reads at ``next()`` (torch's ``_MapDatasetFetcher.fetch``, ``Subset.__getitems__`` and
``__getitem__``, ``DatasetFolder.__getitem__``, its loader, the transform, ``default_collate``), each recorded where
the batch is made ahead (:class:`_Reads`, and each file's identity just before the loader thread reads it) and
compared at hand-over, by identity for objects and by value for states:

1. the loader's dataset and every ``Subset`` below it: each the same object of the same class, whose
   ``__getitem__`` and ``__getitems__`` (the class's, and one set on the instance) are the same, each ``Subset``'s
   ``dataset`` and ``indices`` the same objects;
2. the root dataset's attributes its ``__getitem__`` reads: ``samples``, ``loader``, ``transform`` and
   ``target_transform``, each the same object; and the samples the batch's indices map to, each the same
   ``(path, target)`` object;
3. the transform's steps and every step's attributes, compared by value (``compose_state``), and torch's defaults
   its draws and ``ToTensor`` read (the default dtype and device);
4. each sample's file: its device, inode, size, modification and change times (``stat``) as they were just before
   the loader thread read it; a file whose times were too recent to tell a rewrite apart (``cache.racy``) proves
   nothing, and a file that is gone makes the batch as stock makes it, which raises stock's error;
5. PIL's flags and the working directory (``worker_state``), torchvision's image backend;
6. the fetcher's ``collate_fn`` and ``default_collate``'s functions for tensors and ints;
7. the calling thread's torch modes (grad, inference, autocast: ``thread_modes``);
8. torch's generator, which must stand where the copy was taken (a training step on the CPU that draws, dropout for
   one, moves it; on a GPU the model draws from the CUDA generator); it then moves on by the batch's draws in one
   operation, as stock's draws would have moved it;
9. the batch loaded whole by the fast path (anything that needs stock's code, a warning or an error, makes it
   again as stock does).

Where any differs, the batch is thrown away and stock's fetch makes it, at ``next()``, from what it reads then; the
batches made after it are thrown away too. Where the loader's eligibility may have changed (anything of 1-3 or 5
differs from what it was last decided on), it is decided again before the next batch is made ahead.

Only where no code of the user's runs in the loading (the loader's eligibility is the virtual workers':
``virtual_eligibility.why_not_made_apart``) and the sampler's next indices can be taken early without moving a
generator anyone sees (a ``BatchSampler`` over a ``SequentialSampler``, or over a ``RandomSampler`` with no generator
of its own: its one draw from torch's generator is at the epoch's first batch, which is always made as stock's).
The indices are pulled one batch early, so a ``batch_size`` set on the ``BatchSampler`` itself in the middle of an
epoch applies a batch late (the DataLoader's own ``batch_size`` cannot be set). A loader whose steps keep moving
torch's generator stops making batches ahead after three in a row. ``--report`` counts the batches made ahead,
those used, and why any were thrown away.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from ... import config, forks, report, sysinfo
from ...vision.images import file_index
from ...vision.kernels import native, torch_draws
from ...vision.plans.compose_state import ComposeState
from .. import collate
from ..workers import worker_state
from ..workers.virtual_eligibility import root_of, why_not_made_apart
from . import exit_gate, thread_modes

REPORT_KEY = "dataloader"
#: batches thrown away in a row because torch's generator moved (the step draws from it) before a loader stops
MOVED_LIMIT = 3
#: seconds between checks that the thread making the batch still lives, while next() waits for it
WATCH_INTERVAL = 1.0


def why_not(loader: Any) -> str | None:
    """Why ``loader`` (``num_workers=0``) cannot have its batches made ahead (None: it can)."""
    import torch.utils.data as data

    if not config.current().batches_ahead:
        return "batches_ahead is off"
    sampler = getattr(loader.batch_sampler, "sampler", None)
    if type(loader.batch_sampler) is not data.BatchSampler or not (
            type(sampler) is data.SequentialSampler
            or (type(sampler) is data.RandomSampler and sampler.generator is None)):
        return "a sampler whose next indices cannot be taken early (only BatchSampler over Sequential or " \
               "RandomSampler without a generator of its own)"
    why = getattr(loader, "_nano_ahead_off", None)
    return why if why is not None else why_not_made_apart(loader)


def install(iterator: Any, loader: Any, n_threads: int, uint8: Any = None) -> str | None:
    """Make ``iterator`` (stock's single-process iterator over ``loader``) hand over batches made ahead where they
    are stock's; None, or why not (the iterator is left as it is). ``uint8``: the Compose this iteration stops
    before its tail (a device finishes it), or None."""
    why = why_not(loader)
    if why is not None:
        return why
    ahead = _Ahead(iterator, loader, n_threads, uint8)
    iterator._next_data = ahead.next_data  # (an instance attribute: the iterator stays stock's class)
    return None


def _class_reads(obj: Any) -> tuple[Any, ...]:
    """What of ``obj``'s class a fetch reads: the class, its ``__getitem__`` and ``__getitems__`` (as the class's
    namespaces hold them: a descriptor makes a new object at each look-up), and a ``__getitems__`` set on the
    instance (the fetcher asks the object for it)."""
    cls = type(obj)
    own = vars(obj).get("__getitems__") if hasattr(obj, "__dict__") else None
    return (cls, _defined(cls, "__getitem__"), _defined(cls, "__getitems__"), own)


def _defined(cls: type, name: str) -> Any:
    """``name`` as the first class of ``cls``'s MRO that holds it has it (None: no class does)."""
    for klass in cls.__mro__:
        found = vars(klass).get(name, _NONE)
        if found is not _NONE:
            return found
    return None


_NONE = object()


#: the root dataset's attributes its ``__getitem__`` reads
_ATTRIBUTES = ("samples", "loader", "transform", "target_transform")


@dataclass(eq=False)
class _Reads:
    """What stock's fetch of a batch reads at ``next()`` (the module's inventory, files aside), at one moment."""

    #: the loader's dataset, each ``Subset`` below it and the root, outermost first, each with its class's reads
    chain: tuple[tuple[Any, tuple[Any, ...]], ...]
    #: each ``Subset``'s indices object, outermost first
    indices: tuple[Any, ...]
    #: the root's ``samples``, ``loader``, ``transform`` and ``target_transform``
    attributes: tuple[Any, Any, Any, Any]
    #: the fetcher's collate_fn, and default_collate's functions for tensors and ints
    collate: tuple[Any, Any, Any]
    backend: str
    draws_stock: bool
    state: worker_state.WorkerState
    modes: thread_modes.ThreadModes | None

    @classmethod
    def now(cls, it: Any) -> _Reads | None:
        """The reads as they stand, for iterator ``it``; None where the dataset is no longer a chain of ``Subset``s
        over a root (stock's fetch then decides everything)."""
        import torchvision
        from torch.utils.data._utils import collate as stock_collate

        dataset = it._dataset
        root, subsets = root_of(dataset)
        if root is None:
            return None
        objects = (*subsets, root)
        fn_map = stock_collate.default_collate_fn_map
        import torch

        return cls(chain=tuple((o, _class_reads(o)) for o in objects),
                   indices=tuple(s.indices for s in subsets),
                   attributes=tuple(getattr(root, name, None) for name in _ATTRIBUTES),  # type: ignore[arg-type]
                   collate=(it._dataset_fetcher.collate_fn, fn_map.get(torch.Tensor), fn_map.get(int)),
                   backend=torchvision.get_image_backend(), draws_stock=torch_draws.defaults_are_stock(),
                   state=worker_state.capture(), modes=thread_modes.capture())

    @property
    def root(self) -> Any:
        return self.chain[-1][0]

    @property
    def transform(self) -> Any:
        return self.attributes[2]

    def changed(self, then: _Reads, modes: bool = True) -> str | None:
        """What of these reads differs from ``then`` (None: nothing), for the run report; ``modes``: the calling
        thread's torch modes compared too."""
        if len(self.chain) != len(then.chain) or any(
                a is not b or any(x is not y for x, y in zip(ca, cb))
                for (a, ca), (b, cb) in zip(self.chain, then.chain)):
            return "the dataset, a Subset or its class changed"
        if any(a is not b for a, b in zip(self.indices, then.indices)):
            return "a Subset's indices changed"
        changed = [n for n, a, b in zip(_ATTRIBUTES, self.attributes, then.attributes) if a is not b]
        if changed:
            return f"the dataset's {changed[0]} changed"
        if any(a is not b for a, b in zip(self.collate, then.collate)):
            return "the collate function changed"
        if self.backend != then.backend:
            return "torchvision's image backend changed"
        if self.draws_stock != then.draws_stock or self.state.default_dtype != then.state.default_dtype:
            return "torch's default dtype or device changed"
        if self.state != then.state:
            return "PIL's flags or the working directory changed"
        if modes and self.modes != then.modes:
            return "the calling thread's torch modes changed"
        return None


@dataclass
class _Pending:
    """The indices of a batch pulled from the sampler ahead, and the batch made ahead from them (or being made):
    what it was made from, and what came of it. ``draws`` None: not made ahead (stock's code makes it)."""

    index: Any
    reads: _Reads | None = None
    entries: list[Any] | None = None
    compose: ComposeState | None = None
    #: each sample's file as it was just before the loader thread read it (None: nothing could be proved of it)
    files: list[Any] = field(default_factory=list)
    draws: Any = None
    #: the batch made ahead just before this one, whose draws this one's start from (None: torch's generator now)
    after: _Pending | None = None
    done: threading.Event = field(default_factory=threading.Event)
    data: Any = None
    #: what the run report counts of it, counted where it is handed over (``drawn_batches.Counted``)
    counted: list[Any] = field(default_factory=list)
    #: why it cannot be handed over, found while it was made (None: it can, if nothing changed since)
    why: str | None = None


#: ``sampler`` is exhausted: the pulled ``next()`` raised StopIteration (stock's next ``next()`` raises it too)
_END = object()
#: batches made ahead at most (each waits for the one before it on the same loader thread)
AHEAD = 2


class _Ahead:
    """One iterator's batches made ahead (weakly bound to it: a dropped iterator is not kept alive; the loader is
    held while the iterator lives)."""

    def __init__(self, iterator: Any, loader: Any, n_threads: int, uint8: Any) -> None:
        self._iterator = weakref.ref(iterator)
        self._uint8 = uint8
        # (held, not weakly: ``for batch in DataLoader(...)`` drops the loader while its iterator runs)
        self._loader = loader
        self._n_threads = n_threads
        #: the reads the loader's eligibility was last decided on (it was: ``install`` checked it)
        self._eligible: _Reads | None = _Reads.now(iterator)
        #: indices pulled from the sampler ahead, in order, each with its batch made ahead or not
        self._queue: collections.deque[_Pending] = collections.deque()

    def next_data(self) -> Any:
        """Stock's ``_next_data``, pinning included, a batch made ahead handed over where it is stock's; then the
        next ones made ahead."""
        it = self._iterator()
        data = self._next_batch(it)
        if it._pin_memory:
            from torch.utils.data import _utils

            data = _utils.pin_memory.pin_memory(data, it._pin_memory_device)
        return data

    def _next_batch(self, it: Any) -> Any:
        if not self._queue:
            index = it._next_index()  # may raise StopIteration
        else:
            pending = self._queue.popleft()
            if pending.index is _END:
                index = it._next_index()  # (raises StopIteration again, as stock's would)
            else:
                index = pending.index
                if pending.draws is not None:
                    data = self._take(pending) if config.in_force() is not None else _NOT_TAKEN
                    if data is not _NOT_TAKEN:
                        self._fill(it)
                        return data
                    for later in self._queue:  # (drawn from where this one's draws would have left the generator)
                        later.draws = None
        data = it._dataset_fetcher.fetch(index)
        self._fill(it)
        return data

    def _fill(self, it: Any) -> None:
        """Up to :data:`AHEAD` batches made ahead on the loader thread, each from where the one before it leaves
        torch's generator (the first from where it stands now)."""
        loader = self._loader
        if getattr(loader, "_nano_ahead_off", None) is not None or config.in_force() is None or exit_gate.exiting():
            return
        while len(self._queue) < AHEAD:
            last = self._queue[-1] if self._queue else None
            if last is not None and (last.index is _END or last.draws is None):
                return  # (past the epoch's end, or after a batch stock's code makes: its draws are not known yet)
            if not self._launch(it, last):
                return

    def _launch(self, it: Any, after: _Pending | None) -> bool:
        """Pull the next indices and make their batch ahead; False where nothing more is made ahead now."""
        try:
            index = it._next_index()
        except StopIteration:
            self._queue.append(_Pending(_END))
            return False
        pending = _Pending(index, after=after)
        self._queue.append(pending)
        reads = _Reads.now(it)
        if reads is None or reads.modes is None or not self._still_eligible(reads):
            return False  # (stock's code makes it: a state that cannot be carried, or a loader that is not eligible)
        entries = _entries(reads, index)
        if entries is None:
            return False  # (an index that does not map: stock's fetch raises it, at its sample)
        import torch

        pending.reads, pending.entries, pending.compose = reads, entries, ComposeState(reads.transform)
        # (from torch's generator as it stands now; one made after another starts where that one's draws end,
        # which the loader thread loads once it is made)
        pending.draws = torch_draws.TorchDraws.from_state(native.kernel("torch_draws"), torch.get_rng_state())
        _maker().submit(self, pending)
        return True

    def _still_eligible(self, reads: _Reads) -> bool:
        """Whether the loader may still have its batches made ahead, decided again where anything it was decided on
        has changed since (a new transform, target_transform, loader, dataset, default dtype or backend)."""
        eligible = self._eligible
        if eligible is not None and reads.changed(eligible, modes=False) is None and reads.draws_stock:
            return True
        loader = self._loader
        why = why_not_made_apart(loader)
        if why is None and not reads.draws_stock:
            why = "torch's default dtype or device is not the draws' (float32 on the CPU)"
        if why is not None:
            self._eligible = None
            report.count(REPORT_KEY, False, f"num_workers=0: no batch made ahead: {why}")
            return False
        self._eligible = reads
        return True

    def make(self, pending: _Pending) -> None:
        """On the loader thread: the batch of ``pending``, drawn from its copy of the generator and collated."""
        import torch.utils.data as data

        from ..batches import drawn_batches

        try:
            after = pending.after
            if after is not None:  # (made before this one, on this thread)
                if after.why is not None or after.data is None:
                    pending.why = "the batch made ahead before it was not made"
                    return
                pending.draws.load(after.draws.torch_state())
            root = pending.reads.root  # type: ignore[union-attr]
            with thread_modes.entered(pending.reads.modes):  # type: ignore[union-attr]
                got = drawn_batches.load_drawn(root, root, pending.entries, pending.draws, self._n_threads,
                                               self._uint8, pending.counted, pending.files)
                handed = collate.take_handed()
                if isinstance(got, drawn_batches.GivenBack):
                    pending.why = got.why
                    return
                batch = collate.collate_pairs(got, handed)
                pending.data = batch if batch is not None else data.default_collate(got)
        except Exception as exc:  # noqa: BLE001 - never the user's error: stock's code makes the batch again
            pending.why = f"an error while it was made ahead ({type(exc).__name__})"
        finally:
            pending.after = None  # (no chain of batches kept alive)
            pending.done.set()

    def _take(self, pending: _Pending) -> Any:
        """The batch made ahead, where it is stock's now (torch's generator moved on by its draws); else
        :data:`_NOT_TAKEN`, with the reason counted."""
        while not pending.done.wait(WATCH_INTERVAL):
            if not _maker().alive():
                return self._thrown(pending, "the loader thread that made it stopped")
        if pending.why is not None:
            return self._thrown(pending, pending.why)
        then = pending.reads
        now = _Reads.now(self._iterator())
        why = "the dataset is no longer a Subset chain over a root" if now is None else now.changed(then)  # type: ignore[arg-type]
        if why is not None:
            return self._thrown(pending, f"{why} since it was made")
        if not pending.compose.still(now.transform):  # type: ignore[union-attr]
            return self._thrown(pending, "the transform changed since it was made (its steps or parameters)")
        entries = _entries(now, pending.index)  # type: ignore[arg-type]
        if entries is None or len(entries) != len(pending.entries) or any(  # type: ignore[arg-type]
                a is not b for a, b in zip(entries, pending.entries)):  # type: ignore[arg-type]
            return self._thrown(pending, "the dataset's samples changed since it was made")
        if len(pending.files) != len(entries) or None in pending.files or \
                file_index.identities([path for path, _ in entries]) != pending.files:
            return self._thrown(pending, "a sample's file changed, or was too new to prove unchanged, since it was "
                                         "read")
        loader = self._loader
        if not pending.draws.to_torch_unless_moved():
            # (counted on the loader, across its epochs: a step that draws keeps drawing)
            moved = loader._nano_ahead_moved = getattr(loader, "_nano_ahead_moved", 0) + 1
            if moved >= MOVED_LIMIT:
                why = (f"torch's generator moved between batches {MOVED_LIMIT} times in a row (the training step "
                       f"draws from it)")
                loader._nano_ahead_off = why
                report.count(REPORT_KEY, False, f"num_workers=0: no more batches made ahead for this loader: {why}")
            return self._thrown(pending, _MOVED)
        loader._nano_ahead_moved = 0
        report.count(REPORT_KEY, True, "num_workers=0: a batch made ahead while the step ran, handed over")
        for counted in pending.counted:
            counted.count()
        return pending.data

    def _thrown(self, pending: _Pending, why: str) -> Any:
        report.count(REPORT_KEY, False, f"num_workers=0: a batch made ahead, thrown away and made as stock: {why}")
        return _NOT_TAKEN


def _entries(reads: _Reads, index: Any) -> list[Any] | None:
    """The samples ``(path, target)`` of ``index``, mapped through the ``Subset``s; None where one does not map."""
    try:
        indices = list(index)
        for subset_indices in reads.indices:
            indices = [subset_indices[i] for i in indices]
        samples = reads.attributes[0]
        return [samples[i] for i in indices]
    except Exception:  # noqa: BLE001 - stock's fetch raises it, at its sample
        return None


_NOT_TAKEN = object()
_MOVED = "torch's generator moved since it was made (a draw between batches)"


class _Maker:
    """The thread that makes batches ahead, for every iterator of this process, one at a time, at a lower
    scheduling priority than the training thread (it fills what the step leaves of the cores). Ended before the
    interpreter finalizes (``exit_gate``): once it is exiting, nothing more is made."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[_Ahead, _Pending] | None] = queue.SimpleQueue()
        self._thread = exit_gate.start(self._serve, "nano-patch-batches-ahead", wake=lambda: self._queue.put(None))

    def submit(self, ahead: _Ahead, pending: _Pending) -> None:
        if self._thread is None:  # (the interpreter is exiting: stock's code makes it)
            pending.why = "the interpreter is exiting"
            pending.done.set()
            return
        self._queue.put((ahead, pending))

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _serve(self) -> None:
        sysinfo.lower_this_thread()
        while True:
            item = self._queue.get()
            if item is None:  # woken at exit
                return
            ahead, pending = item
            if exit_gate.exiting():  # nothing more is made (see exit_gate)
                pending.why = "the interpreter is exiting"
                pending.done.set()
            else:
                ahead.make(pending)
            del item, ahead, pending  # (what it held is freed here, not while it waits)


_maker_instance: _Maker | None = None
_maker_pid = 0
_maker_lock = threading.Lock()


def _maker() -> _Maker:
    global _maker_instance, _maker_pid
    with _maker_lock:
        if _maker_instance is None or _maker_pid != os.getpid():
            _maker_instance, _maker_pid = _Maker(), os.getpid()
        return _maker_instance


forks.fresh_in_child(globals(), _maker_lock=threading.Lock)
