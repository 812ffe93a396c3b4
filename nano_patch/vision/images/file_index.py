"""A dataset's files as this process has seen them: path -> (the file's identity, its cache key, its cache entry).

The draw step of a batch (``data/batches/batch_loader.py``) runs in the calling thread, with the GIL held; asking the
decoded-image cache for each sample there (the key's formatting and hash, an LMDB read transaction, the entry's
checks) cost more than the rest of a warm sample's draw. The index answers from memory for a file it has seen:

- every look-up still ``stat``s the file (1-2 us), and the entry is used only while the file's device, inode,
  size, modification and change times are those the entry was made from, the very fields the cache's key is
  made of (``cache.key_material``): a file replaced or rewritten since is looked up afresh, under its new key;
- a file whose times were too recent when it was looked up (``cache.racy``, git's racily clean rule) is not
  indexed: its key is made afresh each time, so that it is stored once its times are safely in the past;
- a miss is not indexed (the next look-up asks the store, which then holds the image); a hit is: the entry is
  the store's own read-only view (entries are only ever added to a store, and the view is of the process's own
  map of its file), so the index holds no pixels of its own;
- at most :data:`MAX_ENTRIES` files (the rest are looked up in the store, as without an index);
- an index serves one store: a look-up through another (another folder, a store re-opened) empties it.

Filled as the files are first seen, once per process: a DataLoader worker inherits its parent's entries (the
views are of a shared map) and adds its own. One index per dataset (``for_dataset``), dropped with it.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from . import cache
from .cache import keys as cache_keys

_Identity = tuple[int, int, int, int, int]


#: Entries an index holds at most (about 300 bytes each, with the view object: 60 MB); files beyond are looked up
#: in the store each time, as without an index.
MAX_ENTRIES = 200_000
#: The key material returned for a hit the index answered (it keeps no key: a hit needs none).
INDEXED = b""


class FileIndex:
    """path -> (identity, the store's view) for one dataset's files, checked on every look-up."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[_Identity, np.ndarray]] = {}
        self._store: Any = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def look_up(self, store: cache.Store, path: str | os.PathLike[str], mode: str = "RGB"
                ) -> tuple[bytes | None, np.ndarray | None]:
        """(key material, the store's image or None), as ``cache.key_material`` and ``store.get`` give them
        (:data:`INDEXED` as the material of a hit the index answered); (None, None) when the file cannot be
        stat'ed."""
        p = os.fspath(path)
        try:
            st = cache_keys.stat_file(p)  # the key's own stat (tests replace it to fake file times)
        except OSError:
            return None, None
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self._store is store:
            entry = self._entries.get((p, mode))
            if entry is not None and entry[0] == identity and not store.off:
                return INDEXED, entry[1]
        material = cache.key_material(p, mode)
        if material is None:
            return None, None
        a = store.get(material)
        if a is not None and _settled(material) and _identity_in(material, identity):
            with self._lock:
                if self._store is not store:
                    self._entries.clear()
                    self._store = store
                if len(self._entries) < MAX_ENTRIES:
                    self._entries[(p, mode)] = (identity, a)
        return material, a

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by a thread of the parent's stays held in the child


# The index relies on two details of the cache's key (``cache.key_material``): the racy key's type, and the key
# ending in the stat fields. Where either changes, the index holds nothing and every look-up asks the store, as
# without an index (tests/test_pixel_source.py then fails, so that the change is seen).


def _settled(material: bytes) -> bool:
    """The key is not a racily new file's (whose times are too recent to tell a rewrite from this content)."""
    return not isinstance(material, cache_keys.RacyMaterial)


def _identity_in(material: bytes, identity: _Identity) -> bool:
    """The key was made from the same stat as ``identity`` (the file did not change between the two stats)."""
    return material.endswith(":".join(map(str, identity)).encode())


#: "the caller has not read the file's identity" (None is a file that cannot be stat'ed)
UNREAD: Any = object()


class HeaderIndex:
    """path -> (identity, the JPEG's size) for one dataset's files, where the decoded-image cache is off.

    Without the cache, the draw step read each file whole, parsed its header and walked its segments (PIL's open
    checks) in the calling thread, 10-15 us a sample with the GIL held. A JPEG that libjpeg-turbo decodes as PIL
    does, whose header can warn of nothing but its size (``decode.check_open``'s plain case) and whose bytes do
    not end before its image, is indexed here once: later look-ups ``stat`` it and, while its device, inode,
    size, modification and change times are the same, give its size without reading it (the render reads it,
    on the loader's threads, and checks its header again). Anything else is never indexed: it takes the full
    path every time.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[_Identity, tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def size_of(self, path: str | os.PathLike[str], identity: Any = UNREAD) -> tuple[int, int] | None:
        """The indexed JPEG's (height, width) where the file is as it was when indexed; else None. ``identity``: the
        file's, where the caller has just read it (:func:`identities`), else it is stat'ed here."""
        try:
            entry = self._entries.get(path if type(path) is str else os.fspath(path))
        except TypeError:
            return None
        if entry is None:
            return None
        if identity is UNREAD:
            identity = identity_of(path)
        return entry[1] if entry[0] == identity else None

    def add(self, path: str | os.PathLike[str], identity: _Identity, size: tuple[int, int]) -> None:
        """Index ``path`` as a plain, whole JPEG of ``size``, as it was when stat'ed to ``identity``."""
        with self._lock:
            if len(self._entries) < MAX_ENTRIES:
                self._entries[os.fspath(path)] = (identity, size)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()


def identity_of(path: str | os.PathLike[str]) -> _Identity | None:
    """The fields a file's index entry is checked on (``os.stat``), or None where it cannot be stat'ed."""
    try:
        st = os.stat(os.fspath(path))
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_NO_FILE = (0, 0, 0, 0, 0)


def identities(paths: list[Any]) -> list[_Identity | None]:
    """:func:`identity_of` of each path, stat'ed in one native call with the GIL released once (``csrc/stat.c``;
    ``os.stat`` one by one where the extension is not here)."""
    stat_all = _stat_all()
    if stat_all is None:
        return [identity_of(p) for p in paths]
    return [None if row == _NO_FILE else row for row in struct.iter_unpack("5q", stat_all(paths))]


def settled(identity: _Identity | None, now_ns: int) -> bool:
    """Whether a file of this identity proves its content at ``now_ns`` (its times safely in the past:
    ``cache.racy``)."""
    return identity is not None and not cache.racy_times(identity[3], identity[4], now_ns)


_stat_extension: Any = None


def _stat_all() -> Any:
    global _stat_extension
    if _stat_extension is None:
        try:
            from ..kernels import native

            _stat_extension = native.extension().stat_identities
        except Exception:  # noqa: BLE001 - no native module here (or switched off): os.stat one by one
            _stat_extension = False
    return _stat_extension or None


_indexes: weakref.WeakKeyDictionary[Any, FileIndex] = weakref.WeakKeyDictionary()
_headers: weakref.WeakKeyDictionary[Any, HeaderIndex] = weakref.WeakKeyDictionary()
_unowned_headers = HeaderIndex()
_unowned = FileIndex()  # for look-ups outside a dataset (a loader called on its own)
_lock = threading.Lock()


_Index = TypeVar("_Index", FileIndex, HeaderIndex)


def _per_dataset(table: weakref.WeakKeyDictionary[Any, _Index], dataset: Any, unowned: _Index,
                 make: Callable[[], _Index]) -> _Index:
    """``dataset``'s index in ``table`` (made on first use); ``unowned`` for None, or an object that cannot be
    weakly referenced."""
    if dataset is None:
        return unowned
    try:
        index = table.get(dataset)
        if index is None:
            with _lock:
                index = table.setdefault(dataset, make())
        return index
    except TypeError:  # not weakly referenceable, or not hashable
        return unowned


def for_dataset(dataset: Any) -> FileIndex:
    """The index of ``dataset``'s files: their cache entries."""
    return _per_dataset(_indexes, dataset, _unowned, FileIndex)


def headers_for(dataset: Any) -> HeaderIndex:
    """The header index of ``dataset``'s files: their JPEG sizes, where the cache is off."""
    return _per_dataset(_headers, dataset, _unowned_headers, HeaderIndex)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _unowned.reset_after_fork()
    _unowned_headers.reset_after_fork()
    for index in [*_indexes.values(), *_headers.values()]:
        index.reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
