"""Callbacks the Trainer patch adds: channels-last and learning-rate scaling with warmup.

Built per Lightning namespace, since each has its own ``Callback`` base class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import LIGHTNING, find_class, name_class

_classes: dict[tuple[str, str], type] = {}


def to_channels_last(batch: Any) -> Any:
    """Convert every 4-D tensor in a batch (lists, tuples, dicts, namedtuples) to channels-last, in place."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and not batch.is_contiguous(memory_format=torch.channels_last):
            batch.data = batch.data.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, dict):
        for v in batch.values():
            to_channels_last(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            to_channels_last(v)
    return batch


def has_conv2d(model: Any) -> bool:
    """True if the model has 4-D weights (2-D convolutions): the only models channels-last changes."""
    parameters = getattr(model, "parameters", None)
    return parameters is not None and any(p.dim() == 4 for p in parameters())


def is_channels_last(callback: Any) -> bool:
    """Whether ``callback`` is a :func:`channels_last_callback` (of any Lightning namespace)."""
    return type(callback).__name__.startswith("ChannelsLast") and type(callback).__module__ == __name__


def channels_last_callback(pl: ModuleType) -> type:
    key = (pl.__name__, "ChannelsLast")
    if key not in _classes:
        import torch

        class ChannelsLast(pl.Callback):
            """Puts a model with 2-D convolutions in channels-last memory format before the DDP wrap, and each
            batch too. Other models (no 4-D weights) are left as they are."""

            def __init__(self) -> None:
                self.active = False

            def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
                self.active = has_conv2d(pl_module)
                if self.active:
                    pl_module.to(memory_format=torch.channels_last)

            def _batch(self, batch: Any) -> None:
                if self.active:
                    to_channels_last(batch)

            def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
                self._batch(batch)

            def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                          dataloader_idx: int = 0) -> None:
                self._batch(batch)

            def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                    dataloader_idx: int = 0) -> None:
                self._batch(batch)

            def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                       dataloader_idx: int = 0) -> None:
                self._batch(batch)

        _classes[key] = name_class(ChannelsLast, __name__, "ChannelsLast", pl.__name__)
    return _classes[key]


def warmup_factor(step: int, warmup_steps: int, world_size: int) -> float:
    """The lr multiplier at ``step``: from 1/world_size of the scaled lr up to all of it, linearly."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    start = 1.0 / world_size
    return start + (1.0 - start) * step / warmup_steps


def scale_lrs(optimizers: Any, schedulers: Any, world_size: int) -> None:
    """Multiply every param group's lr, and every scheduler's base lrs, by ``world_size``."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] *= world_size
            if "initial_lr" in group:
                group["initial_lr"] *= world_size
    for sched in schedulers:
        if hasattr(sched, "base_lrs"):
            sched.base_lrs = [lr * world_size for lr in sched.base_lrs]


def wrap_step(opt: Any, factor: Callable[[], float]) -> Callable[[], None]:
    """Scale the lrs by ``factor()`` around each ``opt.step`` only; return a function that undoes the wrap.

    A scheduler stepping after the optimizer never sees the factor, so a user's scheduler composes
    with the warmup instead of being overwritten by it.
    """
    inner = opt.step

    def step(*args: Any, **kwargs: Any) -> Any:
        f = factor()
        if f == 1.0:
            return inner(*args, **kwargs)
        saved = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * f
        try:
            return inner(*args, **kwargs)
        finally:
            for g, lr in zip(opt.param_groups, saved):
                g["lr"] = lr

    if hasattr(inner, "_wrapped_by_lr_sched"):
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # torch's order check
    had, old = "step" in vars(opt), vars(opt).get("step")
    opt.step = step

    def undo() -> None:
        if had:
            opt.step = old
        else:
            del opt.step

    return undo


def auto_lr_callback(pl: ModuleType) -> type:
    key = (pl.__name__, "AutoLR")
    if key not in _classes:

        class AutoLR(pl.Callback):
            """Scales every learning rate by the world size, warming up from the original one.

            The warmup lasts ``warmup_epochs`` epochs, or a tenth of training when not given. A
            user's scheduler keeps working: its base lrs are scaled too, and the warmup factor is
            applied around each optimizer step only, so the scheduler never sees it.
            """

            def __init__(self, warmup_epochs: int | None = None) -> None:
                self.warmup_epochs = warmup_epochs
                self.world_size = 1
                self.warmup_steps = 0
                self._wrapped: list[Callable[[], None]] = []

            def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
                self.world_size = max(1, trainer.world_size)
                if self.world_size == 1:
                    return
                scale_lrs(trainer.optimizers, [c.scheduler for c in trainer.lr_scheduler_configs], self.world_size)
                steps_per_epoch = max(1, int(trainer.num_training_batches)) if math.isfinite(
                    trainer.num_training_batches) else 1
                if self.warmup_epochs is not None:
                    self.warmup_steps = self.warmup_epochs * steps_per_epoch
                else:
                    total = trainer.estimated_stepping_batches
                    self.warmup_steps = int(total // 10) if math.isfinite(total) else steps_per_epoch

                for opt in trainer.optimizers:
                    self._wrap_step(trainer, opt)

            def _wrap_step(self, trainer: Any, opt: Any) -> None:
                self._wrapped.append(wrap_step(
                    opt, lambda: warmup_factor(trainer.global_step, self.warmup_steps, self.world_size)))

            def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
                while self._wrapped:
                    self._wrapped.pop()()

        _classes[key] = name_class(AutoLR, __name__, "AutoLR", pl.__name__)
    return _classes[key]


def __getattr__(name: str) -> type:
    return find_class(name, {"ChannelsLast": (channels_last_callback, LIGHTNING),
                             "AutoLR": (auto_lr_callback, LIGHTNING)})
