"""Opening a store: created with room for it or checked before anything of it is read, then ``lmdb.open``
with its map size (smaller under an address-space limit that leaves no room
for the cap's map), and LMDB's errors sorted into damage and "cannot use it now".

"Cannot use it now" is not damage: ENOMEM (the cap's map under an address-space limit; a smaller map is
used when one fits), EACCES/EPERM, EROFS, ENOSPC: one warning naming the cause, the run goes on uncached,
and the store is left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any

from . import verify
from .disk import (
    CREATE_MIN_FREE,
    MAX_READERS,
    REFUSAL_ERRNOS,
    SPACE_RESERVE,
    STRUCTURAL,
    StoreDamaged,
    StoreRefused,
    address_space,
    free_space,
    human_bytes,
    prepare_files,
    refused_store_folder,
    store_bytes,
)
from .entries import CAP_KEY, FORMAT_KEY, FORMAT_VALUE, MIN_CAP
from .environ import warn_once


def open_checked(lmdb: Any, path: Path, cap: int, explicit: bool) -> tuple[Any, int]:
    """Open the store folder ``path`` (creating it if missing) and check it: (the environment, the cap it
    is mapped for). :class:`StoreDamaged` if it is not sound, :class:`StoreRefused` if it cannot be used
    now. Nothing of the store is read in this process before the check says it is sound. ``explicit``:
    the cap was asked for; else the cap the store was created with is used, so that every process maps
    the store at one size (LMDB keeps the largest, and makes the others re-map)."""
    why = refused_store_folder(path)
    if why is not None:
        raise StoreRefused(f"refused the store: {why}")
    new = not path.exists()
    if new:
        free = free_space(path.parent)
        if free < CREATE_MIN_FREE:
            raise StoreRefused(f"no space left on the disk of {path.parent} to create the store "
                               f"({human_bytes(free)} free)")
        path.mkdir(mode=0o700)
        try:
            prepare_files(path, new=True)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # a store that cannot be created is not created
            raise
    else:
        verify.ensure_sound(path, record=True)
    env = open_env(lmdb, path, map_size(cap))
    try:
        env, cap = _check(lmdb, env, path, cap, explicit, new)
    except BaseException:
        with contextlib.suppress(Exception):
            env.close()  # nothing was read from it
        raise
    with contextlib.suppress(OSError):
        verify.record_sound(path, (path / "data.mdb").stat(), file=False)  # made or checked here
    return env, cap


def _check(lmdb: Any, env: Any, path: Path, cap: int, explicit: bool, new: bool) -> tuple[Any, int]:
    """The opened store's size, format and cap (after the open-time check, so reading it cannot fault).
    Returns the environment to use (re-opened at the store's recorded cap when that is the one to use)
    and its cap."""
    try:
        fmt, recorded_text, _ = verify.read_header(env, path)
    except lmdb.Error as exc:
        if type(exc).__name__ in STRUCTURAL:
            raise StoreDamaged(f"unreadable ({type(exc).__name__}: {exc})") from exc
        raise classify(exc, path, map_size(cap)) from exc
    problem = verify.format_problem(fmt)
    if not new and problem is not None:
        raise StoreDamaged(problem)
    recorded = int(recorded_text) if recorded_text is not None and recorded_text.isdigit() else 0
    if recorded and not explicit and recorded != map_size(cap):
        # Re-opened rather than re-mapped: a failed re-map (ENOMEM) leaves LMDB without a map at all.
        cap = recorded
        env.close()
        env = open_env(lmdb, path, map_size(cap))
    if new or recorded < map_size(cap):
        try:
            with env.begin(write=True) as txn:
                txn.put(FORMAT_KEY, FORMAT_VALUE)
                txn.put(CAP_KEY, str(max(recorded, map_size(cap))).encode())
        except lmdb.MapFullError:
            pass  # mapped smaller than the cap (an address-space limit): the cap is recorded by a later run
        except lmdb.Error as exc:
            raise OSError(errno.ENOSPC if free_space(path.parent) < SPACE_RESERVE else errno.EIO,
                          f"cannot write to the store: {exc}") from exc
    return env, cap


def map_size(cap: int) -> int:
    """The map LMDB is opened with for ``cap``: whole pages, at least :data:`MIN_CAP`."""
    page = 4096
    return max(MIN_CAP, cap // page * page)


def open_env(lmdb: Any, path: Path, size: int) -> Any:
    """``lmdb.open`` of the store folder ``path`` at map ``size``; under an address-space limit that leaves
    too little room, at the largest map that fits (the store is read, and filled up to that map) rather
    than not at all."""
    try:
        return _lmdb_open(lmdb, path, size, size)
    except StoreRefused as refused:
        limit = address_space()
        if not getattr(refused, "enomem", False) or limit is None:
            raise
        soft, used = limit
        data = store_bytes(path.parent)
        # Half of what is left, less the process's own map of the data file: the program needs room too.
        fits = (soft - used - data) // 2 // 4096 * 4096
        if fits < data + MIN_CAP:
            raise StoreRefused(_enomem_message(size, soft, used)) from refused
        env = _lmdb_open(lmdb, path, fits, size)
        warn_once(f"smaller-map:{path.parent}", f"decoded-image cache: the address-space limit of "
                  f"{human_bytes(soft)} (ulimit -v, RLIMIT_AS; {human_bytes(used)} in use) leaves no room "
                  f"for a map of the cap, {human_bytes(size)}: the store is mapped at "
                  f"{human_bytes(fits)} this run (read, and filled up to that)")
        return env


def _enomem_message(size: int, soft: int, used: int) -> str:
    return (f"cannot map the store: its cap of {human_bytes(size)} does not fit the address-space "
            f"limit of {human_bytes(soft)} (ulimit -v, RLIMIT_AS; {human_bytes(used)} already in use) "
            "(a smaller --cache-decoded=SIZE fits)")


def _lmdb_open(lmdb: Any, path: Path, size: int, cap_size: int) -> Any:
    try:
        return lmdb.open(str(path), map_size=size, subdir=True, sync=False, metasync=False,
                         readahead=False, max_readers=MAX_READERS, max_spare_txns=0, mode=0o600)
    except lmdb.Error as exc:
        raise classify(exc, path, cap_size) from exc


def classify(exc: Exception, path: Path, cap_size: int) -> Exception:
    """An LMDB error on the store folder ``path`` mapped for a cap of ``cap_size``: :class:`StoreDamaged`
    only for structural damage; the rest (ENOMEM, EACCES, EPERM, EROFS, ENOSPC, ...) mean "cannot use it
    now" (:class:`StoreRefused`; an ``OSError`` EBUSY where other code of this process has it open)."""
    text = str(exc)
    if "already open" in text:  # by other code of this process: not damage, just not ours
        return OSError(errno.EBUSY, text)
    if type(exc).__name__ in STRUCTURAL:
        return StoreDamaged(f"not an LMDB store ({type(exc).__name__}: {exc})")
    if type(exc).__name__ == "MemoryError" or os.strerror(errno.ENOMEM) in text:
        limit = address_space()
        refused = StoreRefused(_enomem_message(cap_size, *limit) if limit is not None else
                               f"cannot map the store: {text}")
        refused.enomem = True  # type: ignore[attr-defined]
        return refused
    for code, why in REFUSAL_ERRNOS.items():
        if os.strerror(code) in text:
            return StoreRefused(f"cannot use the store in {path}: {why}")
    return StoreRefused(f"cannot open the store in {path} ({type(exc).__name__}: {exc})")
