"""State a process hands to the processes it starts, in environment variables: warnings already given, data
files already checked. DataLoader workers and launched ranks inherit it and stay quiet / skip the check."""

from __future__ import annotations

import os
import threading
import warnings

#: Warnings already given in this process tree (children inherit it and stay quiet).
WARNED_ENV = "_NANO_PATCH_CACHE_WARNED"

#: Guards the read-modify-writes of ``os.environ`` below (threads of one process).
_lock = threading.Lock()


def tokens(name: str) -> list[str]:
    """The comma-separated tokens of the environment variable ``name``."""
    return [t for t in os.environ.get(name, "").split(",") if t]


def add_token(name: str, token: str, keep: int | None = None) -> bool:
    """Add ``token`` to ``name`` (keeping the last ``keep`` others); False if it was already there."""
    with _lock:
        have = tokens(name)
        if token in have:
            return False
        kept = have if keep is None else have[-keep:] if keep else []
        os.environ[name] = ",".join([*kept, token])
        return True


def remove_token(name: str, token: str) -> None:
    with _lock:
        os.environ[name] = ",".join(t for t in tokens(name) if t != token)


def warn_once(tag: str, message: str) -> None:
    """Warn unless this process or the one that started it already did for ``tag``."""
    if not add_token(WARNED_ENV, tag):
        return
    from ....registry import NanoPatchWarning

    warnings.warn(f"nano-patch: {message}", NanoPatchWarning, stacklevel=3)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a lock another thread held at the fork would stay held forever


os.register_at_fork(after_in_child=_after_fork_in_child)
