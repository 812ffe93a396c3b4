"""The open-time check of a store, run as its own short-lived process before any process reads the store.

Started by :func:`nano_patch.vision.images.cache.verify.check_store` as ``python -I check_child.py LMDB_PARENT PATH
MAP_SIZE MAX_READERS``: the script by its path, in isolated mode (no environment variables, no user site, no
script folder on ``sys.path``), with only the folder that holds ``lmdb`` added. It imports nothing of
nano-patch: a fault on the store's bytes (SIGBUS, SIGSEGV) kills this process, never the run.

It prints one line (why) and exits with :data:`SOUND`, :data:`DAMAGED` or :data:`UNCHECKED`.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

#: What the child exits with: the store is sound, damaged, or could not be checked.
SOUND, DAMAGED, UNCHECKED = 0, 10, 11


def verdict(code: int, message: str) -> NoReturn:
    sys.stdout.write(message)
    sys.stdout.flush()
    os._exit(code)


def problems(offline: Any, path: str) -> list[str]:
    """What py-lmdb's offline verifier finds (the first, and how many more).

    It reads the file with ``read()``, never through a map: damage cannot fault it. It checks both meta
    pages, every page reachable from the roots (the main tree and LMDB's free list), their bounds and
    flags, that every overflow extent (an image's pages) lies inside the file and matches its value's
    recorded size, key order, counts, and that live and free pages cover the file exactly once.
    """
    try:
        found = offline.verify(path, subdir=True)
    except offline.VerifyError as exc:
        return [str(exc)]
    return found and [found[0] + ("" if len(found) == 1 else f" (and {len(found) - 1} more)")]


def main(argv: list[str]) -> NoReturn:
    sys.path.insert(0, argv[0])
    path, map_size, max_readers = argv[1], int(argv[2]), int(argv[3])
    try:
        import lmdb
        from lmdb import verify as offline
    except ImportError as exc:
        verdict(UNCHECKED, f"cannot check it: {exc}")

    def open_env(readonly: bool) -> Any:
        return lmdb.open(path, subdir=True, readonly=readonly, lock=True, map_size=map_size,
                         max_readers=max_readers, max_spare_txns=0, readahead=False, sync=False, metasync=False)

    env = None
    found = problems(offline, path)
    if found:
        # A writer in another process may have committed while the file was read: read it again while
        # holding LMDB's writer lock (no commit can happen meanwhile), and only then call it damaged.
        try:
            env = open_env(False)
            with env.begin(write=True):
                found = problems(offline, path)
        except lmdb.Error:
            pass
        if found:
            verdict(DAMAGED, found[0])
    try:
        env = env or open_env(True)
    except lmdb.MemoryError as exc:
        verdict(UNCHECKED, f"cannot map it to check it ({exc})")
    except lmdb.Error as exc:
        verdict(DAMAGED, f"not an LMDB store ({type(exc).__name__}: {exc})")
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
                verdict(DAMAGED, f"more keys than the {entries} recorded")
            if not lookup.set_key(bytes(key)):
                verdict(DAMAGED, "a key the walk reaches is not found by a lookup")
        if n != entries:
            verdict(DAMAGED, f"{n} keys found, {entries} recorded")
    verdict(SOUND, "")


if __name__ == "__main__":
    main(sys.argv[1:])
