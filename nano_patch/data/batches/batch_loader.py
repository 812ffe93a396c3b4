"""Batch-parallel loading, exact: a batch's random draws in the calling thread, its pixels on the loader's threads.

The DataLoader patch's fetch (``data/fetch.py``) hands a batch's indices to the patched dataset's batch loader
where stock's fetcher would call that dataset's ``__getitem__`` per index; the loader comes here. For each run of
samples of a batch:

- **draw** (the calling thread, in stock's order): per sample, the image's size (the JPEG header, with PIL's guards,
  or the decoded-image cache's entry), then the plan's run on a :class:`compose_plan.Recording`: every draw of every
  step exactly as stock's one-by-one loop makes it (torch's, Python's and NumPy's generators), and the pixel
  operations written down. No user code runs here; the generators' state before each sample is kept (or found again
  by drawing the run once more from its start, where no ``target_transform`` needs it).
- **render** (``data/batches/batch_render.py``, on the loader's threads, in the calling thread's torch modes:
  ``data/threads/thread_modes.py``): per sample, the decode (whole, or only a crop's window) or the cache's view, and
  the
  written-down operations, in order (``compose_plan.render``). Draws nothing; the decoders and kernels release the
  GIL.
- **take** (the calling thread, sample by sample): the dataset's ``target_transform``, called with the generators
  where stock has them after that sample's draws; then cache misses go into the decoded-image cache.

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
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import config, forks, report
from ...vision.images import decode
from ...vision.kernels import native, torch_draws
from ...vision.plans import compose_call, compose_plan, draw_program, oprunner
from ...vision.plans.tensor_tail import ErasedImage
from .. import collate
from ..threads import render_pool, thread_modes
from . import batch_render, generator_states
from .sample_source import GuardRaised, SampleJob, Tables, one_reusing, source_of


def why_not_split(transform: Any, plan: compose_plan.Plan | None = None) -> str | None:
    """Why samples of ``transform`` cannot be drawn apart from their pixels (None: they can). ``plan``: its plan,
    where the caller has it."""
    if transform is None:
        return None
    from torchvision.transforms import Compose

    if not compose_call.behaves_as(transform, Compose):
        return f"the transform is a {type(transform).__name__}, not a torchvision Compose"
    if config.current().scaled_decode:
        return "scaled_decode fuses the first Resize into the decode"
    return (plan or compose_plan.plan_for(transform)).unsplittable


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
    job: SampleJob | None = None


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
    if why_one_by_one(dataset) is not None:
        return None
    plan = compose_call.plan_of(transform)  # (once per batch)
    if why_not_split(transform, plan) is not None:
        return None
    out: list[Any] = []
    k = 0
    while k < len(entries):
        if (plan is not None and plan.unsplittable is not None) or why_one_by_one(dataset) is not None:
            out.extend(one(j) for j in range(k, len(entries)))  # marked part-way: the rest as stock, in order
            break
        k = _load_run(dataset, entries, k, transform, target_transform, plan, n_threads, one, out)
    return out


@dataclass
class _Run(Tables):
    """What the stages of one run of samples share: the dataset's tables and plan, fixed for the run."""

    dataset: Any
    transform: Any
    target_transform: Any
    #: the run's draws may move Python's or NumPy's generator too (timm's steps, a target_transform)
    beyond: bool

    @classmethod
    def of_run(cls, dataset: Any, transform: Any, target_transform: Any, plan: compose_plan.Plan | None) -> _Run:
        tables = Tables.of(dataset, transform, plan)
        return cls(**vars(tables), dataset=dataset, transform=transform, target_transform=target_transform,
                   beyond=_draws_beyond_torch(plan) or target_transform is not None)


@dataclass
class _Drawn:
    """A run's draw: its samples' jobs in order, where it stopped, and the generators' states it can go back to."""

    k0: int
    jobs: list[SampleJob]
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
            generator_states.put_back(self.before[j])
            return
        generator_states.put_back(self.run_start)  # type: ignore[arg-type]
        for done_job in self.jobs[:j]:
            _draw_again(done_job, transform)


#: One run's draw stage at a time in this process: a stage with native draws copies torch's generator, draws from
#: the copy and writes it back; two at once (two threads iterating loaders) would each write back over the other's.
_draw_lock = threading.Lock()
#: Draw stages whose copy found torch's generator moved by another thread meanwhile, before torch draws itself.
_COPY_ATTEMPTS = 2


