"""Patch the Lightning ``Trainer`` in place, for ``pytorch_lightning`` and ``lightning.pytorch`` alike.

``Trainer.__init__`` gains BigDL-Nano's arguments and translates them into stock Lightning objects:
``num_processes``/``cpu_for_each_process`` -> the registered ``nano_ddp`` strategy on the CPU,
``precision="bf16"`` -> ``"bf16-mixed"``, ``channels_last``/``auto_lr`` -> callbacks. Each argument
defaults to its ``NANO_PATCH_*`` environment variable (or ``patch_torch()`` option); an explicit
argument wins. Stock arguments keep their stock meaning. ``Trainer.compile`` wraps a plain
``nn.Module`` into a LightningModule.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from types import ModuleType
from typing import Any, ClassVar

from ..config import ConfigError, Options
from ..registry import Patch
from ..train.legacy import pop_legacy
from ..train.training_plan import warn_bf16_once

log = logging.getLogger("nano_patch")

NANO_ARGS = ("num_processes", "cpu_for_each_process", "channels_last", "auto_lr")


class LightningTrainerPatch(Patch):
    group: ClassVar[str] = "trainer"
    requires: ClassVar[dict[str, str]]

    def __init__(self, namespace: str) -> None:
        dist = "pytorch-lightning" if namespace == "pytorch_lightning" else "lightning"
        super().__init__(namespace, f"trainer[{namespace}]", {dist: ">=2.4,<2.7"})
        self._registered: list[tuple[dict[str, Any], str]] = []

    def check_internals(self, module: ModuleType) -> str | None:
        trainer = getattr(module, "Trainer", None)
        strategies = getattr(module, "strategies", None)
        if trainer is None or strategies is None or not hasattr(strategies, "DDPStrategy"):
            return f"{self.target} lacks Trainer or strategies.DDPStrategy"
        if not hasattr(strategies.DDPStrategy, "_register_ddp_hooks"):
            return f"{self.target}.strategies.DDPStrategy lacks _register_ddp_hooks"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from ..train import strategy as strategy_mod
        from ..train.compile import compile_for

        pl = module
        Trainer = pl.Trainer
        original = vars(Trainer)["__init__"]
        registry = importlib.import_module(f"{self.target}.strategies").StrategyRegistry
        cls = strategy_mod.strategy_class(pl)
        for name, method in strategy_mod.STRATEGY_NAMES.items():
            if name not in registry:
                registry.register(name, cls, description=f"nano-patch multi-instance CPU DDP ({method})",
                                  start_method=method)
                self._registered.append((registry, name))

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            nano = {k: kwargs.pop(k) for k in NANO_ARGS if k in kwargs}
            legacy = pop_legacy(kwargs)
            pending: list[Any] = []
            kwargs = translate(pl, kwargs, nano, legacy, pending)
            original(self, *args, **kwargs)
            if pending:  # num_processes="auto": decided at fit, from a measurement (train/auto_trainer.py)
                self._nano_auto = pending[0].with_connector(type(self), original, kwargs)

        __init__.__signature__ = _signature(original)  # type: ignore[attr-defined]
        __init__.__doc__ = _docstring(original.__doc__)
        self.record.replace(Trainer, "__init__", __init__)
        self.record.replace(Trainer, "compile", staticmethod(compile_for(pl)))
        self.record.wrap(Trainer, "fit", _noting_fit)
        # a loader Lightning's own loop iterates may hand its tensor tail to the device
        from ..train import tail_deferral
        fetchers = importlib.import_module(f"{self.target}.loops.fetchers")
        if "_run_stage" in vars(Trainer) and hasattr(fetchers, "_DataFetcher"):  # else: the tail stays on the CPU
            self.record.wrap(Trainer, "_run_stage", tail_deferral.running)
            self.record.wrap(fetchers._DataFetcher, "__iter__", tail_deferral.iterating)
            self.record.wrap(fetchers._DataFetcher, "__next__", tail_deferral.iterating)  # loaders started lazily

    def _revert(self) -> None:
        while self._registered:
            registry, name = self._registered.pop()
            registry.pop(name, None)


def _signature(original: Any) -> inspect.Signature:
    """Stock signature plus the nano arguments, so LightningCLI and ``--help`` show them."""
    sig = inspect.signature(original)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    # Real types, not strings: jsonargparse (LightningCLI) validates and converts with them.
    types: dict[str, Any] = {
        "num_processes": int | str | None,
        "cpu_for_each_process": list[list[int]] | None,
        "channels_last": bool | None,
        "auto_lr": bool | dict[str, int] | None,
    }
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
             for name, annotation in types.items()]
    tail = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    return sig.replace(parameters=params + extra + tail)


_ARG_DOCS = """
            num_processes: nano-patch: data-parallel training with this many CPU processes on each node, each
                pinned to its own cores, or ``"auto"``. Default: ``NANO_PATCH_NUM_PROCESSES``.
                The effective batch size is num_processes x num_nodes x the DataLoader batch size.

            cpu_for_each_process: nano-patch: an explicit core list for each process, e.g. ``[[0, 1], [2, 3]]``.
                Default: ``NANO_PATCH_CPU_FOR_EACH_PROCESS``.

            channels_last: nano-patch: run the model and the 4-D tensors of each batch in channels-last memory
                format. Default: ``NANO_PATCH_CHANNELS_LAST``.

            auto_lr: nano-patch: multiply learning rates by the world size, with a linear warmup over
                ``{"warmup_epochs": k}`` epochs (default: a tenth of training). Default: ``NANO_PATCH_AUTO_LR``.
