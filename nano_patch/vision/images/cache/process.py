"""This process's stores: the setting the options ask for, one store per cache folder, and the fork hooks.

LMDB allows one open environment per file and process, and must not be used across a fork: before a
fork every store closes its environment (the opening lock held across the fork, so that no thread opens
one meanwhile); both sides reopen it when they next need it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .... import config
from .disk import free_space, store_bytes
from .entries import DEFAULT_CAP, MIN_CAP
from .store import Store


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/nano-patch/decoded-images``, else ``~/.cache/nano-patch/decoded-images``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nano-patch" / "decoded-images"


@dataclass(frozen=True)
class Setting:
    """What the options ask of the cache: ``mode`` "off", "on" or "auto", and the cap (None: default)."""

    mode: str
    cap: int | None
    folder: Path


#: the last setting made, with what it was made from (asked once per batch: the folder's path, made anew, cost
#: more than the rest of the look-up)
_last_setting: tuple[tuple[object, ...], Setting] | None = None


def setting() -> Setting:
    """The setting the options ask for now (the same object while the options and the home folder are the same)."""
    global _last_setting
    opts = config.current()
    value, given = opts.cache_decoded, opts.cache_dir
    made_from = (value, given, os.environ.get("HOME"), None if given else os.environ.get("XDG_CACHE_HOME"))
    last = _last_setting
    if last is not None and last[0] == made_from:
        return last[1]
    folder = Path(given).expanduser() if given else default_dir()
    made = Setting("on", value, folder) if isinstance(value, int) else Setting(str(value), None, folder)
    _last_setting = (made_from, made)
    return made


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
                store = _stores[key] = Store(Path(folder), cap if cap is not None else default_cap(Path(folder)),
                                             explicit)
    return store


def opened_store(folder: Path) -> Store | None:
    """This process's store in ``folder`` if it made one (never makes one)."""
    return _stores.get(os.path.abspath(os.fspath(folder)))


def default_cap(folder: Path) -> int:
    """``on``: at most :data:`DEFAULT_CAP`, and at most half of the free disk space (the store counted as free)."""
    room = (free_space(folder) + store_bytes(folder)) // 2
    return max(MIN_CAP, min(DEFAULT_CAP, room))


def _before_fork() -> None:
    # Each store's opening lock is held across the fork, so that no thread opens an environment between
    # this close and the fork (the child would inherit it open); the child gets fresh locks, since a
    # lock another thread held at the fork would stay held forever there.
    for store in list(_stores.values()):
        store.hold_across_fork()


def _after_fork_in_parent() -> None:
    for store in list(_stores.values()):
        store.release_after_fork()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for store in list(_stores.values()):
        store.reset_locks()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
