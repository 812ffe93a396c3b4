"""The loader's threads: one pool per process that loads the samples of a batch (``--loader-threads``).

Used only while a batch is being fetched, by ``vision/batch.py``: a ``num_workers=0`` DataLoader of a
patched dataset renders its samples here. Inside DataLoader worker processes it is one thread (each
worker is already one of many processes). Sized to the cores this process may use: its affinity mask,
and the cgroup's CPU quota where one is set (a container given 2 CPUs of a 64-core host gets 2 threads).

Shared state is a lock-guarded pool and setting, so that it stays correct on a free-threaded Python.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_setting: int | str = "off"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


def configure(setting: int | str) -> None:
    """``setting``: a thread count, ``"auto"`` (the usable cores) or ``"off"`` (one by one, as stock)."""
    global _setting
    with _lock:
        _setting = setting
        _drop_pool()


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
    return usable_cores() if setting == "auto" else int(setting)


def map_in_order(fn: Callable[[T], R], items: Iterable[T], n_threads: int) -> list[R]:
    """``[fn(x) for x in items]`` on ``n_threads`` threads, the calling thread one of them; the first exception in
    item order is raised, after every item finished (so that nothing runs on once the caller carries on).

    Each thread takes the next item under a lock until none is left: one task per thread, not one per item
    (a future per item cost more than a cache hit's render, measured 0.64x one thread on warm-cache batches),
    and still balanced when items differ in cost (decodes of different sizes).
    """
    items = list(items)
    if n_threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    results: list[Any] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)
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
                results[i] = fn(items[i])
            except BaseException as exc:  # noqa: BLE001 - raised below, in item order
                errors[i] = exc

    executor = _executor(n_threads - 1)
    helpers = [executor.submit(work) for _ in range(min(n_threads, len(items)) - 1)]
    work()
    for helper in helpers:
        helper.result()
    for error in errors:
        if error is not None:
            raise error
    return results


def map_outcomes(fn: Callable[[T], R], items: Iterable[T], n_threads: int,
                 state: Any = None) -> list[tuple[bool, Any]]:
    """``[(True, fn(x)) or (False, the exception fn(x) raised) for x in items]``, on ``n_threads`` threads as
    :func:`map_in_order`, each item's outcome on its own (the caller decides, item by item, what a failure means).

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
    """For ``nano-patch status`` and the run report."""
    return {"setting": _setting, "threads": threads(), "usable_cores": usable_cores()}
