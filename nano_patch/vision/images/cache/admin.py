"""``nano-patch cache``: the cache folders to look in, a store's description, and clearing a store.

A listing runs the same check as a run makes before its first read (so that it cannot fault on a
damaged store either, nor call it [ok]) and changes nothing; clearing renames the store away before
removing it, so that a process still reading it keeps a valid map.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from . import verify
from .disk import STRUCTURAL, StoreDamaged, StoreRefused, check_directory, refused_store_folder, store_bytes
from .entries import STORE_NAME
from .process import default_dir, opened_store


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


def _refused(folder: Path) -> str | None:
    """Why the cache folder ``folder`` or its store folder may not be used (neither is created), or None."""
    try:
        why = check_directory(folder, create=False)
    except OSError as exc:
        why = str(exc)
    return why if why is not None else refused_store_folder(folder / STORE_NAME)


def describe(folder: Path) -> dict[str, Any]:
    """A store's location, size on disk, entries, cap and state, read without changing it."""
    path = folder / STORE_NAME
    row: dict[str, Any] = {"folder": str(folder), "store": str(path), "exists": path.exists(),
                           "bytes_on_disk": store_bytes(folder), "entries": None, "cap": None, "state": ""}
    if not row["exists"]:
        row["state"] = "no cache here"
        return row
    why = _refused(folder)
    if why is not None:
        row["state"] = f"refused: {why}"
        return row
    mine = opened_store(folder)
    env = mine.opened_env() if mine is not None else None
    if env is None:
        try:
            data_st = (path / "data.mdb").stat()
        except OSError:
            data_st = None
        if data_st is not None and not verify.recorded_sound(path, data_st):
            try:  # the check child uses the lock file: its pages are backed first (this changes no byte)
                verify.ensure_sound(path, record=False)
            except StoreDamaged as exc:
                row["state"] = f"damaged ({exc}); rebuilt on next use"
                return row
            except verify.CheckFailed as exc:
                row["state"] = f"not checked ({exc.why}); left as it is"
                return row
            except (StoreRefused, OSError) as exc:
                row["state"] = f"not checked ({exc}); left as it is"
                return row
    try:
        import lmdb

        if env is None:
            env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_spare_txns=0)
            close = env.close
        else:
            close = None  # this process's own store: read it, leave it open
    except Exception as exc:  # noqa: BLE001 - a listing never fails
        if type(exc).__name__ in STRUCTURAL:
            row["state"] = f"damaged ({type(exc).__name__}); rebuilt on next use"
        else:
            row["state"] = f"cannot be read now ({type(exc).__name__}: {exc}); left as it is"
        return row
    try:
        fmt, cap, row["entries"] = verify.read_header(env, path)
        row["cap"] = int(cap) if cap is not None and cap.isdigit() else None
        problem = verify.format_problem(fmt)
        row["state"] = "ok" if problem is None else f"{problem}; rebuilt on next use"
    except StoreDamaged as exc:
        row["state"] = f"damaged ({exc}); rebuilt on next use"
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
    verify.discard(path, "cleared")
    for leftover in folder.glob(f"{STORE_NAME}.*"):  # stores a crashed rebuild left behind
        shutil.rmtree(leftover, ignore_errors=True)
    return str(path)
