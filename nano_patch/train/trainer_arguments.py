"""A ``Trainer(...)`` call's arguments: BigDL-Nano's, Lightning 1.x's and the run-level defaults, resolved once into
stock Lightning arguments, as Lightning's own connectors resolve its flags into objects.

``num_processes``/``cpu_for_each_process`` become the registered nano-patch strategy on the CPU
(``train/strategy.py``), ``precision="bf16"`` becomes ``"bf16-mixed"``, ``channels_last``/``auto_lr`` become callbacks
(``train/callbacks.py``), and ``--report`` adds its profiler and callback (``train/profiling.py``). Each nano argument
defaults to its ``NANO_PATCH_*`` environment variable (or ``patch_torch()`` option); an explicit argument wins. Stock
arguments keep their stock meaning.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from . import callbacks, legacy, training_plan
from . import strategy as strategy_mod
from .training_plan import TrainingPlan, resolve_plan, warn_bf16_once

if TYPE_CHECKING:
    from .auto_trainer import AutoRequest

log = logging.getLogger("nano_patch")

#: The nano arguments ``Trainer(...)`` takes besides stock's (``precision`` is stock's own).
NANO_ARGS = ("num_processes", "cpu_for_each_process", "channels_last", "auto_lr")


@dataclasses.dataclass
class TrainerArguments:
    """One ``Trainer(...)`` call, resolved."""

    stock: dict[str, Any]  # the arguments stock ``Trainer.__init__`` gets
    plan: TrainingPlan
    #: ``num_processes="auto"``: the Trainer is built as one process, and this decides the count at ``fit``
    auto: AutoRequest | None = None


def resolve(pl: ModuleType, kwargs: dict[str, Any]) -> TrainerArguments:
    """Take the nano and legacy arguments out of ``kwargs`` (a ``Trainer(...)`` call's, in the Lightning namespace
    ``pl``) and turn them and the run-level defaults into stock Trainer arguments.

    Legacy: BigDL-Nano's and Lightning 1.x's arguments (``train/legacy.py``). A run-level setting (``patch_torch()``
    option, ``nano-patch run`` flag, ``NANO_PATCH_*``) wins over the stock arguments a script passes (``devices=1``,
    ``precision=32``), with a log line; two arguments of this very call that contradict each other are an error.
    """
    import torch

    nano = {k: kwargs.pop(k) for k in NANO_ARGS if k in kwargs}
    legacy_args = legacy.pop_legacy(kwargs)
    plan = resolve_plan(nano, what="Trainer argument", defer_auto=True)
    start_method = legacy.translate(kwargs, legacy_args, plan.multi_instance or plan.auto, torch.cuda.is_available())
    _resolve_precision(kwargs, plan)
    if str(kwargs.get("precision", "")).startswith("bf16") and kwargs.get("accelerator", "cpu") == "cpu":
        warn_bf16_once()  # (its stacklevel counts the frames from this call to the script's: keep it here)
    # LightningCLI passes every signature argument, the unset ones as None.
    run_level = nano.get("num_processes") is None and nano.get("cpu_for_each_process") is None
    auto = None
    if plan.multi_instance:
        multi_instance_arguments(pl, kwargs, plan.num_processes, plan.cpu_for_each_process, run_level, start_method)
    elif plan.auto:
        auto = _auto_request(pl, kwargs, run_level, start_method)
    _add_callbacks(pl, kwargs, plan)
    return TrainerArguments(kwargs, plan, auto)


def _resolve_precision(kwargs: dict[str, Any], plan: TrainingPlan) -> None:
    """``precision="bf16"`` as Lightning 2.x spells it; a run-level precision over the script's, with a log line."""
    precision = kwargs.get("precision")
    if isinstance(precision, str) and precision.strip().lower() == "bf16":
        kwargs["precision"] = precision = "bf16-mixed"
    if plan.precision is not None:
        wanted = "bf16-mixed" if plan.precision == "bf16" else "32-true"
        if precision is not None and str(precision) not in (wanted, plan.precision):
            log.warning("nano-patch: precision=%r for this run wins over the script's precision=%r", wanted, precision)
        if precision is None or str(precision) != wanted:
            kwargs["precision"] = wanted


def _auto_request(pl: ModuleType, kwargs: dict[str, Any], run_level: bool, start_method: str | None) -> AutoRequest:
    """What deciding ``num_processes="auto"`` at ``fit`` needs (``train/auto_trainer.py``)."""
    from . import auto_trainer

    multi = functools.partial(multi_instance_arguments, pl, run_level=run_level, start_method=start_method)
    skip = auto_trainer.skip_reason(kwargs, run_level, start_method, strategy_mod.strategy_class(pl))
    return auto_trainer.AutoRequest(pl.__name__, multi, skip)


