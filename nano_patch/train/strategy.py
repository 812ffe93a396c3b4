"""The multi-instance CPU strategy: Lightning's own ``DDPStrategy`` (gloo) with pinned cores.

``pytorch_lightning`` and ``lightning.pytorch`` are separate copies of the same code, so the
subclass is built once per namespace from that namespace's ``DDPStrategy``.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

from . import topology

log = logging.getLogger("nano_patch")

STRATEGY_NAMES = {"nano_ddp": "popen", "nano_ddp_spawn": "spawn", "nano_ddp_fork": "fork"}

_classes: dict[str, type] = {}


def strategy_class(pl: ModuleType) -> type:
    """``NanoDDPStrategy`` for the Lightning namespace ``pl`` (``pytorch_lightning`` or ``lightning.pytorch``)."""
    key = pl.__name__
    if key not in _classes:
        _classes[key] = _build(pl)
    return _classes[key]


def _build(pl: ModuleType) -> type:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    DDPStrategy = pl.strategies.DDPStrategy

    class NanoDDPStrategy(DDPStrategy):
        """DDP on CPU processes, each pinned to its own physical cores, with gloo.

        Args:
            cpu_for_each_process: an explicit core list per local rank; default: split evenly.
            start_method: "popen" (Lightning re-runs the script), "spawn" or "fork".
            **kwargs: passed to Lightning's ``DDPStrategy``; ``gradient_as_bucket_view`` defaults on.
        """

        strategy_name = "nano_ddp"

        def __init__(
            self,
            cpu_for_each_process: list[list[int]] | None = None,
            start_method: str = "popen",
            **kwargs: Any,
        ) -> None:
            kwargs.setdefault("process_group_backend", "gloo")
            kwargs.setdefault("gradient_as_bucket_view", True)
            super().__init__(start_method=start_method, **kwargs)
            self.cpu_for_each_process = [list(c) for c in cpu_for_each_process] if cpu_for_each_process else None
            self.pinned_cores: list[int] | None = None

        def setup_environment(self) -> None:
            self._pin()
            super().setup_environment()

        def _pin(self) -> None:
            n = self.num_processes
            groups = self.cpu_for_each_process or topology.split_cores(n)
            if len(groups) != n:
                raise ValueError(
                    f"cpu_for_each_process has {len(groups)} core groups but there are {n} processes per node"
                )
            cores = groups[self.local_rank]
            topology.pin_process(cores)
            # Lightning's launcher divided the cores by the process count; set what this rank really has.
            os.environ["OMP_NUM_THREADS"] = str(len(cores))
            torch.set_num_threads(len(cores))
            self.pinned_cores = list(cores)
            log.info("nano-patch: rank %d pinned to cores %s", self.global_rank, cores)

        def _register_ddp_hooks(self) -> None:
            super()._register_ddp_hooks()
            if (
                self.root_device.type == "cpu"
                and self._ddp_comm_hook is None
                and getattr(self.precision_plugin, "precision", None) == "bf16-mixed"
            ):
                # Halve gradient traffic: gradients travel as bf16 under bf16 autocast.
                self.model.register_comm_hook(None, default_hooks.bf16_compress_hook)

    NanoDDPStrategy.__module__ = __name__
    NanoDDPStrategy.__qualname__ = "NanoDDPStrategy"
    return NanoDDPStrategy
