"""The check before a process first reads a store, its verdict, and the discarding of a condemned store.

The store is untrusted until checked, as PIL treats a file. A short-lived child process
(:mod:`.check_child`) checks it: py-lmdb's offline verifier, which reads with ``read()``, then LMDB's own
walk and lookup of every key; a fault kills the child, not the run. Damage (the child finds it, or dies of
SIGBUS/SIGSEGV/SIGABRT) discards and rebuilds the store. The verdict is kept for the process tree (an
environment variable: DataLoader workers and launched ranks skip the check) and in the store folder,
keyed by the data file's device, inode, size and both times (any write to it changes them), for an hour.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import check_child, environ
from .disk import MAX_READERS, StoreDamaged, StoreRefused, open_no_follow, prepare_files
from .entries import CAP_KEY, FORMAT_KEY, FORMAT_VALUE

#: Deaths by these signals are faults on the store's bytes: the store is damaged. A child killed by any
#: other signal (the OOM killer's SIGKILL, a Ctrl-C) proves nothing: the store is kept, unused this run.
FAULTS = {signal.SIGBUS, signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE, signal.SIGSYS}
#: Environment: data files (device:inode) this process tree checked or made (children skip the check).
VERIFIED_ENV = "_NANO_PATCH_CACHE_VERIFIED"
#: A verdict file in the store folder: the data file's identity when it was found sound, and when.
RECORD_NAME = "verified"
#: How long a recorded verdict counts for a process outside the process tree that made it (the other
#: ranks of a run, a run started again soon after): an hour-old verdict is checked again.
RECORD_MAX_AGE_NS = 3600 * 10**9
#: The script the checking child runs (by its path, so that it imports nothing of the package).
CHILD_SCRIPT = check_child.__file__


class CheckFailed(StoreRefused):
    """The check could not say (it timed out, was killed by a signal that is not a fault, could not start)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"could not check the store: {why}")
        self.why = why


