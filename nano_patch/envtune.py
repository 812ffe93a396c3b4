"""``nano-patch init``: environment settings for CPU training on this machine.

Only settings that exist here are printed: an allocator is preloaded only when its library is found.
"""

from __future__ import annotations

import glob
import os
import shlex
from collections.abc import MutableMapping

ALLOCATORS = (
    ("jemalloc", ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"),
     {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                     "dirty_decay_ms:-1,muzzy_decay_ms:-1"}),
    ("tcmalloc", ("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "/usr/lib/libtcmalloc.so.4"), {}),
)


def find_allocator() -> tuple[str, str, dict[str, str]] | None:
    for name, paths, extra in ALLOCATORS:
        for pattern in paths:
            for path in glob.glob(pattern):
                if os.path.exists(path):
                    return name, path, extra
    return None


def settings() -> tuple[dict[str, str], list[str]]:
    """(variables, notes) for this machine."""
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0))
    env = {
        "OMP_NUM_THREADS": str(min(cores, usable)),
        # libgomp (PyTorch's OpenMP on Linux): one thread per physical core, kept in place.
        "OMP_PROC_BIND": "close",
        "OMP_PLACES": "cores",
        # Intel OpenMP, if a build uses it: do not spin after parallel regions.
        "KMP_BLOCKTIME": "1",
        "KMP_AFFINITY": "granularity=fine,compact,1,0",
    }
    notes = []
    alloc = find_allocator()
    if alloc is None:
        notes.append("no jemalloc or tcmalloc found (apt-get install libjemalloc2); LD_PRELOAD left alone")
    else:
        name, path, extra = alloc
        env["LD_PRELOAD"] = path
        env.update(extra)
        notes.append(f"preloading {name} from {path}")
    return env, notes


def shell_lines(unset: bool = False) -> str:
    env, notes = settings()
    lines = [f"# nano-patch init: {n}" for n in notes]
    if unset:
        lines += [f"unset {k}" for k in env]
    else:
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    return "\n".join(lines)


def apply_to(environ: MutableMapping[str, str]) -> None:
    """``nano-patch run --tune-env``: the same settings, for the program about to run and its children."""
    env, _ = settings()
    for k, v in env.items():
        if k == "LD_PRELOAD":
            continue  # only takes effect in a new process; children inherit it below
        environ.setdefault(k, v)
    if "LD_PRELOAD" in env:
        environ["LD_PRELOAD"] = " ".join(filter(None, [environ.get("LD_PRELOAD", ""), env["LD_PRELOAD"]]))
