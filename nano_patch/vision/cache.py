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

Safety:
- the folder is created with mode 0700; one owned by another user, or writable by group or others,
  is refused with one warning and the run goes on uncached;
- a store that is not an LMDB file, is truncated (pages the store says it has are missing), or is
  of another format is discarded and rebuilt, with one warning;
- a full disk or a read-only location: one warning, and the run goes on without adding entries;
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


def _warn_once(tag: str, message: str) -> None:
    """Warn unless this process or the one that started it already did for ``tag``."""
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
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); make it 0700"
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
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ino: int | None = None
        self._lmdb_map: tuple[int, int, int] | None = None  # (start, end, file offset of start)
        self._maps: list[np.ndarray] = []  # whole-file maps, each as long as the file was when made

    def opened(self) -> None:
        """The environment was (re)opened: its map may sit elsewhere, its file may be a new one."""
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            ino = None
        if ino != self._ino:
            self._ino, self._maps = ino, []  # old maps stay alive in the views made from them
        self._lmdb_map = None

    def view(self, value: Any, offset: int, length: int) -> np.ndarray | None:
        addr = np.frombuffer(value, np.uint8, 1).__array_interface__["data"][0]
        where = self._lmdb_map
        if where is None or not where[0] <= addr < where[1]:
            where = self._lmdb_map = _mapping_of(addr, self._ino)
            if where is None:
                return None
        start = addr - where[0] + where[2] + offset
        for a in reversed(self._maps):
            if start + length <= a.size:
                return a[start:start + length]
        a = self._map_file()
        if a is None or start + length > a.size:
            return None
        return a[start:start + length]

    def _map_file(self) -> np.ndarray | None:
        import mmap

        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_ino != self._ino or st.st_size == 0:
                return None  # replaced since the environment was opened: copy instead
            a = np.frombuffer(mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ), np.uint8)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        self._maps.append(a)
        return a


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


# --- the store ----------------------------------------------------------------------------------


class StoreDamaged(Exception):
    """The store on disk cannot be trusted: the message says what is wrong."""


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


