"""Where a sample's pixels come from: the decoded-image cache's entry (a hit), a decode that is then stored (a
miss), or the decode alone (no cache, or one that takes no more), and the cache's counting of each.

Every path goes through here (``loading.cached`` one by one, ``batch`` for a batch), so the rules are kept in
one place: stock's size rule acts on a hit (stock opens the file each time); only a reproducible decode is
stored; a miss counts the seconds its decode took wherever it ran (the batch path decodes on the loader's
threads and stores in the calling thread, :func:`record_miss`); every count is made under the ``Stats`` lock
(:meth:`report.Stats.add_cache`). Once per process, the first hit times the decode it saved, for the report's
estimate of the time the cache saved.

A lookup goes through the dataset's :class:`file_index.FileIndex` when one is given: the file is stat'ed and
compared with what the index saw, and LMDB is asked only for a file the index does not hold yet.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import report
from . import cache, decode
from .cache.fill import FillBudget
from .file_index import FileIndex

#: What a lookup found: the cache's view, a miss the store takes (decode, then :func:`record_miss`), or no cache.
HIT, MISS, UNCACHED = "hit", "miss", "uncached"


@dataclass
class Found:
    kind: str
    #: HIT: the decoded image, a read-only view into the store
    array: np.ndarray | None = None
    #: MISS: the key material the decode is stored under
    material: bytes | None = None


def look_up(store: cache.Store | None, path: str | os.PathLike[str], mode: str = "RGB",
            index: FileIndex | None = None, size_rule: Callable[[int, int], Any] = decode.check_size,
            native_mode: bool = False, budget: FillBudget | None = None) -> Found:
    """The cache's answer for ``path`` decoded to ``mode``. A hit has had ``size_rule`` (stock's size rule, or a
    caller's wrapper of it: called only where that rule can act, ``decode.below_size_limit``) applied and is
    counted; a miss is counted once its decode is recorded. ``budget``: a miss is one to store only where it
    allows (``cache/fill.py``); else it is served as with the cache off (UNCACHED), and the caller tells the
    budget what each sample cost."""
    if store is None:
        return Found(UNCACHED)
    if index is not None:
        material, a = index.look_up(store, path, mode)
    else:
        material = cache.key_material(path, mode)
        a = store.get(material) if material is not None else None
    if material is None:
        return Found(UNCACHED)  # cannot stat it: the decode raises stock's error
    if a is not None:
        # Stock opens the file each time, and PIL's size rule acts there: a limit lowered since the image was
        # stored must act on the hit (the entry is the full decode, so its shape is the size). Where this
        # sample's open stage already ran (PIL opened the file for its header), the rule has acted once.
        if not decode.below_size_limit(a.shape[0], a.shape[1]) and not decode.open_stage_ran(path):
            size_rule(a.shape[0], a.shape[1])
        count_hit(path, a, native_mode)
        return Found(HIT, array=a)
    if not store.accepting or (budget is not None and not budget.fill()):
        return Found(UNCACHED)
    return Found(MISS, material=material)


def record_miss(store: cache.Store, material: bytes, a: np.ndarray | None, decode_s: float,
                reproducible: bool) -> None:
    """A miss (its key ``material``) decoded in ``decode_s`` seconds: stored where the decode is reproducible,
    and counted with its decode time."""
    stored = a is not None and reproducible and store.put(material, a)
    count_miss(a, decode_s, stored)


def load(store: cache.Store, path: str | os.PathLike[str], native_mode: bool = False,
         index: FileIndex | None = None) -> np.ndarray | None:
    """The full decode of ``path`` through ``store``: a hit's view, or a miss decoded, stored and counted.

    ``native_mode``: the JPEG's own mode (grey stays H x W), as :func:`decode.decode_jpeg_native`. None when the
    store takes no more entries (full, or no disk space), or the file is not one this decoder handles
    (``native_mode``): the caller decodes as it would without a cache.
    """
    found = look_up(store, path, "native" if native_mode else "RGB", index, native_mode=native_mode)
    if found.kind != MISS:
        return found.array
    start = time.perf_counter()
    if native_mode:
        a, reproducible = decode.decode_jpeg_native(path), True
        if a is None:
            return None
    else:
        a, reproducible = decode.decode_rgb_reproducibly(path)
    record_miss(store, found.material, a, time.perf_counter() - start, reproducible)
    return a


_timed_a_decode = False
_timing_lock = threading.Lock()


def count_hit(path: str | os.PathLike[str], a: np.ndarray, native_mode: bool = False) -> None:
    """Count a hit; once per process, time the decode it saved, so that the report can estimate the total."""
    global _timed_a_decode
    stats = report.stats
    if stats is None:
        return
    figures = {"hits": 1, "hit_bytes": a.nbytes, "hit_px": a.shape[0] * a.shape[1]}
    if not _timed_a_decode:
        with _timing_lock:
            first, _timed_a_decode = not _timed_a_decode, True
        if first:
            start = time.perf_counter()
            if native_mode:  # checked: the hit already applied stock's size rule, warn no second time
                decode.decode_jpeg_native(path, checked=True)
            else:
                decode.decode_rgb(path, checked=True)
            figures.update(decode_s=time.perf_counter() - start, decode_px=a.shape[0] * a.shape[1])
    stats.add_cache(figures)


def count_miss(a: np.ndarray | None, seconds: float, stored: bool) -> None:
    stats = report.stats
    if stats is None:
        return
    figures: dict[str, float] = {"misses": 1}
    if a is not None:
        figures.update(decode_s=seconds, decode_px=a.shape[0] * a.shape[1])
        if stored:
            figures.update(stored=1, stored_bytes=a.nbytes)
    stats.add_cache(figures)


def _after_fork_in_child() -> None:
    global _timing_lock
    _timing_lock = threading.Lock()  # a lock held by a thread of the parent's stays held in the child


os.register_at_fork(after_in_child=_after_fork_in_child)
