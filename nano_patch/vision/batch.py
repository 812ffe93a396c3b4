"""Batch-parallel loading, exact: a batch's random draws in the calling thread, its pixels on the loader's threads.

Torch's map-style fetcher calls ``dataset.__getitems__(indices)`` when a dataset has one; the dataset patches
give the patched datasets one that comes here. For each batch:

- **draw** (the calling thread, in stock's order): per sample, the image's size (the JPEG header, or the
  decoded-image cache's entry), then the plan's run on a :class:`plan.Recording`: every draw of every step
  exactly as stock's one-by-one loop makes it (torch's, Python's and NumPy's generators), and the pixel
  operations written down; then the dataset's ``target_transform``.
- **render** (``data/parallel.py``'s threads): per sample, the decode (whole, or only a crop's window) or the
  cache's view, and the written-down operations, in order (``plan.render``). Draws nothing; the decoders and
  kernels release the GIL.
- **store** (the calling thread): cache misses go into the decoded-image cache, in sample order.

What stock would have done differently (a file that fails to decode, a kernel that leaves an argument to
stock) puts every generator back where the batch started and the batch is loaded one by one instead, so
that the error, or the fallback, is stock's, at stock's point. A Compose whose steps need pixels while they
draw (a transform the plan does not know, AugMix, a step after the tensor tail) is not split: its dataset
keeps the one-by-one path, and the run report says why.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import report
from . import cache, decode, file_index, native, oprunner, pipeline, plan, source
from .image import FastImage, plain

#: A sample's pixels, as the draw found them: one of these kinds, with what the render needs.
ARRAY, JPEG_WINDOW, DECODE, READY = "array", "jpeg window", "decode", "ready"


@dataclass
class Job:
    """One sample of a batch, between its draw and its render."""

    kind: str
    path: Any
    recording: plan.Recording | None
    array: np.ndarray | None = None
    data: bytes | None = None
    size: tuple[int, int] | None = None
    #: the decoded-image cache's key material, where a miss should be stored
    material: bytes | None = None
    #: READY: the whole sample (image and target), loaded one by one in the calling thread
    sample: Any = None
    #: the recording as one native call (``oprunner``), or None: ``plan.render`` in Python
    native: oprunner.NativeRun | None = None


@dataclass
class Rendered:
    sample: Any
    decoded: np.ndarray | None  # a full decode to store, or None
    reproducible: bool
    decode_s: float
    render_s: float


def why_not_split(transform: Any) -> str | None:
    """Why samples of ``transform`` cannot be drawn apart from their pixels (None: they can)."""
    import nano_patch

    if transform is None:
        return None
    from torchvision.transforms import Compose

    if not pipeline.behaves_as(transform, Compose):
        return f"the transform is a {type(transform).__name__}, not a torchvision Compose"
    if nano_patch.options().scaled_decode:
        return "scaled_decode fuses the first Resize into the decode"
    return plan.plan_for(transform).unsplittable


def _states() -> tuple[Any, Any, Any]:
    import torch

    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _restore(states: tuple[Any, Any, Any]) -> None:
    import torch

    torch.set_rng_state(states[0])
    random.setstate(states[1])
    np.random.set_state(states[2])


def load_samples(dataset: Any, entries: list[tuple[Any, Any]], transform: Any, target_transform: Any,
                 n_threads: int, one: Callable[[int], Any]) -> list[tuple[Any, Any]] | None:
    """``[(transform(load(path)), target_transform(target)) for path, target in entries]`` as stock makes it,
    rendered on ``n_threads`` threads; None where the caller must load the batch one by one (the generators are
    then where they were when this was called). ``one(k)``: the ``k``-th sample loaded one by one, as stock's
    ``dataset[index]`` (for a sample whose draws turn out to need its pixels)."""
    from ..data import parallel

    if why_not_split(transform) is not None:
        return None
    stats = report.stats
    states = _states()
    store = cache.store_for(dataset)
    index = file_index.for_dataset(dataset) if store is not None else None
    the_plan = plan.plan_for(transform) if transform is not None else None
    crop_window = the_plan is not None and the_plan.crop_first and native.available("crop_decode")
    # Where a sample's draws may need its pixels (a policy op its library runs itself), each sample starts from
    # a copy of the generators, so that such a sample alone can be loaded one by one, from the same point.
    per_sample = the_plan is not None and the_plan.sometimes_unsplittable is not None
    start = time.perf_counter()
    try:
        jobs: list[Job] = []
        targets: list[Any] = []
        for k, (path, target) in enumerate(entries):
            before = _states() if per_sample else None
            try:
                jobs.append(_draw(path, transform, store, crop_window, index))
            except plan.NotSplittable as exc:
                if exc.every_time or the_plan is None:
                    raise
                if before is None:  # the first time: the batch again, each sample from its own copy
                    the_plan.sometimes_unsplittable = str(exc)
                    raise
                _restore(before)
                jobs.append(Job(READY, path, None, sample=one(k)))
                report.count("dataloader", False, f"sample loaded one by one: {exc}")
                continue
            targets.append(target_transform(target) if target_transform is not None else target)
        for job, run in zip(jobs, oprunner.prepare_batch([j.recording for j in jobs])):
            job.native = run  # (all of them: into one batch tensor, which default_collate then takes as it is)
        drawn = time.perf_counter()
        rendered = parallel.map_in_order(_render, jobs, n_threads)
    except _GuardRaised as raised:
        # raised where stock raises it, every generator where stock's is then: no retry one by one, which would
        # repeat the warnings this batch's draws already gave
        raise raised.error from None
    except plan.NotSplittable as exc:
        _restore(states)
        if exc.every_time:
            the_plan.unsplittable = str(exc)
            report.count("dataloader", False, f"batch loaded one by one: {exc}")
            return None
        return load_samples(dataset, entries, transform, target_transform, n_threads, one)
    except Exception:  # noqa: BLE001 - a file or step that stock handles its own way: one by one, from the start
        _restore(states)
        report.count("dataloader", False, "batch loaded one by one: a sample failed to load or render")
        return None
    done = time.perf_counter()
    if store is not None:
        for job, r in zip(jobs, rendered):
            if job.material is not None and r.decoded is not None:
                source.record_miss(store, job.material, r.decoded, r.decode_s, r.reproducible)
    if stats is not None:
        stored_s = time.perf_counter() - done
        stats.count("dataloader", True, f"batch loaded on {n_threads} threads (draws in stock's order)")
        stats.add_loader({"parallel_batches": 1, "parallel_samples": len(jobs), "parallel_threads": n_threads,
                          "draw_s": drawn - start + stored_s, "render_wall_s": done - drawn,
                          "render_s": sum(r.render_s for r in rendered)})
    out, targets_left = [], iter(targets)
    for job, r in zip(jobs, rendered):
        out.append(r.sample if job.kind == READY else (r.sample, next(targets_left)))
    return out


class _GuardRaised(Exception):
    """PIL's guard raised in the draw: stock's error at stock's point (the earlier samples' draws are stock's)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _guard(check: Callable[..., Any], *args: Any) -> Any:
    try:
        return check(*args)
    except Exception as exc:
        raise _GuardRaised(exc) from exc


