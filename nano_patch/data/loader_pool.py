"""The loader's threads: how many load each batch of a ``num_workers=0`` DataLoader (``--loader-threads``), and
the threads that run a batch's renders.

Used while a batch is being fetched, by ``data/batch_loader.py``. Three kinds of thread serve it: the native helpers
of the extension (``csrc/helpers.c``: a batch's native calls, no GIL taken), parked Python helpers where those are
missing (:func:`run_on_threads`), and a thread pool for renders that run Python (:func:`map_outcomes`). Inside a
DataLoader worker process the count is one (each worker is already one of many processes). Sized to the cores this
process may use (``sysinfo.usable_cores``: its affinity mask, capped by the cgroup's CPU quota: a container given 2
CPUs of a 64-core host gets 2 threads).

``auto`` starts on every usable core and takes fewer only where fewer measured faster (:class:`AutoThreads`; the
rule is in its docstring and in docs/reference.md).

Shared state is a lock-guarded pool and setting, so that it stays correct on a free-threaded Python.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from ..sysinfo import usable_cores

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_setting: int | str = "off"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


class AutoThreads:
    """``--loader-threads auto``: the thread count, chosen from the throughput the process measures.

    The counts are 1, 2, 4, ... up to the usable cores, and the usable cores themselves (the ladder). The first
    batch loads on every usable core: the batch path's serial part is small (its draws, a few microseconds a
    sample), so the threads scale to the cores, and a job whose epochs are shorter than any measurement gets them
    from its first batch.

    Throughput is measured in windows: after each change of count one batch is not counted (it pays one-time
    costs: the pool's threads, the first batch-path setup), then a window lasts at least ``WINDOW_BATCHES``
    batches and ``WINDOW_SECONDS`` of loading, and its rate is its samples over the seconds its batches took to
    load (draws and renders: what the thread count changes). Two counts are compared in three windows interleaved
    in time, one count's either side of the other's, and the mean of the two outer windows is set against the
    middle one: a throughput that drifts steadily meanwhile (the cold first epoch: files read for the first time,
    the decoded-image cache filling) moves both sides alike and cancels out.

    ``RECHECK_BATCHES`` batches on, the kept count is compared with the counts one step down and, below the top, one
    step up, in windows kept / up / kept / down / kept, each set against the kept windows either side (a pipeline
    whose serial part is large, another load on the machine, moves the best count): where the count below measured
    faster, it is kept and compared with the next one down (next / kept / next), as far as fewer threads keep
    measuring faster; else, where the count above pays (more than ``MARGIN`` faster), the same upwards. A check
    that keeps the count doubles the batches to the next one (up to ``MAX_RECHECK_BATCHES``): a count that holds is
    asked less and less often, so its windows on the other counts cost ever less throughput.

    ``record`` runs once per batch, under the lock, in constant time; ``current`` reads one attribute.
    """

    WINDOW_BATCHES = 8  # at +-10% noise per batch, a window's rate varies by about 2% (one sd): inside MARGIN
    WINDOW_SECONDS = 0.3  # and one slow batch (page faults, a GC pause) weighs little against 0.3 s of others
    MARGIN = 0.05
    # a recheck spends a window on each count either side: 1% of the throughput where they are 10% slower, 2.3%
    # where the count below is 1.6x slower (2 cores)
    RECHECK_BATCHES = 200
    #: a recheck that keeps the count doubles the batches to the next one, up to this many (its windows on the other
    #: counts cost throughput: the longer a count holds, the less often it is asked again)
    MAX_RECHECK_BATCHES = 3200

    def __init__(self, cores: int) -> None:
        ladder, n = [], 1
        while n < cores:
            ladder.append(n)
            n *= 2
        self.ladder = [*ladder, cores]
        self.rates: dict[int, float] = {}  # each count's last window, in samples/s
        self.kept = 0  # index into the ladder of the count kept
        self.climbing = False  # a comparison is under way: the climb, or a recheck
        self.rechecks = 0
        self._in_use = self.ladder[-1]  # the count the next batch loads on (one attribute: read without the lock)
        self._plan: tuple[int, ...] = ()  # the ladder indices of the comparison's windows, in order
        self._window_rates: list[float] = []  # the rates of its windows so far
        self._rechecking = False
        self._samples, self._seconds, self._batches = 0, 0.0, 0
        self._skip = 0  # batches not to count (the first on a new count)
        self._since_check = 0
        self._interval = self.RECHECK_BATCHES
        self._step = 1  # the way the comparison under way moves: +1 up the ladder, -1 down
        self._lock = threading.Lock()
        self.kept = len(self.ladder) - 1

    def current(self) -> int:
        """The count the next batch loads on."""
        return self._in_use

    def record(self, n_threads: int, samples: int, seconds: float) -> None:
        """A batch of ``samples`` loaded on ``n_threads`` threads in ``seconds``."""
        with self._lock:
            if n_threads != self._in_use:
                return  # loaded before the last change of count: not this window's
            if not self.climbing:
                self._since_check += 1
                if self._since_check >= self._interval and len(self.ladder) > 1:
                    self._recheck()
                return
            if self._skip:
                self._skip -= 1
                return
            self._samples += samples
            self._seconds += seconds
            self._batches += 1
            if self._batches < self.WINDOW_BATCHES or self._seconds < self.WINDOW_SECONDS or self._seconds <= 0:
                return
            rate = self._samples / self._seconds
            self._samples, self._seconds, self._batches = 0, 0.0, 0
            self.rates[n_threads] = rate
            self._window_rates.append(rate)
            if len(self._window_rates) < len(self._plan):
                self._use(self._plan[len(self._window_rates)])
            elif self._rechecking:
                self._end_recheck()
            else:
                self._end_climb_step()

    def _use(self, step: int) -> None:
        """Load on the ladder's count at ``step`` from the next batch on, that batch not counted."""
        self._in_use, self._skip = self.ladder[step], 1

    def _compare(self, plan: tuple[int, ...], rechecking: bool = False) -> None:
        """Start a comparison: a window on each of the ladder's counts at ``plan`` (the kept count every other)."""
        self._plan, self._window_rates, self._rechecking, self.climbing = plan, [], rechecking, True
        self._use(plan[0])

    def _keep(self, step: int, held: bool = False) -> None:
        """End the comparison on the ladder's count at ``step``; ``held``: a recheck kept the count it had (the next
        comes twice as many batches on), else the next is ``RECHECK_BATCHES`` on."""
        self.kept, self._plan, self._window_rates, self.climbing, self._since_check = step, (), [], False, 0
        self._interval = min(2 * self._interval, self.MAX_RECHECK_BATCHES) if held else self.RECHECK_BATCHES
        self._use(step)

    def _gain(self, i: int) -> float:
        """Window ``i``'s rate over the mean of the kept count's windows either side of it."""
        w = self._window_rates
        return w[i] / ((w[i - 1] + w[i + 1]) / 2)

    def _move(self, step: int) -> None:
        """Keep the count one step ``step`` (+1 up, -1 down) from the kept one, which measured faster, and compare
        it with the next one that way (next / kept / next), as far as the ladder goes."""
        k = self.kept + step
        if 0 <= k + step < len(self.ladder):
            self.kept, self._step = k, step
            self._compare((k + step, k, k + step))
        else:
            self._keep(k)

    def _end_climb_step(self) -> None:
        w = self._window_rates
        # up pays beyond the margin; down where it measured faster (fewer threads that lose nothing)
        if (w[0] + w[2]) / 2 > w[1] * ((1 + self.MARGIN) if self._step > 0 else 1.0):
            self._move(self._step)
        else:
            self._keep(self.kept)  # the next count that way did not pay: the move ends here

    def _recheck(self) -> None:
        k, top = self.kept, len(self.ladder) - 1
        self.rechecks += 1
        self._compare((k, *((k + 1, k) if k < top else ()), *((k - 1, k) if k > 0 else ())), rechecking=True)

    def _end_recheck(self) -> None:
        k, plan = self.kept, self._plan
        window_of = {plan[i]: i for i in range(1, len(plan), 2)}  # the ladder index of a count -> its window
        up, down = window_of.get(k + 1), window_of.get(k - 1)
        if down is not None and self._gain(down) > 1:
            self._move(-1)  # fewer threads measured faster: down from there, as far as they keep being faster
        elif up is not None and self._gain(up) > 1 + self.MARGIN:
            self._move(+1)  # more threads pay now (another load on the machine ended): up, as far as they pay
        else:
            self._keep(k, held=True)

    def describe(self) -> dict[str, Any]:
        with self._lock:  # rates may be written meanwhile (a free-threaded Python has no GIL to order it)
            rates = sorted(self.rates.items())
            return {"threads": self._in_use, "climbing": self.climbing, "rechecks": self.rechecks,
                    "images_per_s": {str(n): round(r, 1) for n, r in rates}}


_auto: AutoThreads | None = None


def configure(setting: int | str) -> None:
    """``setting``: a thread count, ``"auto"`` (chosen as the process runs: :class:`AutoThreads`) or ``"off"``
    (one by one, as stock)."""
    global _setting, _auto
    with _lock:
        _setting = setting
        _auto = None
        _drop_pool()


def _auto_threads() -> AutoThreads:
    global _auto
    auto = _auto
    if auto is None or auto.ladder[-1] != usable_cores():
        with _lock:
            if _auto is None or _auto.ladder[-1] != usable_cores():
                _auto = AutoThreads(usable_cores())
            auto = _auto
    return auto


def _after_fork_in_child() -> None:
    global _auto, _crew_busy
    _auto = None  # a worker process loads one by one; a forked rank measures its own throughput
    _crew_busy = threading.Lock()  # (held by a thread of the parent's, perhaps)


os.register_at_fork(after_in_child=_after_fork_in_child)


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


def in_worker_process() -> bool:
    import sys

    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def batch_path_on() -> bool:
    """Whether the patched datasets' batches may load whole (draws, then renders), not one by one as stock."""
    return _setting != "off"


def threads() -> int:
    """Threads a batch is loaded with in this process now: 1 means one by one, in the calling thread."""
    setting = _setting
    if setting == "off" or in_worker_process():
        return 1
    return _auto_threads().current() if setting == "auto" else int(setting)


def measuring() -> bool:
    """Whether batches are timed for ``auto``'s choice in this process (:func:`measured`)."""
    return _setting == "auto" and not in_worker_process()


@contextmanager
def measured(n_threads: int, samples: int) -> Iterator[None]:
    """Time the loading of one batch of ``samples`` on ``n_threads`` (from :func:`threads`), for ``auto``'s
    choice; a batch that raises is not counted."""
    start = time.perf_counter()
    yield
    if samples > 1 and measuring():
        _auto_threads().record(n_threads, samples, time.perf_counter() - start)


def load_batch(load: Callable[[Any, list[Any], int], list[Any] | None], dataset: Any,
               indices: list[Any]) -> list[Any] | None:
    """A batch loader's call, on the thread count in use now and timed for ``auto``'s choice: ``load(dataset,
    indices, n_threads)``, the batch or None (stock's loop loads it). While ``auto`` measures, a None is loaded
    here, inside the timing, exactly as the fetcher would (``dataset[i]`` for each index, in order), so that the
    batches stock's loop loads are timed too."""
    n_threads = threads()
    with measured(n_threads, len(indices)):
        out = load(dataset, indices, n_threads)
        if out is None and measuring():
            out = [dataset[i] for i in indices]
        return out


def map_outcomes(fn: Callable[[T], R], items: Iterable[T], n_threads: int,
                 state: Any = None) -> list[tuple[bool, Any]]:
    """``[(True, fn(x)) or (False, the exception fn(x) raised) for x in items]``, on ``n_threads`` threads, the
    calling thread one of them, each item's outcome on its own (the caller decides, item by item, what a failure
    means). Each thread takes the next item under a lock until none is left: one task per thread, not one per
    item (a future per item cost more than a cache hit's render: 0.64x one thread on warm-cache batches), and
    still balanced when items differ in cost (decodes of different sizes).

    ``state``: the calling thread's torch state (``data/torch_state.py``), entered on every other thread while it
    works on these items; a thread that cannot enter it takes no item (the calling thread takes them), and None
    (a state no other thread can hold) keeps every item in the calling thread.
    """
    from . import torch_state

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
            with torch_state.entered(state):
                work()
        except torch_state.NotEntered:
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
    ``submit`` and ``result`` (a future, a work item, a queue, a condition) cost about 10 us of Python with the
    GIL held per call; two lock operations cost a fraction of that. Each lock starts held, so that its waiter
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


def describe() -> dict[str, Any]:
    """The setting, the count in use and, under ``auto``, the rates it measured."""
    out = {"setting": _setting, "threads": threads(), "usable_cores": usable_cores()}
    if _setting == "auto" and _auto is not None:
        out["auto"] = _auto.describe()
    return out
