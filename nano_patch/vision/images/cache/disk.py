"""The store's folder and files on disk: privacy, allocation, free space, address space, and what is damage
and what is a refusal.

A mapped store must never take the process down: a read past the end of a mapped file, or a write to a
page the disk cannot back, is a SIGBUS, with no Python exception. So the folders must be private to this
user, the data and lock files this user's own single-link regular files (never written through a link),
and every page LMDB writes through a map is allocated before it opens the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .entries import STORE_NAME


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
REFUSAL_ERRNOS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                  errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the disk",
                  errno.EDQUOT: "disk quota exceeded", errno.ENOMEM: "not enough memory or address space",
                  errno.EFBIG: "file too large for the file-size limit (ulimit -f)"}
#: py-lmdb's errors that mean the store's structure is damaged (the others: it cannot be used now).
STRUCTURAL = ("InvalidError", "VersionMismatchError", "CorruptedError", "PageNotFoundError", "IncompatibleError",
              "BadChecksumError")


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def open_no_follow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that never follows a symbolic link at ``path`` (ELOOP) and never leaks into a child."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), mode)


# --- the folders ----------------------------------------------------------------------------------


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
    return _not_private(path, st, advice=True)


def _not_private(path: Path, st: os.stat_result, advice: bool = False) -> str | None:
    """Why a folder with this ``stat`` is not this user's private folder, or None (``advice``: with the fix
    where it is the user's to make)."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
                + ("; make it 0700" if advice else ""))
    return None


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


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Serialise opening, checking and rebuilding a store between processes (a flock on a file in it)."""
    import fcntl

    fd = open_no_follow(folder / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- space ----------------------------------------------------------------------------------------


def free_space(path: Path) -> int:
    """Bytes free to this user on the disk of ``path`` (or of its nearest existing parent); 0 if unknown."""
    probe = Path(path)
    while True:
        try:
            st = os.statvfs(probe)
        except FileNotFoundError:
            if probe == probe.parent:
                return 0
            probe = probe.parent
            continue
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize


def store_bytes(folder: Path) -> int:
    """The size of the data file of the store in the cache folder ``folder`` (0: none)."""
    try:
        return (folder / STORE_NAME / "data.mdb").stat().st_size
    except OSError:
        return 0


_FALLOC_KEEP_SIZE = 1
_fallocate_fn: Any = None


def _fallocate(fd: int, offset: int, length: int, keep_size: bool = False) -> None:
    """Linux ``fallocate(2)``: allocate the blocks of a byte range (already allocated ones are kept, and
    no byte changes), so that no later write through a map of it can fault for want of space; ENOSPC
    comes back here as an ``OSError`` instead. Not ``os.posix_fallocate``: where the file system lacks
    fallocate, glibc emulates it by reading and writing back a byte per block, which would race with
    other processes writing their reader slots into the lock file."""
    global _fallocate_fn
    import ctypes

    if _fallocate_fn is None:
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
    if _fallocate_fn(fd, _FALLOC_KEEP_SIZE if keep_size else 0, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


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
        if free_space(path.parent) < size - st.st_blocks * 512 + SPACE_RESERVE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from exc


def refusal(exc: OSError, where: Path) -> StoreRefused:
    why = REFUSAL_ERRNOS.get(exc.errno or 0) or exc.strerror or str(exc)
    return StoreRefused(f"cannot use {where}: {why}")


def prepare_files(path: Path, new: bool) -> os.stat_result | None:
    """Refuse a data or lock file of the store folder ``path`` that is not this user's own single-link
    regular file; allocate every page of the lock file (LMDB writes it through a map) and any hole in the
    data file (on tmpfs even reading a hole through a map needs a page). Returns the data file's status
    (None if it is missing). Changes no byte of either file.
    """
    data_st = None
    for name in ("lock.mdb", "data.mdb"):
        p = path / name
        try:
            fd = open_no_follow(p, os.O_RDWR | (os.O_CREAT if name == "lock.mdb" else 0))
        except FileNotFoundError:
            continue  # no data file yet (a creation that stopped early): LMDB makes it
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreRefused(f"refused the store: {p} is a symbolic link") from exc
            if exc.errno in REFUSAL_ERRNOS:
                raise refusal(exc, p) from exc
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
                    raise StoreRefused(f"no space left on the disk of {path.parent} "
                                       f"({'to create the store' if new else f'to back {p}'})") from exc
                if exc.errno in REFUSAL_ERRNOS:
                    raise refusal(exc, p) from exc
                raise
        finally:
            os.close(fd)
    return data_st


def address_space() -> tuple[int, int] | None:
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
