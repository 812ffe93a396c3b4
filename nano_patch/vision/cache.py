"""The decoded-image cache: full JPEG decodes kept in an LMDB store that every process on the machine shares.

Training reads the same files every epoch; only the first epoch needs to decode them. The dataset
patch asks :func:`store_for` for the store, looks a file up by its key, and on a miss decodes it in
full and adds the array. A hit is a read-only NumPy view of the pixels where the store's file holds
them (mapped into memory): no copy, and a planned crop reads only the window it needs.

Why LMDB: an embedded store made for exactly this (memory-mapped, zero-copy reads, readers in many
processes without locks, one writer at a time, atomic transactions that a killed writer never
leaves half-done), and a well-kept Python binding. DataLoader workers and the ranks of a
multi-instance run each open the store themselves: a process closes its LMDB environment just
before it forks (ending its read transactions first), and both sides reopen it when they next
need it. LMDB must not be used across a fork, and py-lmdb would refuse to open a store that a child
inherited open.

What an entry is: a fixed header (magic, format, dtype, channels, height, width, pixel length, the
length of the key material), the key material itself, padding, then the raw pixels. Every read
checks all of it, including that the key material equals the one looked up; nothing in the store is
ever executed or unpickled. The key is a digest of: the decoding stack (simplejpeg's and PIL's
versions), the output mode, the file's resolved path, its device, inode, size, modification and
change times. A file changed on disk gets a new key, so it is decoded again, never served stale.

Entries are only ever added: never overwritten, never deleted, and LMDB frees a value's pages only
when its key is deleted or overwritten, so the bytes of a value never change once written. That is
what lets a view outlive its read transaction and the environment itself: views map the data file
with the process's own ``mmap`` (never unmapped; valid in forked children too), not LMDB's map.
(Values small enough to sit inside a B-tree page are copied instead.) ``nano-patch cache clear`` and
a rebuild rename the store away before removing it, so a process still reading it keeps a valid
mapping.

Safety: the store is untrusted until checked, as PIL treats a file. A mapped store must never take the
process down (a read past the end of a mapped file, or a write to a page the disk cannot back, is a
SIGBUS, with no Python exception), so:
- the folder is created with mode 0700; one owned by another user, or writable by group or others,
  is refused with one warning and the run goes on uncached; so is a store folder that is a symbolic
  link or open to others, and a data or lock file that is a link, another user's, or has more than
  one name (it is never written through);
- before a process first reads an existing store, a short-lived child process checks it
  (:func:`check_store`: py-lmdb's offline verifier, which reads with ``read()``, then LMDB's own walk
  and lookup of every key); a fault kills the child, not the run. Damage (the child finds it, or dies
  of SIGBUS/SIGSEGV/SIGABRT) discards and rebuilds the store, with one warning. The verdict is kept for
  the process tree (an environment variable: DataLoader workers and launched ranks skip the check) and
  in the store folder, keyed by the data file's device, inode, size and both times (any write to it
  changes them), for an hour;
- every image view is checked against the data file's current size before it is made, and every
  entry's header and key material on every read (a failed entry switches the cache off for the run
  and marks the store to be rebuilt);
- "cannot use it now" is not damage: ENOMEM (the cap's map under an address-space limit; a smaller map
  is used when one fits), EACCES/EPERM, EROFS, ENOSPC: one warning naming the cause, the run goes on
  uncached, and the store is left as it is;
- LMDB writes its lock file through a shared map: every page of it is allocated (``fallocate``) before
  LMDB opens it, as are holes in the data file (tmpfs needs a page even to read one), so a full disk is
  an error, not a fault; a store is only created with room for it, and stops adding entries before the
  disk's last 16 MB;
- a file whose modification or change time is within the file system's timestamp granularity of now
  (one second for whole-second timestamps) is served but not cached, so that a same-size rewrite in
  the same second can never be served the old pixels (git's "racily clean" rule);
- what the store cannot detect: bytes changed inside a value (a bit flip on disk, say) that keep
  its header intact. There is no checksum over the pixels: it would cost more than the decode it saves.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import shutil
import signal
import stat
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import report

#: The store's folder inside the cache folder; a new entry format gets a new name.
STORE_NAME = "decoded-v1"
#: Written once into every store: a store without it (or with another value) is of another format.
FORMAT_KEY = b"\x00nano-patch:format"
FORMAT_VALUE = b"nano-patch decoded-image cache, entry format 1"
#: The largest cap (bytes, ASCII) any process opened the store with: LMDB keeps the largest map size.
CAP_KEY = b"\x00nano-patch:cap"
#: The cap that ``on`` means, at most; never more than half the free disk space when the store opens.
DEFAULT_CAP = 20 * 1000**3
#: Caps below this are refused: LMDB needs a few pages of its own.
MIN_CAP = 1024**2
#: ``--fast`` caches a dataset only when its estimated decoded size is at most this share of the
#: machine's memory (so that epochs read the store from the page cache, not the disk) and of the
#: free disk space (the store's own size counted as free).
AUTO_MEMORY_SHARE = 0.5
AUTO_DISK_SHARE = 0.5
#: Files whose JPEG header is read to estimate a dataset's decoded size (evenly spaced).
AUTO_SAMPLE = 200
#: Environment: warnings already given in this process tree (children inherit it and stay quiet).
WARNED_ENV = "_NANO_PATCH_CACHE_WARNED"

_ENTRY = struct.Struct("<4sBBBxIIQI")  # magic, format, dtype code, channels, pad, height, width, length, key length
_MAGIC = b"NPDI"
_ENTRY_FORMAT = 1
_UINT8 = 1
#: LMDB puts a value into its own pages after a 16-byte page header: pixels start 64-byte aligned.
_PAGE_HEADER = 16
_ALIGN = 64


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/nano-patch/decoded-images``, else ``~/.cache/nano-patch/decoded-images``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nano-patch" / "decoded-images"


def decoder_identity() -> str:
    """The decoding stack whose output the entries hold: a new version of either library means new keys."""
    import PIL

    try:
        import simplejpeg

        sj = getattr(simplejpeg, "__version__", "?")
    except ImportError:  # pragma: no cover - a declared dependency
        sj = "none"
    return f"simplejpeg {sj}; Pillow {PIL.__version__}"


# --- warnings, once per process tree --------------------------------------------------------------


#: Guards this module's read-modify-writes of ``os.environ`` (threads of one process).
_env_lock = threading.Lock()


def _warn_once(tag: str, message: str) -> None:
    """Warn unless this process or the one that started it already did for ``tag``."""
    with _env_lock:
        done = set(filter(None, os.environ.get(WARNED_ENV, "").split(",")))
        if tag in done:
            return
        os.environ[WARNED_ENV] = ",".join(sorted(done | {tag}))
    from ..registry import NanoPatchWarning

    warnings.warn(f"nano-patch: {message}", NanoPatchWarning, stacklevel=3)


# --- the folder ---------------------------------------------------------------------------------


def check_directory(path: Path, create: bool = True) -> str | None:
    """Why ``path`` may not hold a cache (it is not private to this user), or None.

    Created with mode 0700 when missing (``create``); an ``OSError`` says why it could not be.
    """
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    try:
        st = path.stat()  # the folder a symlink points to is the one that must be private
    except FileNotFoundError:
        return f"{path} does not exist"
    problem = _not_private(path, st)
    return None if problem is None else f"{problem}; make it 0700" if "writable" in problem else problem


def _not_private(path: Path, st: os.stat_result) -> str | None:
    """Why a folder with this ``stat`` is not this user's private folder, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Serialise opening, checking and rebuilding a store between processes (a flock on a file in it)."""
    import fcntl

    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- entries ------------------------------------------------------------------------------------