def _add_callbacks(pl: ModuleType, kwargs: dict[str, Any], plan: TrainingPlan) -> None:
    """The plan's callbacks (channels-last, lr scaling) and ``--report``'s profiler and callback, after the script's."""
    from .. import report

    extra_callbacks = []
    if plan.channels_last:
        extra_callbacks.append(callbacks.channels_last_callback(pl)())
    if plan.auto_lr:
        extra_callbacks.append(callbacks.auto_lr_callback(pl)(plan.warmup_epochs))
    if report.stats is not None:
        from . import profiling

        if kwargs.get("profiler") is None:
            kwargs["profiler"] = profiling.quiet_profiler(pl)()
        extra_callbacks.append(profiling.report_callback(pl)())
        report.stats.count(f"trainer[{pl.__name__}]", True, describe(kwargs, plan))
    if extra_callbacks:
        given = kwargs.get("callbacks")
        given = [] if given is None else [given] if not isinstance(given, list) else list(given)
        kwargs["callbacks"] = given + extra_callbacks


def describe(kwargs: dict[str, Any], plan: TrainingPlan) -> str:
    """The Trainer as resolved, for the run report's row."""
    parts = [f"precision={kwargs.get('precision', '32-true')}"]
    if plan.multi_instance:
        parts.append(f"{plan.num_processes} pinned CPU processes")
    elif plan.auto:
        parts.append("num_processes='auto', decided at fit")
    if plan.channels_last:
        parts.append("channels-last")
    if plan.auto_lr:
        parts.append("auto_lr")
    return f"Trainer({', '.join(parts)})"


def multi_instance_arguments(pl: ModuleType, kwargs: dict[str, Any], n: int, cores: Any, run_level: bool = False,
                             start_method: str | None = None) -> dict[str, Any]:
    """``kwargs`` (changed in place) for ``n`` nano-patch CPU processes per node, pinned to ``cores`` (one core list
    per process) or to an even split. ``run_level``: ``n`` comes from the run, not from this call's arguments, and
    wins over the script's ``devices`` and plain data-parallel ``strategy``; ``start_method``: a legacy argument's."""
    cls = strategy_mod.strategy_class(pl)
    source = "for this run" if run_level else "Trainer argument"
    _check_devices(kwargs.get("devices", "auto"), n, run_level)
    accelerator = kwargs.get("accelerator", "auto")
    if not strategy_mod.on_cpu(accelerator):
        raise ConfigError(
            f"num_processes={n} ({source}: CPU processes) and Trainer argument accelerator={accelerator!r} conflict; "
            "num_processes runs on the CPU"
        )
    strategy = kwargs.get("strategy", "auto")
    if isinstance(strategy, cls):  # the script's own nano-patch strategy, as it built it
        kwargs["accelerator"], kwargs["devices"] = "cpu", n
        return kwargs
    start_method = _start_method(strategy, n, source, run_level, start_method)
    kwargs["accelerator"], kwargs["devices"] = "cpu", n
    kwargs["strategy"] = cls(cpu_for_each_process=[list(c) for c in cores] if cores else None,
                             start_method=start_method)
    training_plan.starting_processes(n, kwargs.get("num_nodes", 1), start_method)
    return kwargs


def _check_devices(devices: Any, n: int, run_level: bool) -> None:
    if devices not in ("auto", n, str(n)) and devices != [n]:
        if not run_level:
            raise ConfigError(f"Trainer arguments num_processes={n} and devices={devices!r} conflict; give one of them")
        log.warning("nano-patch: num_processes=%d for this run wins over the script's devices=%r", n, devices)


def _start_method(strategy: Any, n: int, source: str, run_level: bool, start_method: str | None) -> str:
    """How the processes start: as the ``strategy`` name asks (``nano_ddp_spawn``...), else as ``start_method``
    (a legacy argument's) or the default; a ``strategy`` that is not plain data parallelism is an error."""
    if isinstance(strategy, str) and strategy in strategy_mod.STRATEGY_NAMES:
        return strategy_mod.STRATEGY_NAMES[strategy]
    if run_level and isinstance(strategy, str) and strategy in strategy_mod.REPLACEABLE_STRATEGIES:
        if strategy != "auto":
            log.warning("nano-patch: num_processes=%d for this run wins over the script's strategy=%r", n, strategy)
    elif strategy != "auto":
        raise ConfigError(
            f"num_processes={n} ({source}) and Trainer argument strategy={strategy!r} conflict; num_processes uses "
            f"nano-patch's strategy ({', '.join(strategy_mod.STRATEGY_NAMES)})"
        )
    return start_method or training_plan.default_start_method()
