"""Patch ``torch.utils.data.DataLoader.__init__`` and ``__iter__``, and torch's map-style fetch, in place.

Wiring only: ``__init__`` and ``__iter__`` go to the loader plan (``data/loader_plan.py``: stock's iterator, the loader
threads, virtual workers or worker processes, uint8 batches, the tail on the device, and why), the fetch to
``data/fetch.py`` (stock's, with the patched datasets' batch loaders where stock would call their ``__getitem__``),
collation to ``data/collate.py`` and ``data/tail/finish_tail.py``. The forkserver's preload list gains what a worker
imports (``data/workers/processes.py``), where the server has not started.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, ClassVar

from ..config import Options
from ..registry import Patch


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

        from ..data import collate, fetch, loader_plan
        from ..data.tail import finish_tail
        from ..data.threads import loader_threads
        from ..data.workers import processes as workers
        from ..train import tail_deferral

        loader_threads.configure(options.loader_threads)
        collate.install(self.record)  # a batch the loader's threads rendered into one tensor is collated as it is
        finish_tail.register_collate(self.record)  # (samples that carry RandomErasing's draws to the device)
        fetcher = torch_fetch._MapDatasetFetcher
        self.record.replace(fetcher, "fetch", fetch.make_fetch(vars(fetcher)["fetch"], module.Subset))

        def init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            result = wrapped(*args, **kwargs)  # stock's own arguments, errors and defaults
            loader_plan.at_init(instance, options, module.default_collate)
            return result

        def iter_(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return loader_plan.iterate(wrapped, args, kwargs, instance, options, tail_deferral.decide)

        self.record.wrap(module.DataLoader, "__init__", init)
        self.record.wrap(module.DataLoader, "__iter__", iter_)
        self._preload_before = workers.preload_forkserver()

    def _revert(self) -> None:
        from ..data.threads import loader_threads
        from ..data.workers import processes as workers

        loader_threads.configure("off")  # (the collation entries go back with the record)
        workers.restore_forkserver_preload(getattr(self, "_preload_before", None))
        self._preload_before = None
