"""Trainer arguments of BigDL-Nano and of Lightning 1.x, translated to Lightning 2.x.

Stock Lightning 2.x raises ``TypeError`` on each of these, so accepting them changes nothing for a
script that runs today. Each one warns once, naming the modern spelling. Any other unknown argument
still reaches stock ``Trainer.__init__`` and its ``TypeError``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from ..config import ConfigError

LEGACY_ARGS = ("use_ipex", "distributed_backend", "gpus", "use_amp", "amp_level", "nb_gpu_nodes")

#: distributed_backend -> (start method with num_processes, stock strategy without it)
_BACKENDS = {
    "subprocess": ("popen", None),
    "spawn": ("spawn", None),
    "ddp": ("popen", "ddp"),
    "dp": ("popen", "ddp"),
    "ddp_spawn": ("spawn", "ddp_spawn"),
}
_BEYOND_ONE_MACHINE = ("ray", "k8s")


class NanoPatchMigrationWarning(UserWarning):
    """A BigDL-Nano or Lightning 1.x argument was translated to its Lightning 2.x spelling."""


@functools.cache
def _warn_once(argument: str, message: str) -> None:
    warnings.warn(f"nano-patch: Trainer({argument}) {message}", NanoPatchMigrationWarning, stacklevel=4)


def _conflict(old: str, new: str, kwargs: dict[str, Any]) -> None:
    if new in kwargs:
        raise ConfigError(f"Trainer arguments {old} and {new}={kwargs[new]!r} conflict; {old} is the old spelling "
                          f"of {new}: give only {new}")


def pop_legacy(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the legacy arguments out of ``kwargs``."""
    return {k: kwargs.pop(k) for k in LEGACY_ARGS if k in kwargs}


def translate(kwargs: dict[str, Any], legacy: dict[str, Any], multi_instance: bool, cuda: bool) -> str | None:
    """Rewrite ``kwargs`` in place for the ``legacy`` arguments; return the start method they ask for.

    ``multi_instance``: nano-patch runs several CPU processes (``num_processes``), so a
    ``distributed_backend`` only chooses how they start. ``cuda``: CUDA is available (``use_amp``).
    """
    start_method = None
    if "use_ipex" in legacy:
        _warn_once(f"use_ipex={legacy['use_ipex']!r}", "is accepted and does nothing: IPEX is retired, and "
                   "PyTorch's own CPU kernels (oneDNN, AVX-512 and AMX bf16) now do what it did; "
                   "use precision='bf16' for bf16 autocast")
    if "nb_gpu_nodes" in legacy:
        _conflict("nb_gpu_nodes", "num_nodes", kwargs)
        kwargs["num_nodes"] = legacy["nb_gpu_nodes"]
        nodes = legacy["nb_gpu_nodes"]
        _warn_once(f"nb_gpu_nodes={nodes!r}", f"is Lightning 1.x: now num_nodes={nodes!r}")
    if legacy.get("gpus") not in (None, 0, [], "", "0"):
        gpus = legacy["gpus"]
        _conflict(f"gpus={gpus!r}", "devices", kwargs)
        _conflict(f"gpus={gpus!r}", "accelerator", kwargs)
        kwargs["accelerator"], kwargs["devices"] = "gpu", gpus
        _warn_once(f"gpus={gpus!r}", f"is Lightning 1.x: now accelerator='gpu', devices={gpus!r}")
    elif "gpus" in legacy:
        _warn_once(f"gpus={legacy['gpus']!r}", "is Lightning 1.x and asks for no GPU: it is ignored")
    if "distributed_backend" in legacy:
        start_method = _backend(kwargs, legacy["distributed_backend"], multi_instance)
    if "use_amp" in legacy:
        if legacy["use_amp"]:
            _conflict("use_amp=True", "precision", kwargs)
            accelerator = str(kwargs.get("accelerator", "auto")).lower()
            on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and cuda)
            kwargs["precision"] = "16-mixed" if on_gpu else "bf16-mixed"
            _warn_once("use_amp=True", f"is Lightning 1.x: now precision={kwargs['precision']!r}")
        else:
            _warn_once("use_amp=False", "is Lightning 1.x: full precision is the default, it is ignored")
    if "amp_level" in legacy:
        _warn_once(f"amp_level={legacy['amp_level']!r}", "is ignored: it configured NVIDIA apex, which Lightning "
                   "no longer uses; native mixed precision has no levels")
    return start_method


def _backend(kwargs: dict[str, Any], backend: Any, multi_instance: bool) -> str | None:
    name = str(backend).lower()
    if name in _BEYOND_ONE_MACHINE:
        raise ConfigError(
            f"Trainer(distributed_backend={backend!r}) is not supported: beyond one machine, start the script with "
            "torchrun or SLURM's srun (Lightning's own cluster environments) and set num_processes per node")
    if name not in _BACKENDS:
        raise ConfigError(f"Trainer(distributed_backend={backend!r}): accepted values are "
                          f"{', '.join(repr(b) for b in _BACKENDS)} (and {', '.join(_BEYOND_ONE_MACHINE)} are "
                          "replaced by torchrun and SLURM)")
    start_method, strategy = _BACKENDS[name]
    if name == "dp":
        _warn_once("distributed_backend='dp'", "is removed in Lightning 2.x and runs as DDP: the DataLoader batch "
                   "size is now per process, so the effective batch is that times the number of processes")
    if multi_instance:
        _warn_once(f"distributed_backend={backend!r}",
                   f"now means the start method of nano-patch's CPU processes: strategy='nano_ddp"
                   f"{'' if start_method == 'popen' else '_' + start_method}'")
        return start_method
    if strategy is not None:
        _conflict(f"distributed_backend={backend!r}", "strategy", kwargs)
        kwargs["strategy"] = strategy
        _warn_once(f"distributed_backend={backend!r}", f"is Lightning 1.x: now strategy={strategy!r}")
    else:
        _warn_once(f"distributed_backend={backend!r}", "only chooses how nano-patch's CPU processes start, and "
                   "num_processes is 1: it is ignored")
    return None