def _draw(path: Any, transform: Any, store: cache.Store | None, crop_window: bool,
          index: file_index.FileIndex | None = None) -> Job:
    """The sample's source of pixels and its size, then its draws (``transform``'s plan on a Recording)."""
    job = _source(path, store, crop_window, index)
    if transform is not None:
        hw = job.array.shape[:2] if job.array is not None else job.size
        job.recording = pipeline.run_compose(transform, plan.Recording(hw))
    return job


def _source(path: Any, store: cache.Store | None, crop_window: bool, index: file_index.FileIndex | None = None
            ) -> Job:
    """Where the sample's pixels come from (``source.look_up``: a cache hit, a miss to decode and store, or no
    cache), and, for a JPEG to decode, its size from the header, after PIL's open checks."""
    found = source.look_up(store, path, index=index, size_rule=lambda h, w: _guard(decode.check_size, h, w))
    if found.kind == source.HIT:  # stock's size rule applied, as its open of the file
        return Job(ARRAY, path, None, array=found.array)
    material = found.material  # a miss to store, or None
    data = decode.read_bytes(path)
    size = decode.jpeg_size(data)
    # PIL's guards on the header, in this thread, in stock's order (before this sample's draws)
    if size is not None and not _guard(decode.check_open, data, *size):
        size = None  # PIL's open rejects the bytes: PIL decodes the file below and raises stock's error
    if size is None:
        # not a JPEG libjpeg-turbo takes like PIL: PIL decodes it now, in this thread, as one by one
        start = time.perf_counter()
        a, reproducible = decode.decode_rgb_reproducibly(path, data=data)
        if material is not None:
            source.record_miss(store, material, a, time.perf_counter() - start, reproducible)
        return Job(ARRAY, path, None, array=a)
    if material is None and crop_window:
        return Job(JPEG_WINDOW, path, None, data=data, size=size)
    return Job(DECODE, path, None, data=data, size=size, material=material)


def _render(job: Job) -> Rendered:
    start = time.perf_counter()
    decoded, reproducible, decode_s = None, False, 0.0
    if job.kind == READY:
        return Rendered(job.sample, None, False, 0.0, 0.0)
    if job.kind == JPEG_WINDOW and job.native is not None:
        sample = oprunner.run_jpeg(job.native, job.data, job.size, job.path)
        return Rendered(sample, None, False, 0.0, time.perf_counter() - start)
    if job.kind == JPEG_WINDOW:
        px: plan.Pixels = plan.JpegPixels(job.data, job.size, job.path)
    else:
        a = job.array
        if a is None:
            a, reproducible = decode.decode_rgb_reproducibly(job.path, data=job.data, checked=True)
            decode_s = time.perf_counter() - start
            if a.shape[:2] != tuple(job.size):
                raise plan.RenderFailed("the decode's size is not the header's")
            decoded = a if job.material is not None else None
        if job.recording is None:
            return Rendered(plain(FastImage.wrap(a)), decoded, reproducible, decode_s, time.perf_counter() - start)
        if job.native is not None:
            sample = oprunner.run(job.native, a)
            return Rendered(sample, decoded, reproducible, decode_s, time.perf_counter() - start)
        px = plan.Pixels.of(FastImage.wrap(a))
    sample = plain(plan.render(job.recording, px))
    return Rendered(sample, decoded, reproducible, decode_s, time.perf_counter() - start)

