"""Every rank patched, or a clear error within a minute.

How ranks get the patch:

- Lightning's and Fabric's script launchers (the ``popen`` start method) start each child rank with the
  command their ``_basic_subprocess_cmd`` / ``_hydra_subprocess_cmd`` builds. nano-patch wraps those builders
  (``patches/launch_command.py``) so that the child runs ``python -m nano_patch._rank SCRIPT ARGS`` (or
  ``-m MODULE ARGS``): the patch no longer depends on the child's interpreter processing
  ``nano_patch_startup.pth``, which ``--target``/``PYTHONPATH`` installs, ``python -S``/``-I``, zipapps and
  embedded interpreters skip.
- ``spawn`` children unpickle nano-patch's strategy and patch themselves in its ``setup_environment``
  (:func:`ensure_patched`); ``fork`` children inherit the patched process.

How a rank that is not patched is caught:

1. A child started through the rank entry announces itself to the launching process's store at once
   (:func:`announce_start`, in a thread, before the script's own start-up). The launching process waits
   for its children's announcements before it enters ``init_process_group`` (:func:`await_started_ranks`):
   a child that does not announce within ``NANO_PATCH_RANK_START_TIMEOUT`` seconds (30) is one that runs
   the script without nano-patch, as a separate single-process job, and would leave the launcher waiting
   in ``init_process_group`` for torch's 30-minute default. The launcher stops its children and raises
   :class:`RankPatchError` naming the rank, what it lacked, the cause it can read from the child's command
   line and environment, and the fix.
2. Right after ``init_process_group``, before the first collective, every rank writes a small record
   (patched or not, nano-patch's version, the options in force, how it was patched) to the process group's
   store and reads everyone's (:func:`check_records`). Any difference fails every rank with the same
   message.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import site
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from .. import config
from .._version import __version__

log = logging.getLogger("nano_patch")
#: The package's folder (``nano_patch/``), where this interpreter imports it from.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The module a launcher runs in each child rank: ``python -m nano_patch._rank (SCRIPT | -m MODULE) [ARGS]``.
RANK_ENTRY = "nano_patch._rank"
#: Seconds a launching process waits for a started child to announce itself (not a patch option).
START_TIMEOUT_ENV = "NANO_PATCH_RANK_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 30.0
#: Seconds every rank waits for the others' records once the process group is up (all are running by then).
RECORD_TIMEOUT = 45.0
_KEY = "nano_patch/"

#: How this process got the patch: "rank entry", ".pth hook", "patch_torch()" (set when it happens).
patched_by: str | None = None
_announcer: threading.Thread | None = None


class RankPatchError(RuntimeError):
    """A rank runs without nano-patch, or with other options than rank 0: the run is stopped on every rank."""


FIX = ("Fix: start the run with `nano-patch run ...` (or call nano_patch.patch_torch(...) at the top of the "
       "script) and let Lightning's launcher start the ranks: nano-patch then starts each with "
       "`python -m nano_patch._rank`. A rank started by other means needs nano-patch installed where its "
       "interpreter processes .pth files (pip install, --user or editable, not --target/PYTHONPATH), "
       "without -S/-I, and the launcher's environment (_NANO_PATCH_STARTUP).")


# -- the child's command ----------------------------------------------------------------------------------------


def child_command(command: list[str] | tuple[str, ...]) -> list[str]:
    """Lightning's child command ``[python, SCRIPT | -m MODULE, ARGS...]`` run through the rank entry."""
    command = list(command)
    if RANK_ENTRY in command[1:3]:
        return command
    return [command[0], "-m", RANK_ENTRY, *command[1:]]


