"""The render stage of the batch path: each sample's pixels, off the GIL, on the loader's threads.

A run's samples render as one native call per thread into the batch tensor (``oprunner.NativeBatch``) where every
sample can; else each sample on its own (``render_pool.map_outcomes``), by its native run or the plan's Python
render, in the calling thread's torch modes (``data/threads/thread_modes.py``). A render draws nothing. Misses go into
the
decoded-image cache afterwards, in the calling thread, with what each sample cost for the cache's fill budget.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import report
from ...vision.images import cache, decode, source
from ...vision.images.cache import fill
from ...vision.images.image import FastImage, plain
from ...vision.plans import compose_plan, oprunner
from ..threads import render_pool
from .sample_source import ARRAY, JPEG_WINDOW, SampleJob, read_indexed


@dataclass(slots=True)
class Rendered:
    sample: Any
    decoded: np.ndarray | None  # a full decode to store, or None
    reproducible: bool
    decode_s: float
    render_s: float


def store_misses(store: cache.Store, jobs: list[SampleJob], outcomes: list[tuple[bool, Any]] | None, each: float,
                  n_threads: int) -> None:
    """Store the decodes of ``jobs``' misses, and tell the store's fill budget (``--fast``) what each sample cost:
    its render (``outcomes``' times, or ``each`` for a batch taken at once), a fill's write added. The write is
    made here, in the calling thread, while the renders share ``n_threads`` threads: it counts ``n_threads`` times
    (the threads' time it holds the batch up)."""
    budget = store.fill_budget
    for k, job in enumerate(jobs):
        if outcomes is None:
            seconds = each
        else:
            ok, r = outcomes[k]
            if not ok:
                continue
            seconds = r.render_s
            if job.material is not None and r.decoded is not None:
                start = time.perf_counter()
                source.record_miss(store, job.material, r.decoded, r.decode_s, r.reproducible)
                seconds += (time.perf_counter() - start) * n_threads
        if budget is not None:  # (the look-up was made in the calling thread, as the write)
            budget.seen(fill.HIT if job.hit else fill.FILLED if job.material is not None else fill.UNCACHED, seconds,
                        job.lookup_s * n_threads)


def native_batch(jobs: list[SampleJob]) -> oprunner.NativeBatch | None:
    """The batch's renders as one native call per loader thread (``oprunner.NativeBatch``), where every sample
    renders natively into the batch tensor from an array (the cache's, or one decoded in the draw) or from a JPEG
    the header index answered for; else None."""
    if not jobs or any(j.native is None or j.native.flat is None for j in jobs):
        return None
    sources: list[Any] = []
    for job in jobs:
        if job.kind == ARRAY:
            sources.append(job.array)
        elif job.data is None:
            sources.append((job.path, job.size))
        else:
            return None  # (bytes read in the draw: the first epoch, or a miss to store)
    try:
        return oprunner.native_batch([j.native for j in jobs], sources)
    except Exception:  # noqa: BLE001 - a record the batch call refuses: each sample renders on its own, and fails
        return None  # there on its own (its error at its sample, as before)


def erasing(jobs: list[SampleJob]) -> bool:
    """Some sample goes out with RandomErasing's draws for the device (``tensor_tail.ErasedImage``)."""
    return any(job.recording is not None and job.recording.erasures is not None for job in jobs)


def run_batch(batch: oprunner.NativeBatch, calls: int, n: int) -> float:
    """``batch``'s native calls on ``calls`` threads; the render's seconds per sample (wall time shared out)."""
    start = time.perf_counter()
    # never the user's error: a sample a failed call did not render takes the Python path (batch_outcomes)
    with contextlib.suppress(Exception):
        if not batch.run_on(calls):  # (native helpers: no helper takes the GIL; else the loader's threads)
            render_pool.run_on_threads(batch.run, calls)
    return (time.perf_counter() - start) * calls / n


def count_taken(stats: Any, jobs: list[SampleJob]) -> None:
    """The run report's counts for a batch taken at once, as :func:`batch_outcomes` counts its samples."""
    decoded = counted_decodes(jobs)
    if decoded:
        stats.count_many(decoded)


def counted_decodes(jobs: list[SampleJob]) -> dict[tuple[str, bool, str], int]:
    """The run report's decode counts of a batch's samples (whole, or a crop's window)."""
    decoded: dict[tuple[str, bool, str], int] = {}
    for job in jobs:
        if job.kind != ARRAY:
            key = ("vision_datasets", True, oprunner.DECODED[job.kind == JPEG_WINDOW])
            decoded[key] = decoded.get(key, 0) + 1
    return decoded


def batch_outcomes(batch: oprunner.NativeBatch, jobs: list[SampleJob], each: float) -> list[tuple[bool, Any]]:
    """Each job's outcome once ``batch``'s calls returned: its slot, or the Python path's render of what they left."""
    stats = report.stats
    done = batch.done()
    outcomes: list[tuple[bool, Any]] = []
    for k, job in enumerate(jobs):
        if done[k] and stats is None:  # (the common case first: written to its slot)
            outcomes.append((True, Rendered(job.native.slot_tensor, None, False, 0.0, each)))  # type: ignore
            continue
        try:
            got = batch.result(k)
            if got is not None and not isinstance(got, bytes):
                if stats is not None and job.kind != ARRAY:
                    stats.count("vision_datasets", True, oprunner.DECODED[job.kind == JPEG_WINDOW])
                outcomes.append((True, Rendered(got, None, False, 0.0, each)))
                continue
            outcomes.append((True, render_job(job, got, native_file=False)))
        except Exception as exc:  # noqa: BLE001 - the caller's to judge, in order (as map_outcomes gives it)
            outcomes.append((False, exc))
    return outcomes


def render_job(job: SampleJob, read: bytes | None = None, native_file: bool = True) -> Rendered:
    """The sample's pixels, by its native run or the Python path. ``read``: the bytes of a header-indexed file,
    already read (by a native call that left it); ``native_file``: such a file may be read, decoded and rendered
    in one native call first."""
    start = time.perf_counter()
    decoded, reproducible, decode_s = None, False, 0.0
    if job.data is None and job.kind != ARRAY:
        # the header index answered the draw: where the sample runs natively, its file read, checks, decode, ops
        # and tail are one native call (the GIL released once); what that call leaves takes the Python path
        got = read
        if got is None and native_file and job.native is not None:
            got = oprunner.run_file(job.native, job.path, job.size)
        if got is not None and not isinstance(got, bytes):
            return Rendered(got, None, False, 0.0, time.perf_counter() - start)
        read_indexed(job, got)
    if job.kind == JPEG_WINDOW and job.native is not None:
        sample = oprunner.run_jpeg(job.native, job.data, job.size, job.path)
        return Rendered(sample, None, False, 0.0, time.perf_counter() - start)
    if job.kind == JPEG_WINDOW:
        px: compose_plan.Pixels = compose_plan.JpegPixels(job.data, job.size, job.path)
        if job.info:
            px.info = job.info
    else:
        a = job.array
        if a is None:
            a, reproducible = decode.decode_rgb_reproducibly(job.path, data=job.data, checked=True)
            decode_s = time.perf_counter() - start
            if a.shape[:2] != tuple(job.size):
                raise compose_plan.RenderFailed("the decode's size is not the header's")
            decoded = a if job.material is not None else None
        if job.native is not None:  # (a sample the draw program made has a native run and no recording)
            sample = oprunner.run(job.native, a)
            return Rendered(sample, decoded, reproducible, decode_s, time.perf_counter() - start)
        if job.recording is None:
            return Rendered(plain(FastImage.wrap(a, job.info)), decoded, reproducible, decode_s,
                            time.perf_counter() - start)
        px = compose_plan.Pixels.of(FastImage.wrap(a, job.info))
    sample = plain(compose_plan.render(job.recording, px))
    return Rendered(sample, decoded, reproducible, decode_s, time.perf_counter() - start)
