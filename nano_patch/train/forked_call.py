"""Run a function in a forked child process, with a timeout, and take back its picklable result.

What the measurement of ``num_processes="auto"`` (``train/job_measure.py``) runs where the user's process must stay
as it was: whatever the function draws, counts or changes is the child's copy. A child runs one torch thread (as a
DataLoader worker does: a forked process must not start OpenMP threads its parent already used), writes nothing to
the user's terminal, counts nothing in the run report, and ends with ``os._exit``. One that is not done within the
timeout is killed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


class ChildFailed(Exception):
    """A child gave no result: it raised, died before it wrote, or ran past its time; the message says which."""


def call_in_child(work: Callable[[], Any], timeout: float, what: str) -> Any:
    """``work()`` run in a forked child; its result, which must pickle. ``what`` names the work in the errors."""
    return call_in_children([work], timeout, what)


def call_in_children(works: Sequence[Callable[[], Any]], timeout: float, what: str) -> Any:
    """Each of ``works`` run in a forked child of its own, all at the same time; the first one's result (the others'
    are not read). Every child has ended when this returns or raises :class:`ChildFailed`."""
    r, w = os.pipe()
    pids: list[int] = []
    try:
        for i, work in enumerate(works):
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(r)
                _run_child(work, w if i == 0 else None)
            pids.append(pid)
        os.close(w)
        w = -1
        data = _read_until_eof(r, timeout)
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)
        for pid in pids:
            _reap(pid)
    if data is None:
        raise ChildFailed(f"{what} took more than {timeout:.0f} s")
    try:
        status, value = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - the child died before it wrote (a crash in the user's dataset)
        raise ChildFailed(f"{what} failed: the child process ended without a result") from exc
    if status != "ok":
        raise ChildFailed(f"{what} failed: {value}")
    return value


def _run_child(work: Callable[[], Any], fd: int | None) -> NoReturn:
    """In the child: run ``work`` quietly, write ``("ok", result)`` or ``("error", why)`` to ``fd`` (where given),
    and end the process without returning."""
    try:
        _quiet()
        result: tuple[str, Any] = ("ok", work())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = ("error", f"{type(exc).__name__}: {exc}")
    if fd is not None:
        try:
            data = pickle.dumps(result)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            data = pickle.dumps(("error", f"unpicklable result: {exc}"))
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
    os._exit(0)


def _quiet() -> None:
    """In a forked child: one torch thread (OpenMP's threads belong to the parent), no output, no report counts."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    import torch

    torch.set_num_threads(1)
    from .. import report

    report.stats = None  # this child's loads are not the run's


def _read_until_eof(fd: int, timeout: float) -> bytes | None:
    """All that ``fd`` gives until every writer has closed it; None where that takes more than ``timeout``."""
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(pid: int) -> None:
    """Wait for the child ``pid``, killing it first where it is still running."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
