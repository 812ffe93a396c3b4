"""Options for nano-patch: fields, ``NANO_PATCH_*`` environment parsing and validation.

Every option has one environment variable. An explicit argument always wins over the environment.
Validation happens before anything is patched, so a bad value never leaves a half-patched process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

ENV_PREFIX = "NANO_PATCH_"
#: Set by ``patch_torch()`` and ``nano-patch run`` so that child processes come up patched.
STARTUP_ENV = "_NANO_PATCH_STARTUP"
#: ``NANO_PATCH_*`` variables that are settings of the native kernels (vision/kernels/native.py) or of how long a
#: launcher waits for its ranks to start (train/ranks.py), not patch options.
NON_OPTION_ENV = frozenset({"NANO_PATCH_NO_NATIVE", "NANO_PATCH_NATIVE_ISA", "NANO_PATCH_RANK_START_TIMEOUT"})

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
PRECISIONS = ("32", "bf16")


class ConfigError(ValueError):
    """A nano-patch option, or its environment variable, has a bad value."""


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything ``patch_torch()`` can be told.

    The three switches choose which patch groups run; the rest are the BigDL-Nano training knobs that
    the Lightning Trainer, ``@nano`` and ``TorchNano`` read as defaults.
    """

    vision: bool = True
    dataloader: bool = True
    trainer: bool = True
    num_processes: int | str | None = None
    cpu_for_each_process: tuple[tuple[int, ...], ...] | None = None
    precision: str | None = None
    channels_last: bool = False
    auto_lr: bool | dict[str, Any] = False
    scaled_decode: bool = False
    uint8_batches: bool = True
    cache_decoded: str | int = "off"
    cache_dir: str | None = None
    loader_threads: int | str = "auto"
    virtual_workers: bool = True
    lazy_images: bool = True
    batches_ahead: bool = True


FIELDS = tuple(f.name for f in dataclasses.fields(Options))
BOOLEAN_FIELDS = ("vision", "dataloader", "trainer", "channels_last", "scaled_decode", "uint8_batches",
                  "virtual_workers", "lazy_images", "batches_ahead")

# What each option does, for `nano-patch run --help`.
DESCRIPTIONS = {
    "vision": "accelerated torchvision datasets and transforms",
    "dataloader": "DataLoader batch-parallel loading on threads, worker thread caps and uint8 batches",
    "trainer": "BigDL-Nano's Trainer arguments",
    "num_processes": "multi-instance CPU data-parallel training: processes per node",
    "cpu_for_each_process": "explicit cores for each process",
    "precision": "bf16 = autocast to bfloat16 on the CPU; 32 = fp32",
    "channels_last": "model and 4-D batch tensors in channels-last memory format",
    "auto_lr": "learning rate x world size, with a linear warmup",
    "scaled_decode": "DCT-domain JPEG downscale before a first Resize (outside parity bars)",
    "uint8_batches": "where a device finishes the tensor tail, DataLoader workers send uint8 images",
    "cache_decoded": "keep decoded images in an on-disk store shared by all processes, so later epochs skip "
                     "JPEG decoding",
    "cache_dir": "the private folder of the decoded-image cache (default: ~/.cache/nano-patch/decoded-images)",
    "loader_threads": "threads that load each batch of a num_workers=0 DataLoader (decode and transforms, with "
                      "stock's draws in stock's order); auto = every usable core, fewer where measured faster",
    "virtual_workers": "num_workers=N as N virtual workers in this process where no user code runs in a worker "
                       "(stock's seeds and batches; else worker processes)",
    "lazy_images": "Image.open(...).convert(\"RGB\") of a plain JPEG decodes when its pixels are read; a patched "
                   "Compose that starts with a crop decodes only the crop, and in a DataLoader batch its pixel work "
                   "is rendered on the loader's threads",
    "batches_ahead": "num_workers=0: the next batch made ahead while the training step runs, handed over only where "
                     "what it was drawn from is unchanged (else made again, as stock)",
}

