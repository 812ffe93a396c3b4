"""Patch ``torch.utils.data.DataLoader.__init__`` and ``__iter__`` in place.

Only arguments the user did not pass are changed, so an explicit argument always wins, and
Lightning's re-creation of a DataLoader from its captured arguments (to inject a
DistributedSampler) goes through the same rules again. ``__iter__`` finishes uint8 batches
(``data/batches.py``) for loaders whose workers were told to send them.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType
from typing import Any, ClassVar

from .. import report
from ..config import Options
from ..registry import Patch


class DataLoaderPatch(Patch):
    name: ClassVar[str] = "dataloader"
    group: ClassVar[str] = "dataloader"
    target: ClassVar[str] = "torch.utils.data"
    requires: ClassVar[dict[str, str]] = {"torch": ">=2.4,<2.15"}

    def check_internals(self, module: ModuleType) -> str | None:
        params = inspect.signature(module.DataLoader.__init__).parameters
        missing = [p for p in ("num_workers", "worker_init_fn", "persistent_workers", "pin_memory") if p not in params]
        return f"DataLoader.__init__ lacks {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from ..data import batches, workers

        signature = inspect.signature(module.DataLoader.__init__)

        def init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                bound = signature.bind(instance, *args, **kwargs)
            except TypeError:
                return wrapped(*args, **kwargs)  # let stock raise its own error
            given = bound.arguments
            extra: dict[str, Any] = {}
            dataset = given.get("dataset")
            iterable = isinstance(dataset, module.IterableDataset)
            if "num_workers" not in given and not iterable:
                extra["num_workers"] = workers.auto_num_workers(dataset)
            num_workers = given.get("num_workers", extra.get("num_workers", 0))
            spec, why = None, "num_workers=0: nothing crosses processes"
            if num_workers > 0:
                user_init = given.get("worker_init_fn")
                if isinstance(user_init, workers.WorkerInit):  # Lightning re-creating a patched loader
                    user_init = user_init.user_fn
                spec, why = _uint8_spec(given, options)
                extra["worker_init_fn"] = workers.WorkerInit(user_init, uint8=spec is not None)
                if "persistent_workers" not in given:
                    extra["persistent_workers"] = True
            if "pin_memory" not in given:
                import torch

                extra["pin_memory"] = torch.cuda.is_available()
            if options.vision and dataset is not None:
                _prepare_cache(dataset)
            if extra:
                merged = dict(given)
                merged.pop("self", None)
                merged.update(extra)
                result = wrapped(**merged)
            else:
                result = wrapped(*args, **kwargs)
            instance._nano_uint8, instance._nano_uint8_why = spec, why
            return result

        def iter_(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            iterator = loader_iterator = wrapped(*args, **kwargs)
            spec = getattr(instance, "_nano_uint8", None)
            if spec is not None:
                iterator = batches.Uint8Batches(iterator, spec)
            if report.stats is not None:
                if instance.num_workers > 0:  # without workers nothing crosses processes: no path to count
                    why = getattr(instance, "_nano_uint8_why", "")
                    report.stats.count("dataloader", spec is not None, why)
                iterator = report.TimedBatches(iterator, instance.num_workers, loader_iterator)
            return iterator

        def _uint8_spec(given: dict[str, Any], opts: Options) -> tuple[batches.BatchSpec | None, str]:
            if not opts.uint8_batches:
                return None, "uint8_batches is off: float batches"
            if given.get("collate_fn") not in (None, module.default_collate):
                return None, "the loader's own collate_fn: float batches"
            if given.get("batch_size", 1) is None and given.get("batch_sampler") is None:
                # No automatic batching: samples reach the loop one by one, as stock made them.
                return None, "batch_size=None: float samples"
            found = batches.uint8_transform(given.get("dataset"))
            if found is None:
                return None, ("the dataset is not an image folder with a stock Compose ending in ToTensor "
                              "(and Normalize): float batches")
            return dataclasses.replace(found[1], channels_last=opts.channels_last), "uint8 batches"

        def _prepare_cache(dataset: Any) -> None:
            from ..vision import cache

            try:
                cache.prepare(dataset)
            except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail the loader
                import warnings

                from ..registry import NanoPatchWarning

                warnings.warn(f"nano-patch: decoded-image cache not prepared: {type(exc).__name__}: {exc}",
                              NanoPatchWarning, stacklevel=4)

        self.record.wrap(module.DataLoader, "__init__", init)
        self.record.wrap(module.DataLoader, "__iter__", iter_)
