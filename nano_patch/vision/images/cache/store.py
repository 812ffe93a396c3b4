"""One store of decoded images, opened separately in every process: get, put, and what a fork needs.

Every image view is checked against the data file's current size before it is made, and every entry's
header and key material on every read (a failed entry switches the cache off for the run and marks the
store to be rebuilt).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import opening, verify
from .disk import SPACE_RESERVE, StoreDamaged, StoreRefused, check_directory, folder_lock, free_space
from .entries import FORMAT_KEY, STORE_NAME, digest, encode_entry, parse_entry
from .environ import warn_once
from .fill import FillBudget
from .keys import RacyMaterial
from .mapped import Gate, StoreFile


class Store:
    """One LMDB store of decoded images in a private folder, opened separately in every process.

    ``get`` returns a read-only view or None; ``put`` adds an entry unless the store is full, out of
    disk space or unwritable (then it stops adding, with one warning). Nothing here raises into the
    caller: a store that fails is switched off for the process, and the image is decoded as usual.

    Threads: ``get``, ``put``, ``env``, ``accepting`` and ``close_for_fork`` may be called from several
    threads at once. Opening is serialised by ``_open_lock``; ``put`` by ``_write_lock``; memory in
    LMDB's map is only touched under ``_gate`` held shared, and the environment is only closed or
    re-mapped with it held alone. Each thread keeps its own read transaction.
    """

    def __init__(self, folder: Path, cap: int, explicit: bool = True) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STORE_NAME
        self.cap = int(cap)
        #: the cap was asked for (a SIZE): else the cap the store was created with is used, so that every
        #: process maps the store at one size (LMDB keeps the largest, and makes the others re-map)
        self.explicit = explicit
        self.off: str | None = None  # why this process does not use the store
        self.full = False  # the cap (or the map an address-space limit allowed) was reached
        self.no_writes: str | None = None  # why this process adds no more entries
        self._opened: tuple[int, Any] | None = None  # (pid, environment or None when off), set in one store
        self._txns: dict[int, Any] = {}  # thread -> its kept read transaction (aborted before a fork)
        self._pixels = StoreFile(self.path / "data.mdb")
        self._kept = False  # the store was refused, not damaged: say that it is left as it is
        #: under ``--fast``: how many misses the batch path stores (``fill.py``); None: every one
        self.fill_budget: FillBudget | None = None
        self.reset_locks()

    def reset_locks(self) -> None:
        """In a forked child: fresh locks (one another thread held at the fork would stay held forever)."""
        self._open_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._txns_lock = threading.Lock()
        self._gate = Gate()
        self._pixels.reset_after_fork()

    def opened_env(self) -> Any:
        """The environment this process has opened, or None (this never opens one)."""
        opened = self._opened
        return opened[1] if opened is not None and opened[0] == os.getpid() else None

    def holds_handles(self) -> bool:
        """An LMDB environment or read transaction of this store is open in this process (or was inherited)."""
        opened = self._opened
        return (opened is not None and opened[1] is not None) or bool(self._txns)

    def _is_current(self, env: Any) -> bool:
        opened = self._opened
        return opened is not None and opened[1] is env

    # -- opening

    def env(self) -> Any:
        """This process's LMDB environment, opened (and checked) on first use here; None when off."""
        opened = self._opened
        if opened is not None and opened[0] == os.getpid():
            return opened[1]
        with self._open_lock:
            opened = self._opened
            if opened is not None and opened[0] == os.getpid():
                return opened[1]
            with self._txns_lock:
                self._txns = {}
            env = None
            if self.off is None:
                try:
                    env = self._open()
                except StoreDamaged as exc:  # a rebuild failed too
                    self.off = str(exc)
            if env is not None:
                with self._gate.alone():  # the kept file descriptor is swapped: no view is being made
                    self._pixels.opened()
            self._opened = (os.getpid(), env)
        if env is None and self.off:
            kept = "; the run goes on uncached, and the store is left as it is" if self._kept else ""
            warn_once(f"off:{self.folder}", f"decoded-image cache off for this run: {self.off}{kept}")
        return env

    def _open(self) -> Any:
        try:
            import lmdb
        except ImportError:
            self.off = "the lmdb package is not installed (pip install lmdb)"
            return None
        try:
            why = check_directory(self.folder)
            if why is not None:
                self.off = f"refused the cache folder: {why}"
                return None
            with folder_lock(self.folder):
                try:
                    env, self.cap = opening.open_checked(lmdb, self.path, self.cap, self.explicit)
                except StoreDamaged as exc:
                    self._discard(str(exc))
                    env, self.cap = opening.open_checked(lmdb, self.path, self.cap, self.explicit)
                if env is not None:
                    with contextlib.suppress(lmdb.Error):
                        env.reader_check()  # slots of readers that were killed
        except StoreRefused as exc:
            self.off, self._kept = str(exc), self.path.exists()
            return None
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                self.off = f"{self.folder} is read-only ({exc.strerror})"
            elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.off = f"no space left on the disk of {self.folder}"
            else:
                self.off = f"cannot open the store in {self.folder}: {exc}"
            self._kept = self.path.exists()
            return None
        return env

    def _discard(self, why: str) -> None:
        """Move the damaged store aside, remove it, and say so once; a fresh one is made next."""
        try:
            verify.discard(self.path, "discarded")
        except OSError as exc:
            raise StoreDamaged(f"the store was damaged ({why}) and could not be moved aside: {exc}") from exc
        warn_once(f"rebuilt:{self.folder}", f"the decoded-image cache in {self.path} was damaged ({why}): "
                                            "discarded, and a new one is being built")

    # -- reading

    def _read_txn(self, env: Any, fresh: bool = False) -> Any:
        me = threading.get_ident()
        txn = self._txns.get(me)
        if fresh and txn is not None:
            txn.abort()
            txn = None
        if txn is None:
            txn = env.begin(buffers=True)
            with self._txns_lock:
                self._txns[me] = txn
        return txn

    def get(self, material: bytes) -> np.ndarray | None:
        """The decoded image stored for ``material`` (a read-only array over the store), or None."""
        for _ in range(2):
            env = self.env()
            if env is None:
                return None
            self._gate.acquire_shared()
            try:
                if not self._is_current(env):  # closed or re-mapped by another thread meanwhile
                    continue
                a, problem = self._get(env, material)
            finally:
                self._gate.release_shared()
            if problem is None:
                return a
            # what needs the environment alone, with this thread's hold on it let go first
            if problem == "resized":
                self._adopt_map_size(env)
                continue
            self._switch_off(problem.partition(":")[2])
            return None
        return None

    def _get(self, env: Any, material: bytes) -> tuple[np.ndarray | None, str | None]:
        """The lookup, with the gate held shared: (the image or None, None) or (None, what went wrong)."""
        import lmdb

        key = digest(material)
        value = None
        for fresh in (False, True):
            try:
                # A miss on the kept snapshot is tried once more on a fresh one: another process may
                # have added the image since the snapshot began.
                value = self._read_txn(env, fresh=fresh).get(key)
            except lmdb.MapResizedError:
                return None, "resized"
            except lmdb.Error as exc:
                return None, f"off:reading failed ({type(exc).__name__}: {exc})"
            if value is not None:
                break
        if value is None:
            return None, None
        # Before a byte of it is read: the whole value must lie inside the data file as it is now. A
        # recorded size that runs past its end (damage) would raise SIGBUS on the first byte beyond.
        start = self._pixels.locate(value) if len(value) else None
        if start is not None and not self._pixels.holds(start + len(value)):
            self._mark_damaged(env)
            return None, "damaged:an entry points outside the data file: the store is damaged, and is rebuilt next run"
        entry = parse_entry(value, material)
        if entry is None:
            self._mark_damaged(env)
            return None, "damaged:an entry failed its check: the store is damaged, and is rebuilt next run"
        offset, shape = entry
        length = math.prod(shape)
        if len(value) > 4096 and start is not None:
            # The value's own pages are never rewritten (entries are only added), so it can be read where
            # the file holds it, through this process's own map of the file, which outlives LMDB's.
            a = self._pixels.view(start + offset, length)
            if a is not None:
                return a.reshape(shape), None
        # small values live inside B-tree pages, which later writes reuse: copied
        return np.frombuffer(value, np.uint8, length, offset).reshape(shape).copy(), None

    def _adopt_map_size(self, env: Any) -> None:
        """Another process mapped the store larger (a larger explicit cap): map it at that size too."""
        import lmdb

        failed = None
        with self._gate.alone():
            if not self._is_current(env):
                return
            self._abort_txns()
            try:
                env.set_mapsize(0)
            except lmdb.Error as exc:  # ENOMEM under an address-space limit: LMDB is left without a map
                failed = exc
        if failed is not None:
            self._switch_off(f"cannot re-map the store ({failed}); it is kept")

    def _abort_txns(self) -> None:
        with self._txns_lock:
            txns, self._txns = self._txns, {}
        for txn in txns.values():
            with contextlib.suppress(Exception):
                txn.abort()

    def close_for_fork(self) -> None:
        """Before a fork: end this process's transactions and close its environment (both sides reopen it
        when they next need it). LMDB must not be used across a fork, and py-lmdb refuses a second open
        of a store that a child inherited open. Views stay valid: they map the file, not LMDB."""
        with self._open_lock:
            self._close_locked()

    def hold_across_fork(self) -> None:
        """The fork hook's :meth:`close_for_fork`: the opening lock stays held until :meth:`release_after_fork`
        (in the parent; the child makes fresh locks), so that no thread opens the store before the fork."""
        self._open_lock.acquire()
        self._close_locked()

    def release_after_fork(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._open_lock.release()

    def _close_locked(self) -> None:
        opened = self._opened
        if opened is None or opened[0] != os.getpid() or opened[1] is None:
            return
        with self._gate.alone():
            self._abort_txns()
            with contextlib.suppress(Exception):
                opened[1].close()
            self._opened = None

    # -- writing

    @property
    def accepting(self) -> bool:
        """New entries are still added (not full, not out of disk space, not switched off)."""
        return not self.full and self.no_writes is None and self.off is None

    def put(self, material: bytes, a: np.ndarray) -> bool:
        """Add the decoded image ``a`` under ``material``; False when nothing was added.

        Not added either: an image of a file whose timestamps are too recent to tell a later rewrite
        from this content (see :func:`key_material`): it is served, and cached on a later read.
        """
        if not self.accepting or isinstance(material, RacyMaterial):
            return False
        value = encode_entry(material, a)
        with self._write_lock:
            for _ in range(2):
                if not self.accepting:
                    return False
                env = self.env()
                if env is None:
                    return False
                # Growth is written with pwrite (an error, not a fault, when the disk is full); the reserve
                # keeps the cache from taking the disk's last bytes from everything else.
                if free_space(self.path) < len(value) + SPACE_RESERVE:
                    self._stop_writes(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
                    return False
                outcome = self._put(env, material, value)
                if outcome == "resized":
                    self._adopt_map_size(env)
                    continue
                return outcome == "added"
        return False

    def _put(self, env: Any, material: bytes, value: bytes) -> str:
        import lmdb

        self._gate.acquire_shared()
        try:
            if not self._is_current(env):
                return "closed"
            try:
                with env.begin(write=True) as txn:
                    return "added" if txn.put(digest(material), value, overwrite=False) else "present"
            except lmdb.MapResizedError:
                return "resized"
            except lmdb.MapFullError:
                self.full = True
                return "full"
            except lmdb.Error as exc:
                self._stop_writes(exc)
                return "failed"
        finally:
            self._gate.release_shared()

    def _stop_writes(self, exc: Exception) -> None:
        # LMDB reports a full disk as an I/O error of the commit; the free space tells which it was.
        if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free_space(self.path) < SPACE_RESERVE:
            self.no_writes = f"no space left on the disk of {self.folder}"
        else:
            self.no_writes = f"writing failed ({type(exc).__name__}: {exc})"
        warn_once(f"nowrite:{self.folder}", f"decoded-image cache: {self.no_writes}; the run goes on, "
                                            "adding no more images to the cache")

    def _switch_off(self, why: str) -> None:
        with self._open_lock:
            self.off = why
            self._close_locked()  # views map the file itself, not LMDB: closing leaves them valid
            self._opened = (os.getpid(), None)
        warn_once(f"off:{self.folder}", f"decoded-image cache off for the rest of this run: {why}")

    @staticmethod
    def _mark_damaged(env: Any) -> None:
        # The next process to open the store checks this record first: changing it makes that process
        # rebuild the store, without deleting anything a running process may still be reading.
        with contextlib.suppress(Exception), env.begin(write=True) as txn:
            txn.put(FORMAT_KEY, b"damaged")
