"""What the patched Lightning ``Trainer``'s methods do, for ``pytorch_lightning`` and ``lightning.pytorch`` alike.

``__init__`` takes BigDL-Nano's arguments too (resolved by ``train/trainer_arguments.py``), with a signature and
docstring that show them; ``fit`` notes what trains, decides ``num_processes="auto"`` before Lightning's launcher
starts any rank (``train/auto_trainer.py``), and marks a failed rank (``train/shutdown.py``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import callbacks, shutdown, trainer_arguments

#: Where a Trainer built for ``num_processes="auto"`` keeps its AutoRequest until its ``fit``.
_AUTO = "_nano_auto"


def init_with_nano_arguments(pl: ModuleType, original: Callable[..., None]) -> Callable[..., None]:
    """``Trainer.__init__`` of the Lightning namespace ``pl`` that also takes nano-patch's arguments; ``original``:
    stock's, which it calls with the resolved stock arguments."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        resolved = trainer_arguments.resolve(pl, kwargs)
        original(self, *args, **resolved.stock)
        if resolved.auto is not None:  # num_processes="auto": decided at fit, from a measurement
            setattr(self, _AUTO, resolved.auto.with_connector(type(self), original, resolved.stock))

    __init__.__signature__ = _signature(original)  # type: ignore[attr-defined]
    __init__.__doc__ = _docstring(original.__doc__)
    return __init__


def _signature(original: Callable[..., None]) -> inspect.Signature:
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


def noting_fit(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Around ``Trainer.fit``: decide ``num_processes="auto"``, note what trains for the notices at exit, and mark
    this rank failed where ``fit`` raises."""
    from .. import exit_notices

    shutdown.destroy_at_clean_exit()  # a process group this fit starts is destroyed at a clean exit
    model = args[0] if args else kwargs.get("model")
    channels_last = any(callbacks.is_channels_last(c) for c in instance.callbacks)
    if _AUTO in vars(instance):  # before Lightning's launcher starts any rank
        from . import auto_trainer

        auto_trainer.decide_at_fit(instance, vars(instance).pop(_AUTO), model, args, kwargs, channels_last)
    if model is not None:
        exit_notices.note_training("Trainer", model, str(instance.precision),
                                   channels_last and callbacks.has_conv2d(model))
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        shutdown.mark_failed()  # a rank that failed leaves its process group alone (another may never end)
        raise