def basic_command(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Around Lightning's ``_basic_subprocess_cmd``: the command it builds, through the rank entry."""
    return child_command(wrapped(*args, **kwargs))


def hydra_command(wrapped: Any, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[list[str], Any]:
    """Around Lightning's ``_hydra_subprocess_cmd``: the command it builds, through the rank entry, and its folder."""
    command, cwd = wrapped(*args, **kwargs)
    return child_command(command), cwd


# -- in the child ----------------------------------------------------------------------------------------------


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def announce_start() -> None:
    """Tell the launching process (through its store at MASTER_ADDR:MASTER_PORT) that this child rank started
    through nano-patch. Runs in a thread: the script's own start-up goes on meanwhile. Whether it is patched
    as rank 0 is, every rank checks once the process group is up (:func:`check_records`)."""
    global _announcer
    local, port, host = _env_int("LOCAL_RANK"), _env_int("MASTER_PORT"), os.environ.get("MASTER_ADDR")
    if not local or port is None or not host or _announcer is not None:
        return
    key = f"{_KEY}started/{os.environ.get('NODE_RANK', '0')}/{local}"
    value = str(os.getpid())
    _announcer = threading.Thread(target=_announce, args=(host, port, key, value), name="nano-patch-announce",
                                  daemon=True)
    _announcer.start()


def _announce(host: str, port: int, key: str, value: str) -> None:
    try:
        from torch.distributed import TCPStore

        store = TCPStore(host, port, None, False, timedelta(seconds=5 * start_timeout()), wait_for_workers=False)
        store.set(key, value)
    except Exception as exc:  # noqa: BLE001 - the launching process reports a child that never announced
        log.debug("nano-patch: could not announce this rank: %s", exc)


def start_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT)))
    except ValueError:
        return DEFAULT_START_TIMEOUT


def ensure_patched() -> None:
    """In a rank that the launcher's strategy reached unpatched (a ``spawn`` child whose interpreter skipped the
    .pth hook): patch it with the launcher's options, which it inherited in ``_NANO_PATCH_STARTUP``."""
    global patched_by
    if config.in_force() is not None or config.STARTUP_ENV not in os.environ:
        return
    config.patch_process(config.from_json(os.environ[config.STARTUP_ENV] or "{}"))
    patched_by = "nano-patch's strategy (spawn)"


def _install_cause() -> str:
    """Why this interpreter would skip ``nano_patch_startup.pth``, as far as it can tell."""
    if sys.flags.no_site or sys.flags.isolated:
        return "its interpreter runs with -S or -I, which skip site processing and so .pth files"
    home = os.path.dirname(PACKAGE_DIR)
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    if not any(os.path.abspath(s) == home for s in sites) and not _editable_here():
        return (f"its interpreter did not process nano_patch_startup.pth: nano-patch is imported from {home}, "
                "not a site directory, and --target/PYTHONPATH installs skip .pth files")
    return "its interpreter did not process nano_patch_startup.pth"


def _editable_here() -> bool:
    return any(os.path.isfile(os.path.join(s, "nano_patch_startup.pth")) for s in site.getsitepackages())


def local_record() -> dict[str, Any]:
    """This process as the other ranks see it: patched or not, version, options, how, and why not."""
    in_force = config.in_force()
    patched = in_force is not None
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "version": __version__,
        "patched": patched,
        "options": _jsonable(dataclasses.asdict(in_force)) if in_force is not None else None,
        "how": (patched_by or "patch_torch()") if patched else None,
        "executable": sys.executable,
    }
    if not patched:
        if config.STARTUP_ENV not in os.environ:
            record["cause"] = (f"its environment lacks {config.STARTUP_ENV}, the variable nano-patch sets for the "
                               "processes it starts, and it did not call patch_torch()")
        else:
            record["cause"] = _install_cause()
    return record


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# -- in the launching process, before init_process_group -------------------------------------------------------


