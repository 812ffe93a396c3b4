"""Batch-parallel loading, exact: a batch's random draws in the calling thread, its pixels on the loader's threads.

The DataLoader patch's fetch (``data/fetch.py``) hands a batch's indices to the patched dataset's batch loader
where stock's fetcher would call that dataset's ``__getitem__`` per index; the loader comes here. For each run of
samples of a batch:

- **draw** (the calling thread, in stock's order): per sample, the image's size (the JPEG header, with PIL's
  guards, or the decoded-image cache's entry), then the plan's run on a :class:`plan.Recording`: every draw of
  every step exactly as stock's one-by-one loop makes it (torch's, Python's and NumPy's generators), and the
  pixel operations written down. No user code runs here; the generators' state before each sample is kept (or
  found again by drawing the run once more from its start, where no ``target_transform`` needs it).
- **render** (``data/loader_threads.py``'s threads, in the calling thread's torch state: ``data/torch_state.py``): per
  sample, the decode (whole, or only a crop's window) or the cache's view, and the written-down operations, in
  order (``plan.render``). Draws nothing; the decoders and kernels release the GIL.
- **take** (the calling thread, sample by sample): the dataset's ``target_transform``, called with the
  generators where stock has them after that sample's draws; then cache misses go into the decoded-image cache.

A sample that needs stock's own code (a file that fails, a truncated JPEG, a step that needs pixels while it draws,
a crop box PIL's size check warns or raises for) is loaded one by one at its place, from stock's state before it,
its open stage not run again, and the batch path resumes after it: every user callable runs as often as on stock, in
stock's order relative to every draw; every warning is given once; an error comes at stock's sample with stock's
generators. A ``target_transform`` that changes a global generator makes that dataset load one by one from there on.
A Compose whose steps need pixels while they draw (a transform the plan does not know, AugMix, a step after the
tensor tail) is not split: its dataset keeps the one-by-one path, and the run report says why.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import config, forks, report
from ..vision.images import cache, decode, file_index, source
from ..vision.images.cache import fill
from ..vision.images.image import FastImage, plain
from ..vision.kernels import native, torch_draws
from ..vision.plans import compose_call, compose_plan, draw_program, oprunner
from ..vision.plans.tensor_tail import ErasedImage
from . import collate, render_pool, torch_state

#: A sample's pixels, as the draw found them: one of these kinds, with what the render needs.
ARRAY, JPEG_WINDOW, DECODE = "array", "jpeg window", "decode"


@dataclass(slots=True)
class Job:
    """One sample of a batch, between its draw and its render."""

    kind: str
    path: Any
    recording: compose_plan.Recording | None
    array: np.ndarray | None = None
    data: bytes | None = None
    size: tuple[int, int] | None = None
    #: the decoded-image cache's key material, where a miss should be stored
    material: bytes | None = None
    #: stock's ``Image.open(path).info``, where the sample can be an image (None where no image leaves the plan)
    info: dict[Any, Any] | None = None
    #: the recording as one native call (``oprunner``), or None: ``plan.render`` in Python
    native: oprunner.NativeRun | None = None
    #: the array is the decoded-image cache's (a hit)
    hit: bool = False
    #: seconds the decoded-image cache's look-up took in the draw (None: no cache)
    lookup_s: float = 0.0


@dataclass(slots=True)
class Rendered:
    sample: Any
    decoded: np.ndarray | None  # a full decode to store, or None
    reproducible: bool
    decode_s: float
    render_s: float


def why_not_split(transform: Any) -> str | None:
    """Why samples of ``transform`` cannot be drawn apart from their pixels (None: they can)."""
    if transform is None:
        return None
    from torchvision.transforms import Compose

    if not compose_call.behaves_as(transform, Compose):
        return f"the transform is a {type(transform).__name__}, not a torchvision Compose"
    if config.current().scaled_decode:
        return "scaled_decode fuses the first Resize into the decode"
    return compose_plan.plan_for(transform).unsplittable


def _states(beyond_torch: bool = True) -> tuple[Any, Any, Any]:
    """The generators' states: torch's, and Python's and NumPy's unless ``beyond_torch`` is False (they are then
    None: a plan that draws from torch alone leaves them where they are)."""
    import torch

    if not beyond_torch:
        return torch.get_rng_state(), None, None
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _restore(states: tuple[Any, Any, Any]) -> None:
    import torch

    torch.set_rng_state(states[0])
    if states[1] is not None:
        random.setstate(states[1])
    if states[2] is not None:
        np.random.set_state(states[2])


def _same(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> bool:
    import torch

    if not torch.equal(a[0], b[0]) or a[1] != b[1]:
        return False
    if a[2] is None or b[2] is None:
        return a[2] is b[2]
    return a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and tuple(a[2][2:]) == tuple(b[2][2:])


def _draws_beyond_torch(the_plan: compose_plan.Plan | None) -> bool:
    """Whether a step of the plan may draw from Python's or NumPy's generator (timm's steps), not torch's alone."""
    if the_plan is None:
        return False
    return any(r is not None and r.__name__.startswith("run_timm") for r in the_plan.runners)


#: Datasets whose batches load one by one, and why (a ``target_transform`` that draws from the global generators:
#: the draws of a batch could not be made ahead of it). Weak keys: a dataset's entry goes with it.
_one_by_one: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_one_by_one_lock = threading.Lock()


def why_one_by_one(dataset: Any) -> str | None:
    with _one_by_one_lock:
        try:
            return _one_by_one.get(dataset)
        except TypeError:  # not weak-referenceable, or unhashable: never marked
            return None


def _mark_one_by_one(dataset: Any, why: str) -> None:
    with _one_by_one_lock, contextlib.suppress(TypeError):
        _one_by_one[dataset] = why
    report.count("dataloader", False, f"batch loaded one by one: {why}")


@dataclass
class _Stop:
    """The draw stopped at a sample that stock's own code must load, from where stock stands then."""

    k: int
    #: raise this (PIL's guard raised in the open stage), else load the sample one by one
    error: BaseException | None = None
    #: the sample's open stage already ran (its source): the one-by-one load must not run it again
    job: Job | None = None


def load_samples(dataset: Any, entries: list[tuple[Any, Any]], transform: Any, target_transform: Any,
                 n_threads: int, one: Callable[[int], Any]) -> list[tuple[Any, Any]] | None:
    """``[(transform(load(path)), target_transform(target)) for path, target in entries]`` as stock makes it,
    rendered on ``n_threads`` threads; None where this dataset's batches load one by one (nothing ran then).
    ``one(k)``: the ``k``-th sample loaded one by one, as stock's ``dataset[index]``.

    Every user callable runs as often as on stock, and in stock's order relative to every draw: the draws of a
    run of samples are made first (they run no user code), their pixels rendered, and only then, sample by
    sample, each ``target_transform`` is called with the generators where stock has them after that sample's
    draws. A sample that needs stock's own code (a file that fails, a step that needs pixels while it draws) is
    loaded one by one at its place, from stock's generator state, and the batch path resumes after it: nothing
    is drawn, opened, warned or called twice.
    """
    if why_not_split(transform) is not None or why_one_by_one(dataset) is not None:
        return None
    out: list[Any] = []
    k = 0
    while k < len(entries):
        if why_not_split(transform) is not None or why_one_by_one(dataset) is not None:
            out.extend(one(j) for j in range(k, len(entries)))  # marked part-way: the rest as stock, in order
            break
        k = _load_run(dataset, entries, k, transform, target_transform, n_threads, one, out)
    return out


@dataclass
class _Run:
    """What the stages of one run of samples share: the dataset's tables and plan, fixed for the run."""

    dataset: Any
    transform: Any
    target_transform: Any
    store: cache.Store | None
    index: file_index.FileIndex | None
    headers: file_index.HeaderIndex | None
    with_info: bool
    plan: compose_plan.Plan | None
    crop_window: bool
    #: the run's draws may move Python's or NumPy's generator too (timm's steps, a target_transform)
    beyond: bool

    @classmethod
    def of(cls, dataset: Any, transform: Any, target_transform: Any) -> _Run:
        from . import sample_loading as loading

        store = cache.store_for(dataset)
        with_info = loading.needs_info(transform)
        the_plan = compose_plan.plan_for(transform) if transform is not None else None
        return cls(dataset, transform, target_transform, store,
                   file_index.for_dataset(dataset) if store is not None else None,
                   # sizes from the header index where the images are not cached (a sample that is an image needs
                   # its file's info, read in the draw: those take the full path)
                   file_index.headers_for(dataset) if not with_info else None,
                   with_info, the_plan,
                   the_plan is not None and the_plan.crop_first and native.available("crop_decode"),
                   _draws_beyond_torch(the_plan) or target_transform is not None)


@dataclass
class _Drawn:
    """A run's draw: its samples' jobs in order, where it stopped, and the generators' states it can go back to."""

    k0: int
    jobs: list[Job]
    stop: _Stop | None
    #: the generators before each sample's draws (where a target_transform needs them), else None
    before: list[tuple[Any, Any, Any]] | None
    #: the generators at the run's start (where ``before`` is None)
    run_start: tuple[Any, Any, Any] | None
    #: the generators after the run's draws (where ``before`` is kept)
    after: tuple[Any, Any, Any] | None = None
    #: the draw program's counts for the run report
    counts: dict[tuple[str, bool, str], int] | None = None

    def rewind(self, j: int, transform: Any) -> None:
        """The generators where they were before the ``j``-th job's draws."""
        if self.before is not None:
            _restore(self.before[j])
            return
        _restore(self.run_start)  # type: ignore[arg-type]
        for done_job in self.jobs[:j]:
            _draw_again(done_job, transform)


#: One run's draw stage at a time in this process: a stage with native draws copies torch's generator, draws from
#: the copy and writes it back; two at once (two threads iterating loaders) would each write back over the other's.
_draw_lock = threading.Lock()
#: Draw stages whose copy found torch's generator moved by another thread meanwhile, before torch draws itself.
_COPY_ATTEMPTS = 2


def _load_run(dataset: Any, entries: list[tuple[Any, Any]], k0: int, transform: Any, target_transform: Any,
              n_threads: int, one: Callable[[int], Any], out: list[Any]) -> int:
    """Load samples from ``k0`` into ``out``: draw as many as can be drawn ahead, render them, then take them in
    order; return the index to go on from."""
    stats = report.stats
    run = _Run.of(dataset, transform, target_transform)
    start = time.perf_counter()
    with _draw_lock:
        for attempt in range(_COPY_ATTEMPTS + 1):
            drawn = _draw(run, entries, k0, copy=attempt < _COPY_ATTEMPTS)
            if drawn is not None:
                break
    if stats is not None and drawn.counts:
        stats.count_many(drawn.counts)
    jobs = drawn.jobs
    for job, native_run in zip(jobs, oprunner.prepare_batch([j.native or j.recording for j in jobs])):
        job.native = native_run  # (all of them: into one batch tensor, which default_collate then takes as it is)
    drawn_at = time.perf_counter()
    outcomes, each = _render(run, drawn, n_threads)
    done = time.perf_counter()
    if outcomes is None:  # the common batch: every sample in its slot, nothing to call or store between them
        if stats is not None:
            _count_taken(stats, jobs)
        slots = tuple([job.native.slot_tensor for job in jobs])  # type: ignore[union-attr]
        out.extend(zip(slots, [entry[1] for entry in entries[k0:k0 + len(jobs)]]))
        committed = len(jobs)
        if k0 == 0 and drawn.stop is None and len(jobs) == len(entries):  # the whole batch, for the fetch's collation
            collate.hand_over(jobs[0].native.batch, slots)  # type: ignore[union-attr]
    else:
        committed = _take(run, drawn, outcomes, entries, one, out)
    stop = drawn.stop
    if stop is not None:
        if stop.error is not None:
            raise stop.error  # PIL's guard: stock's error, where stock raises it
        out.append(_one_reusing(one, stop.k, stop.job) if stop.job is not None else one(stop.k))
    resume = stop.k + 1 if stop is not None else k0 + len(jobs)
    if run.store is not None:  # (the batch taken at once has no miss)
        _store_misses(run.store, jobs[:committed], outcomes[:committed] if outcomes else None, each, n_threads)
    if stats is not None and committed:
        rendered_s = [r.render_s for ok, r in outcomes[:committed] if ok] if outcomes else [each] * committed
        stats.count("dataloader", True, f"batch loaded on {n_threads} threads (draws in stock's order)")
        stats.add_loader({"parallel_batches": 1, "parallel_samples": committed, "parallel_threads": n_threads,
                          "draw_s": drawn_at - start + time.perf_counter() - done, "render_wall_s": done - drawn_at,
                          "render_s": sum(rendered_s)})
    return resume


def _draw(run: _Run, entries: list[tuple[Any, Any]], k0: int, copy: bool) -> _Drawn | None:
    """The draw stage: each sample's source and draws, in stock's order, as far as they can be made ahead. ``copy``:
    torch's draws may be made natively from a copy of its generator, written back at the end; None where another
    thread moved torch's generator meanwhile (nothing was written back: the caller draws again)."""
    transform = run.transform
    jobs: list[Job] = []
    # The generators before each sample's draws: kept per sample only where a target_transform needs them (a kept
    # state is a new 5 KB tensor, ~15-40 us); else the run's start, from which the draws are made again (they run no
    # user code and give no warning) in the rare case that a sample needs stock's code.
    before: list[tuple[Any, Any, Any]] | None = [] if run.target_transform is not None else None
    drawn = _Drawn(k0, jobs, None, before, _states(run.beyond) if before is None else None)
    # torch's draws made natively from a copy of its generator, written back once the run's draws are made; only
    # where no user code runs between two samples' draws (no target_transform) and every step's draws are known
    draws = _native_draws() if copy and before is None and run.plan is not None and run.plan.draws_natively \
        else None
    # the samples' recordings share their tensor tail's op: no user code runs between their draws (a
    # target_transform runs after them all), so a Normalize's constants are the same for all of them
    shared: dict[Any, Any] = {}
    # where every step of the plan is one the draw program knows: each sample's native run straight from its draws
    program = draw_program.bind(transform, draws, shared) if draws is not None else None
    try:
        for k in range(k0, len(entries)):
            path = entries[k][0]
            states = _states(run.beyond) if before is not None else None
            try:
                job = _source(path, run.store, run.crop_window, run.index, run.headers)
                if run.with_info:
                    job.info = decode.image_info(path, job.data)
            except _GuardRaised as raised:
                drawn.stop = _Stop(k, error=raised.error)
                break
            except Exception:  # noqa: BLE001 - a file stock's own code handles its way (missing, damaged): one by one
                drawn.stop = _Stop(k)
                break
            try:
                native_run = program.draw(job.array.shape[:2] if job.array is not None else job.size) \
                    if program is not None else None
                if native_run is not None:
                    job.native = native_run
                else:
                    _draw_sample(job, transform, draws, shared)
                    if program is not None:
                        program.resync()  # (the plan drew this sample from the program's generator copy)
            except torch_draws.GeneratorMoved:
                return None  # (nothing written back: the caller draws the run again)
            except Exception as exc:  # noqa: BLE001 - stock's own code loads this sample, from its state before it
                if states is not None:
                    _restore(states)
                else:
                    draws = None  # the rewind draws again with torch's own generator, which then stands right
                    drawn.rewind(len(jobs), transform)
                if isinstance(exc, compose_plan.NotSplittable):
                    if exc.every_time and run.plan is not None:
                        run.plan.unsplittable = str(exc)
                        report.count("dataloader", False, f"batch loaded one by one: {exc}")
                    else:
                        report.count("dataloader", False, f"sample loaded one by one: {exc}")
                # (else a draw stock raises at, a crop larger than the image: the samples before it are taken
                # first, as stock's loop takes them, then stock's code raises it at its sample)
                drawn.stop = _Stop(k, job=job)
                break
            jobs.append(job)
            if before is not None:
                before.append(states)
    except BaseException:
        if draws is not None:
            draws.to_torch()  # torch's generator where the run's draws leave it, as stock's would be
        raise
    if draws is not None and not draws.to_torch_unless_moved():
        return None  # (another thread drew from torch's generator meanwhile: these draws are not stock's)
    if program is not None:
        drawn.counts = program.report_counts()
    drawn.after = _states(run.beyond) if before is not None and jobs else None
    return drawn


def _render(run: _Run, drawn: _Drawn, n_threads: int) -> tuple[list[tuple[bool, Any]] | None, float]:
    """The render stage: each sample's pixels, on ``n_threads`` threads. Its outcomes, in order, and the seconds a
    sample took; no outcomes (None) where the batch was rendered whole, every sample into its slot, with nothing
    to call between them (no target_transform, no erasers' draws): it is then taken at once."""
    jobs = drawn.jobs
    parallel = n_threads > 1 and len(jobs) > 1
    batch = _native_batch(jobs)
    if batch is None:
        return render_pool.map_outcomes(_render_job, jobs, n_threads,
                                        torch_state.capture() if parallel else None), 0.0
    # the native calls run no torch op (no thread enters the caller's torch state); where that state cannot be
    # held by another thread, the calling thread takes them all, as map_outcomes would
    calls = min(n_threads, len(jobs)) if parallel and not torch_state.caller_only() else 1
    each = _run_batch(batch, calls, len(jobs))
    if drawn.before is None and b"\0" not in batch.done() and not _erasing(jobs):
        return None, each
    return _batch_outcomes(batch, jobs, each), each


def _take(run: _Run, drawn: _Drawn, outcomes: list[tuple[bool, Any]], entries: list[tuple[Any, Any]],
          one: Callable[[int], Any], out: list[Any]) -> int:
    """The take stage, sample by sample in order: the ``target_transform`` with the generators where stock has them
    after that sample's draws; a sample that failed loaded by stock's own code, from stock's state before it (and
    those after it too). Returns how many samples were taken from the batch path."""
    jobs, before, after = drawn.jobs, drawn.before, drawn.after
    target_transform = run.target_transform
    committed = 0
    stale = False  # the samples left were drawn from a state that is not stock's: one by one, in order
    for j, (job, (ok, rendered)) in enumerate(zip(jobs, outcomes)):
        k = drawn.k0 + j
        if stale:
            out.append(_one_reusing(one, k, job))
            continue
        if not ok:
            # stock's own code for this sample, from stock's state before it; those drawn after it follow it
            drawn.rewind(j, run.transform)
            failures = (compose_plan.DecodeFailed, compose_plan.RenderFailed, compose_plan.NotSplittable)
            if not isinstance(rendered, failures):
                report.count("dataloader", False, "sample loaded one by one: it failed to load or render")
            stale = True
            out.append(_one_reusing(one, k, job))
            continue
        target = entries[k][1]
        if target_transform is not None:
            # the user's callable sees the generators where stock has them after this sample's draws
            expected = before[j + 1] if before is not None and j + 1 < len(jobs) else after
            _restore(expected)  # type: ignore[arg-type]
            target = target_transform(target)
            if not _same(_states(), expected):  # type: ignore[arg-type]
                # it drew from a global generator: the samples after this one were drawn from a state that is not
                # stock's; they load one by one, and so does every later batch of this dataset
                _mark_one_by_one(run.dataset, "its target_transform draws from the global random generators")
                stale = True
        sample = rendered.sample
        if job.recording is not None and job.recording.erasures is not None:
            sample = ErasedImage(sample, job.recording.erasures)  # the tail is left to the device
        out.append((sample, target))
        committed = j + 1
    return committed


def _store_misses(store: cache.Store, jobs: list[Job], outcomes: list[tuple[bool, Any]] | None, each: float,
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


def _one_reusing(one: Callable[[int], Any], k: int, job: Job) -> Any:
    """``one(k)``, its file's open stage not run again (it ran when ``job`` was made: PIL's warnings were given)."""
    if job.data is None and job.kind != ARRAY:
        job.data = decode.read_bytes(job.path)  # the header index answered its draw: its bytes, read now
    with decode.reusing_open(job.path, job.data, job.array if job.kind == ARRAY else None, job.info):
        return one(k)


class _OneByOne(Exception):
    """A sample stock's own code must load, found before its open stage ran."""


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


def _guarded_size_rule(height: int, width: int) -> None:
    _guard(decode.check_size, height, width)


def _native_draws() -> torch_draws.TorchDraws | None:
    """torch's draws made natively from here (``torch_draws``), where that kernel passed its check; else None."""
    if not native.available("torch_draws"):
        return None
    return torch_draws.start(native.kernel("torch_draws"))


def _draw_sample(job: Job, transform: Any, draws: torch_draws.TorchDraws | None = None,
                 shared: dict[Any, Any] | None = None) -> None:
    """The sample's draws: ``transform``'s plan on a Recording of the source's size (torch's draws made by
    ``draws`` where given, else by torch; ``shared``: what the recordings of this run share)."""
    if transform is not None:
        hw = job.array.shape[:2] if job.array is not None else job.size
        job.recording = compose_call.run_compose(transform, compose_plan.Recording(hw, draws=draws, shared=shared))


def _draw_again(job: Job, transform: Any) -> None:
    """``job``'s draws once more, from where the generators are (its recording kept as it was)."""
    if transform is not None:
        hw = job.array.shape[:2] if job.array is not None else job.size
        compose_call.run_compose(transform, compose_plan.Recording(hw))


def _quiet_size_rule(height: int, width: int) -> None:
    """A size PIL's rule would act on (warn or raise): not for a virtual worker, which must never warn here."""
    raise _OneByOne("an image above PIL's size limit")


def _source(path: Any, store: cache.Store | None, crop_window: bool, index: file_index.FileIndex | None = None,
            headers: file_index.HeaderIndex | None = None, quiet: bool = False) -> Job:
    """Where the sample's pixels come from (``source.look_up``: a cache hit, a miss to decode and store, or no
    cache), and, for a JPEG to decode, its size from the header, after PIL's open checks. ``headers``: where the
    image is not cached, the dataset's index of plain JPEGs' sizes (the file is then read on the render's thread).
    ``quiet``: anything that would give a warning or need PIL here (a size PIL's rule acts on, a JPEG with EXIF or
    MPF data, another kind of file, a truncated one) raises :class:`_OneByOne` instead, having warned nothing.
    """
    material = None  # a miss to store, or None
    if store is not None:
        start = time.perf_counter()
        found = source.look_up(store, path, index=index, size_rule=_quiet_size_rule if quiet else _guarded_size_rule,
                               budget=store.fill_budget)
        if found.kind == source.HIT:  # stock's size rule applied, as its open of the file
            return Job(ARRAY, path, None, array=found.array, hit=True, lookup_s=time.perf_counter() - start)
        material = found.material
        lookup_s = time.perf_counter() - start
    else:
        lookup_s = 0.0
    if material is None and headers is not None:
        indexed = headers.size_of(path)
        if indexed is not None:  # a plain, whole JPEG, unchanged: its open checks come down to the size rule
            if not decode.below_size_limit(*indexed):
                if quiet:
                    raise _OneByOne("an image above PIL's size limit")
                _guard(decode.check_size, *indexed)
            return Job(JPEG_WINDOW if crop_window else DECODE, path, None, size=indexed, lookup_s=lookup_s)
    identity = file_index.identity_of(path) if material is None and headers is not None else None
    data = decode.read_bytes(path)
    size = decode.jpeg_size(data)
    if quiet and (size is None or decode.looks_truncated(data) or not decode.plain_open(data)
                  or not decode.below_size_limit(*size)):
        raise _OneByOne("a file PIL must open or decode")
    # PIL's guards on the header, in this thread, in stock's order (before this sample's draws)
    if size is not None and decode.looks_truncated(data):
        # stock raises for it (or, with LOAD_TRUNCATED_IMAGES, decodes PIL's fill) before its draws: stock's own
        # code loads it, before its open stage has run here
        raise _OneByOne("a truncated JPEG")
    if size is not None and not _guard(decode.check_open, data, *size, path):
        size = None  # PIL's open rejects the bytes: PIL decodes the file below and raises stock's error
    if identity is not None and size is not None and decode.plain_open(data):
        headers.add(path, identity, size)  # (stat'ed before it was read: a later change is seen)
    if size is None:
        # not a JPEG libjpeg-turbo takes like PIL: PIL decodes it now, in this thread, as one by one
        start = time.perf_counter()
        a, reproducible = decode.decode_rgb_reproducibly(path, data=data)
        if material is not None:
            source.record_miss(store, material, a, time.perf_counter() - start, reproducible)
        return Job(ARRAY, path, None, array=a, data=data, lookup_s=lookup_s)
    if material is None and crop_window:
        return Job(JPEG_WINDOW, path, None, data=data, size=size, lookup_s=lookup_s)
    return Job(DECODE, path, None, data=data, size=size, material=material, lookup_s=lookup_s)


def _read_indexed(job: Job, data: bytes | None = None) -> None:
    """The bytes of a JPEG the header index answered for (on the render's thread; ``data``: already read): still
    the whole, plain JPEG of the size the draw used, or :class:`compose_plan.RenderFailed` (the sample then loads
    one by one, from stock's state before it)."""
    if data is None:
        data = decode.read_bytes(job.path)
    if decode.jpeg_size(data) != tuple(job.size) or decode.looks_truncated(data):
        raise compose_plan.RenderFailed("the file changed after its size was read")
    job.data = data


def _native_batch(jobs: list[Job]) -> oprunner.NativeBatch | None:
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


def _erasing(jobs: list[Job]) -> bool:
    """Some sample goes out with RandomErasing's draws for the device (``tensor_tail.ErasedImage``)."""
    return any(job.recording is not None and job.recording.erasures is not None for job in jobs)


def _run_batch(batch: oprunner.NativeBatch, calls: int, n: int) -> float:
    """``batch``'s native calls on ``calls`` threads; the render's seconds per sample (wall time shared out)."""
    start = time.perf_counter()
    # never the user's error: a sample a failed call did not render takes the Python path (_batch_outcomes)
    with contextlib.suppress(Exception):
        if not batch.run_on(calls):  # (native helpers: no helper takes the GIL; else the loader's threads)
            render_pool.run_on_threads(batch.run, calls)
    return (time.perf_counter() - start) * calls / n


def _count_taken(stats: Any, jobs: list[Job]) -> None:
    """The run report's counts for a batch taken at once, as :func:`_batch_outcomes` counts its samples."""
    decoded: dict[tuple[str, bool, str], int] = {}
    for job in jobs:
        if job.kind != ARRAY:
            key = ("vision_datasets", True, oprunner.DECODED[job.kind == JPEG_WINDOW])
            decoded[key] = decoded.get(key, 0) + 1
    if decoded:
        stats.count_many(decoded)


def _batch_outcomes(batch: oprunner.NativeBatch, jobs: list[Job], each: float) -> list[tuple[bool, Any]]:
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
            outcomes.append((True, _render_job(job, got, native_file=False)))
        except Exception as exc:  # noqa: BLE001 - the caller's to judge, in order (as map_outcomes gives it)
            outcomes.append((False, exc))
    return outcomes


def _render_job(job: Job, read: bytes | None = None, native_file: bool = True) -> Rendered:
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
        _read_indexed(job, got)
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



def why_not_drawn_apart(dataset: Any) -> str | None:
    """Why the batches of ``dataset`` (an ``ImageFolder``'s kin) cannot be drawn from a private generator, with no
    code of the user's run and nothing but the draw program's draws (None: they can, :func:`load_drawn`)."""
    from torchvision.datasets import folder

    if dataset.target_transform is not None:
        return "a target_transform (code of the user's, run in the worker)"
    if getattr(dataset, "loader", None) not in (folder.default_loader, folder.pil_loader):
        return "the dataset's own loader"
    import torchvision

    if torchvision.get_image_backend() != "PIL":
        return "torchvision's image backend is not PIL"
    transform = dataset.transform
    if transform is None:
        return "no transform (the samples are PIL images)"
    why = why_not_split(transform)
    if why is not None:
        return why
    why = compose_plan.plan_for(transform).not_drawn_natively()
    if why is not None:
        return why
    if not native.available("torch_draws") or not torch_draws.defaults_are_stock():
        return "torch's draws are not made natively here (nano-patch status: torch_draws)"
    from . import sample_loading as loading

    if loading.needs_info(transform):
        return "an image may leave the pipeline"
    import torch

    for uint8 in (None, transform):
        probe = torch_draws.TorchDraws.from_state(native.kernel("torch_draws"), torch.Generator().get_state())
        with compose_call.uint8_here(uint8) if uint8 is not None else contextlib.nullcontext():
            if draw_program.bind(transform, probe, {}) is None:
                return "a step the draw program does not make" + (" before the device's tail" if uint8 else "")
    return None


def load_drawn(dataset: Any, owner: Any, entries: list[tuple[Any, Any]], draws: torch_draws.TorchDraws,
               n_threads: int, uint8: Any = None) -> list[tuple[Any, Any]] | None:
    """``[(transform(image), target) ...]`` for ``entries`` of ``dataset`` (whose every draw the draw program makes:
    :func:`why_not_drawn_apart`), drawn from ``draws`` alone (a virtual worker's generator copy; no generator of
    torch's, Python's or NumPy's is read or moved) and rendered on ``n_threads`` threads; or None where some sample
    needs stock's own code (nothing was warned, stored or called; ``draws`` has moved and must be put back).
    ``owner``: the dataset whose tables (header index, cache choice) serve ``dataset``, a snapshot of it.
    ``uint8``: the Compose to stop before its tail (the device finishes the batch)."""
    with compose_call.uint8_here(uint8) if uint8 is not None else contextlib.nullcontext():
        return _load_drawn(dataset, owner, entries, draws, n_threads)


def _load_drawn(dataset: Any, owner: Any, entries: list[tuple[Any, Any]], draws: torch_draws.TorchDraws,
                n_threads: int) -> list[tuple[Any, Any]] | None:
    transform = dataset.transform
    store = cache.store_for(owner)
    index = file_index.for_dataset(owner) if store is not None else None
    headers = file_index.headers_for(owner)
    the_plan = compose_plan.plan_for(transform)
    crop_window = the_plan.crop_first and native.available("crop_decode")
    program = draw_program.bind(transform, draws, {})
    if program is None:
        return None
    jobs: list[Job] = []
    for path, _ in entries:
        try:
            job = _source(path, store, crop_window, index, headers, quiet=True)
        except Exception:  # noqa: BLE001 - stock's code decides what this file gives (a stand-in runs it)
            return None
        run = program.draw(job.array.shape[:2] if job.array is not None else job.size)  # type: ignore[arg-type]
        if run is None:
            return None
        job.native = run
        jobs.append(job)
    if not jobs:
        return None
    for job, run in zip(jobs, oprunner.prepare_batch([j.native for j in jobs])):
        job.native = run
    targets = [entry[1] for entry in entries]
    batch = _native_batch(jobs)
    if batch is not None:
        _run_batch(batch, min(n_threads, len(jobs)), len(jobs))
        if b"\0" in batch.done():
            return None
        slots = tuple([job.native.slot_tensor for job in jobs])  # type: ignore[union-attr]
        collate.hand_over(jobs[0].native.batch, slots)  # type: ignore[union-attr]
        return list(zip(slots, targets))
    outcomes = render_pool.map_outcomes(_render_job, jobs, n_threads, torch_state.capture())
    if not all(ok for ok, _ in outcomes):
        return None
    if store is not None:
        _store_misses(store, jobs, outcomes, 0.0, n_threads)
    return [(r.sample, target) for (_, r), target in zip(outcomes, targets)]


forks.fresh_in_child(globals(), _one_by_one_lock=threading.Lock, _draw_lock=threading.Lock)
