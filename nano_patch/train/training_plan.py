"""BigDL-Nano's training knobs, resolved once for the Trainer, ``@nano`` and ``TorchNano`` alike.

An explicit argument wins over the ``patch_torch()`` option, which wins over ``NANO_PATCH_*``.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import config
from ..config import ConfigError, validate
from ..registry import NanoPatchWarning

log = logging.getLogger("nano_patch")

NANO_ARGS = ("num_processes", "cpu_for_each_process", "precision", "channels_last", "auto_lr")


@dataclass(frozen=True)
class TrainingPlan:
    """What to run: processes per node and their cores, precision, channels-last and lr scaling."""

    num_processes: int | None
    cpu_for_each_process: list[list[int]] | None
    precision: str | None  # "32", "bf16", or None for the framework's default
    channels_last: bool
    auto_lr: bool | dict[str, Any]
    #: ``num_processes="auto"`` not decided yet: it is, at ``Trainer.fit`` (``train/instance_count.py``)
    auto: bool = False

    @property
    def multi_instance(self) -> bool:
        return self.num_processes is not None and (self.num_processes > 1 or self.cpu_for_each_process is not None)

    @property
    def warmup_epochs(self) -> int | None:
        return self.auto_lr.get("warmup_epochs") if isinstance(self.auto_lr, dict) else None


def resolve_plan(given: Mapping[str, Any], what: str = "argument", defer_auto: bool = False) -> TrainingPlan:
    """Validate the nano arguments in ``given`` (a subset of :data:`NANO_ARGS`) over the defaults in force.

    ``defer_auto``: the caller decides ``num_processes="auto"`` later, from a measurement (the Trainer, at ``fit``):
    the plan says one process and ``auto``. Elsewhere ``auto`` is 1 process, as nothing can be measured before the
    ranks start.
    """
    from .. import exit_notices

    opts = config.current()
    exit_notices.note_picked_up(what)
    values = {k: validate(k, v, source=f"{what} {k}") for k, v in given.items() if v is not None}
    n = values.get("num_processes", opts.num_processes)
    cores = values.get("cpu_for_each_process", opts.cpu_for_each_process)
    if cores is not None:
        if n not in (None, "auto") and n != len(cores):
            raise ConfigError(
                f"{what}s num_processes={n} and cpu_for_each_process ({len(cores)} core groups) disagree; "
                "give one, or make them match"
            )
        n = len(cores)
    auto = False
    if n == "auto":
        from . import instance_count, topology  # (only here: the measurement's modules are not loaded otherwise)

        # Under torchrun or srun the ranks already exist: take as many as were launched on this node. In a rank that
        # Lightning started, and in a later Trainer of the process that measured, take the count it chose.
        n = topology.launched_ranks_per_node() or instance_count.decided()
        if n is None:
            n, auto = 1, defer_auto
            if not defer_auto:
                _auto_needs_a_trainer(what)
    return TrainingPlan(
        num_processes=n,
        cpu_for_each_process=[list(c) for c in cores] if cores is not None else None,
        precision=values.get("precision", opts.precision),
        channels_last=values.get("channels_last", opts.channels_last),
        auto_lr=values.get("auto_lr", opts.auto_lr),
        auto=auto,
    )


@functools.cache
def _auto_needs_a_trainer(what: str) -> None:
    from . import warm_start

    warm_start.stop()  # no rank will start for this auto
    log.warning("nano-patch: num_processes='auto' (%s) runs 1 process here: auto is decided from a measurement of "
                "the model at Trainer.fit, and TorchNano and @nano start their ranks before the model is known; "
                "give num_processes=N to run N", what)


def starting_processes(n: int, num_nodes: Any, start_method: str) -> None:
    """``n`` nano-patch CPU processes per node are set up to start by ``start_method`` (Trainer and Fabric alike):
    the warm interpreter only where they start through the rank entry, and the log line on the batch size."""
    if start_method != "popen":
        from . import warm_start

        warm_start.stop()  # only the script re-run starts its ranks through the rank entry
    log.warning("nano-patch: %d CPU processes per node; the effective batch size is %d x the DataLoader batch size",
                n, n * int(num_nodes or 1))


def default_start_method() -> str:
    """``"fork"`` in notebooks and interactive sessions, where the script cannot be re-run; else ``"popen"``."""
    main = sys.modules.get("__main__")
    interactive = main is None or not hasattr(main, "__file__") or hasattr(sys, "ps1")
    return "fork" if interactive else "popen"


@functools.lru_cache(maxsize=1)
def warn_bf16_once() -> None:
    """bf16 asked for on the CPU: one warning where the CPU computes bf16 only by emulation (slower than fp32)."""
    from .. import sysinfo

    if not sysinfo.has_native_bf16():
        warnings.warn(
            "nano-patch: precision='bf16' on a CPU without avx512_bf16 or AMX is usually slower than fp32",
            NanoPatchWarning,
            stacklevel=5,
        )
