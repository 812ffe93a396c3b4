"""``TorchNano`` and ``@nano``: multi-instance CPU training, bf16 and channels-last for custom loops.

Both are built on Lightning Fabric (``lightning_fabric``, or ``lightning.fabric`` when only the
``lightning`` package is installed) and on the same pinned-core DDP strategy as the Trainer patch.
Fabric's own launchers start the ranks: the script re-run by default, ``fork`` in interactive
sessions, or ``spawn`` on request.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

import torch
from torch.utils.data import DataLoader

from ..config import ConfigError
from . import callbacks, shutdown
from . import strategy as strategy_mod
from .training_plan import TrainingPlan, default_start_method, resolve_plan, starting_processes, warn_bf16_once

START_METHODS = ("popen", "spawn", "fork")

P = ParamSpec("P")
R = TypeVar("R")


def _fabric_namespace() -> ModuleType:
    try:
        return importlib.import_module("lightning_fabric")
    except ImportError:
        return importlib.import_module("lightning.fabric")


_fabric = _fabric_namespace()


class CPUBf16Precision(_fabric.plugins.precision.MixedPrecision):
    """bf16 autocast on the CPU that lets a loop call ``loss.backward()`` itself.

    bf16 needs no loss scaler, so the stock backward is exactly what Fabric's would do. Restoring the
    base class's backward tells Fabric so, and it stops demanding ``fabric.backward(loss)``.
    """

    backward = _fabric.plugins.precision.Precision.backward

    def __init__(self) -> None:
        super().__init__(precision="bf16-mixed", device="cpu")


def fabric_arguments(plan: TrainingPlan, fabric_kwargs: dict[str, Any], start_method: str | None) -> dict[str, Any]:
    """Fabric's constructor arguments for ``plan``; stock Fabric arguments in ``fabric_kwargs`` keep their meaning."""
    kwargs = dict(fabric_kwargs)
    if start_method is not None and start_method not in START_METHODS:
        raise ConfigError(f"start_method={start_method!r} is not one of {', '.join(START_METHODS)}")
    if "precision" in kwargs:
        raise ConfigError("give precision as the nano argument precision='bf16' or '32', not as a Fabric argument")
    accelerator = kwargs.setdefault("accelerator", "cpu")
    if plan.multi_instance:
        n = plan.num_processes
        if accelerator not in ("cpu", "auto"):
            raise ConfigError(f"num_processes={n} (CPU processes) and accelerator={accelerator!r} conflict")
        if kwargs.get("devices", n) not in (n, str(n), "auto"):
            raise ConfigError(f"num_processes={n} and devices={kwargs['devices']!r} conflict; give one of them")
        if "strategy" in kwargs:
            raise ConfigError(f"num_processes={n} and strategy={kwargs['strategy']!r} conflict; "
                              "num_processes uses nano-patch's pinned-core DDP strategy")
        cls = strategy_mod.fabric_strategy_class(_fabric)
        start_method = start_method or default_start_method()
        kwargs.update(accelerator="cpu", devices=n, strategy=cls(
            cpu_for_each_process=plan.cpu_for_each_process, start_method=start_method))
        starting_processes(n, kwargs.get("num_nodes", 1), start_method)
    else:
        kwargs.setdefault("devices", 1)
    on_cpu = kwargs["accelerator"] == "cpu"
    if plan.precision == "bf16":
        if on_cpu:
            warn_bf16_once()
            plugins = kwargs.get("plugins") or []
            kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), CPUBf16Precision()]
        else:
            kwargs["precision"] = "bf16-mixed"
    elif plan.precision == "32":
        kwargs["precision"] = "32-true"
    return kwargs


def _channels_last_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    callbacks.to_channels_last(args)
    callbacks.to_channels_last(kwargs)


