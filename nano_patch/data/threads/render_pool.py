"""The threads that run a batch's renders: parked helper threads (crews) that run a batch's calls beside the calling
thread, for renders that run Python (:func:`map_outcomes`) and for a batch's native calls where the extension's own
helper threads are missing (:func:`run_on_threads`). The native helpers (``csrc/helpers.c``) are the extension's.

Every thread here is the loader's own, started and ended by ``exit_gate`` (woken and joined before the interpreter
finalizes), never a standard-library pool: a ``ThreadPoolExecutor``'s threads are not daemons, and one whose start
a Ctrl-C interrupts is never told to end, so the interpreter's exit would wait for it forever. A forked child starts
its own threads (its parent's are not there). Shared state is guarded by locks, never by the GIL.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ... import forks
from . import exit_gate

T = TypeVar("T")
R = TypeVar("R")

#: idle crews kept at most (each caller that loads at the same time as another takes a crew of its own)
IDLE_CREWS = 4


def map_outcomes(fn: Callable[[T], R], items: Iterable[T], n_threads: int,
                 state: Any = None) -> list[tuple[bool, Any]]:
    """``[(True, fn(x)) or (False, the exception fn(x) raised) for x in items]``, on ``n_threads`` threads, the
    calling thread one of them, each item's outcome on its own (the caller decides, item by item, what a failure
    means). Each thread takes the next item under a lock until none is left: one call per thread, not one per item
    (a future per item costs more than a cache hit's render: docs/benchmarks.md), and still balanced when items
    differ in cost (decodes of different sizes).

    ``state``: the calling thread's torch state (``data/threads/thread_modes.py``), entered on every other thread
    while it works on these items; a thread that cannot enter it takes no item (the calling thread takes them), and
    None (a state no other thread can hold) keeps every item in the calling thread.
    """
    from . import thread_modes

    items = list(items)
    outcomes: list[tuple[bool, Any]] = [(False, None)] * len(items)
    taken = [0]
    lock = threading.Lock()
    caller = threading.get_ident()

    def work() -> None:
        while True:
            with lock:
                i = taken[0]
                taken[0] = i + 1
            if i >= len(items):
                return
            try:
                outcomes[i] = (True, fn(items[i]))
            except Exception as exc:  # noqa: BLE001 - the caller's to judge, in item order
                outcomes[i] = (False, exc)

    def each() -> None:
        if threading.get_ident() == caller:
            work()
            return
        try:
            with thread_modes.entered(state):
                work()
        except thread_modes.NotEntered:
            return

    run_on_threads(each, n_threads if state is not None and len(items) > 1 else 1)
    return outcomes


class _Crew:
    """Helper threads that stay parked between batches, for :func:`run_on_threads`: a batch hands each its call by
    releasing a lock the helper waits on, and takes it back by acquiring one the helper releases. An executor's
    ``submit`` and ``result`` (a future, a work item, a queue, a condition) are Python with the GIL held on every
    call; two lock operations cost a fraction of that. Each lock starts held, so that its waiter
    blocks until the other side releases it (a ``threading.Lock`` may be released by any thread).

    The helpers end when the crew is stopped (replaced, dropped, or at the interpreter's exit: ``exit_gate``); a
    stop waits for the call under way, and a stopped crew's :meth:`run` calls ``fn`` in the calling thread alone."""

    def __init__(self, helpers: int) -> None:
        self.helpers = helpers
        self._fn: Callable[[], Any] | None = None
        self._errors: list[BaseException | None] = [None] * helpers
        self._go = [threading.Lock() for _ in range(helpers)]
        self._done = [threading.Lock() for _ in range(helpers)]
        #: held while a call runs on the crew, and by a stop
        self._using = threading.Lock()
        self._stopped = False
        self.broken = False
        for lock in (*self._go, *self._done):
            lock.acquire()
        for k in range(helpers):
            if exit_gate.start(functools.partial(self._serve, k), f"nano-patch-loader-{k}", wake=self.stop) is None:
                self._stopped = True  # (the interpreter is exiting: the calling thread runs every call alone)
                self.stop()
                break

    def _serve(self, k: int) -> None:
        go, done = self._go[k], self._done[k]
        while True:
            go.acquire()
            fn = self._fn
            if fn is None:  # the crew is stopped
                return
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
                self._errors[k] = exc
            del fn  # (what the call held is freed here, not while the helper waits)
            done.release()

    def run(self, fn: Callable[[], Any]) -> None:
        """``fn()`` on every helper and the calling thread at once; returns once all returned (the first error
        raised). Called by the one caller that took the crew. Interrupted (Ctrl-C) before every helper had its
        call, or while helpers still run, the crew is broken: never used again, its helpers stopped once done."""
        with self._using:
            if self._stopped:
                fn()  # (fn shares its items among its calls: alone, it does them all)
                return
            self._fn = fn
            handed = 0
            try:
                for go in self._go:
                    go.release()
                    handed += 1
                fn()
            finally:
                try:
                    for done in self._done[:handed]:
                        done.acquire()
                except BaseException:
                    handed = -1
                    raise
                finally:
                    self._fn = None  # (the helpers are parked, or this crew is broken)
                    self.broken = handed != self.helpers
            errors = [e for e in self._errors if e is not None]
            self._errors = [None] * self.helpers
            if errors:
                raise errors[0]

    def start(self, fn: Callable[[], Any]) -> bool:
        """``fn()`` on every helper, the calling thread going on (:meth:`join` waits for them); False (nothing
        started) where the crew is stopped. Called by the one caller that took the crew."""
        self._using.acquire()
        if self._stopped:
            self._using.release()
            return False
        self._fn = fn
        for go in self._go:
            go.release()
        return True

    def join(self) -> None:
        """After :meth:`start`: wait until every helper's call has returned (the first error raised). Interrupted
        (Ctrl-C) while helpers still run, the crew is broken: never used again, its helpers stopped once done."""
        handed = 0
        try:
            for done in self._done:
                done.acquire()
                handed += 1
        finally:
            self._fn = None
            self.broken = handed != self.helpers
            self._using.release()
        errors = [e for e in self._errors if e is not None]
        self._errors = [None] * self.helpers
        if errors:
            raise errors[0]

    def stop(self, timeout: float = exit_gate.EXIT_WAIT_S) -> None:
        """Let the parked helpers end, once the call under way (if any) has returned: a crew of another size, the
        pool dropped, or the interpreter exiting."""
        if not self._using.acquire(timeout=timeout):
            return  # (a call that outlasts the bound: its helpers are left as they are)
        try:
            self._stopped = True
            self._fn = None
            for go in self._go:
                with contextlib.suppress(RuntimeError):  # (released already: a helper that has not taken it yet)
                    go.release()
        finally:
            self._using.release()


_lock = threading.Lock()
#: crews no caller uses now, each parked (most recently used last)
_idle: list[_Crew] = []


def run_on_threads(fn: Callable[[], Any], n_threads: int) -> None:
    """``fn()`` on ``n_threads`` threads at once, the calling thread one of them, for work that shares its items
    among its calls itself (so that fewer calls still do it all). Returns once every call has returned; a call's
    exception is raised here. Each caller takes a crew no other caller uses; its helpers are the same threads from
    one batch to the next."""
    if n_threads <= 1 or exit_gate.exiting():
        fn()
        return
    crew = _take(n_threads - 1)
    try:
        crew.run(fn)
    finally:
        _give_back(crew)


class Background:
    """``fn()`` on one helper thread while the calling thread goes on; :meth:`join` waits for it to return and raises
    what it raised. ``fn`` must return once the caller tells it to (its own signal, set before ``join``). The helper
    is a parked crew's, as :func:`run_on_threads`'s; where none can start (the interpreter exiting), nothing runs."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._crew: _Crew | None = None
        if exit_gate.exiting():
            return
        crew = _take(1)
        if crew.start(fn):
            self._crew = crew
        else:
            _give_back(crew)

    @property
    def started(self) -> bool:
        return self._crew is not None

    def join(self) -> None:
        crew, self._crew = self._crew, None
        if crew is None:
            return
        try:
            crew.join()
        finally:
            _give_back(crew)


def _take(helpers: int) -> _Crew:
    with _lock:
        for k in range(len(_idle) - 1, -1, -1):
            if _idle[k].helpers == helpers:
                return _idle.pop(k)
    return _Crew(helpers)


def _give_back(crew: _Crew) -> None:
    ended: list[_Crew] = []
    with _lock:
        if crew.broken:
            ended.append(crew)  # (interrupted while its helpers ran: never used again)
        else:
            _idle.append(crew)
        while len(_idle) > IDLE_CREWS:
            ended.append(_idle.pop(0))
    for old in ended:
        old.stop()


def drop() -> None:
    """End the idle crews' helpers (the setting changed, or the patch was reverted); a crew in use is ended when it
    is given back, if it was broken, or kept for the next batch."""
    with _lock:
        ended, _idle[:] = list(_idle), []
    for crew in ended:
        crew.stop()


forks.fresh_in_child(globals(), _lock=threading.Lock, _idle=list)
