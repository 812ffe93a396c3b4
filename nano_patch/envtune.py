"""``nano-patch init``: environment settings for CPU training on this machine.

Only settings that exist here are printed: an allocator is preloaded only when its library is found.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex
from collections.abc import Mapping, MutableMapping

from . import sysinfo

#: Where `nano-patch init` keeps the values it overwrote, for `nano-patch init --unset`.
SAVED_ENV = "_NANO_PATCH_INIT_SAVED"

ALLOCATORS = (
    # tcmalloc first: it measured faster than jemalloc on the training benchmark (docs/benchmarks.md).
    ("tcmalloc", ("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "/usr/lib/libtcmalloc.so.4"), {}),
    ("jemalloc", ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"),
     {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                     "dirty_decay_ms:-1,muzzy_decay_ms:-1"}),
)


def find_allocator() -> tuple[str, str, dict[str, str]] | None:
    for name, paths, extra in ALLOCATORS:
        for pattern in paths:
            for path in glob.glob(pattern):
                if os.path.exists(path):
                    return name, path, extra
    return None


def _torch_uses_intel_openmp() -> bool:
    # Looked up on disk: importing torch would cost seconds in every shell that evals `nano-patch init`.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(glob.glob(os.path.join(d, "lib", "libiomp5*")) for d in spec.submodule_search_locations)


def settings() -> tuple[dict[str, str], list[str]]:
    """(variables, notes) for this machine: only settings that exist here and that measured as helping."""
    import psutil

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    usable = len(sysinfo.affinity_cpus())
    # One OpenMP thread per physical core this process may use: SMT siblings only contend for the FPUs.
    env = {"OMP_NUM_THREADS": str(min(cores, usable))}
    notes = []
    if _torch_uses_intel_openmp():
        # Intel OpenMP spins 200 ms after each parallel region by default, stealing cores from data workers.
        env.update(KMP_BLOCKTIME="1", KMP_AFFINITY="granularity=fine,compact,1,0")
    alloc = find_allocator()
    if alloc is None:
        notes.append("no tcmalloc or jemalloc found (apt-get install libgoogle-perftools4); LD_PRELOAD left alone")
    else:
        name, path, extra = alloc
        env["LD_PRELOAD"] = path
        env.update(extra)
        notes.append(f"preloading {name} from {path}")
    return env, notes


def shell_lines(unset: bool = False, environ: Mapping[str, str] | None = None) -> str:
    """``export`` lines for ``eval``; with ``unset``, lines that put back what the last init overwrote."""
    environ = os.environ if environ is None else environ
    env, notes = settings()
    lines = [f"# nano-patch init: {n}" for n in notes]
    if unset:
        saved = json.loads(environ.get(SAVED_ENV, "{}"))
        for k in sorted(set(env) | set(saved)):
            lines.append(f"export {k}={shlex.quote(saved[k])}" if k in saved else f"unset {k}")
        lines.append(f"unset {SAVED_ENV}")
        return "\n".join(lines)
    # A second init keeps the values from before the first.
    saved = json.loads(environ[SAVED_ENV]) if SAVED_ENV in environ else {k: environ[k] for k in env if k in environ}
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(f"export {SAVED_ENV}={shlex.quote(json.dumps(saved))}")
    return "\n".join(lines)


def apply_to(environ: MutableMapping[str, str]) -> None:
    """``nano-patch run --tune-env``: the same settings, for the program about to run and its children."""
    env, _ = settings()
    for k, v in env.items():
        if k == "LD_PRELOAD":
            continue  # only takes effect in a new process; children inherit it below
        environ.setdefault(k, v)
    if "LD_PRELOAD" in env and env["LD_PRELOAD"] not in environ.get("LD_PRELOAD", "").split():
        environ["LD_PRELOAD"] = " ".join(filter(None, [environ.get("LD_PRELOAD", ""), env["LD_PRELOAD"]]))


def needs_reexec(environ: Mapping[str, str]) -> bool:
    """True when an allocator should be preloaded and this process started without it."""
    env, _ = settings()
    return "LD_PRELOAD" in env and env["LD_PRELOAD"] not in environ.get("LD_PRELOAD", "").split()
