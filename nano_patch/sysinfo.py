"""What the machine offers: cores, CPU features that matter for training, the active PIL build."""

from __future__ import annotations

import functools
import math
import os
import time


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


def affinity_cpus() -> list[int]:
    """The logical CPUs this process may run on: its affinity mask (which already reflects the cgroup's cpuset)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def cgroup_quota() -> float | None:
    """CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, or v1's CFS quota), or None where unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


#: Seconds a cgroup quota read stays in use (a container resized meanwhile is seen within this long); reading the
#: cgroup's files costs about 50 us, and the loader asks once per batch.
QUOTA_REFRESH_S = 5.0
_quota_read: tuple[float, float | None] = (-math.inf, None)


def _quota_now() -> float | None:
    global _quota_read
    now = time.monotonic()
    at, quota = _quota_read
    if now - at >= QUOTA_REFRESH_S:
        quota = cgroup_quota()
        _quota_read = (now, quota)
    return quota


def usable_cores() -> int:
    """Cores this process may keep busy: its affinity mask, capped by the cgroup's CPU quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _quota_now()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


#: How much lower than the process's own priority the loader's threads run (a nice increment; Linux sets it per
#: thread): the training thread gets a core back at once, and loading takes what the step leaves.
LOADER_NICE = 10


def lower_this_thread() -> None:
    """Run the calling thread (one of the loader's own, never the user's) :data:`LOADER_NICE` below the process's
    priority. Linux only (elsewhere the call would change the whole process); a refusal leaves it as it is."""
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        return
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # (the main thread's: the process's own)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + LOADER_NICE))
    except OSError:
        pass


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


def torch_build() -> dict[str, object]:
    """Which torch is installed: its version and build (``CPU``, ``CUDA x.y`` or ``ROCm x.y``), and the GPUs it
    sees where it is a GPU build. PyPI's Linux x86-64 wheel is the CUDA build (its ``nvidia-*`` and ``triton``
    dependencies take several GB); PyTorch's CPU index has the same version without them (README, "Install")."""
    try:
        import torch
    except ImportError as exc:
        return {"version": None, "build": f"not importable: {exc}"}
    cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
    out: dict[str, object] = {"version": torch.__version__,
                              "build": f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU"}
    if cuda or hip:
        try:
            out["gpus"] = torch.cuda.device_count()
        except Exception as exc:  # noqa: BLE001 - a summary never fails
            out["gpus"] = f"? ({type(exc).__name__})"
    return out


def summary() -> dict[str, object]:
    import psutil

    flags = cpu_flags()
    return {
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(affinity_cpus()),
        "physical_cores": psutil.cpu_count(logical=False),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "pil": "{} {}".format(*pillow_distribution()),
    }

