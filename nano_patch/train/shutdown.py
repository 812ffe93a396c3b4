"""How a multi-instance run ends: the process group is destroyed after a clean finish, never after a failure.

Lightning destroys the process group at exit only for NCCL. With gloo nobody does, and gloo's threads
are then torn down during interpreter shutdown, which can end a finished rank with
``terminate called without an active exception`` and SIGABRT (pytorch/pytorch#190489). Every rank
that exits normally therefore destroys the group from an ``atexit`` handler, with Lightning's own
``_destroy_dist_connection``, unless an exception was seen: a failed rank must not wait in a
collective (the torchtitan rule). Ranks started by ``multiprocessing`` (spawn, fork) end with
``os._exit``, which runs neither ``atexit`` nor C++ destructors, so they need nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nano_patch")

_failed = False
_handlers: set[Callable[[], None]] = set()  # registered at exit
_hooked = False
_waited = False
_strategies: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def watch(strategy: Any) -> None:
    """Called by the nano strategies in ``setup_environment``: destroy the group at a clean exit."""
    _strategies.add(strategy)
    _at_exit_once(_at_exit)


def destroy_at_clean_exit() -> None:
    """Called by the patched ``Trainer.fit`` whatever its strategy (Lightning's own ``ddp`` too, whose gloo group
    Lightning leaves to interpreter shutdown, with the same SIGABRT): destroy the default process group at a
    clean exit. Nothing else of :func:`watch`: no wait for child ranks, so the exit status stays stock's."""
    _at_exit_once(destroy_after_clean_finish)


def _at_exit_once(handler: Callable[[], None]) -> None:
    """Run ``handler`` at exit (registered once), with uncaught exceptions marking this process failed."""
    with _lock:
        if handler in _handlers:
            return
        _handlers.add(handler)
        _note_uncaught_exceptions()
        atexit.register(handler)


def _note_uncaught_exceptions() -> None:
    """An uncaught exception marks this process failed (called once, holding ``_lock``)."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        mark_failed()
        previous(kind, value, tb)

    sys.excepthook = excepthook


def _at_exit() -> None:
    destroy_after_clean_finish()
    if _failed:
        return
    failures = wait_for_child_ranks()
    if failures:
        # Lightning's own watcher would have ended this rank had it still been running: end it non-zero.
        for pid, status in failures:
            print(f"nano-patch: rank process {pid} ended with status {status}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def mark_failed() -> None:
    """An exception ended (or is ending) this rank's training: leave the process group alone."""
    global _failed
    _failed = True


def failed() -> bool:
    return _failed


def destroy_after_clean_finish() -> None:
    """Destroy the default process group if one is up and no exception was seen in this process."""
    if _failed:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        from lightning_fabric.utilities.distributed import _destroy_dist_connection
    except ImportError:  # only the `lightning` package is installed
        try:
            from lightning.fabric.utilities.distributed import _destroy_dist_connection
        except ImportError:
            _destroy_dist_connection = dist.destroy_process_group
    with contextlib.suppress(Exception):  # never turn a finished run into a failed one at exit
        _destroy_dist_connection()


def wait_for_child_ranks(timeout: float = 300.0) -> list[tuple[int, int | None]]:
    """Wait for the ranks this process started by re-running the script; return (pid, status) of failures.

    Lightning's and Fabric's script launchers do not wait for their children, so without this a rank
    that failed after rank 0 finished would go unnoticed by whoever started the run.
    """
    global _waited
    if _waited:
        return []
    _waited = True
    failures = []
    for strategy in list(_strategies):
        launcher = getattr(strategy, "launcher", None) or getattr(strategy, "_launcher", None)
        for proc in getattr(launcher, "procs", None) or []:
            try:
                code = proc.wait(timeout=timeout)
            except Exception:  # noqa: BLE001 - a hung child: report it, do not hang the launcher too
                code = None
            if code != 0:
                failures.append((proc.pid, code))
    return failures
