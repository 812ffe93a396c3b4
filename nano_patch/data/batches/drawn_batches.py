"""The virtual workers' fast path: a batch drawn from a worker's own generator copy, with no user code and no
global generator read or moved.

Only for an ``ImageFolder``'s kin whose every draw the draw program makes natively (:func:`why_not_drawn_apart`).
The run's tables (the cache, the file and header indexes, the plan) are the thread path's (:class:`Tables`); where
some sample needs stock's own code, nothing was warned, stored or called and the caller's stand-in loads the batch.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

from ... import report
from ...vision.images import file_index
from ...vision.kernels import native, torch_draws
from ...vision.plans import compose_call, compose_plan, draw_program, oprunner
from .. import collate
from ..threads import render_pool, thread_modes
from . import batch_render
from .batch_loader import why_not_split
from .sample_source import OneByOne, SampleJob, Tables, source_of


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


@dataclass(frozen=True)
class GivenBack:
    """Why the fast path gave a batch back to stock's code: the one cause that fired, for the run report."""

    why: str


@dataclass
class Counted:
    """What the run report counts of a batch loaded here, to be counted once it is handed over (the loader threads'
    counts: each step per sample, the decodes, the batch's stages' times)."""

    counts: dict[tuple[str, bool, str], int]
    loader: dict[str, Any]

    def count(self) -> None:
        stats = report.stats
        if stats is not None:
            stats.count_many(self.counts)
            stats.add_loader(self.loader)


def load_drawn(dataset: Any, owner: Any, entries: list[tuple[Any, Any]], draws: torch_draws.TorchDraws,
               n_threads: int, uint8: Any = None, counted: list[Counted] | None = None,
               files: list[Any] | None = None) -> list[tuple[Any, Any]] | GivenBack:
    """``[(transform(image), target) ...]`` for ``entries`` of ``dataset`` (whose every draw the draw program makes:
    :func:`why_not_drawn_apart`), drawn from ``draws`` alone (a virtual worker's generator copy; no generator of
    torch's, Python's or NumPy's is read or moved) and rendered on ``n_threads`` threads; or :class:`GivenBack` where
    some sample needs stock's own code (nothing was warned, stored or called; ``draws`` has moved and must be put
    back). ``owner``: the dataset whose tables (header index, cache choice) serve ``dataset``, a snapshot of it.
    ``uint8``: the Compose to stop before its tail (the device finishes the batch). ``counted``: where given (and
    the run report is on), a batch loaded whole appends what the report counts of it (:class:`Counted`).
    ``files``: where given, each sample's file identity is appended as it stands just before the file is read (None
    where it proves nothing: ``file_index.settled``), for a batch made ahead to prove its files unchanged at
    hand-over."""
    with compose_call.uint8_here(uint8) if uint8 is not None else contextlib.nullcontext():
        return _load_drawn(dataset, owner, entries, draws, n_threads, counted, files)


def _load_drawn(dataset: Any, owner: Any, entries: list[tuple[Any, Any]], draws: torch_draws.TorchDraws,
                n_threads: int, counted: list[Counted] | None = None, files: list[Any] | None = None,
                ) -> list[tuple[Any, Any]] | GivenBack:
    start = time.perf_counter()
    transform = dataset.transform
    tables = Tables.of(owner, transform)  # (the thread path's: no image leaves these pipelines, so no info is read)
    program = draw_program.bind(transform, draws, {id(transform): (transform, tables.plan)})
    if program is None:
        return GivenBack("a step the draw program does not make")
    if not entries:
        return GivenBack("an empty batch")
    jobs: list[SampleJob] = []
    # every file stat'ed at once, before any is read (the header index's check, and what a batch made ahead proves)
    idents = file_index.identities([path for path, _ in entries])
    if files is not None:
        now = time.time_ns()
        files.extend(ident if file_index.settled(ident, now) else None for ident in idents)
    for (path, _), ident in zip(entries, idents):
        try:
            job = source_of(path, tables.store, tables.crop_window, tables.index, tables.headers, quiet=True,
                            identity=ident)
        except OneByOne as exc:  # stock's code decides what this file gives (a stand-in runs it)
            return GivenBack(f"{exc} ({os.path.basename(str(path))})")
        except Exception as exc:  # noqa: BLE001 - (the same: stock's error, if any, from stock's code)
            return GivenBack(f"a file that failed to open here ({os.path.basename(str(path))}: "
                             f"{type(exc).__name__})")
        run = program.draw(job.array.shape[:2] if job.array is not None else job.size)  # type: ignore[arg-type]
        if run is None:
            return GivenBack("a draw the draw program gives back (stock's get_params must make it)")
        job.native = run
        jobs.append(job)
    for job, run in zip(jobs, oprunner.prepare_batch([j.native for j in jobs])):
        job.native = run
    targets = [entry[1] for entry in entries]
    batch = batch_render.native_batch(jobs)
    if batch is not None:
        drawn_at = time.perf_counter()
        each = batch_render.run_batch(batch, min(n_threads, len(jobs)), len(jobs))
        if b"\0" in batch.done():
            return GivenBack("a render that failed (a damaged JPEG)")
        slots = tuple([job.native.slot_tensor for job in jobs])  # type: ignore[union-attr]
        collate.hand_over(jobs[0].native.batch, slots)  # type: ignore[union-attr]
        if counted is not None and report.stats is not None:
            counted.append(_counted(program, jobs, n_threads, start, drawn_at, each))
        return list(zip(slots, targets))
    outcomes = render_pool.map_outcomes(batch_render.render_job, jobs, n_threads, thread_modes.capture())
    if not all(ok for ok, _ in outcomes):
        return GivenBack("a render that failed (a damaged JPEG)")
    if tables.store is not None:
        batch_render.store_misses(tables.store, jobs, outcomes, 0.0, n_threads)
    return [(r.sample, target) for (_, r), target in zip(outcomes, targets)]


def _counted(program: Any, jobs: list[SampleJob], n_threads: int, start: float, drawn_at: float,
             each: float) -> Counted:
    """What the loader threads' path counts of such a batch (``batch_loader``): the steps, the decodes, the times."""
    counts = dict(program.report_counts())
    decoded = batch_render.counted_decodes(jobs)
    for key, n in decoded.items():
        counts[key] = counts.get(key, 0) + n
    counts[("dataloader", True, f"batch loaded on {n_threads} threads (draws in stock's order)")] = 1
    done = time.perf_counter()
    return Counted(counts, {"parallel_batches": 1, "parallel_samples": len(jobs), "parallel_threads": n_threads,
                            "draw_s": drawn_at - start, "render_wall_s": done - drawn_at,
                            "render_s": each * len(jobs)})
