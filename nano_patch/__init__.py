"""nano-patch: make unchanged PyTorch, torchvision and Lightning training faster on the CPU.

One line switches it on::

    from nano_patch import patch_torch; patch_torch()

Everything is patched in place and undone by :func:`unpatch_torch`. Targets that are not imported yet
are patched when the program imports them.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from . import config
from ._version import __version__
from .config import STARTUP_ENV, ConfigError, Options

if TYPE_CHECKING:
    from .registry import PatchManager

__all__ = [
    "ConfigError",
    "Options",
    "TorchNano",
    "__version__",
    "is_patched",
    "nano",
    "options",
    "patch_torch",
    "status",
    "unpatch_torch",
]

_manager: PatchManager | None = None


def __getattr__(name: str) -> Any:
    # Imported on first use: they need torch and Lightning Fabric, and `import nano_patch` must stay cheap.
    if name in ("nano", "TorchNano"):
        from .train import fabric

        return getattr(fabric, name)
    raise AttributeError(f"module 'nano_patch' has no attribute {name!r}")


def _get_manager() -> PatchManager:
    global _manager
    if _manager is None:
        from .patches import all_patches
        from .registry import PatchManager

        _manager = PatchManager(all_patches())
    return _manager


def patch_torch(
    vision: bool | None = None,
    dataloader: bool | None = None,
    trainer: bool | None = None,
    **options: Any,
) -> None:
    """Patch torchvision, ``torch.utils.data.DataLoader`` and the Lightning Trainer in place.

    Args:
        vision: accelerate torchvision datasets and transforms (``NANO_PATCH_VISION``).
        dataloader: thread caps, worker defaults and uint8 batches (``NANO_PATCH_DATALOADER``).
        trainer: BigDL-Nano's Trainer arguments (``NANO_PATCH_TRAINER``).
        **options: defaults for the training knobs: ``num_processes``, ``cpu_for_each_process``,
            ``precision``, ``channels_last``, ``auto_lr``, ``scaled_decode``. Each also has its
            ``NANO_PATCH_*`` environment variable; an explicit argument wins.

    Safe to call twice. Raises :class:`ConfigError`, before patching anything, for an unknown
    option or a bad value. A missing or unsupported target package only skips that patch, with one
    warning.
    """
    switches = (("vision", vision), ("dataloader", dataloader), ("trainer", trainer))
    explicit = {k: v for k, v in switches if v is not None}
    explicit.update(options)
    opts = config.resolve(explicit)
    # Children (Lightning's script re-run, spawn workers) read this in the .pth startup hook.
    os.environ[STARTUP_ENV] = json.dumps({k: _jsonable(v) for k, v in explicit.items()})
    from . import exit_notices, report

    report.activate_from_env()
    exit_notices.note_options(opts)
    config.set_in_force(opts)  # before the patches apply: they read the options in force
    _get_manager().patch(opts)
    from .train import warm_start

    warm_start.maybe_start(opts.num_processes, opts.cpu_for_each_process)  # a script asking for several ranks
    if opts.vision:
        _warn_if_kernels_missing(stacklevel=2)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def unpatch_torch() -> None:
    """Restore every attribute nano-patch replaced, to the very same object it was before."""
    os.environ.pop(STARTUP_ENV, None)
    from .train import warm_start

    warm_start.stop()  # (the warm interpreter patch_torch started: no patched rank will start from here on)
    if _manager is not None:
        _manager.unpatch()
        config.set_in_force(None)  # after the reverts, which still see the options they were applied with
        from . import exit_notices

        exit_notices.forget_options()


def is_patched() -> bool:
    """True between :func:`patch_torch` and :func:`unpatch_torch`."""
    return _manager is not None and _manager.active


def options() -> Options:
    """The options in force: those given to :func:`patch_torch`, else the environment's (``config.current()``)."""
    return config.current()


def status() -> dict[str, Any]:
    """Every patch as applied, pending, skipped or off (with the reason and versions), each native image
    kernel (native, with its instruction set, or on PIL's code and why), the decoded-image cache
    setting and its store, CPU facts, and the torch build installed (CPU or CUDA, and its version)."""
    from . import sysinfo

    return {"patched": is_patched(), "patches": _get_manager().status(), "kernels": _native_kernels(),
            "decoded_cache": _cache_status(), "system": sysinfo.summary(), "torch": sysinfo.torch_build()}


def _warn_if_kernels_missing(stacklevel: int = 2) -> None:
    """The first ``patch_torch()`` of a process tree: one warning where the compiled kernels were not installed.

    pip hides the build's own warning, and the wheel installs fine without them; without this line the
    user would learn it only from ``nano-patch status``. Processes a patched run starts (ranks, workers)
    stay quiet: their parent said it. Switching the kernels off on purpose is not warned about.
    """
    from . import exit_notices

    if not exit_notices.first_kernel_check():
        return
    import warnings

    from .registry import NanoPatchWarning
    from .vision.kernels import native

    why = native.missing()
    if why is not None:
        warnings.warn(f"nano-patch: resize and colour transforms run PIL's own code, exact but slower: {why}.",
                      NanoPatchWarning, stacklevel=stacklevel + 1)


def _cache_status() -> dict[str, Any]:
    try:
        from .vision.images import cache

        s = cache.setting()
        return {"setting": s.mode if s.cap is None else f"on, cap {s.cap} bytes", **cache.describe(s.folder)}
    except Exception as exc:  # noqa: BLE001 - a summary never fails
        return {"setting": "?", "state": f"{type(exc).__name__}: {exc}"}


def report_facts() -> tuple[list[dict[str, Any]], str]:
    """What the run report needs from above ``exit_notices``: every patch's row, and the resize kernel's state."""
    return _get_manager().status(), _resample_state()


def _resample_state() -> str:
    try:
        from .vision.kernels import native

        native.available("resample")  # checks this kernel only, not every one
        return native.state()["resample"]
    except Exception as exc:  # noqa: BLE001 - a report never fails
        return f"PIL's code: {exc}"


def _native_kernels() -> dict[str, str]:
    """Per native image kernel: ``native (<instruction set>)`` or ``PIL's code: <why>`` (checks them all);
    one entry ``all`` where the extension itself cannot be used."""
    try:
        from .vision.kernels import native

        return native.summary()
    except Exception as exc:  # noqa: BLE001 - a status never fails
        return {"all": f"PIL's code: {type(exc).__name__}: {exc}"}


config.set_patcher(patch_torch)  # a spawned rank's strategy patches the rank through it (train/ranks.py)
