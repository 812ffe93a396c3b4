"""``num_workers=0`` made ahead, exactly: the next batch drawn and rendered while the training step runs, and used at
``next()`` only where everything it was made from is still as it was (speculate, then check).

Stock's single-process iterator makes a batch when ``next()`` is called: the sampler's indices, then each sample's
draws from torch's global generator, in the calling thread. So the step and the loading add up. Here, once a batch
is handed over, the next one is made on a loader thread from a copy of torch's generator as it stands then (the
virtual workers' fast path, ``drawn_batches.load_drawn``: native draws from a private state, no generator of
torch's, Python's or NumPy's read or moved, nothing warned or called). At the next ``next()`` it is handed over
only where:

- torch's generator stands where the copy was taken (a training step on the CPU that draws, dropout for one,
  moves it: the batch is thrown away and made as stock makes it; on a GPU the model draws from the CUDA generator);
  it then moves on by the batch's draws in one operation, as stock's draws would have moved it;
- the transform is the same object, with the same steps and parameters, under the same default dtype
  (``compose_state``); the samples the indices map to are the same objects (a dataset changed in between);
- PIL's flags and the working directory (``worker_state``) and the calling thread's torch modes (grad, inference,
  autocast) are as they were;
- the batch loaded whole by the fast path (anything that needs stock's code, a warning or an error, makes it
  again as stock does).

Only where no code of the user's runs in the loading (the loader's eligibility is the virtual workers':
``virtual_eligibility.why_not_made_apart``) and the sampler's next indices can be taken early without moving a
generator anyone sees (a ``BatchSampler`` over a ``SequentialSampler``, or over a ``RandomSampler`` with no generator
of its own: its one draw from torch's generator is at the epoch's first batch, which is always made as stock's).
A loader whose steps keep moving torch's generator stops making batches ahead after three in a row. ``--report``
counts the batches made ahead, those used, and why any were thrown away.
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


@dataclass
class _Pending:
    """The indices of a batch pulled from the sampler ahead, and the batch made ahead from them (or being made):
    what it was made from, and what came of it. ``draws`` None: not made ahead (stock's code makes it)."""

    index: Any
    entries: list[Any] | None = None
    compose: ComposeState | None = None
    state: worker_state.WorkerState | None = None
    modes: Any = None
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
    """One iterator's batches made ahead (weakly bound to it: a dropped iterator is not kept alive)."""

    def __init__(self, iterator: Any, loader: Any, n_threads: int, uint8: Any) -> None:
        self._iterator = weakref.ref(iterator)
        self._uint8 = uint8
        self._loader = weakref.ref(loader)
        self._n_threads = n_threads
        self._root, self._chain = root_of(loader.dataset)
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
        loader = self._loader()
        if loader is None or getattr(loader, "_nano_ahead_off", None) is not None or config.in_force() is None:
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
        modes = thread_modes.capture()
        transform = getattr(self._root, "transform", None)
        entries = self._entries(index)
        if modes is None or transform is None or entries is None:
            return False  # (stock's code makes it: a state that cannot be carried, or an index that does not map)
        import torch

        pending.entries, pending.modes, pending.state = entries, modes, worker_state.capture()
        pending.compose = ComposeState(transform)
        # (from torch's generator as it stands now; one made after another starts where that one's draws end,
        # which the loader thread loads once it is made)
        pending.draws = torch_draws.TorchDraws.from_state(native.kernel("torch_draws"), torch.get_rng_state())
        _maker().submit(self, pending)
        return True

    def _entries(self, index: Any) -> list[Any] | None:
        """The samples ``(path, target)`` of ``index``, mapped through the ``Subset``s; None where one does not map."""
        try:
            indices = list(index)
            for subset in self._chain:
                indices = [subset.indices[i] for i in indices]
            samples = self._root.samples
            return [samples[i] for i in indices]
        except Exception:  # noqa: BLE001 - stock's fetch raises it, at its sample
            return None

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
            with thread_modes.entered(pending.modes):
                got = drawn_batches.load_drawn(self._root, self._root, pending.entries, pending.draws,
                                               self._n_threads, self._uint8, pending.counted)
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
        root = self._root
        if not pending.compose.still(root.transform):  # type: ignore[union-attr]
            return self._thrown(pending, "the transform changed since it was made")
        if worker_state.capture() != pending.state:
            return self._thrown(pending, "PIL's flags or the working directory changed since it was made")
        if thread_modes.capture() != pending.modes:
            return self._thrown(pending, "the calling thread's torch modes changed since it was made")
        now = self._entries(pending.index)
        if now is None or len(now) != len(pending.entries) or any(  # type: ignore[arg-type]
                a is not b for a, b in zip(now, pending.entries)):  # type: ignore[arg-type]
            return self._thrown(pending, "the dataset's samples changed since it was made")
        loader = self._loader()
        if not pending.draws.to_torch_unless_moved():
            # (counted on the loader, across its epochs: a step that draws keeps drawing)
            moved = getattr(loader, "_nano_ahead_moved", 0) + 1
            if loader is not None:
                loader._nano_ahead_moved = moved
            if moved >= MOVED_LIMIT and loader is not None:
                why = (f"torch's generator moved between batches {MOVED_LIMIT} times in a row (the training step "
                       f"draws from it)")
                loader._nano_ahead_off = why
                report.count(REPORT_KEY, False, f"num_workers=0: no more batches made ahead for this loader: {why}")
            return self._thrown(pending, _MOVED)
        if loader is not None:
            loader._nano_ahead_moved = 0
        report.count(REPORT_KEY, True, "num_workers=0: a batch made ahead while the step ran, handed over")
        for counted in pending.counted:
            counted.count()
        return pending.data

    def _thrown(self, pending: _Pending, why: str) -> Any:
        report.count(REPORT_KEY, False, f"num_workers=0: a batch made ahead, thrown away and made as stock: {why}")
        return _NOT_TAKEN


_NOT_TAKEN = object()
_MOVED = "torch's generator moved since it was made (a draw between batches)"


class _Maker:
    """The thread that makes batches ahead, for every iterator of this process, one at a time, at a lower
    scheduling priority than the training thread (it fills what the step leaves of the cores)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[_Ahead, _Pending]] = queue.SimpleQueue()
        self._gate = exit_gate.ExitGate()
        self._thread = threading.Thread(target=self._serve, name="nano-patch-batches-ahead", daemon=True)
        self._thread.start()

    def submit(self, ahead: _Ahead, pending: _Pending) -> None:
        self._queue.put((ahead, pending))

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        sysinfo.lower_this_thread()
        while True:
            ahead, pending = self._queue.get()
            if not self._gate.enter():  # the interpreter is exiting: nothing more is made (see exit_gate)
                pending.why = "the interpreter is exiting"
                pending.done.set()
                return
            try:
                ahead.make(pending)
            finally:
                self._gate.leave()


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