def _digest(material: bytes) -> bytes:
    return hashlib.blake2b(material, digest_size=20).digest()


def _pixel_offset(key_length: int) -> int:
    head = _ENTRY.size + key_length
    return head + (-(head + _PAGE_HEADER)) % _ALIGN


def encode_entry(material: bytes, a: np.ndarray) -> bytes:
    """An entry: header, key material, padding, then ``a``'s pixels (H x W or H x W x C uint8)."""
    a = np.ascontiguousarray(a)
    channels = 1 if a.ndim == 2 else int(a.shape[2])
    head = _ENTRY.pack(_MAGIC, _ENTRY_FORMAT, _UINT8, channels, a.shape[0], a.shape[1], a.nbytes, len(material))
    pad = bytes(_pixel_offset(len(material)) - len(head) - len(material))
    return b"".join((head, material, pad, a.data.cast("B")))


def parse_entry(value: Any, material: bytes) -> tuple[int, tuple[int, ...]] | None:
    """(offset of the pixels, their shape) in an entry read back for ``material``, or None if anything
    about it is wrong: magic, format, dtype, channels, sizes, total length, the key material."""
    if len(value) < _ENTRY.size:
        return None
    magic, fmt, dtype, channels, h, w, length, key_length = _ENTRY.unpack_from(value)
    if (magic != _MAGIC or fmt != _ENTRY_FORMAT or dtype != _UINT8 or channels not in (1, 3) or h <= 0 or w <= 0
            or length != h * w * channels or key_length != len(material)):
        return None
    offset = _pixel_offset(key_length)
    if len(value) != offset + length or value[_ENTRY.size:_ENTRY.size + key_length] != material:
        return None
    return offset, ((h, w) if channels == 1 else (h, w, channels))


def decode_entry(value: Any, material: bytes) -> np.ndarray | None:
    """The pixels of an entry read back for ``material`` (a view of ``value``), or None if it is wrong."""
    entry = parse_entry(value, material)
    if entry is None:
        return None
    offset, shape = entry
    return np.frombuffer(value, np.uint8, int(np.prod(shape)), offset).reshape(shape)


class _StoreFile:
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
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
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
            where = _mapping_of(addr, self._ino)
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


def _mapping_of(addr: int, ino: int | None) -> tuple[int, int, int] | None:
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


# --- the store's files: damage, refusal, space ----------------------------------------------------


class StoreDamaged(Exception):
    """The store on disk cannot be trusted: the message says what is wrong. It is discarded and rebuilt."""


class StoreRefused(Exception):
    """The store cannot be used now (permissions, a read-only disk, no space, no address space, a store
    folder or file that is not private): the run goes on uncached and the store is left as it is."""


#: Reader slots LMDB keeps in the lock file (one per process or thread reading at once).
MAX_READERS = 2048
#: The lock file's size for MAX_READERS: LMDB's header (192 bytes) and 64 bytes per slot, in whole pages.
#: LMDB writes it through a shared map: every page of it is allocated before LMDB opens it, since a
#: page that cannot be backed (a full tmpfs or ext4) would raise SIGBUS inside ``lmdb.open``.
LOCK_BYTES = -(-(192 + MAX_READERS * 64) // 4096) * 4096
#: Free space a new store needs: its lock file, its two meta pages and its first entries' pages.
CREATE_MIN_FREE = LOCK_BYTES + 64 * 1024
#: Free space left to everything else on the disk: a store stops adding entries rather than go below it.
SPACE_RESERVE = 16 * 1024**2
#: Errors that mean "cannot use it now", never "damaged".
_REFUSAL_ERRNOS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                   errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the disk",
                   errno.EDQUOT: "disk quota exceeded", errno.ENOMEM: "not enough memory or address space",
                   errno.EFBIG: "file too large for the file-size limit (ulimit -f)"}

_FALLOC_KEEP_SIZE = 1
_fallocate_fn: Any = None


