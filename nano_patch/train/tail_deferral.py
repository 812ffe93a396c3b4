"""When to defer the tensor tail to the device: which loader iterations of a Trainer may hand over uint8 batches.

A patched DataLoader whose pipeline ends in the tensor tail (``vision/plans/tensor_tail.py``) yields stock's float
batches, except where this module says that nothing the user wrote can see the difference; then its batches carry uint8
images as a ``DeferredImages`` that Lightning's transfer (``Strategy.batch_to_device`` ->
``LightningModule.transfer_batch_to_device`` -> ``move_data_to_device``, which calls its ``.to``) finishes on the
device, before ``on_after_batch_transfer``, the callbacks' batch hooks and the step. The rule, all of it:

- the iteration is Lightning's own: the fit, validate, test or predict loop's data fetcher (not the
  ``dataloader_iter`` kind, whose batches reach the step untransferred) starts the loader's iterator, inside
  ``Trainer.fit/validate/test/predict``; any other iteration of the same loader gets float batches;
- the batch goes to an accelerator (``DEVICE_TYPES``), through ``Strategy.batch_to_device`` as Lightning defines it;
- neither the LightningModule nor the DataModule overrides ``on_before_batch_transfer`` or
  ``transfer_batch_to_device``, and the precision plugin's ``convert_input`` is Lightning's identity;
- the loader's collate function is the default one, its dataset's transform a stock pipeline ending in the tail
  (``data/tail/uint8_batches.py``), and each batch an ``[images, labels...]`` structure with a uint8 image tensor first
  (any
  other batch is left as it is).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

#: Device types the tail is deferred to. Tests add "cpu" to see the deferral work on a machine without CUDA.
DEVICE_TYPES: tuple[str, ...] = ("cuda",)
#: Lightning's fetchers whose batches go through the transfer (not ``_DataLoaderIterDataFetcher``).
_TRANSFERRING_FETCHERS = ("_DataFetcher", "_PrefetchDataFetcher")

_local = threading.local()


def _stack() -> list[Any]:
    stack = getattr(_local, "trainers", None)
    if stack is None:
        stack = _local.trainers = []
    return stack


def running(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Around ``Trainer._run_stage`` (what ``fit/validate/test/predict`` run): the Trainer whose fetchers may
    defer."""
    stack = _stack()
    stack.append(instance)
    try:
        return wrapped(*args, **kwargs)
    finally:
        stack.pop()


def iterating(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Around Lightning's ``_DataFetcher.__iter__`` and ``__next__``: the loaders' iterators start inside them (in
    ``__next__`` where a loader starts lazily)."""
    stack = _stack()
    trainer = stack[-1] if stack else None
    if trainer is None or type(instance).__name__ not in _TRANSFERRING_FETCHERS:
        return wrapped(*args, **kwargs)
    previous = getattr(_local, "fetching", None)
    _local.fetching = trainer
    try:
        return wrapped(*args, **kwargs)
    finally:
        _local.fetching = previous


def _package(trainer: Any) -> Any:
    root = type(trainer).__module__.split(".trainer")[0]
    return sys.modules.get(root)


def why_not(loader: Any) -> str | None:
    """Why this iteration of ``loader`` keeps the tail on the CPU (None: it is deferred to the device)."""
    trainer = getattr(_local, "fetching", None)
    if trainer is None:
        return "not iterated by a Lightning loop (the loader yields stock's float batches)"
    pl = _package(trainer)
    if pl is None:
        return "Lightning's package is not imported"
    from lightning_utilities.core.overrides import is_overridden

    strategy = trainer.strategy
    try:
        device = strategy.root_device
    except Exception:  # noqa: BLE001 - a strategy without a device yet: keep stock's batches
        return "the strategy has no device yet"
    if device.type not in DEVICE_TYPES:
        return f"the batch goes to {device.type}, not to an accelerator"
    if type(strategy).batch_to_device is not pl.strategies.Strategy.batch_to_device:
        return f"{type(strategy).__name__} moves batches its own way"
    precision = trainer.precision_plugin
    if type(precision).convert_input is not pl.plugins.precision.Precision.convert_input:
        return f"the precision plugin {type(precision).__name__} converts the batch before the transfer"
    model = trainer.lightning_module
    if model is None:
        return "no LightningModule"
    hooks = ("on_before_batch_transfer", "transfer_batch_to_device")
    for owner, parent in ((model, pl.LightningModule), (trainer.datamodule, pl.LightningDataModule)):
        if owner is None:
            continue
        for hook in hooks:
            if is_overridden(hook, owner, parent):
                return f"{type(owner).__name__} overrides {hook} (it would see the batch before the transfer)"
    return None


def decide(loader: Any, spec: Any, workers: bool) -> tuple[bool, str]:
    """Whether this iteration defers ``loader``'s tail (``spec``: its tail, or None), and why (for ``--report``)."""
    from .. import report

    name = f"{type(getattr(loader, 'dataset', None)).__name__} loader"
    why = why_not(loader)
    if why is None and spec is None:
        why = ("its batches are not the patch's uint8 batches (the dataset, its transform or the collate_fn is "
               "not one the patch knows)")
    deferred = why is None
    if why is None:
        why = f"{spec.describe()} runs on the device after the transfer (uint8 batches)"
    if report.stats is not None and (spec is not None or getattr(_local, "fetching", None) is not None):
        # under the dataloader patch's row of the run report: per loader, deferred or not, and why
        report.stats.count("dataloader", deferred, f"device tail, {name}: {why}")
    return deferred, why