def await_started_ranks(strategy: Any) -> None:
    """In a process whose launcher just started child ranks: wait until each announced itself, else stop them
    all and raise :class:`RankPatchError` (it would otherwise wait in ``init_process_group`` for a rank that
    trains alone)."""
    import torch.distributed as dist

    launcher = getattr(strategy, "_launcher", None)
    procs = list(getattr(launcher, "procs", None) or [])
    env = getattr(strategy, "cluster_environment", None)
    if not procs or env is None or (dist.is_available() and dist.is_initialized()):
        return
    if config.in_force() is None:
        # TorchNano/@nano in a process that did not patch: its children are not started through the rank entry
        # and run unpatched alike; the record check after init_process_group sees that they agree.
        return
    timeout = start_timeout()
    try:
        store = dist.TCPStore(env.main_address, int(env.main_port), None, env.global_rank() == 0,
                              timedelta(seconds=timeout), wait_for_workers=False, multi_tenant=True)
    except Exception as exc:  # noqa: BLE001 - e.g. another node's rank 0 not up yet: the record check remains
        log.debug("nano-patch: no store to check the ranks' start on: %s", exc)
        return
    # The store's server lives as long as this object: keep it for init_process_group, which reuses it.
    strategy._nano_start_store = store
    node = env.node_rank()
    waiting = {i + 1: proc for i, proc in enumerate(procs)}
    seen = {local: _read_process(proc) for local, proc in waiting.items()}  # while the children still exist
    start = time.monotonic()
    # A child whose command runs the rank entry announces first thing; if it has not yet, it is slow (a loaded
    # machine), not unpatched: it gets longer. The others can only announce from the .pth hook.
    limits = {local: timeout * (4 if RANK_ENTRY in seen[local][0] else 1) for local in waiting}
    while waiting:
        late = []
        for local, proc in list(waiting.items()):
            if store.check([f"{_KEY}started/{node}/{local}"]):
                del waiting[local]
            elif proc.poll() is not None or time.monotonic() - start > limits[local]:
                late.append(local)  # ended without announcing (it failed, or ran the script alone), or too late
        if late:
            for local in late:
                if waiting[local].poll() is None:  # the environment it runs with now, past any exec
                    seen[local] = _read_process(waiting[local])
            message = _never_announced(strategy, {k: (waiting[k], seen[k]) for k in late}, time.monotonic() - start)
            stop_children(procs)
            raise RankPatchError(message)
        if waiting:
            time.sleep(0.05)


def _read_process(proc: Any) -> tuple[list[str], dict[str, str] | None]:
    """A child's command line and environment (Linux /proc; else the command it was given)."""
    command = [str(a) for a in (proc.args if isinstance(proc.args, (list, tuple)) else [proc.args])]
    environ: dict[str, str] | None = None
    try:
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            environ = dict(e.decode(errors="replace").partition("=")[::2] for e in f.read().split(b"\0") if e)
    except OSError:
        pass
    return command, environ


def _global_rank(strategy: Any, local: int) -> int:
    return strategy.cluster_environment.node_rank() * strategy.num_processes + local


def _never_announced(strategy: Any, waiting: dict[int, tuple[Any, tuple]], timeout: float) -> str:
    lines = []
    for local, (proc, (command, environ)) in waiting.items():
        rank = _global_rank(strategy, local)
        code = proc.poll()
        if code is None:
            what = (f"did not register with the launching rank within {timeout:.0f} s, so it runs the script "
                    "unpatched, as a separate single-process job that never joins this run")
        elif code == 0:
            what = ("ran the script to its end without registering with the launching rank: it ran unpatched, as a "
                    "separate single-process job")
        else:
            what = f"ended with status {code} before it registered with the launching rank (its error is above)"
        lines.append(f"nano-patch: rank {rank} (pid {proc.pid}) did not start with nano-patch: it {what}. "
                     f"Cause: {_child_cause(command, environ, code)}.")
    return "\n".join([*lines, FIX, "The run is stopped on every rank."])


