"""A DataLoader's plan: how its batches are made, resolved once per loader and once per iterator, with one why.

The DataLoader patch (``patches/dataloader.py``) only wires ``DataLoader.__init__`` and ``__iter__`` to the two
functions here, as Lightning's connectors resolve a Trainer's flags once into objects:

- :func:`at_init`, after stock's ``__init__``: whether the loader's batches can cross processes as uint8 images
  (:mod:`.uint8_batches`), the tail a Trainer may finish on the device, and the decoded-image cache prepared;
- :func:`iterate`, at stock's ``__iter__``: a :class:`LoaderPlan` (stock's iterator, the loader threads, virtual
  workers or worker processes; uint8 or float batches; the tail deferred to the device or not; the thread count)
  and the iterator that carries it out. ``--report`` reads the plan's ``why``.

The patch changes no argument whose effect a loop can observe: ``num_workers``, ``persistent_workers``,
``pin_memory`` and ``worker_init_fn`` stay as the user passed them, so Lightning's checks and injections
(``seed_everything(workers=True)`` adds its seeding only to a loader whose ``worker_init_fn`` is None) act as on
stock. Where worker processes run, a step before the user's ``worker_init_fn`` (:class:`.workers.WorkerInit`) is
wrapped around it only while stock's ``__iter__`` starts them, so ``loader.worker_init_fn`` always reads as the
user left it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

from .. import report
from ..config import Options
from ..registry import NanoPatchWarning
from . import fetch
from .tail import uint8_batches
from .threads import exit_gate, loader_threads

#: Serialises the brief swap of ``worker_init_fn`` while workers start (a loader iterated from two threads).
_start_lock = threading.Lock()

#: ``(loader, tail, workers) -> (deferred, why)``: whether this iteration leaves the tensor tail to the device; the
#: Trainer's side decides it (``train/tail_deferral.py``), and the patch hands its function down.
DeferTail = Callable[[Any, Any, bool], tuple[bool, str]]

STOCK, THREADS, VIRTUAL, PROCESSES = "stock", "loader threads", "virtual workers", "worker processes"


@dataclasses.dataclass
class LoaderPlan:
    """How one iterator of a DataLoader makes its batches."""

    path: str  # STOCK, THREADS, VIRTUAL or PROCESSES
    #: the tail the batches leave off (uint8 images, finished after collation here or on the device), or None
    uint8: uint8_batches.TailSpec | None
    deferred: bool  # the tail runs on the device after the transfer
    threads: int  # threads a batch loads on in this process (1: one by one)
    why: str  # why this path, for --report

    def report_line(self, num_workers: int) -> str:
        if self.path == VIRTUAL:
            return f"num_workers={num_workers} as virtual workers in this process"
        return f"num_workers={num_workers} in worker processes: {self.why}"


def at_init(loader: Any, options: Options, stock_collate: Callable[..., Any]) -> None:
    """After stock's ``DataLoader.__init__``: the loader's uint8 tail (kept on the loader, read by :func:`iterate`
    and by a Trainer that may defer it) and its decoded-image cache."""
    spec, why = _uint8_spec(loader, options, stock_collate)
    loader._nano_tail = spec  # the tail a Trainer may defer to the device (train/tail_deferral.py)
    if loader.num_workers == 0:
        spec, why = None, "num_workers=0: nothing crosses processes"
    if options.vision and loader.dataset is not None and fetch.patched_dataset(loader.dataset):
        # only datasets the patch loads: a user's class is never asked for attributes (its __getattr__)
        _prepare_cache(loader.dataset)
    elif options.vision and options.lazy_images and loader.dataset is not None:
        # a dataset of the user's own class: its lazy images go through the cache (nothing of it is read here)
        from ..vision.images import cache

        cache.announce_own(loader.dataset)
    loader._nano_uint8, loader._nano_uint8_why = spec, why


def iterate(stock: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], loader: Any, options: Options,
            defer_tail: DeferTail) -> Any:
    """Stock's ``__iter__`` (``stock(*args, **kwargs)``) carried out by this iteration's plan."""
    stock_iter = functools.partial(stock, *args, **kwargs)
    spec = getattr(loader, "_nano_uint8", None)
    tail = getattr(loader, "_nano_tail", None)
    defer, _ = defer_tail(loader, tail, loader.num_workers > 0)
    here = None
    if loader.num_workers > 0:
        plan, iterator = _with_workers(stock_iter, loader, options, spec if defer else None)
        # the workers' batches are uint8 where they were started so: finished on the device where this iteration
        # defers the tail, else here
        spec = spec if getattr(loader, "_nano_workers_uint8", False) else None
    else:
        iterator = stock_iter()
        if defer:  # num_workers=0: this thread's draws stop before the tail (RandomErasing's ride along)
            spec, here = tail, uint8_batches.uint8_transform(loader.dataset)[0]
        plan = _without_workers(loader)
        if plan.path == THREADS:
            from .threads import batches_ahead

            why = batches_ahead.install(iterator, loader, plan.threads, here)
            report.count("dataloader", why is None, "num_workers=0: the next batch made ahead while the step runs"
                         if why is None else f"num_workers=0: no batch made ahead: {why}")
    plan.uint8, plan.deferred = spec, defer
    loader._nano_plan = plan  # (read by tests and tools; the report has its lines already)
    loader_iterator = iterator
    if spec is not None:
        iterator = uint8_batches.Uint8Batches(iterator, spec, defer=defer, here=here)
    if report.stats is not None:
        if loader.num_workers > 0:  # without workers nothing crosses processes: no path to count
            why = getattr(loader, "_nano_uint8_why", "")
            if spec is None and getattr(loader, "_nano_uint8", None) is not None:
                why = "no device finishes the tail: the workers finish it (float batches)"
            report.stats.count("dataloader", spec is not None, why)
        iterator = report.TimedBatches(iterator, loader.num_workers, loader_iterator)
    return iterator


def _without_workers(loader: Any) -> LoaderPlan:
    threads = loader_threads.threads()
    if threads > 1 and fetch.patched_dataset(loader.dataset):
        return LoaderPlan(THREADS, None, False, threads, f"num_workers=0: batches load on {threads} threads")
    why = "num_workers=0: the dataset loads through its own __getitem__" if threads > 1 else "num_workers=0"
    return LoaderPlan(STOCK, None, False, threads, why)


def _with_workers(stock_iter: Callable[[], Any], loader: Any, options: Options,
                  uint8: uint8_batches.TailSpec | None) -> tuple[LoaderPlan, Any]:
    """The iterator of a loader with workers: virtual workers where no user code runs in a worker, else stock's
    worker processes (the same for a persistent loader's later epochs). ``uint8``: the tail the device finishes,
    where this iteration defers it (the workers then hand back uint8 images)."""
    from .workers import virtual_eligibility, virtual_workers

    current = loader._iterator if loader.persistent_workers else None
    if current is not None:  # stock's __iter__ resets the persistent workers: processes or streams
        virtual = isinstance(current, virtual_workers.iterator_class())
        if virtual:  # (streams switch as they go)
            current.uint8 = loader._nano_workers_uint8 = uint8 is not None
        return LoaderPlan(VIRTUAL if virtual else PROCESSES, None, False, 1, "persistent workers"), stock_iter()
    n = loader.num_workers
    why = (virtual_eligibility.why_not(loader, options.loader_threads) if options.virtual_workers
           else "virtual_workers is off")
    if why is None and exit_gate.exiting():
        why = "the interpreter is exiting (no loader thread starts)"
    loader._nano_workers_uint8 = uint8 is not None
    if why is None:
        iterator = virtual_workers.start(loader, options.loader_threads, uint8 is not None)
        why = "the dataset does not pickle for a fresh worker" if iterator is None else None
    plan = LoaderPlan(VIRTUAL if why is None else PROCESSES, None, False, 1, why or "no user code runs in a worker")
    report.count("dataloader", why is None, plan.report_line(n))
    if why is None:
        if loader.persistent_workers:
            loader._iterator = iterator
        return plan, iterator
    return plan, _start_processes(stock_iter, loader, uint8)


def _start_processes(stock_iter: Callable[[], Any], loader: Any, uint8: uint8_batches.TailSpec | None) -> Any:
    from ..vision.kernels import native
    from .datasets import lazy_samples
    from .workers import processes as workers
    from .workers import virtual_eligibility

    if fetch.patched_dataset(loader.dataset):
        native.check_all()  # (once here: every worker inherits the verdicts instead of checking again)
    else:
        lazy_samples.check_kernels()  # (the same, for the kernels a user's own dataset's lazy images may use)
        if virtual_eligibility.start_method(loader) == "fork":  # (a fresh worker gets pixels by pickle)
            lazy_samples.hold_pixels_before_fork(loader_threads.threads())
    # Workers read ``worker_init_fn`` as the iterator starts them: the step goes around the user's function for
    # exactly that moment, and the attribute reads as the user left it afterwards.
    with _start_lock:
        user_fn = loader.worker_init_fn
        loader.worker_init_fn = workers.WorkerInit(user_fn, uint8=uint8 is not None)
        try:
            return stock_iter()
        finally:
            loader.worker_init_fn = user_fn


def _uint8_spec(loader: Any, options: Options,
                stock_collate: Callable[..., Any]) -> tuple[uint8_batches.TailSpec | None, str]:
    if not options.uint8_batches:
        return None, "uint8_batches is off: float batches"
    if loader.batch_sampler is None:
        # No automatic batching: samples reach the loop one by one, as stock made them.
        return None, "batch_size=None: float samples"
    if loader.collate_fn is not stock_collate:
        return None, "the loader's own collate_fn: float batches"
    found = uint8_batches.uint8_transform(loader.dataset)
    if found is None:
        return None, f"{uint8_batches.why_not_uint8(loader.dataset)}: float batches"
    return dataclasses.replace(found[1], channels_last=options.channels_last), "uint8 batches"


def _prepare_cache(dataset: Any) -> None:
    from ..vision.images import cache

    try:
        cache.prepare(dataset)
    except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail the loader
        warnings.warn(f"nano-patch: decoded-image cache not prepared: {type(exc).__name__}: {exc}",
                      NanoPatchWarning, stacklevel=5)