class TorchNano(_fabric.Fabric):
    """A Fabric whose ``train`` runs in every rank, with BigDL-Nano's knobs.

    Override ``train(self, ...)``; inside it call ``self.setup(model, optimizer, loader)`` and
    ``self.backward(loss)``. Calling ``MyNano(num_processes=2).train(...)`` starts the ranks with
    Lightning Fabric's launcher, runs ``train`` in each and returns rank 0's result.

    Args:
        num_processes: CPU processes on this machine (an int or ``"auto"``); each gets its own cores.
        cpu_for_each_process: an explicit core list per process, e.g. ``[[0, 1], [2, 3]]``.
        precision: ``"bf16"`` for bf16 autocast, or ``"32"``.
        channels_last: put the model and its 4-D inputs in channels-last memory format.
        auto_lr: scale lrs by the world size with a linear warmup: ``True`` (one epoch) or
            ``{"warmup_epochs": k}``. An epoch is the length of the first DataLoader set up.
        start_method: ``"popen"`` (re-run the script; default), ``"spawn"`` or ``"fork"`` (default in
            interactive sessions).
        **fabric_kwargs: stock Fabric arguments (``accelerator``, ``num_nodes``, ``loggers``, ...).

    Each knob defaults to its ``NANO_PATCH_*`` environment variable or ``patch_torch()`` option.
    """

    def __init__(
        self,
        num_processes: int | str | None = None,
        cpu_for_each_process: list[list[int]] | None = None,
        precision: str | None = None,
        channels_last: bool | None = None,
        auto_lr: bool | dict[str, Any] | None = None,
        *,
        start_method: str | None = None,
        **fabric_kwargs: Any,
    ) -> None:
        plan = resolve_plan(
            {"num_processes": num_processes, "cpu_for_each_process": cpu_for_each_process, "precision": precision,
             "channels_last": channels_last, "auto_lr": auto_lr},
            what=f"{type(self).__name__} argument",
        )
        super().__init__(**fabric_arguments(plan, fabric_kwargs, start_method))
        self.plan = plan
        self._in_rank = False
        self._steps_per_epoch: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "train" in vars(cls):
            cls.train = _launching(vars(cls)["train"])  # type: ignore[method-assign]

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Override this with the training loop; it runs in every rank."""
        raise NotImplementedError(f"{type(self).__name__} must override train(self, ...)")

    def setup(self, module: torch.nn.Module, *objects: Any, scheduler: Any = None,  # type: ignore[override]
              move_to_device: bool = True, _reapply_compile: bool = True) -> Any:
        """Set up a model with its optimizers and, as in BigDL-Nano, DataLoaders; returned in the order given.

        ``setup(model, optimizer)`` behaves as Fabric's; ``setup(model, optimizer, loader)`` also
        shards and wraps the loader.
        """
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        loaders = [o for o in objects if isinstance(o, DataLoader)]
        odd = [type(o).__name__ for o in objects if not isinstance(o, (torch.optim.Optimizer, DataLoader))]
        if odd:
            raise TypeError(f"setup() takes a model, then optimizers and DataLoaders; got {', '.join(odd)}")
        channels_last = self.plan.channels_last and callbacks.has_conv2d(module)
        if channels_last:
            module.to(memory_format=torch.channels_last)
            module.register_forward_pre_hook(_channels_last_inputs, with_kwargs=True)
        if self.global_rank == 0:
            from .. import exit_notices

            exit_notices.note_training(type(self).__name__, module, self.plan.precision or "32", channels_last)
        if self.plan.auto_lr and self.world_size > 1:
            callbacks.scale_lrs(optimizers, [scheduler] if scheduler is not None else [], self.world_size)
            for opt in optimizers:
                self._warm_up(opt)
        out = super().setup(module, *optimizers, scheduler=scheduler, move_to_device=move_to_device,
                            _reapply_compile=_reapply_compile)
        if not loaders:
            return out
        model, set_opts = (out[0], list(out[1:1 + len(optimizers)])) if optimizers else (out, [])
        set_loaders = self.setup_dataloaders(*loaders)
        set_loaders = set_loaders if isinstance(set_loaders, list) else [set_loaders]
        by_id = {id(o): s for o, s in zip(optimizers + loaders, set_opts + set_loaders)}
        result = [model, *(by_id[id(o)] for o in objects)]
        return (*result, out[-1]) if optimizers and scheduler is not None else tuple(result)

    def setup_dataloaders(self, *dataloaders: DataLoader, **kwargs: Any) -> Any:
        out = super().setup_dataloaders(*dataloaders, **kwargs)
        if self._steps_per_epoch is None:
            first = out[0] if isinstance(out, list) else out
            try:
                self._steps_per_epoch = len(first)
            except TypeError:  # an iterable dataset without a length
                self._steps_per_epoch = 0
        return out

    def _warm_up(self, opt: torch.optim.Optimizer) -> None:
        epochs = self.plan.warmup_epochs
        epochs = 1 if epochs is None else epochs
        count = [0]

        def factor() -> float:
            step, count[0] = count[0], count[0] + 1
            return callbacks.warmup_factor(step, epochs * (self._steps_per_epoch or 0), self.world_size)

        callbacks.wrap_step(opt, factor)


def _launching(user_train: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(user_train)
    def train(self: TorchNano, *args: Any, **kwargs: Any) -> Any:
        if self._in_rank or not isinstance(self, TorchNano):
            return user_train(self, *args, **kwargs)
        launcher = self.strategy.launcher
        if launcher is not None and self._launched and not launcher.is_interactive_compatible:
            # The script re-run already started the ranks: this process is one of them.
            return _run_in_rank(self, *args, **kwargs)
        return self.launch(_run_in_rank, *args, **kwargs)

    return train


def _run_in_rank(nano: TorchNano, *args: Any, **kwargs: Any) -> Any:
    nano._in_rank = True
    try:
        return nano.train(*args, **kwargs)
    except BaseException:
        shutdown.mark_failed()  # leave the process group alone: another rank may never reach its end
        raise
    finally:
        nano._in_rank = False


class _FunctionRef:
    """A decorated function, picklable by name for ``spawn`` although its name now holds the wrapper."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _resolve, (self.func.__module__, self.func.__qualname__)


