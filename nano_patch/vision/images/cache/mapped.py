"""This process's own maps of a store's data file, and the gate that keeps LMDB's map in place while it is read.

Entries are only ever added: never overwritten, never deleted, and LMDB frees a value's pages only when
its key is deleted or overwritten, so the bytes of a value never change once written. That is what lets
a view outlive its read transaction and the environment itself: views map the data file with the
process's own ``mmap`` (never unmapped; valid in forked children too), not LMDB's map. (Values small
enough to sit inside a B-tree page are copied instead.) ``nano-patch cache clear`` and a rebuild rename
the store away before removing it, so a process still reading it keeps a valid mapping.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .disk import open_no_follow


class StoreFile:
    """This process's own read-only maps of a store's data file, for zero-copy views of its values.

    LMDB hands out values as memory inside its own map, which goes away when the environment is closed
    (and it must be closed before a fork). The same bytes are read here through maps of the file made
    with ``mmap``, which are never unmapped, stay valid in forked children, and never change under a
    view: a value's pages are only written once (entries are only added). Where the file cannot be
    mapped or located (not Linux, a store replaced since it was opened), values are copied instead.

    It also tells where a value LMDB handed out lies in the file (:meth:`locate`) and whether the file
    holds all of it (:meth:`holds`): a value whose recorded size runs past the end of the file would
    raise SIGBUS when read, so it is checked before anything reads it.

    Threads: the state is replaced whole under ``_lock`` (tuples, lists copied on write), and read
    without it as one attribute load, so readers never see half an update.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        #: the data file LMDB's map was opened on, kept open: its size and maps are of that very file,
        #: even after a rebuild or ``clear`` put another one in its place
        self._fd: int | None = None
        self._ino: int | None = None
        self._size = 0  # the file's size when last looked at: it only grows while the inode is the same
        self._lmdb_map: tuple[int, int, int] | None = None  # (start, end, file offset of start)
        self._maps: tuple[np.ndarray, ...] = ()  # whole-file maps, each as long as the file was when made

    def opened(self) -> None:
        """The environment was (re)opened: its map may sit elsewhere, its file may be a new one."""
        fd: int | None = None
        try:
            fd = open_no_follow(self.path, os.O_RDONLY)
            st = os.fstat(fd)
            ino, size = st.st_ino, st.st_size
        except OSError:
            if fd is not None:
                os.close(fd)
            fd, ino, size = None, None, 0
        with self._lock:
            old, self._fd = self._fd, fd
            if ino != self._ino:
                self._ino, self._maps = ino, ()  # old maps stay alive in the views made from them
            self._size = size
            self._lmdb_map = None
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old)

    def locate(self, value: Any) -> int | None:
        """The file offset of the first byte of ``value`` (memory in LMDB's map), or None if unknown."""
        addr = np.frombuffer(value, np.uint8, 1).__array_interface__["data"][0]  # no byte is read
        where = self._lmdb_map
        if where is None or not where[0] <= addr < where[1]:
            where = mapping_of(addr, self._ino)
            if where is None:
                return None
            with self._lock:
                self._lmdb_map = where
        return addr - where[0] + where[2]

    def holds(self, end: int) -> bool:
        """The data file is at least ``end`` bytes long now (looked up again only when it seems not)."""
        if end <= self._size:
            return True
        fd = self._fd
        try:
            st = os.fstat(fd) if fd is not None else None
        except OSError:
            st = None
        if st is None:
            return True  # the file cannot be looked at: the open-time check is all there is
        with self._lock:
            self._size = max(self._size, st.st_size)
        return end <= st.st_size

    def view(self, start: int, length: int) -> np.ndarray | None:
        """``length`` bytes at file offset ``start`` through this process's own map (None: copy instead)."""
        for a in reversed(self._maps):
            if start + length <= a.size:
                return a[start:start + length]
        a = self._map_file()
        if a is None or start + length > a.size:
            return None
        return a[start:start + length]

    def _map_file(self) -> np.ndarray | None:
        import mmap

        fd = self._fd
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size == 0:
                return None
            a = np.frombuffer(mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ), np.uint8)
        except (OSError, ValueError):  # ENOMEM under an address-space limit, too: copy instead
            return None
        with self._lock:
            self._maps = (*self._maps, a)
            self._size = max(self._size, a.size)
        return a

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()


def mapping_of(addr: int, ino: int | None) -> tuple[int, int, int] | None:
    """(start, end, file offset) of this process's mapping of file ``ino`` that holds ``addr``."""
    if ino is None:
        return None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                start, _, end = fields[0].partition("-")
                lo, hi = int(start, 16), int(end, 16)
                if lo <= addr < hi:
                    return (lo, hi, int(fields[2], 16)) if int(fields[4]) == ino else None
    except (OSError, ValueError, IndexError):
        return None
    return None


class Gate:
    """Many readers or one changer: gets and puts hold it shared while they touch memory in LMDB's map;
    closing or re-mapping the environment (which unmaps it) holds it alone. A plain lock and condition,
    so nothing relies on the GIL; the shared side takes only the lock (a hit pays about a microsecond)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0
        self._changing = False

    def acquire_shared(self) -> None:
        with self._lock:
            while self._changing:
                self._cond.wait()
            self._readers += 1

    def release_shared(self) -> None:
        with self._lock:
            self._readers -= 1
            if self._changing and self._readers == 0:
                self._cond.notify_all()  # the changer waiting for the last reader

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._lock:
            while self._changing:
                self._cond.wait()
            self._changing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._lock:
                self._changing = False
                self._cond.notify_all()
