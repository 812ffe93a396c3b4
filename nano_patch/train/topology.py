"""Cores this process may use, grouped by NUMA node and physical core, and how to split them."""

from __future__ import annotations

import contextlib
import glob
import os
import re
from dataclasses import dataclass

from .. import sysinfo


@dataclass(frozen=True)
class Core:
    cpu: int  # the logical CPU used for this physical core
    node: int  # NUMA node (socket when the kernel reports no NUMA)
    core_key: tuple[int, int]  # (package, core id): SMT siblings share it


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


def _cpu_to_node() -> dict[int, int]:
    mapping: dict[int, int] = {}
    for node_dir in glob.glob("/sys/devices/system/node/node[0-9]*"):
        node = int(re.sub(r"\D", "", os.path.basename(node_dir)))
        for cpu_dir in glob.glob(os.path.join(node_dir, "cpu[0-9]*")):
            mapping[int(re.sub(r"\D", "", os.path.basename(cpu_dir)))] = node
    return mapping


def usable_cpus() -> list[int]:
    """Logical CPUs in this process's affinity mask (which already reflects the cgroup cpuset)."""
    return sysinfo.affinity_cpus()


def physical_cores(cpus: list[int] | None = None) -> list[Core]:
    """One entry per physical core among ``cpus``: the first of its SMT siblings."""
    cpus = usable_cpus() if cpus is None else cpus
    nodes = _cpu_to_node()
    seen: dict[tuple[int, int], Core] = {}
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        package = _read_int(f"{base}/physical_package_id", 0)
        key = (package, _read_int(f"{base}/core_id", cpu))
        if key not in seen:
            seen[key] = Core(cpu=cpu, node=nodes.get(cpu, package), core_key=key)
    return sorted(seen.values(), key=lambda c: (c.node, c.cpu))


def split_cores(n: int, cpus: list[int] | None = None) -> list[list[int]]:
    """Split the usable physical cores evenly into ``n`` groups, never across a NUMA node when avoidable."""
    cores = physical_cores(cpus)
    if n < 1:
        raise ValueError(f"num_processes must be at least 1, got {n}")
    if n > len(cores):
        raise ValueError(
            f"num_processes={n} is more than the {len(cores)} physical cores this process may use "
            f"(CPUs {usable_cpus()}); use at most {len(cores)}"
        )
    by_node: dict[int, list[int]] = {}
    for c in cores:
        by_node.setdefault(c.node, []).append(c.cpu)
    nodes = list(by_node.values())
    if n % len(nodes) == 0 and all(len(cpus_) >= n // len(nodes) for cpus_ in nodes):
        per_node = n // len(nodes)
        groups: list[list[int]] = []
        for cpus_ in nodes:
            size = len(cpus_) // per_node
            groups += [cpus_[i * size : (i + 1) * size] for i in range(per_node)]
        return groups
    flat = [c.cpu for c in cores]
    size = len(flat) // n
    return [flat[i * size : (i + 1) * size] for i in range(n)]


#: ``num_processes="auto"`` leaves each process two cores at least: besides its step a rank runs serial work (the
#: optimizer, the loader's draws, gloo's thread) that a one-core process can only run in its step's stead, and
#: processes of one core each measured no faster than one process (``docs/benchmarks.md``, ``train.py``).
MIN_CORES_PER_PROCESS = 2


def counts_to_try(cpus: list[int] | None = None) -> dict[int, int]:
    """Process counts ``auto`` predicts, each with its cores per process: 1 (every core), 2, 4, 8, ... while each
    process keeps at least :data:`MIN_CORES_PER_PROCESS` physical cores."""
    cores = physical_cores(cpus)
    out = {1: len(cores)}
    n = 2
    while len(cores) // n >= MIN_CORES_PER_PROCESS:
        out[n] = min(len(g) for g in split_cores(n, cpus))
        n *= 2
    return out


def launched_ranks_per_node() -> int | None:
    """Ranks per node when an outside launcher started this process (torchrun, SLURM's srun), else None."""
    env = os.environ
    if env.get("LOCAL_WORLD_SIZE", "").isdigit():
        return int(env["LOCAL_WORLD_SIZE"])
    if "SLURM_PROCID" in env:
        # "2" or "2(x3)": the tasks on this node come first.
        match = re.match(r"\d+", env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
        if match:
            return int(match.group())
    return None


def bound_by_launcher() -> bool:
    """SLURM already bound this task to its own CPUs (``--cpu-bind``): its mask is the rank's share."""
    bind = os.environ.get("SLURM_CPU_BIND_TYPE", "").strip(",").lower()
    return "SLURM_PROCID" in os.environ and bind not in ("", "none", "quiet", "quiet,none", "none,quiet")


def pin_process(cpus: list[int]) -> None:
    """Pin every existing thread of this process (OpenMP's included) and its future threads to ``cpus``."""
    target = set(cpus)
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a thread that just exited
            os.sched_setaffinity(int(task), target)
    os.sched_setaffinity(0, target)