class Store:
    """One LMDB store of decoded images in a private folder, opened separately in every process.

    ``get`` returns a read-only view or None; ``put`` adds an entry unless the store is full, out of
    disk space or unwritable (then it stops adding, with one warning). Nothing here raises into the
    caller: a store that fails is switched off for the process, and the image is decoded as usual.
    """

    def __init__(self, folder: Path, cap: int, explicit: bool = True) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STORE_NAME
        self.cap = int(cap)
        #: the cap was asked for (a SIZE): else the cap the store was created with is used, so that every
        #: process maps the store at one size (LMDB keeps the largest, and makes the others re-map)
        self.explicit = explicit
        self.off: str | None = None  # why this process does not use the store
        self.full = False  # the cap was reached: no more entries are added
        self.no_writes: str | None = None  # why this process adds no more entries
        self._env: Any = None
        self._pid: int | None = None
        self._txns: dict[int, Any] = {}  # thread -> its kept read transaction (aborted before a fork)
        self._write_lock = threading.Lock()
        self._pixels = _StoreFile(self.path / "data.mdb")

    # -- opening

    def env(self) -> Any:
        """This process's LMDB environment, opened (and checked) on first use here; None when off."""
        if self._pid == os.getpid():
            return self._env
        self._pid = os.getpid()
        self._env, self._txns = None, {}
        try:
            self._env = self._open()
        except StoreDamaged as exc:  # a rebuild failed too
            self.off = str(exc)
        if self._env is not None:
            self._pixels.opened()
        if self._env is None and self.off:
            _warn_once(f"off:{self.folder}", f"decoded-image cache off for this run: {self.off}")
        return self._env

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
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                self.off = f"{self.folder} is read-only ({exc.strerror})"
            elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.off = f"no space left on the disk of {self.folder}"
            else:
                self.off = f"cannot open the store in {self.folder}: {exc}"
            return None
        return env

    def _open_checked(self, lmdb: Any) -> Any:
        """Open the store (creating it if missing) and check it; :class:`StoreDamaged` if it is not sound."""
        new = not self.path.exists()
        if new:
            self.path.mkdir(mode=0o700)
        else:
            for name in ("data.mdb", "lock.mdb"):
                try:
                    st = (self.path / name).lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
                    raise StoreDamaged(f"{self.path / name} is not a regular file of this user")
        try:
            env = lmdb.open(str(self.path), map_size=self._map_size(), subdir=True, sync=False, metasync=False,
                            readahead=False, max_readers=2048, max_spare_txns=0, mode=0o600)
        except lmdb.Error as exc:
            if "already open" in str(exc):  # by other code of this process: not damage, just not ours
                raise OSError(errno.EBUSY, str(exc)) from exc
            raise StoreDamaged(f"not an LMDB store ({type(exc).__name__}: {exc})") from exc
        try:
            self._check(lmdb, env, new)
        except StoreDamaged:
            env.close()  # nothing was read from it
            raise
        return env

    def _map_size(self) -> int:
        page = 4096
        return max(MIN_CAP, self.cap // page * page)

    def _check(self, lmdb: Any, env: Any, new: bool) -> None:
        info, psize = env.info(), env.stat()["psize"]
        size = (self.path / "data.mdb").stat().st_size
        if size < (info["last_pgno"] + 1) * psize:
            raise StoreDamaged(f"truncated: {size} bytes on disk, {(info['last_pgno'] + 1) * psize} recorded")
        try:
            with env.begin() as txn:
                fmt, cap = txn.get(FORMAT_KEY), txn.get(CAP_KEY)
        except lmdb.Error as exc:
            raise StoreDamaged(f"unreadable ({type(exc).__name__}: {exc})") from exc
        if not new and fmt != FORMAT_VALUE:
            raise StoreDamaged("of an older or unknown format" if fmt is None else "of another format")
        recorded = int(cap) if cap is not None and cap.isdigit() else 0
        if recorded and not self.explicit and recorded != self._map_size():
            self.cap = recorded
            env.set_mapsize(self._map_size())
        if new or recorded < self._map_size():
            try:
                with env.begin(write=True) as txn:
                    txn.put(FORMAT_KEY, FORMAT_VALUE)
                    txn.put(CAP_KEY, str(max(recorded, self._map_size())).encode())
            except lmdb.Error as exc:
                raise OSError(errno.ENOSPC if _free_bytes(self.folder) < 16 * 1024**2 else errno.EIO,
                              f"cannot write to the store: {exc}") from exc

    def _discard(self, why: str) -> None:
        """Move the damaged store aside, remove it, and say so once; a fresh one is made next."""
        aside = self.folder / f"{STORE_NAME}.discarded-{os.getpid()}-{time.time_ns()}"
        try:
            os.rename(self.path, aside)
        except OSError as exc:
            raise StoreDamaged(f"the store was damaged ({why}) and could not be moved aside: {exc}") from exc
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
            txn = self._txns[me] = env.begin(buffers=True)
        return txn

    def get(self, material: bytes) -> np.ndarray | None:
        """The decoded image stored for ``material`` (a read-only array over the store), or None."""
        env = self.env()
        if env is None:
            return None
        import lmdb

        key = _digest(material)
        value = None
        for fresh in (False, True):
            try:
                # A miss on the kept snapshot is tried once more on a fresh one: another process may
                # have added the image since the snapshot began.
                value = self._read_txn(env, fresh=fresh).get(key)
            except lmdb.MapResizedError:
                self._adopt_map_size(env)
                continue
            except lmdb.Error as exc:
                self._switch_off(f"reading failed ({type(exc).__name__}: {exc})")
                return None
            if value is not None:
                break
        if value is None:
            return None
        entry = parse_entry(value, material)
        if entry is None:
            self._mark_damaged(env)
            self._switch_off("an entry failed its check: the store is damaged, and is rebuilt next run")
            return None
        offset, shape = entry
        length = int(np.prod(shape))
        if len(value) > 4096:
            # The value's own pages are never rewritten (entries are only added), so it can be read where
            # the file holds it, through this process's own map of the file, which outlives LMDB's.
            a = self._pixels.view(value, offset, length)
            if a is not None:
                return a.reshape(shape)
        # small values live inside B-tree pages, which later writes reuse: copied
        return np.frombuffer(value, np.uint8, length, offset).reshape(shape).copy()

    def _adopt_map_size(self, env: Any) -> None:
        """Another process mapped the store larger (a larger explicit cap): map it at that size too."""
        import lmdb

        txn = self._txns.pop(threading.get_ident(), None)
        if txn is not None:
            txn.abort()
        try:
            env.set_mapsize(0)
        except lmdb.Error as exc:  # another thread of this process is reading: give up on the store
            self._switch_off(f"cannot re-map the store ({exc})")

    def close_for_fork(self) -> None:
        """Before a fork: end this process's transactions and close its environment (both sides reopen it
        when they next need it). LMDB must not be used across a fork, and py-lmdb refuses a second open
        of a store that a child inherited open. Views stay valid: they map the file, not LMDB."""
        if self._pid != os.getpid() or self._env is None:
            return
        for txn in self._txns.values():
            with contextlib.suppress(Exception):
                txn.abort()
        self._txns = {}
        with contextlib.suppress(Exception):
            self._env.close()
        self._env, self._pid = None, None

    # -- writing

    @property
    def accepting(self) -> bool:
        """New entries are still added (not full, not out of disk space, not switched off)."""
        return not self.full and self.no_writes is None and self.off is None

    def put(self, material: bytes, a: np.ndarray) -> bool:
        """Add the decoded image ``a`` under ``material``; False when nothing was added."""
        if self.full or self.no_writes is not None:
            return False
        env = self.env()
        if env is None:
            return False
        import lmdb

        value = encode_entry(material, a)
        with self._write_lock:
            for _ in range(2):
                try:
                    with env.begin(write=True) as txn:
                        return bool(txn.put(_digest(material), value, overwrite=False))
                except lmdb.MapResizedError:
                    self._adopt_map_size(env)
                except lmdb.MapFullError:
                    self.full = True
                    return False
                except lmdb.Error as exc:
                    self._stop_writes(exc)
                    return False
        return False

    def _stop_writes(self, exc: Exception) -> None:
        # LMDB reports a full disk as an I/O error of the commit; the free space tells which it was.
        if _free_bytes(self.folder) < 16 * 1024**2:
            self.no_writes = f"no space left on the disk of {self.folder}"
        else:
            self.no_writes = f"writing failed ({type(exc).__name__}: {exc})"
        _warn_once(f"nowrite:{self.folder}", f"decoded-image cache: {self.no_writes}; the run goes on, "
                                             "adding no more images to the cache")

    def _switch_off(self, why: str) -> None:
        self.off = why
        self.close_for_fork()  # views map the file itself, not LMDB: closing leaves them valid
        self._env, self._pid = None, os.getpid()
        _warn_once(f"off:{self.folder}", f"decoded-image cache off for the rest of this run: {why}")

    @staticmethod
    def _mark_damaged(env: Any) -> None:
        # The next process to open the store checks this record first: changing it makes that process
        # rebuild the store, without deleting anything a running process may still be reading.
        with contextlib.suppress(Exception), env.begin(write=True) as txn:
            txn.put(FORMAT_KEY, b"damaged")




# --- keys -------------------------------------------------------------------------------------


_dir_realpaths: dict[str, str] = {}


def key_material(path: str | os.PathLike[str], mode: str = "RGB") -> bytes | None:
    """The cache key material of ``path`` decoded to ``mode``, or None if the file cannot be stat'ed.

    The folder's resolved path is remembered per process (folders are few; files may be millions);
    the file's own device, inode, size and times come from a ``stat`` on every call.
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError:
        return None
    head, name = os.path.split(p)
    real = _dir_realpaths.get(head)
    if real is None:
        real = _dir_realpaths[head] = os.path.realpath(head or ".")
    return (f"{_identity()}\0{mode}\0{real}{os.sep}{name}\0{st.st_dev}:{st.st_ino}:{st.st_size}:"
            f"{st.st_mtime_ns}:{st.st_ctime_ns}").encode("utf-8", "surrogateescape")


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
    for store in list(_stores.values()):
        store.close_for_fork()


os.register_at_fork(before=_before_fork)


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
    if why is not None:
        row["state"] = f"refused: {why}"
        return row
    mine = _stores.get(os.path.abspath(os.fspath(folder)))
    env = mine._env if mine is not None and mine._pid == os.getpid() else None
    try:
        import lmdb

        if env is None:
            env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_spare_txns=0)
            close = env.close
        else:
            close = None  # this process's own store: read it, leave it open
    except Exception as exc:  # noqa: BLE001 - a listing never fails
        row["state"] = f"damaged ({type(exc).__name__}); rebuilt on next use"
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
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
    for leftover in folder.glob(f"{STORE_NAME}.*"):  # stores a crashed rebuild left behind
        shutil.rmtree(leftover, ignore_errors=True)
    return str(path)


# --- figures for the run report -----------------------------------------------------------------


def count_hit(a: np.ndarray) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
        c["hits"] += 1
        c["hit_bytes"] += a.nbytes
        c["hit_px"] += a.shape[0] * a.shape[1]


def count_miss(a: np.ndarray | None, seconds: float, stored: bool) -> None:
    stats = report.stats
    if stats is not None:
        c = stats.cache
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
