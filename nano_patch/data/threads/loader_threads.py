"""How many threads load each batch of a ``num_workers=0`` DataLoader (``--loader-threads``), and the timing of
its batches for ``auto``.

Used while a batch is being fetched, by ``data/batches/batch_loader.py``; the threads that run a batch's renders are
``render_pool``'s and the extension's native helpers. Inside a DataLoader worker process the count is one (each
worker is already one of many processes). Sized to the cores this process may use (``sysinfo.usable_cores``: its
affinity mask, capped by the cgroup's CPU quota: a container given 2 CPUs of a 64-core host gets 2 threads).
``auto`` starts on every usable core and takes fewer only where fewer measured faster (``auto_threads``; the rule
is in its docstring and in docs/reference.md).

Shared state is a lock-guarded setting, so that it stays correct on a free-threaded Python.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ... import sysinfo
from . import exit_gate, render_pool
from .auto_threads import AutoThreads

_lock = threading.Lock()
_setting: int | str = "off"
_auto: AutoThreads | None = None


def configure(setting: int | str) -> None:
    """``setting``: a thread count, ``"auto"`` (chosen as the process runs: :class:`AutoThreads`) or ``"off"``
    (one by one, as stock)."""
    global _setting, _auto
    with _lock:
        _setting = setting
        _auto = None
    render_pool.drop()


def _auto_threads() -> AutoThreads:
    global _auto
    auto = _auto
    if auto is None or auto.ladder[-1] != sysinfo.usable_cores():
        with _lock:
            if _auto is None or _auto.ladder[-1] != sysinfo.usable_cores():
                _auto = AutoThreads(sysinfo.usable_cores())
            auto = _auto
    return auto


def _after_fork_in_child() -> None:
    global _auto
    _auto = None  # a worker process loads one by one; a forked rank measures its own throughput


os.register_at_fork(after_in_child=_after_fork_in_child)


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
    if setting == "off" or in_worker_process() or exit_gate.exiting():
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


def describe() -> dict[str, Any]:
    """The setting, the count in use and, under ``auto``, the rates it measured."""
    out = {"setting": _setting, "threads": threads(), "usable_cores": sysinfo.usable_cores()}
    if _setting == "auto" and _auto is not None:
        out["auto"] = _auto.describe()
    return out