def _resolve(module: str, qualname: str) -> _FunctionRef:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return _FunctionRef(getattr(obj, "__nano_function__", obj))


class _NanoRunner(TorchNano):
    """Runs an ``@nano`` function in each rank with its model, optimizers and DataLoaders set up."""

    def train(self, func: _FunctionRef, args: tuple, kwargs: dict[str, Any]) -> Any:  # type: ignore[override]
        found = list(_objects(list(args) + list(kwargs.values())))
        models = [m for m in found if isinstance(m, torch.nn.Module) and any(True for _ in m.parameters())]
        optimizers = [o for o in found if isinstance(o, torch.optim.Optimizer)]
        loaders = [d for d in found if isinstance(d, DataLoader)]
        if not models:
            raise TypeError(f"@nano found no nn.Module with parameters among the arguments of {func.func.__name__}; "
                            "pass the model as a positional or keyword argument")
        done: dict[int, Any] = {}
        for model in models:
            params = {id(p) for p in model.parameters()}
            own = [o for o in optimizers
                   if any(id(p) in params for g in o.param_groups for p in g["params"]) and id(o) not in done]
            out = self.setup(model, *own)
            if own:
                done[id(model)] = out[0]
                done.update({id(o): s for o, s in zip(own, out[1:])})
            else:
                done[id(model)] = out
        stray = [o for o in optimizers if id(o) not in done]
        if stray:
            raise TypeError(f"@nano: an optimizer passed to {func.func.__name__} holds parameters of no model "
                            "passed to it; pass that model too")
        if loaders:
            set_loaders = self.setup_dataloaders(*loaders)
            set_loaders = set_loaders if isinstance(set_loaders, list) else [set_loaders]
            done.update({id(d): s for d, s in zip(loaders, set_loaders)})
        new_args = tuple(_swap(a, done) for a in args)
        new_kwargs = {k: _swap(v, done) for k, v in kwargs.items()}
        return func(*new_args, **new_kwargs)


_KINDS = (torch.nn.Module, torch.optim.Optimizer, DataLoader)


def _objects(values: Iterable[Any]) -> Iterable[Any]:
    seen: set[int] = set()
    for v in values:
        items = v if isinstance(v, (list, tuple)) else [v]
        for item in items:
            if isinstance(item, _KINDS) and id(item) not in seen:
                seen.add(id(item))
                yield item


def _swap(value: Any, done: dict[int, Any]) -> Any:
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        swapped = [done.get(id(v), v) for v in value]
        return type(value)(swapped)
    return done.get(id(value), value)


def _taking_the_arguments_of(cls: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated function ``cls``'s parameters, for ``help()``, ``inspect`` and type checkers: ``@nano``
    takes exactly ``TorchNano``'s arguments, listed once."""
    parameters = list(inspect.signature(cls).parameters.values())

    def give(func: Callable[..., R]) -> Callable[P, R]:
        func.__signature__ = inspect.signature(func).replace(parameters=parameters)  # type: ignore[attr-defined]
        return func

    return give


@_taking_the_arguments_of(TorchNano)
def nano(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a training function so that it runs accelerated, in ``num_processes`` pinned ranks.

    The function takes its model, optimizers and DataLoaders as positional or keyword arguments
    (also inside a list or tuple). In each rank they are set up on Lightning Fabric before the
    function body runs: models wrapped for DDP and autocast, DataLoaders sharded. The loop calls
    ``loss.backward()`` and ``optimizer.step()`` as usual. Rank 0's return value is returned.
    The arguments are those of :class:`TorchNano`.
    """
    try:
        inspect.signature(nano).bind(*args, **kwargs)
    except TypeError as exc:  # arguments TorchNano would refuse fail here, at the decoration
        raise TypeError(f"nano(): {exc}") from None

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        ref = _FunctionRef(func)

        @functools.wraps(func)
        def wrapper(*call_args: Any, **call_kwargs: Any) -> Any:
            return _NanoRunner(*args, **kwargs).train(ref, call_args, call_kwargs)

        wrapper.__nano_function__ = func  # type: ignore[attr-defined]
        return wrapper

    return decorate
