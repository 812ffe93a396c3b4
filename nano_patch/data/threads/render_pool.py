"""The threads that run a batch's renders: a thread pool for renders that run Python (:func:`map_outcomes`), and
parked helpers for a batch's native calls where the extension's own helper threads are missing
(:func:`run_on_threads`). The native helpers (``csrc/helpers.c``) are the extension's. A forked child starts its
own threads (its parent's are not there). Shared state is guarded by locks, never by the GIL.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


def map_outcomes(fn: Callable[[T], R], items: Iterable[T], n_threads: int,
                 state: Any = None) -> list[tuple[bool, Any]]:
    """``[(True, fn(x)) or (False, the exception fn(x) raised) for x in items]``, on ``n_threads`` threads, the
    calling thread one of them, each item's outcome on its own (the caller decides, item by item, what a failure
    means). Each thread takes the next item under a lock until none is left: one task per thread, not one per item
    (a future per item costs more than a cache hit's render: docs/benchmarks.md), and still balanced when items
    differ in cost (decodes of different sizes).

    ``state``: the calling thread's torch state (``data/threads/thread_modes.py``), entered on every other thread while
    it
    works on these items; a thread that cannot enter it takes no item (the calling thread takes them), and None
    (a state no other thread can hold) keeps every item in the calling thread.
    """
    from . import thread_modes

    items = list(items)
    outcomes: list[tuple[bool, Any]] = [(False, None)] * len(items)
    taken = [0]
    lock = threading.Lock()

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

    def helper() -> None:
        try:
            with thread_modes.entered(state):
                work()
        except thread_modes.NotEntered:
            return

    n_helpers = min(n_threads, len(items)) - 1 if state is not None else 0
    futures = [_executor(n_threads - 1).submit(helper) for _ in range(n_helpers)] if n_helpers > 0 else []
    work()
    for future in futures:
        future.result()
    return outcomes


class _Crew:
    """Helper threads that stay parked between batches, for :func:`run_on_threads`: a batch hands each its call by
    releasing a lock the helper waits on, and takes it back by acquiring one the helper releases. An executor's
    ``submit`` and ``result`` (a future, a work item, a queue, a condition) are Python with the GIL held on every
    call; two lock operations cost a fraction of that. Each lock starts held, so that its waiter
    blocks until the other side releases it (a ``threading.Lock`` may be released by any thread)."""

    def __init__(self, helpers: int) -> None:
        self.helpers = helpers
        self._fn: Callable[[], Any] | None = None
        self._errors: list[BaseException | None] = [None] * helpers
        self._go = [threading.Lock() for _ in range(helpers)]
        self._done = [threading.Lock() for _ in range(helpers)]
        self.broken = False
        for lock in (*self._go, *self._done):
            lock.acquire()
        for k in range(helpers):
            threading.Thread(target=self._serve, args=(k,), name=f"nano-patch-loader-{k}", daemon=True).start()

    def _serve(self, k: int) -> None:
        go, done = self._go[k], self._done[k]
        while True:
            go.acquire()
            fn = self._fn
            if fn is None:  # the crew is dropped
                return
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
                self._errors[k] = exc
            done.release()

    def run(self, fn: Callable[[], Any]) -> None:
        """``fn()`` on every helper and the calling thread at once; returns once all returned (the first error
        raised). Called by one thread at a time (the crew's lock)."""
        self._fn = fn
        for go in self._go:
            go.release()
        try:
            fn()
        finally:
            try:
                for done in self._done:
                    done.acquire()
            except BaseException:
                self.broken = True  # interrupted while helpers run: they may still release; never reused
                raise
        errors = [e for e in self._errors if e is not None]
        self._errors = [None] * self.helpers
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Let the parked helpers end (a crew of another size, or the pool dropped)."""
        self._fn = None
        for go in self._go:
            with contextlib.suppress(RuntimeError):  # (released already: a crew broken between two releases)
                go.release()


_crew: _Crew | None = None
_crew_pid = 0
#: held by the one caller using the crew; another thread's batch meanwhile takes the executor
_crew_busy = threading.Lock()


def run_on_threads(fn: Callable[[], Any], n_threads: int) -> None:
    """``fn()`` on ``n_threads`` threads at once, the calling thread one of them, for work that shares its items
    among its calls itself and runs no torch op (a native batch call: it needs none of the caller's torch state,
    so no thread enters it). Returns once every call has returned; a call's exception is raised here."""
    if n_threads <= 1:
        fn()
        return
    if _crew_busy.acquire(blocking=False):
        try:
            _crew_of(n_threads - 1).run(fn)
        finally:
            _crew_busy.release()
        return
    futures = [_executor(n_threads - 1).submit(fn) for _ in range(n_threads - 1)]
    try:
        fn()
    finally:
        for future in futures:
            future.result()


def _crew_of(helpers: int) -> _Crew:
    """The parked helpers for :func:`run_on_threads` (called holding ``_crew_busy``)."""
    global _crew, _crew_pid
    crew = _crew
    if crew is None or crew.broken or crew.helpers != helpers or _crew_pid != os.getpid():
        if crew is not None and _crew_pid == os.getpid():
            crew.stop()
        # (a forked child has none of its parent's threads: it starts its own)
        _crew, _crew_pid = _Crew(helpers), os.getpid()
        crew = _crew
    return crew


def _executor(n_threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid() or _pool_size != n_threads:
            if _pool_pid == os.getpid():
                _drop_pool()
            # A forked child has no threads of its parent's pool: it starts its own.
            _pool = ThreadPoolExecutor(n_threads, thread_name_prefix="nano-patch-loader")
            _pool_size, _pool_pid = n_threads, os.getpid()
        return _pool


def _drop_pool() -> None:
    global _pool, _pool_size, _crew
    if _pool is not None and _pool_pid == os.getpid():
        _pool.shutdown(wait=False)
    _pool, _pool_size = None, 0
    if _crew is not None and _crew_busy.acquire(blocking=False):  # (in use: it is replaced at its next use)
        try:
            if _crew_pid == os.getpid():
                _crew.stop()
            _crew = None
        finally:
            _crew_busy.release()


def drop() -> None:
    """End the pool and the parked helpers (the setting changed, or the patch was reverted)."""
    with _lock:
        _drop_pool()


def _after_fork_in_child() -> None:
    global _crew_busy
    _crew_busy = threading.Lock()  # (held by a thread of the parent's, perhaps)


os.register_at_fork(after_in_child=_after_fork_in_child)
