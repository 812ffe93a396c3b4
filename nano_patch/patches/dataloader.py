"""Patch ``torch.utils.data.DataLoader.__init__`` in place.

Only arguments the user did not pass are changed, so an explicit argument always wins, and
Lightning's re-creation of a DataLoader from its captured arguments (to inject a
DistributedSampler) goes through the same rules again.
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
    requires: ClassVar[dict[str, str]] = {"torch": ">=2.4,<2.15"}

    def check_internals(self, module: ModuleType) -> str | None:
        params = inspect.signature(module.DataLoader.__init__).parameters
        missing = [p for p in ("num_workers", "worker_init_fn", "persistent_workers", "pin_memory") if p not in params]
        return f"DataLoader.__init__ lacks {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from ..data import workers

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
            if num_workers > 0:
                user_init = given.get("worker_init_fn")
                if not isinstance(user_init, workers.WorkerInit):
                    extra["worker_init_fn"] = workers.WorkerInit(user_init)
                if "persistent_workers" not in given:
                    extra["persistent_workers"] = True
            if "pin_memory" not in given:
                import torch

                extra["pin_memory"] = torch.cuda.is_available()
            if not extra:
                return wrapped(*args, **kwargs)
            merged = dict(given)
            merged.pop("self", None)
            merged.update(extra)
            return wrapped(**merged)

        self.record.wrap(module.DataLoader, "__init__", init)
