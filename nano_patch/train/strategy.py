"""The multi-instance CPU strategy: Lightning's own ``DDPStrategy`` (gloo) with pinned cores.

``pytorch_lightning`` and ``lightning.pytorch`` are separate copies of the same code, so the
subclass is built once per namespace from that namespace's ``DDPStrategy``.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import FABRIC, LIGHTNING, find_class, name_class, ranks, shutdown, topology

log = logging.getLogger("nano_patch")

#: nano-patch's strategy names in Lightning's registry -> the start method each registers
STRATEGY_NAMES = {"nano_ddp": "popen", "nano_ddp_spawn": "spawn", "nano_ddp_fork": "fork"}
#: Strategies a run-level num_processes replaces: what a script names for plain data parallelism.
REPLACEABLE_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")

_classes: dict[str, type] = {}


def pin_rank(local_rank: int, num_processes: int, cpu_for_each_process: list[list[int]] | None,
             global_rank: int) -> list[int]:
    """Pin this rank's threads to its cores and size torch's and OpenMP's thread pools to match."""
    import torch

    if cpu_for_each_process is None and topology.bound_by_launcher():
        # Every rank sees only its own CPUs: splitting them again would leave cores idle.
        cores = [c.cpu for c in topology.physical_cores()]
    else:
        groups = cpu_for_each_process or topology.split_cores(num_processes)
        if len(groups) != num_processes:
            raise ValueError(
                f"cpu_for_each_process has {len(groups)} core groups but there are {num_processes} processes "
                "per node"
            )
        cores = list(groups[local_rank])
    topology.pin_process(cores)
    # Lightning's launcher divided the cores by the process count; set what this rank really has.
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    torch.set_num_threads(len(cores))
    log.info("nano-patch: rank %d pinned to cores %s", global_rank, cores)
    return cores


class PinnedCores:
    """Mixin for Lightning's and Fabric's ``DDPStrategy``: gloo, bucket views, each rank pinned to its cores.

    Args:
        cpu_for_each_process: an explicit core list per local rank; default: split evenly.
        start_method: "popen" (Lightning re-runs the script), "spawn" or "fork".
        **kwargs: passed to the ``DDPStrategy``; ``gradient_as_bucket_view`` defaults on.
    """

    def __init__(self, cpu_for_each_process: list[list[int]] | None = None, start_method: str = "popen",
                 **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", "gloo")
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(start_method=start_method, **kwargs)  # type: ignore[call-arg]
        self.cpu_for_each_process = [list(c) for c in cpu_for_each_process] if cpu_for_each_process else None
        self.pinned_cores: list[int] | None = None

    def setup_environment(self) -> None:
        if getattr(self, "_start_method", None) in ("spawn", "forkserver"):
            ranks.ensure_patched()  # a spawned rank whose interpreter skipped the .pth hook
        self.pinned_cores = pin_rank(self.local_rank, self.num_processes,  # type: ignore[attr-defined]
                                     self.cpu_for_each_process, self.global_rank)  # type: ignore[attr-defined]
        shutdown.watch(self)
        # Every rank this process started must have come up patched before it waits for them in
        # init_process_group (ranks.py); after it, every rank compares its patch with the others'.
        ranks.await_started_ranks(self)
        super().setup_environment()  # type: ignore[misc]
        vars(self).pop("_nano_start_store", None)
        ranks.check_records(self)

    def on_exception(self, exception: BaseException) -> None:
        shutdown.mark_failed()
        parent = getattr(super(), "on_exception", None)
        if parent is not None:
            parent(exception)


def on_cpu(accelerator: Any) -> bool:
    """Whether a Trainer's ``accelerator`` argument (a name or an ``Accelerator``) leaves it on the CPU, where
    nano-patch's processes run."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    return name in ("auto", "cpu", "cpuaccelerator")


def register_names(pl: ModuleType, registered: list[tuple[dict[str, Any], str]]) -> None:
    """Register :data:`STRATEGY_NAMES` in the Lightning namespace ``pl``'s ``StrategyRegistry``, each name not there
    yet, appending (registry, name) to ``registered`` as each is (so that :func:`unregister_names` undoes even a
    registration that failed half-way)."""
    registry = importlib.import_module(f"{pl.__name__}.strategies").StrategyRegistry
    cls = strategy_class(pl)
    for name, method in STRATEGY_NAMES.items():
        if name not in registry:
            registry.register(name, cls, description=f"nano-patch multi-instance CPU DDP ({method})",
                              start_method=method)
            registered.append((registry, name))


def unregister_names(registered: list[tuple[dict[str, Any], str]]) -> None:
    """Take out what :func:`register_names` registered, newest first, emptying ``registered``."""
    while registered:
        registry, name = registered.pop()
        registry.pop(name, None)


def _per_namespace(module: ModuleType, build: Callable[[ModuleType], type]) -> type:
    if module.__name__ not in _classes:
        _classes[module.__name__] = build(module)
    return _classes[module.__name__]


def strategy_class(pl: ModuleType) -> type:
    """``NanoDDPStrategy`` for the Lightning namespace ``pl`` (``pytorch_lightning`` or ``lightning.pytorch``)."""
    return _per_namespace(pl, _build)


def _build(pl: ModuleType) -> type:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    DDPStrategy = pl.strategies.DDPStrategy

    class NanoDDPStrategy(PinnedCores, DDPStrategy):
        """DDP on CPU processes, each pinned to its own physical cores, with gloo.

        Args:
            cpu_for_each_process: an explicit core list per local rank; default: split evenly.
            start_method: "popen" (Lightning re-runs the script), "spawn" or "fork".
            **kwargs: passed to Lightning's ``DDPStrategy``; ``gradient_as_bucket_view`` defaults on.
        """

        strategy_name = "nano_ddp"

        def _register_ddp_hooks(self) -> None:
            super()._register_ddp_hooks()
            if (
                self.root_device.type == "cpu"
                and self._ddp_comm_hook is None
                and getattr(self.precision_plugin, "precision", None) == "bf16-mixed"
            ):
                # Halve gradient traffic: gradients travel as bf16 under bf16 autocast.
                self.model.register_comm_hook(None, default_hooks.bf16_compress_hook)

    return name_class(NanoDDPStrategy, __name__, "NanoDDPStrategy", pl.__name__)


def fabric_strategy_class(fabric: ModuleType) -> type:
    """The same strategy for Lightning Fabric (``lightning_fabric`` or ``lightning.fabric``)."""
    return _per_namespace(fabric, _build_fabric)


def _build_fabric(fabric: ModuleType) -> type:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    DDPStrategy = fabric.strategies.DDPStrategy

    class NanoFabricDDPStrategy(PinnedCores, DDPStrategy):
        """Fabric's ``DDPStrategy`` on CPU processes pinned to their own physical cores, with gloo."""

        def setup_module(self, module: Any) -> Any:
            ddp = super().setup_module(module)
            if self.root_device.type == "cpu" and getattr(self.precision, "precision", None) == "bf16-mixed":
                ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
            return ddp

    return name_class(NanoFabricDDPStrategy, __name__, "NanoFabricDDPStrategy", fabric.__name__)


def __getattr__(name: str) -> type:
    return find_class(name, {"NanoDDPStrategy": (strategy_class, LIGHTNING),
                             "NanoFabricDDPStrategy": (fabric_strategy_class, FABRIC)})