def check_store(path: Path, timeout: float | None = None) -> tuple[str, str]:
    """Check the store at ``path`` before this process reads it: ("sound" | "damaged" | "unchecked", why).

    The check runs in a short-lived child process, so that a fault on the store's bytes kills the
    child, never this process: a child that dies of SIGBUS, SIGSEGV or SIGABRT found damage. Without a
    Python to start (an embedded interpreter), the offline verifier runs here: it reads with ``read()``,
    so it cannot fault either, but the engine's own walk is skipped.
    """
    data = path / "data.mdb"
    try:
        size = data.stat().st_size
    except OSError as exc:
        return "unchecked", f"cannot read it ({exc.strerror})"
    if size < 2 * 4096:
        return "damaged", f"{size} bytes: shorter than LMDB's two meta pages"
    import lmdb

    if not sys.executable or not os.path.exists(sys.executable):
        from lmdb import verify as offline

        found = check_child.problems(offline, str(path))
        return ("damaged", found[0]) if found else ("sound", "")
    import subprocess

    lmdb_parent = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    map_size = -(-size // 1024**2) * 1024**2 + 1024**2
    # A cold disk reads the B-tree and each value's first page at random: allow for a slow one.
    timeout = timeout or 120 + 10 * size / 1e9
    try:
        proc = subprocess.run([sys.executable, "-I", CHILD_SCRIPT, lmdb_parent, str(path), str(map_size),
                               str(MAX_READERS)], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "unchecked", f"the check did not finish in {timeout:.0f} s"
    except OSError as exc:
        return "unchecked", f"cannot start the check ({exc})"
    message = proc.stdout.decode("utf-8", "replace").strip()
    if proc.returncode == check_child.SOUND:
        return "sound", ""
    if proc.returncode == check_child.DAMAGED:
        return "damaged", message
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode)
        if sig in FAULTS:
            return "damaged", f"reading it raised {sig.name}"
        return "unchecked", f"the check was killed by {sig.name}"
    if proc.returncode == check_child.UNCHECKED:
        return "unchecked", message
    last = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return "unchecked", f"the check failed ({last[0]})"


def ensure_sound(path: Path, record: bool) -> None:
    """Before this process first reads the existing store folder ``path``: back its files' pages, and
    unless a check already found its data file sound, check it (``record``: keep the verdict in the store
    folder too). :class:`StoreDamaged` if it is not sound, :class:`StoreRefused` if it cannot be used now
    (:class:`CheckFailed` if the check could not say)."""
    data_st = prepare_files(path, new=False)
    if data_st is None or recorded_sound(path, data_st):
        return
    verdict, why = check_store(path)
    if verdict == "damaged":
        raise StoreDamaged(why or "damaged")
    if verdict != "sound":
        raise CheckFailed(why)
    if record:
        record_sound(path, data_st, file=True)


def read_header(env: Any, path: Path) -> tuple[bytes | None, bytes | None, int]:
    """The opened store's format and cap records and its number of images (LMDB's own errors raised as
    they are), after the open-time check, so that reading them cannot fault. :class:`StoreDamaged` if
    the data file is shorter than the pages LMDB records."""
    info, st = env.info(), env.stat()
    size = (path / "data.mdb").stat().st_size
    recorded = (info["last_pgno"] + 1) * st["psize"]
    if size < recorded:
        raise StoreDamaged(f"truncated: {size} bytes on disk, {recorded} recorded")
    with env.begin() as txn:
        fmt, cap = txn.get(FORMAT_KEY), txn.get(CAP_KEY)
    return fmt, cap, max(0, st["entries"] - (fmt is not None) - (cap is not None))


def format_problem(fmt: bytes | None) -> str | None:
    """What is wrong with a store whose format record is ``fmt`` (None: it is this format)."""
    if fmt == FORMAT_VALUE:
        return None
    return "of an older or unknown format" if fmt is None else "of another format"


def recorded_sound(store: Path, st: os.stat_result) -> bool:
    """A check already found this data file sound: in this process tree (the environment), or recently
    with the file unchanged since (the verdict file; any write to the file, by any program, changes its
    size, modification or change time, and the change time cannot be set back)."""
    if f"{st.st_dev}:{st.st_ino}" in environ.tokens(VERIFIED_ENV):
        return True
    try:
        fd = open_no_follow(store / RECORD_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        text = os.read(fd, 256).decode("ascii", "replace").split()
    finally:
        os.close(fd)
    if len(text) != 2 or not text[1].isdigit():
        return False
    return text[0] == _file_identity(st) and 0 <= time.time_ns() - int(text[1]) < RECORD_MAX_AGE_NS


def _file_identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def record_sound(store: Path, st: os.stat_result, file: bool) -> None:
    """Remember that the data file ``st`` is sound: for this process and its children (DataLoader workers,
    ranks it launches), and in the verdict file for siblings and soon-started runs (``file``)."""
    environ.add_token(VERIFIED_ENV, f"{st.st_dev}:{st.st_ino}", keep=7)
    if not file:
        return
    tmp = store / f".{RECORD_NAME}-{os.getpid()}-{threading.get_ident()}"
    with contextlib.suppress(OSError):
        fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, f"{_file_identity(st)} {time.time_ns()}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, store / RECORD_NAME)


def discard(path: Path, label: str) -> None:
    """Rename the store folder ``path`` aside (a process still reading it keeps a valid map), forget its
    verdict (its inode may come back for another file) and remove it. ``OSError`` if it cannot be renamed."""
    aside = path.parent / f"{path.name}.{label}-{os.getpid()}-{time.time_ns()}"
    try:
        st: os.stat_result | None = (path / "data.mdb").lstat()
    except OSError:
        st = None
    os.rename(path, aside)
    if st is not None:
        environ.remove_token(VERIFIED_ENV, f"{st.st_dev}:{st.st_ino}")
    if aside.is_symlink():  # a refused store folder that is a link: remove the link, not what it points to
        aside.unlink()
    else:
        shutil.rmtree(aside, ignore_errors=True)
