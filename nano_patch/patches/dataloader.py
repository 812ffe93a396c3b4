"""Patch ``torch.utils.data.DataLoader.__init__`` and ``__iter__`` in place.

The patch changes no argument whose effect a loop can observe: ``num_workers``, ``persistent_workers``,
``pin_memory`` and ``worker_init_fn`` stay as the user passed them (stock's defaults otherwise), so
Lightning's checks and injections (``seed_everything(workers=True)`` adds its seeding only to a loader
whose ``worker_init_fn`` is None) act as on stock. What it still does, none of which can change a batch
(docs/reference.md lists it):

- where worker processes run, a step before the user's ``worker_init_fn`` (uint8 batches, below), wrapped
  around it only while ``__iter__`` starts the workers, so ``loader.worker_init_fn`` always reads as the user
  left it;
- for image-folder datasets with a stock ``Compose`` ending in ``ToTensor``, workers send uint8 images
  and the main process finishes the batch with stock's own arithmetic (``data/uint8_batches.py``);
- prepares the decoded-image cache where it is on;
- adds what a worker imports to the forkserver's preload list, where the server has not started
  (``data/workers.py``: forkserver workers start without importing torch again);
- ``num_workers=0`` batches of the patched datasets load on a pool of threads (``data/loader_pool.py``),
  through torch's map-style fetch (``data/fetch.py``: stock's, with the patched datasets' batch loaders where
  stock would call their ``__getitem__``), with stock's draws in stock's order.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from types import ModuleType
from typing import Any, ClassVar

from .. import report
from ..config import Options
from ..registry import Patch

#: Serialises the brief swap of ``worker_init_fn`` while workers start (a loader iterated from two threads).
_start_lock = threading.Lock()


class DataLoaderPatch(Patch):
    name: ClassVar[str] = "dataloader"
    group: ClassVar[str] = "dataloader"
    target: ClassVar[str] = "torch.utils.data"
    requires: ClassVar[dict[str, str]] = {"torch": ">=2.11,<2.15"}

    def check_internals(self, module: ModuleType) -> str | None:
        params = inspect.signature(module.DataLoader.__init__).parameters
        missing = [p for p in ("num_workers", "worker_init_fn", "persistent_workers", "pin_memory") if p not in params]
        if missing:
            return f"DataLoader.__init__ lacks {', '.join(missing)}"
        import importlib

        try:
            fetcher = importlib.import_module("torch.utils.data._utils.fetch")._MapDatasetFetcher
        except (ImportError, AttributeError):
            return "torch internals changed: no torch.utils.data._utils.fetch._MapDatasetFetcher"
        if "fetch" not in vars(fetcher) or not isinstance(getattr(module, "Subset", None), type):
            return "torch internals changed: no _MapDatasetFetcher.fetch or Subset"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torch.utils.data._utils import fetch as torch_fetch

        from ..data import collate, fetch, finish_tail, loader_pool, uint8_batches
        from ..vision.kernels import native

        loader_pool.configure(options.loader_threads)
        collate.install(self.record)  # a batch the loader's threads rendered into one tensor is collated as it is
        finish_tail.register_collate(self.record)  # (samples that carry RandomErasing's draws to the device)
        fetcher = torch_fetch._MapDatasetFetcher
        self.record.replace(fetcher, "fetch", fetch.make_fetch(vars(fetcher)["fetch"], module.Subset))

        def init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            result = wrapped(*args, **kwargs)  # stock's own arguments, errors and defaults
            spec, why = _uint8_spec(instance, options)
            instance._nano_tail = spec  # the tail a Trainer may defer to the device (train/tail_deferral.py)
            if instance.num_workers == 0:
                spec, why = None, "num_workers=0: nothing crosses processes"
            if options.vision and instance.dataset is not None and fetch.patched_dataset(instance.dataset):
                # only datasets the patch loads: a user's class is never asked for attributes (its __getattr__)
                _prepare_cache(instance.dataset)
            instance._nano_uint8, instance._nano_uint8_why = spec, why
            return result

        def iter_(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            from ..train import tail_deferral

            spec = getattr(instance, "_nano_uint8", None)
            tail = getattr(instance, "_nano_tail", None)
            defer, _ = tail_deferral.decide(instance, tail, instance.num_workers > 0)
            here = None
            if instance.num_workers > 0:
                iterator = loader_iterator = _worker_iterator(wrapped, instance, args, kwargs,
                                                              spec if defer else None)
                # the workers' batches are uint8 where they were started so: finished on the device where this
                # iteration defers the tail, else here
                spec = spec if getattr(instance, "_nano_workers_uint8", False) else None
            else:
                iterator = loader_iterator = wrapped(*args, **kwargs)
                if defer:  # num_workers=0: this thread's draws stop before the tail (RandomErasing's ride along)
                    spec, here = tail, uint8_batches.uint8_transform(instance.dataset)[0]
            if spec is not None:
                iterator = uint8_batches.Uint8Batches(iterator, spec, defer=defer, here=here)
            if report.stats is not None:
                if instance.num_workers > 0:  # without workers nothing crosses processes: no path to count
                    why = getattr(instance, "_nano_uint8_why", "")
                    if spec is None and getattr(instance, "_nano_uint8", None) is not None:
                        why = "no device finishes the tail: the workers finish it (float batches)"
                    report.stats.count("dataloader", spec is not None, why)
                iterator = report.TimedBatches(iterator, instance.num_workers, loader_iterator)
            return iterator

        def _worker_iterator(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                             uint8: uint8_batches.TailSpec | None) -> Any:
            """The iterator of a loader with workers: virtual workers where no user code runs in a worker, else
            stock's worker processes (the same for a persistent loader's later epochs). ``uint8``: the tail the
            device finishes, where this iteration defers it (the workers then hand back uint8 images)."""
            from ..data import virtual_eligibility, virtual_workers, workers

            current = instance._iterator if instance.persistent_workers else None
            if current is not None:  # stock's __iter__ resets the persistent workers: processes or streams
                if isinstance(current, virtual_workers.iterator_class()):  # (streams switch as they go)
                    current.uint8 = instance._nano_workers_uint8 = uint8 is not None
                return wrapped(*args, **kwargs)
            n = instance.num_workers
            why = (virtual_eligibility.why_not(instance, options.loader_threads) if options.virtual_workers
                   else "virtual_workers is off")
            instance._nano_workers_uint8 = uint8 is not None
            if why is None:
                iterator = virtual_workers.start(instance, options.loader_threads, uint8 is not None)
                why = "the dataset does not pickle for a fresh worker" if iterator is None else None
            report.count("dataloader", why is None, f"num_workers={n} as virtual workers in this process"
                         if why is None else f"num_workers={n} in worker processes: {why}")
            if why is None:
                if instance.persistent_workers:
                    instance._iterator = iterator
                return iterator
            if fetch.patched_dataset(instance.dataset):
                native.check_all()  # (once here: every worker inherits the verdicts instead of checking again)
            # Workers read ``worker_init_fn`` as the iterator starts them: the step goes around the user's function
            # for exactly that moment, and the attribute reads as the user left it afterwards.
            with _start_lock:
                user_fn = instance.worker_init_fn
                instance.worker_init_fn = workers.WorkerInit(user_fn, uint8=uint8 is not None)
                try:
                    return wrapped(*args, **kwargs)
                finally:
                    instance.worker_init_fn = user_fn

        def _uint8_spec(loader: Any, opts: Options) -> tuple[uint8_batches.TailSpec | None, str]:
            if not opts.uint8_batches:
                return None, "uint8_batches is off: float batches"
            if loader.batch_sampler is None:
                # No automatic batching: samples reach the loop one by one, as stock made them.
                return None, "batch_size=None: float samples"
            if loader.collate_fn is not module.default_collate:
                return None, "the loader's own collate_fn: float batches"
            found = uint8_batches.uint8_transform(loader.dataset)
            if found is None:
                return None, f"{uint8_batches.why_not_uint8(loader.dataset)}: float batches"
            return dataclasses.replace(found[1], channels_last=opts.channels_last), "uint8 batches"

        def _prepare_cache(dataset: Any) -> None:
            from ..vision.images import cache

            try:
                cache.prepare(dataset)
            except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail the loader
                import warnings

                from ..registry import NanoPatchWarning

                warnings.warn(f"nano-patch: decoded-image cache not prepared: {type(exc).__name__}: {exc}",
                              NanoPatchWarning, stacklevel=4)

        self.record.wrap(module.DataLoader, "__init__", init)
        self.record.wrap(module.DataLoader, "__iter__", iter_)
        from ..data import workers

        self._preload_before = workers.preload_forkserver()

    def _revert(self) -> None:
        from ..data import loader_pool, workers

        loader_pool.configure("off")  # (the collation entries go back with the record)
        workers.restore_forkserver_preload(getattr(self, "_preload_before", None))
        self._preload_before = None