def _fallocate(fd: int, offset: int, length: int, keep_size: bool = False) -> None:
    """Linux ``fallocate(2)``: allocate the blocks of a byte range (already allocated ones are kept, and
    no byte changes), so that no later write through a map of it can fault for want of space; ENOSPC
    comes back here as an ``OSError`` instead. Not ``os.posix_fallocate``: where the file system lacks
    fallocate, glibc emulates it by reading and writing back a byte per block, which would race with
    other processes writing their reader slots into the lock file."""
    global _fallocate_fn
    if _fallocate_fn is None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = getattr(libc, "fallocate64", None) or libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = False
        _fallocate_fn = fn
    if not _fallocate_fn:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not available")
    import ctypes

    if _fallocate_fn(fd, _FALLOC_KEEP_SIZE if keep_size else 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _free_space(path: Path) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _allocate(fd: int, st: os.stat_result, size: int, keep_size: bool, path: Path) -> None:
    """Make sure every block of the first ``size`` bytes of the open file is allocated (see :func:`_fallocate`).

    A file with fewer blocks than bytes has holes; on tmpfs even reading a hole through a map needs a
    page, so a full tmpfs raises SIGBUS there. Where fallocate is unsupported, the free space must at
    least cover the holes.
    """
    if st.st_blocks * 512 >= size:
        return
    try:
        _fallocate(fd, 0, size, keep_size=keep_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        if _free_space(path.parent) < size - st.st_blocks * 512 + SPACE_RESERVE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from exc


def _refusal(exc: OSError, where: Path) -> StoreRefused:
    why = _REFUSAL_ERRNOS.get(exc.errno or 0) or exc.strerror or str(exc)
    return StoreRefused(f"cannot use {where}: {why}")


# --- the open-time check, in a child process ------------------------------------------------------

#: What the child exits with: the store is sound, damaged, or could not be checked.
_SOUND, _DAMAGED, _UNCHECKED = 0, 10, 11
#: Deaths by these signals are faults on the store's bytes: the store is damaged. A child killed by any
#: other signal (the OOM killer's SIGKILL, a Ctrl-C) proves nothing: the store is kept, unused this run.
_FAULTS = {signal.SIGBUS, signal.SIGSEGV, signal.SIGABRT, signal.SIGILL, signal.SIGFPE, signal.SIGSYS}
#: Environment: data files (device:inode) this process tree checked or made (children skip the check).
VERIFIED_ENV = "_NANO_PATCH_CACHE_VERIFIED"
#: A verdict file in the store folder: the data file's identity when it was found sound, and when.
RECORD_NAME = "verified"
#: How long a recorded verdict counts for a process outside the process tree that made it (the other
#: ranks of a run, a run started again soon after): a day-old verdict is checked again.
RECORD_MAX_AGE_NS = 3600 * 10**9

_CHECK_CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
path, map_size, max_readers = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def verdict(code, message):
    sys.stdout.write(message)
    sys.stdout.flush()
    os._exit(code)
try:
    import lmdb
    from lmdb import verify as offline
except ImportError as exc:
    verdict(%(unchecked)d, "cannot check it: %%s" %% exc)
def problems():
    # py-lmdb's offline verifier reads the file with read(), never through a map: damage cannot fault
    # it. It checks both meta pages, every page reachable from the roots (the main tree and LMDB's free
    # list), their bounds and flags, that every overflow extent (an image's pages) lies inside the
    # file and matches its value's recorded size, key order, counts, and that live and free pages
    # cover the file exactly once.
    try:
        found = offline.verify(path, subdir=True)
    except offline.VerifyError as exc:
        return [str(exc)]
    return found and [found[0] + ("" if len(found) == 1 else " (and %%d more)" %% (len(found) - 1))]
def open_env(readonly):
    return lmdb.open(path, subdir=True, readonly=readonly, lock=True, map_size=map_size, max_readers=max_readers,
                     max_spare_txns=0, readahead=False, sync=False, metasync=False)
env = None
found = problems()
if found:
    # A writer in another process may have committed while the file was read: read it again while
    # holding LMDB's writer lock (no commit can happen meanwhile), and only then call it damaged.
    try:
        env = open_env(False)
        with env.begin(write=True):
            found = problems()
    except lmdb.Error:
        pass
    if found:
        verdict(%(damaged)d, found[0])
try:
    env = env or open_env(True)
except lmdb.MemoryError as exc:
    verdict(%(unchecked)d, "cannot map it to check it (%%s)" %% exc)
except lmdb.Error as exc:
    verdict(%(damaged)d, "not an LMDB store (%%s: %%s)" %% (type(exc).__name__, exc))
# Then LMDB itself, on every key: a walk of the keys and a lookup of each, as a run's reads do, so that
# whatever the engine would fault on, it faults on here, in this child. Values are not fetched: py-lmdb
# reads every page of a value it returns, which would read the whole store (the verifier has already
# checked that each value lies inside the file; a run checks each image's header when it reads it).
n = 0
with env.begin(buffers=True) as txn:
    entries = txn.stat()["entries"]
    lookup = txn.cursor()
    for key in txn.cursor().iternext(keys=True, values=False):
        n += 1
        if n > entries:
            verdict(%(damaged)d, "more keys than the %%d recorded" %% entries)
        if not lookup.set_key(bytes(key)):
            verdict(%(damaged)d, "a key the walk reaches is not found by a lookup")
    if n != entries:
        verdict(%(damaged)d, "%%d keys found, %%d recorded" %% (n, entries))
verdict(%(sound)d, "")
"""


def _check_code() -> str:
    return _CHECK_CHILD % {"sound": _SOUND, "damaged": _DAMAGED, "unchecked": _UNCHECKED}


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

        try:
            found = offline.verify(str(path), subdir=True)
        except offline.VerifyError as exc:
            found = [str(exc)]
        return ("damaged", "; ".join(found[:3])) if found else ("sound", "")
    import subprocess

    lmdb_parent = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    map_size = -(-size // 1024**2) * 1024**2 + 1024**2
    # A cold disk reads the B-tree and each value's first page at random: allow for a slow one.
    timeout = timeout or 120 + 10 * size / 1e9
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _check_code(), lmdb_parent, str(path), str(map_size),
                               str(MAX_READERS)], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "unchecked", f"the check did not finish in {timeout:.0f} s"
    except OSError as exc:
        return "unchecked", f"cannot start the check ({exc})"
    message = proc.stdout.decode("utf-8", "replace").strip()
    if proc.returncode == _SOUND:
        return "sound", ""
    if proc.returncode == _DAMAGED:
        return "damaged", message
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode)
        if sig in _FAULTS:
            return "damaged", f"reading it raised {sig.name}"
        return "unchecked", f"the check was killed by {sig.name}"
    if proc.returncode == _UNCHECKED:
        return "unchecked", message
    last = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return "unchecked", f"the check failed ({last[0]})"


def _recorded_sound(store: Path, st: os.stat_result) -> bool:
    """A check already found this data file sound: in this process tree (the environment), or recently
    with the file unchanged since (the verdict file; any write to the file, by any program, changes its
    size, modification or change time, and the change time cannot be set back)."""
    if f"{st.st_dev}:{st.st_ino}" in os.environ.get(VERIFIED_ENV, "").split(","):
        return True
    try:
        fd = os.open(store / RECORD_NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        text = os.read(fd, 256).decode("ascii", "replace").split()
    finally:
        os.close(fd)
    if len(text) != 2 or not text[1].isdigit():
        return False
    return (text[0] == _file_identity(st)
            and 0 <= time.time_ns() - int(text[1]) < RECORD_MAX_AGE_NS)


def _file_identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _record_sound(store: Path, st: os.stat_result, file: bool) -> None:
    """Remember that the data file ``st`` is sound: for this process and its children (DataLoader workers,
    ranks it launches), and in the verdict file for siblings and soon-started runs (``file``)."""
    with _env_lock:
        tokens = [t for t in os.environ.get(VERIFIED_ENV, "").split(",") if t]
        token = f"{st.st_dev}:{st.st_ino}"
        if token not in tokens:
            os.environ[VERIFIED_ENV] = ",".join([*tokens[-7:], token])
    if not file:
        return
    tmp = store / f".{RECORD_NAME}-{os.getpid()}-{threading.get_ident()}"
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, f"{_file_identity(st)} {time.time_ns()}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, store / RECORD_NAME)


def _forget_sound(st: os.stat_result | None) -> None:
    """A data file discarded or cleared by this process: its inode may come back for another file."""
    if st is None:
        return
    with _env_lock:
        token = f"{st.st_dev}:{st.st_ino}"
        tokens = [t for t in os.environ.get(VERIFIED_ENV, "").split(",") if t and t != token]
        os.environ[VERIFIED_ENV] = ",".join(tokens)


def refused_store_folder(path: Path) -> str | None:
    """Why the store folder ``path`` (or its data or lock file) may not be used, or None.

    The cache folder being private is not enough: the store folder could be a symlink to a folder
    open to others, and a data file hard-linked to another file would have that file written through.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    problem = _not_private(path, st)
    if problem is not None:
        return problem
    for name in ("data.mdb", "lock.mdb"):
        try:
            fst = (path / name).lstat()
        except FileNotFoundError:
            continue
        why = _refused_file(path / name, fst)
        if why is not None:
            return why
    return None


def _refused_file(p: Path, st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return f"{p} is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return f"{p} is not a regular file"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{p} is owned by another user (uid {st.st_uid})"
    if st.st_nlink > 1:
        return f"{p} has {st.st_nlink} links (another name would be written through)"
    return None


def _address_space() -> tuple[int, int] | None:
    """(the address-space limit, what this process already maps), or None without a limit."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    used = 0
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
                break
    return soft, used


class _Gate:
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


# --- the store ----------------------------------------------------------------------------------


@dataclass
class CacheFigures:
    """This process's cache figures for the run report."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    hit_bytes: int = 0
    stored_bytes: int = 0
    #: full decodes timed on misses: seconds and pixels, to estimate the decode time hits saved
    decode_s: float = 0.0
    decode_px: int = 0
    hit_px: int = 0


_STRUCTURAL = ("InvalidError", "VersionMismatchError", "CorruptedError", "PageNotFoundError", "IncompatibleError",
               "BadChecksumError")


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
        self._pixels = _StoreFile(self.path / "data.mdb")
        self._reset_locks()

    def _reset_locks(self) -> None:
        self._open_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._txns_lock = threading.Lock()
        self._gate = _Gate()
        self._pixels.reset_after_fork()

    # the environment and the process it was opened in, as the tests and ``describe`` read them
    @property
    def _env(self) -> Any:
        opened = self._opened
        return opened[1] if opened is not None else None

    @property
    def _pid(self) -> int | None:
        opened = self._opened
        return opened[0] if opened is not None else None

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
            _warn_once(f"off:{self.folder}", f"decoded-image cache off for this run: {self.off}{kept}")
        return env

    _kept = False  # the store was refused, not damaged: say that it is left as it is

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
            with _folder_lock(self.folder):
                try:
                    env = self._open_checked(lmdb)
                except StoreDamaged as exc:
                    self._discard(str(exc))
                    env = self._open_checked(lmdb)
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

    def _open_checked(self, lmdb: Any) -> Any:
        """Open the store (creating it if missing) and check it; :class:`StoreDamaged` if it is not sound,
        :class:`StoreRefused` if it cannot be used now. Nothing of the store is read in this process
        before the check says it is sound."""
        why = refused_store_folder(self.path)
        if why is not None:
            raise StoreRefused(f"refused the store: {why}")
        new = not self.path.exists()
        if new:
            free = _free_space(self.folder)
            if free < CREATE_MIN_FREE:
                raise StoreRefused(f"no space left on the disk of {self.folder} to create the store "
                                   f"({human_bytes(free)} free)")
            self.path.mkdir(mode=0o700)
            try:
                self._prepare_files(new=True)
            except BaseException:
                shutil.rmtree(self.path, ignore_errors=True)  # a store that cannot be created is not created
                raise
        else:
            data_st = self._prepare_files(new=False)
            if data_st is not None and not _recorded_sound(self.path, data_st):
                verdict, why = check_store(self.path)
                if verdict == "damaged":
                    raise StoreDamaged(why or "damaged")
                if verdict != "sound":
                    raise StoreRefused(f"could not check the store: {why}")
                _record_sound(self.path, data_st, file=True)
        env = self._open_env(lmdb, self._map_size())
        try:
            env = self._check(lmdb, env, new)
        except BaseException:
            with contextlib.suppress(Exception):
                env.close()  # nothing was read from it
            raise
        with contextlib.suppress(OSError):
            _record_sound(self.path, (self.path / "data.mdb").stat(), file=False)  # made or checked here
        return env

    def _prepare_files(self, new: bool) -> os.stat_result | None:
        """Refuse a data or lock file that is not this user's own single-link regular file; allocate every
        page of the lock file (LMDB writes it through a map) and any hole in the data file (on tmpfs even
        reading a hole through a map needs a page). Returns the data file's status (None if it is missing).
        """
        data_st = None
        for name in ("lock.mdb", "data.mdb"):
            p = self.path / name
            flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            if name == "lock.mdb":
                flags |= os.O_CREAT
            try:
                fd = os.open(p, flags, 0o600)
            except FileNotFoundError:
                continue  # no data file yet (a creation that stopped early): LMDB makes it
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise StoreRefused(f"refused the store: {p} is a symbolic link") from exc
                if exc.errno in _REFUSAL_ERRNOS:
                    raise _refusal(exc, p) from exc
                raise
            try:
                st = os.fstat(fd)
                why = _refused_file(p, st)
                if why is not None:
                    raise StoreRefused(f"refused the store: {why}")
                try:
                    if name == "lock.mdb":
                        _allocate(fd, st, max(st.st_size, LOCK_BYTES), keep_size=False, path=p)
                    else:
                        _allocate(fd, st, st.st_size, keep_size=True, path=p)
                        data_st = os.fstat(fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise StoreRefused(f"no space left on the disk of {self.folder} "
                                           f"({'to create the store' if new else f'to back {p}'})") from exc
                    if exc.errno in _REFUSAL_ERRNOS:
                        raise _refusal(exc, p) from exc
                    raise
            finally:
                os.close(fd)
        return data_st

    def _open_env(self, lmdb: Any, map_size: int) -> Any:
        """``lmdb.open`` at ``map_size``; under an address-space limit that leaves too little room, at the
        largest map that fits (the store is read, and filled up to that map) rather than not at all."""
        try:
            return self._lmdb_open(lmdb, map_size)
        except StoreRefused as refused:
            limit = _address_space()
            if not getattr(refused, "enomem", False) or limit is None:
                raise
            soft, used = limit
            data = store_bytes(self.folder)
            # Half of what is left, less the process's own map of the data file: the program needs room too.
            fits = (soft - used - data) // 2 // 4096 * 4096
            if fits < data + MIN_CAP:
                raise StoreRefused(self._enomem_message(soft, used)) from refused
            env = self._lmdb_open(lmdb, fits)
            _warn_once(f"smaller-map:{self.folder}", f"decoded-image cache: the address-space limit of "
                       f"{human_bytes(soft)} (ulimit -v, RLIMIT_AS; {human_bytes(used)} in use) leaves no room "
                       f"for a map of the cap, {human_bytes(map_size)}: the store is mapped at "
                       f"{human_bytes(fits)} this run (read, and filled up to that)")
            return env

    def _enomem_message(self, soft: int, used: int) -> str:
        return (f"cannot map the store: its cap of {human_bytes(self._map_size())} does not fit the address-space "
                f"limit of {human_bytes(soft)} (ulimit -v, RLIMIT_AS; {human_bytes(used)} already in use) "
                "(a smaller --cache-decoded=SIZE fits)")

    def _lmdb_open(self, lmdb: Any, map_size: int) -> Any:
        try:
            return lmdb.open(str(self.path), map_size=map_size, subdir=True, sync=False, metasync=False,
                             readahead=False, max_readers=MAX_READERS, max_spare_txns=0, mode=0o600)
        except lmdb.Error as exc:
            raise self._classify(exc) from exc

    def _classify(self, exc: Exception) -> Exception:
        """An LMDB error opening the store: :class:`StoreDamaged` only for structural damage; the rest
        (ENOMEM, EACCES, EPERM, EROFS, ENOSPC, ...) mean "cannot use it now"."""
        text = str(exc)
        if "already open" in text:  # by other code of this process: not damage, just not ours
            return OSError(errno.EBUSY, text)
        if type(exc).__name__ in _STRUCTURAL:
            return StoreDamaged(f"not an LMDB store ({type(exc).__name__}: {exc})")
        enomem = type(exc).__name__ == "MemoryError" or os.strerror(errno.ENOMEM) in text
        if enomem:
            limit = _address_space()
            refused = StoreRefused(self._enomem_message(*limit) if limit is not None else
                                   f"cannot map the store: {text}")
            refused.enomem = True  # type: ignore[attr-defined]
            return refused
        for code, why in _REFUSAL_ERRNOS.items():
            if os.strerror(code) in text:
                return StoreRefused(f"cannot use the store in {self.path}: {why}")
        return StoreRefused(f"cannot open the store in {self.path} ({type(exc).__name__}: {exc})")

    def _map_size(self) -> int:
        page = 4096
        return max(MIN_CAP, self.cap // page * page)

    def _check(self, lmdb: Any, env: Any, new: bool) -> Any:
        """The opened store's size, format and cap (after the open-time check, so reading it cannot fault).
        Returns the environment to use: re-opened at the store's recorded cap when that is the one to use."""
        info, psize = env.info(), env.stat()["psize"]
        size = (self.path / "data.mdb").stat().st_size
        if size < (info["last_pgno"] + 1) * psize:
            raise StoreDamaged(f"truncated: {size} bytes on disk, {(info['last_pgno'] + 1) * psize} recorded")
        try:
            with env.begin() as txn:
                fmt, cap = txn.get(FORMAT_KEY), txn.get(CAP_KEY)
        except lmdb.Error as exc:
            if type(exc).__name__ in _STRUCTURAL:
                raise StoreDamaged(f"unreadable ({type(exc).__name__}: {exc})") from exc
            raise self._classify(exc) from exc
        if not new and fmt != FORMAT_VALUE:
            raise StoreDamaged("of an older or unknown format" if fmt is None else "of another format")
        recorded = int(cap) if cap is not None and cap.isdigit() else 0
        if recorded and not self.explicit and recorded != self._map_size():
            # Re-opened rather than re-mapped: a failed re-map (ENOMEM) leaves LMDB without a map at all.
            self.cap = recorded
            env.close()
            env = self._open_env(lmdb, self._map_size())
        if new or recorded < self._map_size():
            try:
                with env.begin(write=True) as txn:
                    txn.put(FORMAT_KEY, FORMAT_VALUE)
                    txn.put(CAP_KEY, str(max(recorded, self._map_size())).encode())
            except lmdb.MapFullError:
                pass  # mapped smaller than the cap (an address-space limit): the cap is recorded by a later run
            except lmdb.Error as exc:
                raise OSError(errno.ENOSPC if _free_space(self.folder) < SPACE_RESERVE else errno.EIO,
                              f"cannot write to the store: {exc}") from exc
        return env

    def _discard(self, why: str) -> None:
        """Move the damaged store aside, remove it, and say so once; a fresh one is made next."""
        aside = self.folder / f"{STORE_NAME}.discarded-{os.getpid()}-{time.time_ns()}"
        try:
            st: os.stat_result | None = (self.path / "data.mdb").lstat()
        except OSError:
            st = None
        try:
            os.rename(self.path, aside)
        except OSError as exc:
            raise StoreDamaged(f"the store was damaged ({why}) and could not be moved aside: {exc}") from exc
        _forget_sound(st)
        shutil.rmtree(aside, ignore_errors=True)
        _warn_once(f"rebuilt:{self.folder}", f"the decoded-image cache in {self.path} was damaged ({why}): "
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
                if self._env is not env:  # closed or re-mapped by another thread meanwhile
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

        key = _digest(material)
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
        length = int(np.prod(shape))
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
            if self._env is not env:
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
        if not self.accepting or isinstance(material, _RacyMaterial):
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
                if _free_space(self.path) < len(value) + SPACE_RESERVE:
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
            if self._env is not env:
                return "closed"
            try:
                with env.begin(write=True) as txn:
                    return "added" if txn.put(_digest(material), value, overwrite=False) else "present"
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
        if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or _free_space(self.path) < SPACE_RESERVE:
            self.no_writes = f"no space left on the disk of {self.folder}"
        else:
            self.no_writes = f"writing failed ({type(exc).__name__}: {exc})"
        _warn_once(f"nowrite:{self.folder}", f"decoded-image cache: {self.no_writes}; the run goes on, "
                                             "adding no more images to the cache")

    def _switch_off(self, why: str) -> None:
        with self._open_lock:
            self.off = why
            self._close_locked()  # views map the file itself, not LMDB: closing leaves them valid
            self._opened = (os.getpid(), None)
        _warn_once(f"off:{self.folder}", f"decoded-image cache off for the rest of this run: {why}")

    @staticmethod
    def _mark_damaged(env: Any) -> None:
        # The next process to open the store checks this record first: changing it makes that process
        # rebuild the store, without deleting anything a running process may still be reading.
        with contextlib.suppress(Exception), env.begin(write=True) as txn:
            txn.put(FORMAT_KEY, b"damaged")


# --- keys -------------------------------------------------------------------------------------


_dir_realpaths: dict[str, str] = {}


class _RacyMaterial(bytes):
    """Key material of a file whose timestamps were not safely in the past when it was looked at: the
    image is looked up and served, never added (see :func:`key_material`)."""


#: A file system whose timestamps are whole seconds (ext4 with 128-byte inodes, many network file
#: systems; FAT's are 2 s): a rewrite within this long of the last one may keep the same timestamps.
COARSE_WINDOW_NS = 3 * 10**9
#: Finer timestamps still come from the kernel's coarse clock (a tick of 1-10 ms): two of its ticks.
_CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)
try:
    FINE_WINDOW_NS = max(2 * 10**6, int(2 * time.clock_getres(_CLOCK_REALTIME_COARSE) * 1e9))
except (OSError, AttributeError):  # pragma: no cover - not Linux
    FINE_WINDOW_NS = 20 * 10**6
#: The clock and ``stat`` the key reads (replaced in tests by a fake clock and one-second timestamps).
_now_ns: Callable[[], int] = time.time_ns
_stat: Callable[[str], os.stat_result] = os.stat


def racy(st: os.stat_result, now_ns: int) -> bool:
    """The file's modification or change time is within the file system's timestamp granularity of
    ``now_ns`` (or after it): a rewrite could still come that keeps the size and both times, so a key made
    from them could not tell the new content from this one (git's "racily clean" index entries).
    Whole-second timestamps (both of them) are taken to mean a file system with one-second timestamps."""
    newest = max(st.st_mtime_ns, st.st_ctime_ns)
    coarse = st.st_mtime_ns % 10**9 == 0 and st.st_ctime_ns % 10**9 == 0
    return now_ns - newest < (COARSE_WINDOW_NS if coarse else FINE_WINDOW_NS)


def key_material(path: str | os.PathLike[str], mode: str = "RGB") -> bytes | None:
    """The cache key material of ``path`` decoded to ``mode``, or None if the file cannot be stat'ed.

    The folder's resolved path is remembered per process (folders are few; files may be millions);
    the file's own device, inode, size and times come from a ``stat`` on every call. A file whose times
    are too recent (:func:`racy`) gets material that :meth:`Store.put` declines. The clock is read
    before the ``stat``: the content read afterwards is then at least as new as what the times say.
    """
    p = os.fspath(path)
    now = _now_ns()
    try:
        st = _stat(p)
    except OSError:
        return None
    head, name = os.path.split(p)
    real = _dir_realpaths.get(head)
    if real is None:
        real = os.path.realpath(head or ".")
        with _lock:
            _dir_realpaths[head] = real
    material = (f"{_identity()}\0{mode}\0{real}{os.sep}{name}\0{st.st_dev}:{st.st_ino}:{st.st_size}:"
                f"{st.st_mtime_ns}:{st.st_ctime_ns}").encode("utf-8", "surrogateescape")
    return _RacyMaterial(material) if racy(st, now) else material


_identity_text: str | None = None


def _identity() -> str:
    global _identity_text
    if _identity_text is None:
        _identity_text = decoder_identity()
    return _identity_text


# --- the process's store, from the options ------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """What the options ask of the cache: ``mode`` "off", "on" or "auto", and the cap (None: default)."""

    mode: str
    cap: int | None
    folder: Path


def setting() -> Setting:
    import nano_patch

    opts = nano_patch.options()
    value = opts.cache_decoded
    folder = Path(opts.cache_dir).expanduser() if opts.cache_dir else default_dir()
    if isinstance(value, int):
        return Setting("on", value, folder)
    return Setting(str(value), None, folder)


#: One store per cache folder and process (LMDB allows one open environment per file and process).
_stores: dict[str, Store] = {}
_lock = threading.Lock()


def open_store(folder: Path, cap: int | None = None, explicit: bool | None = None) -> Store:
    """This process's store in ``folder``: made on first use with ``cap`` (None: the default cap), then
    the same object for every later call (its cap is fixed for the process)."""
    key = os.path.abspath(os.fspath(folder))
    store = _stores.get(key)
    if store is None:
        with _lock:
            store = _stores.get(key)
            if store is None:
                explicit = cap is not None if explicit is None else explicit
                store = _stores[key] = Store(Path(folder), cap if cap is not None else _default_cap(Path(folder)),
                                             explicit)
    return store


def _store(s: Setting) -> Store:
    return open_store(s.folder, s.cap)


def _free_bytes(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 0


def store_bytes(folder: Path) -> int:
    data = folder / STORE_NAME / "data.mdb"
    try:
        return data.stat().st_size
    except OSError:
        return 0


def _default_cap(folder: Path) -> int:
    """``on``: at most :data:`DEFAULT_CAP`, and at most half of the free disk space (the store counted as free)."""
    room = (_free_bytes(folder) + store_bytes(folder)) // 2
    return max(MIN_CAP, min(DEFAULT_CAP, room))


#: --fast's decision per dataset: (cache it?, the one line that says why), kept with the dataset.
_decisions: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_decisions_by_id: dict[int, bool] = {}


def store_for(dataset: Any = None) -> Store | None:
    """The store to use for images of ``dataset`` (None: a loader call outside a dataset), or None."""
    s = setting()
    if s.mode == "off":
        return None
    if s.mode == "auto":
        if dataset is None or not decide(dataset, s):
            return None
        # the budget, fixed when the first dataset is cached in this process
        store = open_store(s.folder, max(MIN_CAP, _budget(s.folder)), explicit=False)
    else:
        store = _store(s)
    return None if store.off else store


def _budget(folder: Path) -> int:
    import psutil

    memory = int(psutil.virtual_memory().total * AUTO_MEMORY_SHARE)
    disk = int((_free_bytes(folder) + store_bytes(folder)) * AUTO_DISK_SHARE)
    return min(memory, disk)


def decide(dataset: Any, s: Setting | None = None) -> bool:
    """``--fast`` (``cache_decoded="auto"``): cache ``dataset`` if its decoded size fits the budget.

    Decided once per dataset and process; the main process of the run prints the one line that says
    what was chosen (DataLoader workers and other ranks decide the same, quietly).
    """
    dataset = _root(dataset)
    try:
        return _decisions[dataset]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        if id(dataset) in _decisions_by_id:
            return _decisions_by_id[id(dataset)]
    s = s or setting()
    files = dataset_files(dataset)
    if not files:
        ok, line = False, ""
    else:
        estimate = estimate_decoded_bytes(files)
        budget = _budget(s.folder)
        name = f"{type(dataset).__name__} {getattr(dataset, 'root', '')}".strip()
        ok = estimate <= budget
        if ok:
            line = (f"nano-patch --fast: decoded-image cache on for {name}: about {human_bytes(estimate)} for "
                    f"{len(files)} images, in {s.folder} (--cache-decoded=off to switch it off)")
        else:
            line = (f"nano-patch --fast: decoded-image cache off for {name}: about {human_bytes(estimate)} decoded "
                    f"would not fit the budget of {human_bytes(budget)} (half the memory, half the free disk); "
                    "--cache-decoded=SIZE sets a cap and caches what fits")
    try:
        _decisions[dataset] = ok
    except TypeError:
        _decisions_by_id[id(dataset)] = ok
    if line and _is_main_process():
        print(line, file=sys.stderr)
    return ok


def prepare(dataset: Any) -> None:
    """Where a DataLoader is built (the main process): decide for ``dataset`` under ``--fast`` and check
    the store, so that the one line and any warning come from here, before the workers start."""
    if setting().mode == "off":
        return
    root = _root(dataset)
    if not dataset_files(root):
        return
    store = store_for(root)
    if store is not None:
        store.env()


def _root(dataset: Any) -> Any:
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def _is_main_process() -> bool:
    import multiprocessing

    from .. import session

    if multiprocessing.parent_process() is not None:
        return False
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            return False
    except ImportError:  # pragma: no cover
        pass
    return session._is_rank_zero()


#: How to list a dataset's image files, for the datasets the patch decodes for.
def dataset_files(dataset: Any) -> list[str]:
    dataset = _root(dataset)
    reader = getattr(dataset, "reader", None)  # timm's ImageDataset keeps its files in its reader
    for owner, attr in ((dataset, "samples"), (dataset, "_samples"), (reader, "samples")):
        items = getattr(owner, attr, None)
        if isinstance(items, list) and items and isinstance(items[0], tuple):
            return [os.fspath(p) for p, *_ in items]
    for attr in ("_image_files", "_images"):
        items = getattr(dataset, attr, None)
        if isinstance(items, list) and items:
            return [os.fspath(p) for p in items]
    return []


def estimate_decoded_bytes(files: list[str], sample: int = AUTO_SAMPLE) -> int:
    """The decoded size of ``files`` (RGB, 1 byte per channel), from the headers of an even sample."""
    from . import decode

    step = max(1, len(files) // sample)
    sizes = []
    for p in files[::step][:sample]:
        size = None
        try:
            with open(p, "rb") as f:
                size = decode.jpeg_size(f.read())
        except OSError:
            continue
        if size is None:
            try:
                from PIL import Image

                with Image.open(p) as im:
                    size = (im.height, im.width)
            except Exception:  # noqa: BLE001 - a file stock would fail on counts as nothing
                continue
        sizes.append(size[0] * size[1] * 3 + 256)
    if not sizes:
        return 0
    return int(math.ceil(sum(sizes) / len(sizes) * len(files)))


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


# --- after a fork ---------------------------------------------------------------------------------


def _before_fork() -> None:
    # Each store's opening lock is held across the fork, so that no thread opens an environment between
    # this close and the fork (the child would inherit it open); the child gets fresh locks, since a
    # lock another thread held at the fork would stay held forever there.
    for store in list(_stores.values()):
        store._open_lock.acquire()
        store._close_locked()


def _after_fork_in_parent() -> None:
    for store in list(_stores.values()):
        with contextlib.suppress(RuntimeError):
            store._open_lock.release()


def _after_fork_in_child() -> None:
    global _lock, _env_lock, _figures_lock
    _lock, _env_lock, _figures_lock = threading.Lock(), threading.Lock(), threading.Lock()
    for store in list(_stores.values()):
        store._reset_locks()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


# --- listing and clearing (``nano-patch cache``) -------------------------------------------------------


def known_folders(extra: list[Path] | None = None) -> list[Path]:
    """The cache folders to look in: the default, ``NANO_PATCH_CACHE_DIR``, and any given."""
    folders = [default_dir()]
    env = os.environ.get("NANO_PATCH_CACHE_DIR")
    if env:
        folders.append(Path(env).expanduser())
    folders += extra or []
    out: list[Path] = []
    for f in folders:
        if f not in out:
            out.append(f)
    return out


def describe(folder: Path) -> dict[str, Any]:
    """A store's location, size on disk, entries, cap and state, read without changing it."""
    path = folder / STORE_NAME
    row: dict[str, Any] = {"folder": str(folder), "store": str(path), "exists": path.exists(),
                           "bytes_on_disk": store_bytes(folder), "entries": None, "cap": None, "state": ""}
    if not row["exists"]:
        row["state"] = "no cache here"
        return row
    try:
        why = check_directory(folder, create=False)
    except OSError as exc:
        why = str(exc)
    if why is None:
        why = refused_store_folder(path)
    if why is not None:
        row["state"] = f"refused: {why}"
        return row
    mine = _stores.get(os.path.abspath(os.fspath(folder)))
    env = mine._env if mine is not None and mine._pid == os.getpid() else None
    if env is None:
        # The same check as a run makes before its first read, in a child process: a listing must not
        # fault on a damaged store either (nor call it [ok]).
        try:
            data_st = (path / "data.mdb").stat()
        except OSError:
            data_st = None
        if data_st is not None and not _recorded_sound(path, data_st):
            try:  # the child uses the lock file: its pages must be backed first (this changes no byte)
                Store(folder, MIN_CAP)._prepare_files(new=False)
            except (StoreRefused, OSError) as exc:
                row["state"] = f"not checked ({exc}); left as it is"
                return row
            verdict, why = check_store(path)
            if verdict == "damaged":
                row["state"] = f"damaged ({why}); rebuilt on next use"
                return row
            if verdict != "sound":
                row["state"] = f"not checked ({why}); left as it is"
                return row
    try:
        import lmdb

        if env is None:
            env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_spare_txns=0)
            close = env.close
        else:
            close = None  # this process's own store: read it, leave it open
    except Exception as exc:  # noqa: BLE001 - a listing never fails
        if type(exc).__name__ in _STRUCTURAL:
            row["state"] = f"damaged ({type(exc).__name__}); rebuilt on next use"
        else:
            row["state"] = f"cannot be read now ({type(exc).__name__}: {exc}); left as it is"
        return row
    try:
        info, st = env.info(), env.stat()
        if row["bytes_on_disk"] < (info["last_pgno"] + 1) * st["psize"]:
            row["state"] = "damaged (truncated); rebuilt on next use"
            return row
        with env.begin() as txn:
            fmt, cap = txn.get(FORMAT_KEY), txn.get(CAP_KEY)
        row["entries"] = max(0, st["entries"] - (fmt is not None) - (cap is not None))
        row["cap"] = int(cap) if cap is not None and cap.isdigit() else None
        row["state"] = "ok" if fmt == FORMAT_VALUE else "of another format; rebuilt on next use"
    finally:
        if close is not None:
            close()
    return row


def clear(folder: Path) -> str | None:
    """Remove the store in ``folder`` (renamed away first, so running readers keep a valid map)."""
    path = folder / STORE_NAME
    if not path.exists():
        return None
    why = check_directory(folder, create=False)
    if why is not None:
        raise PermissionError(f"not clearing {path}: {why}")
    aside = folder / f"{STORE_NAME}.cleared-{os.getpid()}-{time.time_ns()}"
    try:
        st: os.stat_result | None = (path / "data.mdb").lstat()
    except OSError:
        st = None
    os.rename(path, aside)
    _forget_sound(st)
    if aside.is_symlink():  # a refused store folder that is a link: remove the link, not what it points to
        aside.unlink()
    else:
        shutil.rmtree(aside, ignore_errors=True)
    for leftover in folder.glob(f"{STORE_NAME}.*"):  # stores a crashed rebuild left behind
        shutil.rmtree(leftover, ignore_errors=True)
    return str(path)


# --- figures for the run report -----------------------------------------------------------------


#: The figures are read-modify-writes: threads loading at once would lose counts without it.
_figures_lock = threading.Lock()


def count_hit(a: np.ndarray) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
        with _figures_lock:
            c["hits"] += 1
            c["hit_bytes"] += a.nbytes
            c["hit_px"] += a.shape[0] * a.shape[1]


def count_miss(a: np.ndarray | None, seconds: float, stored: bool) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
        with _figures_lock:
            c["misses"] += 1
            if a is not None:
                c["decode_s"] += seconds
                c["decode_px"] += a.shape[0] * a.shape[1]
                if stored:
                    c["stored"] += 1
                    c["stored_bytes"] += a.nbytes


def timed(fn: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    a = fn()
    return a, time.perf_counter() - start
