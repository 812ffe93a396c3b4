"""The loader's threads: one pool per process that loads the samples of a batch (``--loader-threads``).

Used only while a batch is being fetched, by ``vision/batch.py``: a ``num_workers=0`` DataLoader of a
patched dataset renders its samples here. Inside DataLoader worker processes it is one thread (each
worker is already one of many processes). Sized to the cores this process may use: its affinity mask,
and the cgroup's CPU quota where one is set (a container given 2 CPUs of a 64-core host gets 2 threads).

``auto`` does not take every core on trust: the serial part of each sample (its draws, in the calling thread,
and what of its render holds the GIL) makes more threads slower past a point that depends on the pipeline, the
cache and the machine. :class:`AutoThreads` chooses the count from the batches' own throughput as the process
runs (the rule is in its docstring and in docs/reference.md).

Shared state is a lock-guarded pool and setting, so that it stays correct on a free-threaded Python.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_setting: int | str = "off"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


class AutoThreads:
    """``--loader-threads auto``: the thread count, chosen from the throughput the process measures.

    The counts tried are 1, 2, 4, ... up to the usable cores (and the usable cores themselves). Each is held for
    one batch that is not counted (the first batch on a count pays one-time costs: the pool's threads, the first
    batch-path setup), then a window of at least ``WINDOW_BATCHES`` batches and ``WINDOW_SECONDS`` of loading;
    its rate is the window's samples over the seconds its batches took to load (draws and renders: what the
    thread count changes). Starting from 1 thread, the next count is tried only while the last one was faster
    than the one before by more than ``MARGIN``; the climb stops at the first that is not in two windows in a row
    (its first window may have paid one-time costs that the one below had already paid), and the process keeps
    the fastest count measured (so never a count slower than 1 thread, nor than any fewer threads measured). Every
    ``RECHECK_BATCHES`` batches the climb runs again from one count below the kept one (a warm cache, or
    another load on the machine, moves the best count): each recheck can move it one step down, or up while
    more threads keep paying.
    """

    WINDOW_BATCHES = 4
    WINDOW_SECONDS = 0.1
    MARGIN = 0.05
    RECHECK_BATCHES = 200

    def __init__(self, cores: int) -> None:
        ladder, n = [], 1
        while n < cores:
            ladder.append(n)
            n *= 2
        self.ladder = [*ladder, cores]
        self.rates: dict[int, float] = {}
        self.step = 0  # index into the ladder of the count in use
        self.climbing = True
        self._samples, self._seconds, self._batches = 0, 0.0, 0
        self._skip = 1  # the next batch on a new count is not counted
        self._confirming = False  # re-measuring a count that did not pay, before stopping there
        self._since_check = 0
        self._lock = threading.Lock()

    def current(self) -> int:
        return self.ladder[self.step]

    def record(self, n_threads: int, samples: int, seconds: float) -> None:
        """A batch of ``samples`` loaded on ``n_threads`` threads in ``seconds``."""
        with self._lock:
            if n_threads != self.ladder[self.step]:
                return  # measured before the last change: not this window's
            if not self.climbing:
                self._since_check += 1
                if self._since_check >= self.RECHECK_BATCHES:
                    self._since_check, self.climbing, self.rates = 0, True, {}
                    self.step, self._skip = max(0, self.step - 1), 1
                return
            if self._skip:
                self._skip -= 1
                return
            self._samples += samples
            self._seconds += seconds
            self._batches += 1
            if self._batches < self.WINDOW_BATCHES or self._seconds < self.WINDOW_SECONDS:
                return
            rate = self._samples / self._seconds
            self.rates[self.current()] = rate
            self._samples, self._seconds, self._batches = 0, 0.0, 0
            below = self.rates.get(self.ladder[self.step - 1]) if self.step > 0 else None
            if (below is None or rate > below * (1 + self.MARGIN)) and self.step + 1 < len(self.ladder):
                self.step, self._skip = self.step + 1, 1  # more threads paid (or nothing to compare yet): next
                self._confirming = False
                return
            if not self._confirming and below is not None:
                # once more before stopping: a count's first window can land on one-time costs (a small dataset's
                # first batches through the batch path, its files seen for the first time there)
                self._confirming, self._skip = True, 1
                return
            self._confirming = False
            best = max(self.rates, key=self.rates.__getitem__)
            self.step, self.climbing = self.ladder.index(best), False

    def describe(self) -> dict[str, Any]:
        return {"threads": self.current(), "climbing": self.climbing,
                "images_per_s": {str(n): round(r, 1) for n, r in sorted(self.rates.items())}}


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
    global _auto
    _auto = None  # a worker process loads one by one; a forked rank measures its own throughput


os.register_at_fork(after_in_child=_after_fork_in_child)


def _drop_pool() -> None:
    global _pool, _pool_size
    if _pool is not None and _pool_pid == os.getpid():
        _pool.shutdown(wait=False)
    _pool, _pool_size = None, 0


def _cgroup_quota() -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, or v1's CFS quota), or None where unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by the cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def in_worker_process() -> bool:
    import sys

    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


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