# What each option accepts, for error messages and the README table.
ACCEPTED = {
    "vision": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "dataloader": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "trainer": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "num_processes": 'a positive int or "auto"',
    "cpu_for_each_process": 'a list of non-empty lists of core ids, e.g. [[0, 1], [2, 3]] (env: "0,1;2,3")',
    "precision": 'one of "32", "bf16" (also 32, "32-true", "bf16-mixed")',
    "channels_last": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "auto_lr": 'a bool, or {"warmup_epochs": k} with k >= 0 (env: 1/0, or a JSON object)',
    "scaled_decode": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "uint8_batches": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "cache_decoded": 'on, off, auto (what --fast sets: on when the dataset fits the budget), or a size cap '
                     'of at least 1MB such as 20GB, 512MB, 2GiB',
    "cache_dir": "a folder path (created with mode 0700; refused if owned by another user or writable by others)",
    "loader_threads": 'a positive int, "auto" (the usable cores: affinity and cgroup quota) or "off" (one by one, '
                      'as stock)',
    "virtual_workers": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "lazy_images": "a bool (env: 1/0, true/false, yes/no, on/off)",
    "batches_ahead": "a bool (env: 1/0, true/false, yes/no, on/off)",
}


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _err(name: str, value: Any, source: str) -> ConfigError:
    return ConfigError(f"nano-patch option {name!r} ({source}) got {value!r}; accepted: {ACCEPTED[name]}")


