"""What the machine offers: cores, CPU features that matter for training, the active PIL build."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_native_bf16() -> bool:
    """avx512_bf16 or AMX: the CPU computes bf16 natively, so autocast to bf16 pays off."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pillow_distribution() -> tuple[str, str]:
    """(distribution, version) of the installed PIL: ``pillow-simd`` or ``pillow``."""
    import importlib.metadata

    for dist in ("pillow-simd", "Pillow-SIMD"):
        try:
            return "pillow-simd", importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    import PIL

    return "pillow", PIL.__version__


@functools.lru_cache(maxsize=1)
def pillow_is_simd() -> bool:
    return pillow_distribution()[0] == "pillow-simd"


def summary() -> dict[str, object]:
    import psutil

    flags = cpu_flags()
    return {
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "pil": "{} {}".format(*pillow_distribution()),
    }