def _child_cause(command: list[str], environ: dict[str, str] | None, code: int | None = None) -> str:
    """What the child lacked, read from its command line, environment and exit status."""
    shown = " ".join(command[:6]) + (" ..." if len(command) > 6 else "")
    flags = []  # the interpreter's own options: those before the script or -m
    for arg in command[1:]:
        if not arg.startswith("-") or arg in ("-m", "-c"):
            break
        flags.append(arg)
    if RANK_ENTRY in command and code:
        return (f"it was started as `{shown}`, and its interpreter could not run nano-patch's rank entry or the "
                "script (its error is above; `No module named nano_patch._rank`: it imports another nano-patch "
                "install, or none)")
    if RANK_ENTRY in command:
        return (f"it was started as `{shown}` but did not get through nano-patch's rank entry in time (a very slow "
                f"start: raise {START_TIMEOUT_ENV})")
    parts = [f"it was started as `{shown}`, without nano-patch's rank entry (-m {RANK_ENTRY}): something other "
             "than nano-patch built the command"]
    if environ is not None and config.STARTUP_ENV not in environ:
        parts.append(f"its environment lacks {config.STARTUP_ENV}, so nothing patched it")
    elif any(f in ("-S", "-I") or (not f.startswith("--") and f[1:].isalpha() and ("S" in f or "I" in f))
             for f in flags):
        parts.append("its interpreter runs with -S or -I, which skip nano_patch_startup.pth")
    else:
        parts.append(_install_cause().replace("its interpreter", "the interpreter"))
    return "; ".join(parts)


def stop_children(procs: list[Any], grace: float = 3.0, patience: float = 0.0) -> None:
    """End the child ranks this process started: let them end by themselves for ``patience`` seconds (they
    raise the same error), then SIGTERM, then SIGKILL after ``grace`` seconds; reap them."""
    deadline = time.monotonic() + patience
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - still running: kill it
            proc.kill()
            proc.wait()


# -- every rank, right after init_process_group ----------------------------------------------------------------


def check_records(strategy: Any) -> None:
    """Exchange :func:`local_record` over the process group's store; raise the same error on every rank if any
    rank differs from rank 0 in being patched, version or options."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"{_KEY}record/{rank}", json.dumps(local_record()))
    keys = [f"{_KEY}record/{r}" for r in range(world)]
    start = time.monotonic()
    missing = keys
    while missing and time.monotonic() - start < RECORD_TIMEOUT:
        missing = [k for k in missing if not store.check([k])]
        if missing:
            time.sleep(0.05)
    if missing:
        ranks = ", ".join(k.rsplit("/", 1)[1] for k in missing)
        message = (f"nano-patch: rank {ranks} joined the process group but did not check in within "
                   f"{RECORD_TIMEOUT:.0f} s: it runs Lightning's own strategy, not nano-patch's, so it is not "
                   f"patched.\n{FIX}\nThe run is stopped on every rank.")
    else:
        records = [json.loads(store.get(k)) for k in keys]
        message = mismatch_message(records)
    if message:
        procs = list(getattr(getattr(strategy, "_launcher", None), "procs", None) or [])
        if procs:
            stop_children(procs, patience=10.0)
        raise RankPatchError(message)


def mismatch_message(records: list[dict[str, Any]]) -> str | None:
    """One message naming every rank that differs from rank 0, or None when all agree."""
    first = records[0]
    lines = []
    for rank, r in enumerate(records):
        if rank == 0 or _same(r, first):
            continue
        where = f"rank {rank} (pid {r.get('pid')} on {r.get('host')})"
        if r.get("patched") != first.get("patched"):
            lacking, having = (r, first) if not r.get("patched") else (first, r)
            lacking_rank = rank if lacking is r else 0
            lines.append(f"nano-patch: rank {lacking_rank} runs without nano-patch's patches while rank "
                         f"{rank if lacking_rank == 0 else 0} runs them (via {having.get('how')}). "
                         f"Cause: {lacking.get('cause', 'unknown')}.")
        elif r.get("version") != first.get("version"):
            lines.append(f"nano-patch: {where} runs nano-patch {r.get('version')} with {r.get('executable')}, rank 0 "
                         f"runs {first.get('version')} with {first.get('executable')}: the ranks import different "
                         "installs.")
        else:
            diff = {k: (first["options"].get(k), v) for k, v in (r.get("options") or {}).items()
                    if first["options"].get(k) != v}
            shown = ", ".join(f"{k}={a!r} on rank 0 but {b!r}" for k, (a, b) in diff.items())
            lines.append(f"nano-patch: {where} runs with other options than rank 0: {shown}.")
    if not lines:
        return None
    return "\n".join([*lines, FIX, "The run is stopped on every rank."])


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("patched", "version", "options"))