def _bool(name: str, value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _err(name, value, source)


def _num_processes(value: Any, source: str) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v.isdigit() and int(v) > 0:
            return int(v)
        raise _err("num_processes", value, source)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _err("num_processes", value, source)


def _cores(value: Any, source: str) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = [[int(c) for c in grp.split(",") if c.strip()] for grp in value.split(";") if grp.strip()]
        except ValueError:
            raise _err("cpu_for_each_process", value, source) from None
    try:
        groups = tuple(tuple(int(c) for c in grp) for grp in value)
        ok = all(
            all(isinstance(c, int) and not isinstance(c, bool) for c in grp) for grp in value
        )
    except (TypeError, ValueError):
        raise _err("cpu_for_each_process", value, source) from None
    if not ok or not groups or any(not g or min(g) < 0 for g in groups):
        raise _err("cpu_for_each_process", value, source)
    seen = [c for g in groups for c in g]
    if len(seen) != len(set(seen)):
        raise ConfigError(
            f"nano-patch option 'cpu_for_each_process' ({source}) lists a core twice: {value!r}; "
            "each process needs its own cores"
        )
    return groups


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
#: The smallest cap accepted: the store needs a few pages of its own.
MIN_CACHE_BYTES = 1024**2


def parse_size(text: str) -> int | None:
    """Bytes in ``20GB``, ``1.5 GiB``, ``512MB``, ``1048576``; None if it is not a size."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _SIZE_UNITS:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _cache_decoded(value: Any, source: str) -> str | int:
    if isinstance(value, bool) or value in (0, 1):
        return "on" if value else "off"
    if isinstance(value, int) and value >= MIN_CACHE_BYTES:
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return "on"
        if v in _FALSE:
            return "off"
        if v == "auto":
            return "auto"
        size = parse_size(v)
        if size is not None and size >= MIN_CACHE_BYTES:
            return size
    raise _err("cache_decoded", value, source)


def _cache_dir(value: Any, source: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and value.strip():
        return value
    raise _err("cache_dir", value, source)


def normalise_precision(value: Any, source: str = "argument") -> str | None:
    """Map the accepted spellings to ``"32"`` or ``"bf16"``."""
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in ("32", "32-true", "fp32"):
        return "32"
    if v in ("bf16", "bf16-mixed"):
        return "bf16"
    raise _err("precision", value, source)


def _auto_lr(value: Any, source: str) -> bool | dict[str, Any]:
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _err("auto_lr", value, source) from None
    if isinstance(value, Mapping):
        extra = set(value) - {"warmup_epochs"}
        k = value.get("warmup_epochs")
        if extra or (k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0)):
            raise _err("auto_lr", value, source)
        return dict(value)
    return _bool("auto_lr", value, source)


def validate(name: str, value: Any, source: str = "argument") -> Any:
    """Validate and normalise one option value; raise :class:`ConfigError` naming it otherwise."""
    if name not in ACCEPTED:
        raise ConfigError(f"unknown nano-patch option {name!r}; accepted options: {', '.join(FIELDS)}")
    if name in BOOLEAN_FIELDS:
        return _bool(name, value, source)
    return _VALIDATORS[name](value, source)


def _loader_threads(value: Any, source: str) -> int | str:
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("auto", "off"):
            return v
        if v.isdigit() and int(v) > 0:
            return int(v)
    elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _err("loader_threads", value, source)


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read every ``NANO_PATCH_*`` variable. An unknown one is an error, not silently ignored."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in NON_OPTION_ENV:
            continue
        field = key[len(ENV_PREFIX):].lower()
        if field not in ACCEPTED:
            names = ", ".join(env_name(f) for f in FIELDS)
            raise ConfigError(f"unknown environment variable {key}; nano-patch reads: {names}")
        found[field] = validate(field, raw, source=f"environment variable {key}")
    return found


def resolve(explicit: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Options:
    """Build :class:`Options` from explicit arguments over the environment over the defaults."""
    values = from_env(environ)
    for name, value in explicit.items():
        values[name] = validate(name, value)
    if values.get("num_processes") is not None and values.get("cpu_for_each_process") is not None:
        n = values["num_processes"]
        if n != "auto" and n != len(values["cpu_for_each_process"]):
            raise ConfigError(
                f"nano-patch options 'num_processes'={n!r} and 'cpu_for_each_process' "
                f"({len(values['cpu_for_each_process'])} groups) disagree; give one, or make them match"
            )
    return Options(**values)


#: The options ``patch_torch()`` put in force, or None while nothing is patched (the package's face sets it).
_in_force: Options | None = None
#: What patches this process with explicit options: the face's ``patch_torch``, named here when the package is
#: imported, so that code below the face (a spawned rank's strategy) can patch a process without importing it.
_patcher: Callable[..., None] | None = None


def current() -> Options:
    """The options in force: those given to ``patch_torch()``, else the environment's (``NANO_PATCH_*``)."""
    opts = _in_force
    return opts if opts is not None else resolve({})


def in_force() -> Options | None:
    """The options ``patch_torch()`` put in force, or None where this process is not patched."""
    return _in_force


def set_in_force(opts: Options | None) -> None:
    """``patch_torch()`` applies ``opts`` (None: ``unpatch_torch()`` reverted everything)."""
    global _in_force
    _in_force = opts


def set_patcher(patch: Callable[..., None]) -> None:
    """Name the function that patches this process with explicit options (the face's ``patch_torch``)."""
    global _patcher
    _patcher = patch


def patch_process(explicit: Mapping[str, Any]) -> None:
    """Patch this process with ``explicit`` options over the environment, as ``patch_torch(**explicit)`` does."""
    if _patcher is None:
        raise RuntimeError("nano-patch: the package is not imported, so nothing can patch this process")
    _patcher(**explicit)


def from_json(text: str) -> dict[str, Any]:
    """Parse the explicit arguments ``patch_torch()`` left in ``_NANO_PATCH_STARTUP`` for child processes."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ConfigError(f"{STARTUP_ENV} must hold a JSON object, got {text!r}")
    return data


#: The validator of each option that is not a plain bool.
_VALIDATORS: dict[str, Callable[[Any, str], Any]] = {
    "num_processes": _num_processes,
    "cpu_for_each_process": _cores,
    "precision": normalise_precision,
    "cache_decoded": _cache_decoded,
    "cache_dir": _cache_dir,
    "loader_threads": _loader_threads,
    "auto_lr": _auto_lr,
}
