"""The cache's figures for the run report (hits, misses, bytes, decode time), counted where images are loaded."""

from __future__ import annotations

import os
import threading

import numpy as np

from .... import report

#: The figures are read-modify-writes: threads loading at once would lose counts without it.
_lock = threading.Lock()


def count_hit(a: np.ndarray) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
        with _lock:
            c["hits"] += 1
            c["hit_bytes"] += a.nbytes
            c["hit_px"] += a.shape[0] * a.shape[1]


def count_miss(a: np.ndarray | None, seconds: float, stored: bool) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
        with _lock:
            c["misses"] += 1
            if a is not None:
                c["decode_s"] += seconds
                c["decode_px"] += a.shape[0] * a.shape[1]
                if stored:
                    c["stored"] += 1
                    c["stored_bytes"] += a.nbytes


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