def _load_run(dataset: Any, entries: list[tuple[Any, Any]], k0: int, transform: Any, target_transform: Any,
              plan: compose_plan.Plan | None, n_threads: int, one: Callable[[int], Any], out: list[Any]) -> int:
    """Load samples from ``k0`` into ``out``: draw as many as can be drawn ahead, render them, then take them in
    order; return the index to go on from."""
    stats = report.stats
    run = _Run.of_run(dataset, transform, target_transform, plan)
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
            batch_render.count_taken(stats, jobs)
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
        out.append(one_reusing(one, stop.k, stop.job) if stop.job is not None else one(stop.k))
    resume = stop.k + 1 if stop is not None else k0 + len(jobs)
    if run.store is not None:  # (the batch taken at once has no miss)
        batch_render.store_misses(run.store, jobs[:committed], outcomes[:committed] if outcomes else None, each,
                                  n_threads)
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
    jobs: list[SampleJob] = []
    # The generators before each sample's draws: kept per sample only where a target_transform needs them (a kept
    # state is a new tensor, costly per sample); else the run's start, from which the draws are made again (they run no
    # user code and give no warning) in the rare case that a sample needs stock's code.
    before: list[tuple[Any, Any, Any]] | None = [] if run.target_transform is not None else None
    drawn = _Drawn(k0, jobs, None, before, generator_states.take(run.beyond) if before is None else None)
    # torch's draws made natively from a copy of its generator, written back once the run's draws are made; only
    # where no user code runs between two samples' draws (no target_transform) and every step's draws are known
    draws = _native_draws() if copy and before is None and run.plan is not None and run.plan.draws_natively \
        else None
    # the samples' recordings share their tensor tail's op: no user code runs between their draws (a
    # target_transform runs after them all), so a Normalize's constants are the same for all of them
    shared: dict[Any, Any] = {id(transform): (transform, run.plan)} if run.plan is not None else {}
    # where every step of the plan is one the draw program knows: each sample's native run straight from its draws
    program = draw_program.bind(transform, draws, shared) if draws is not None else None
    try:
        for k in range(k0, len(entries)):
            path = entries[k][0]
            states = generator_states.take(run.beyond) if before is not None else None
            try:
                job = source_of(path, run.store, run.crop_window, run.index, run.headers)
                if run.with_info:
                    job.info = decode.image_info(path, job.data)
            except GuardRaised as raised:
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
                    generator_states.put_back(states)
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
    drawn.after = generator_states.take(run.beyond) if before is not None and jobs else None
    return drawn


def _render(run: _Run, drawn: _Drawn, n_threads: int) -> tuple[list[tuple[bool, Any]] | None, float]:
    """The render stage: each sample's pixels, on ``n_threads`` threads. Its outcomes, in order, and the seconds a
    sample took; no outcomes (None) where the batch was rendered whole, every sample into its slot, with nothing
    to call between them (no target_transform, no erasers' draws): it is then taken at once."""
    jobs = drawn.jobs
    parallel = n_threads > 1 and len(jobs) > 1
    batch = batch_render.native_batch(jobs)
    if batch is None:
        return render_pool.map_outcomes(batch_render.render_job, jobs, n_threads,
                                        thread_modes.capture() if parallel else None), 0.0
    # the native calls run no torch op (no thread enters the caller's torch state); where that state cannot be
    # held by another thread, the calling thread takes them all, as map_outcomes would
    calls = min(n_threads, len(jobs)) if parallel and not thread_modes.caller_only() else 1
    each = batch_render.run_batch(batch, calls, len(jobs))
    if drawn.before is None and b"\0" not in batch.done() and not batch_render.erasing(jobs):
        return None, each
    return batch_render.batch_outcomes(batch, jobs, each), each


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
            out.append(one_reusing(one, k, job))
            continue
        if not ok:
            # stock's own code for this sample, from stock's state before it; those drawn after it follow it
            drawn.rewind(j, run.transform)
            failures = (compose_plan.DecodeFailed, compose_plan.RenderFailed, compose_plan.NotSplittable)
            if not isinstance(rendered, failures):
                report.count("dataloader", False, "sample loaded one by one: it failed to load or render")
            stale = True
            out.append(one_reusing(one, k, job))
            continue
        target = entries[k][1]
        if target_transform is not None:
            # the user's callable sees the generators where stock has them after this sample's draws
            expected = before[j + 1] if before is not None and j + 1 < len(jobs) else after
            generator_states.put_back(expected)  # type: ignore[arg-type]
            target = target_transform(target)
            if not generator_states.same(generator_states.take(), expected):  # type: ignore[arg-type]
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


def _native_draws() -> torch_draws.TorchDraws | None:
    """torch's draws made natively from here (``torch_draws``), where that kernel passed its check; else None."""
    if not native.available("torch_draws"):
        return None
    return torch_draws.start(native.kernel("torch_draws"))


def _draw_sample(job: SampleJob, transform: Any, draws: torch_draws.TorchDraws | None = None,
                 shared: dict[Any, Any] | None = None) -> None:
    """The sample's draws: ``transform``'s plan on a Recording of the source's size (torch's draws made by
    ``draws`` where given, else by torch; ``shared``: what the recordings of this run share)."""
    if transform is not None:
        hw = job.array.shape[:2] if job.array is not None else job.size
        job.recording = compose_call.run_compose(transform, compose_plan.Recording(hw, draws=draws, shared=shared))


def _draw_again(job: SampleJob, transform: Any) -> None:
    """``job``'s draws once more, from where the generators are (its recording kept as it was)."""
    if transform is not None:
        hw = job.array.shape[:2] if job.array is not None else job.size
        compose_call.run_compose(transform, compose_plan.Recording(hw))


forks.fresh_in_child(globals(), _one_by_one_lock=threading.Lock, _draw_lock=threading.Lock)