"""


def _docstring(doc: str | None) -> str | None:
    """Stock ``Trainer.__init__`` docs with the nano arguments added to its Args section."""
    if not doc:
        return doc
    at = doc.find("\n        Raises:")
    return doc + _ARG_DOCS if at < 0 else doc[:at] + _ARG_DOCS.rstrip("\n") + "\n" + doc[at:]


def _noting_fit(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from .. import exit_notices
    from ..train import callbacks, shutdown

    shutdown.destroy_at_clean_exit()  # a process group this fit starts is destroyed at a clean exit

    model = args[0] if args else kwargs.get("model")
    channels_last = any(type(c).__name__.startswith("ChannelsLast") and type(c).__module__ == callbacks.__name__
                        for c in instance.callbacks)
    if "_nano_auto" in vars(instance):  # before Lightning's launcher starts any rank
        from ..train import auto_trainer

        auto_trainer.decide_at_fit(instance, vars(instance).pop("_nano_auto"), model, args, kwargs, channels_last)
    if model is not None:
        exit_notices.note_training("Trainer", model, str(instance.precision),
                                   channels_last and callbacks.has_conv2d(model))
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        shutdown.mark_failed()  # a rank that failed leaves its process group alone (another may never end)
        raise


def translate(pl: ModuleType, kwargs: dict[str, Any], nano: dict[str, Any],
              legacy: dict[str, Any] | None = None, pending: list[Any] | None = None) -> dict[str, Any]:
    """Turn BigDL-Nano's arguments (and the run-level defaults) into stock Trainer arguments.

    ``nano``: the nano arguments given to this ``Trainer(...)`` call; ``legacy``: BigDL-Nano and
    Lightning 1.x arguments (``train/legacy.py``). A run-level setting (``patch_torch()`` option,
    ``nano-patch run`` flag, ``NANO_PATCH_*``) wins over the stock arguments a script passes
    (``devices=1``, ``precision=32``), with a log line; two arguments of this very call that
    contradict each other are an error. ``num_processes="auto"`` builds one process and appends to ``pending``
    what deciding it at ``fit`` needs (``train/auto_trainer.py``).
    """
    import torch

    from .. import report
    from ..train import callbacks
    from ..train import legacy as legacy_mod
    from ..train import strategy as strategy_mod
    from ..train.training_plan import resolve_plan

    plan = resolve_plan(nano, what="Trainer argument", defer_auto=pending is not None)
    start_method = legacy_mod.translate(kwargs, legacy or {}, plan.multi_instance or plan.auto,
                                        torch.cuda.is_available())
    precision = kwargs.get("precision")
    if isinstance(precision, str) and precision.strip().lower() == "bf16":
        kwargs["precision"] = precision = "bf16-mixed"
    if plan.precision is not None:
        wanted = "bf16-mixed" if plan.precision == "bf16" else "32-true"
        if precision is not None and str(precision) not in (wanted, plan.precision):
            log.warning("nano-patch: precision=%r for this run wins over the script's precision=%r", wanted, precision)
        if precision is None or str(precision) != wanted:
            kwargs["precision"] = wanted
    if str(kwargs.get("precision", "")).startswith("bf16") and kwargs.get("accelerator", "cpu") == "cpu":
        warn_bf16_once()

    # LightningCLI passes every signature argument, the unset ones as None.
    run_level = nano.get("num_processes") is None and nano.get("cpu_for_each_process") is None
    if plan.multi_instance:
        kwargs = _multi_instance(pl, kwargs, plan.num_processes, plan.cpu_for_each_process, strategy_mod,
                                 run_level, start_method)
    elif plan.auto and pending is not None:
        from ..train import auto_trainer

        multi = functools.partial(_multi_instance, pl, strategy_mod=strategy_mod, run_level=run_level,
                                  start_method=start_method)
        pending.append(auto_trainer.AutoRequest(pl.__name__, multi, auto_trainer.skip_reason(
            kwargs, run_level, start_method, strategy_mod.strategy_class(pl), _REPLACEABLE_STRATEGIES)))

    extra_callbacks = []
    if plan.channels_last:
        extra_callbacks.append(callbacks.channels_last_callback(pl)())
    if plan.auto_lr:
        extra_callbacks.append(callbacks.auto_lr_callback(pl)(plan.warmup_epochs))
    if report.stats is not None:
        from ..train import profiling

        if kwargs.get("profiler") is None:
            kwargs["profiler"] = profiling.quiet_profiler(pl)()
        extra_callbacks.append(profiling.report_callback(pl)())
        report.stats.count(f"trainer[{pl.__name__}]", True, _describe(kwargs, plan))
    if extra_callbacks:
        given = kwargs.get("callbacks")
        given = [] if given is None else [given] if not isinstance(given, list) else list(given)
        kwargs["callbacks"] = given + extra_callbacks
    return kwargs


def _describe(kwargs: dict[str, Any], plan: Any) -> str:
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


#: Strategies a run-level num_processes replaces: what a script names for plain data parallelism.
_REPLACEABLE_STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")


def _multi_instance(pl: ModuleType, kwargs: dict[str, Any], n: int, cores: Any, strategy_mod: ModuleType,
                    run_level: bool = False, start_method: str | None = None) -> dict:
    from ..train.training_plan import default_start_method

    cls = strategy_mod.strategy_class(pl)
    source = "for this run" if run_level else "Trainer argument"
    devices = kwargs.get("devices", "auto")
    if devices not in ("auto", n, str(n)) and devices != [n]:
        if not run_level:
            raise ConfigError(f"Trainer arguments num_processes={n} and devices={devices!r} conflict; give one of them")
        log.warning("nano-patch: num_processes=%d for this run wins over the script's devices=%r", n, devices)
    accelerator = kwargs.get("accelerator", "auto")
    acc_name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    if acc_name not in ("auto", "cpu", "cpuaccelerator"):
        raise ConfigError(
            f"num_processes={n} ({source}: CPU processes) and Trainer argument accelerator={accelerator!r} conflict; "
            "num_processes runs on the CPU"
        )
    strategy = kwargs.get("strategy", "auto")
    start_method = start_method or default_start_method()
    if isinstance(strategy, str) and strategy in strategy_mod.STRATEGY_NAMES:
        start_method = strategy_mod.STRATEGY_NAMES[strategy]
    elif isinstance(strategy, cls):
        kwargs["accelerator"], kwargs["devices"] = "cpu", n
        return kwargs
    elif run_level and isinstance(strategy, str) and strategy in _REPLACEABLE_STRATEGIES:
        if strategy != "auto":
            log.warning("nano-patch: num_processes=%d for this run wins over the script's strategy=%r", n, strategy)
    elif strategy != "auto":
        raise ConfigError(
            f"num_processes={n} ({source}) and Trainer argument strategy={strategy!r} conflict; num_processes uses "
            f"nano-patch's strategy ({', '.join(strategy_mod.STRATEGY_NAMES)})"
        )
    kwargs["accelerator"], kwargs["devices"] = "cpu", n
    kwargs["strategy"] = cls(cpu_for_each_process=[list(c) for c in cores] if cores else None,
                             start_method=start_method)
    if start_method != "popen":
        from ..train import warm_start

        warm_start.stop()  # only the script re-run starts its ranks through the rank entry
    log.warning(
        "nano-patch: %d CPU processes per node; the effective batch size is %d x the DataLoader batch size",
        n, n * int(kwargs.get("num_nodes", 1) or 1),
    )
    return kwargs
