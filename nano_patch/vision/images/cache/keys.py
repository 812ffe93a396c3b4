"""Cache keys: what identifies a decoded image (the decoding stack, the output mode, the file's resolved path,
device, inode, size, modification and change times), and the racy-timestamp rule.

A file changed on disk gets a new key, so it is decoded again, never served stale. A file whose
modification or change time is within the file system's timestamp granularity of now (one second for
whole-second timestamps) is served but not cached, so that a same-size rewrite in the same second can
never be served the old pixels (git's "racily clean" rule).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def decoder_identity() -> str:
    """The decoding stack whose output the entries hold: a new version of either library means new keys."""
    import PIL

    try:
        import simplejpeg

        sj = getattr(simplejpeg, "__version__", "?")
    except ImportError:  # pragma: no cover - a declared dependency
        sj = "none"
    return f"simplejpeg {sj}; Pillow {PIL.__version__}"


class RacyMaterial(bytes):
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


def stat_file(path: str) -> os.stat_result:
    """The ``stat`` a key is made from (the one tests replace), for callers that compare a file with its key."""
    return _stat(path)


def racy(st: os.stat_result, now_ns: int) -> bool:
    """The file's modification or change time is within the file system's timestamp granularity of
    ``now_ns`` (or after it): a rewrite could still come that keeps the size and both times, so a key made
    from them could not tell the new content from this one (git's "racily clean" index entries).
    Whole-second timestamps (both of them) are taken to mean a file system with one-second timestamps."""
    return racy_times(st.st_mtime_ns, st.st_ctime_ns, now_ns)


def racy_times(mtime_ns: int, ctime_ns: int, now_ns: int) -> bool:
    """:func:`racy` of a file with these modification and change times."""
    coarse = mtime_ns % 10**9 == 0 and ctime_ns % 10**9 == 0
    return now_ns - max(mtime_ns, ctime_ns) < (COARSE_WINDOW_NS if coarse else FINE_WINDOW_NS)


#: Folders' resolved paths, per process (folders are few; files may be millions).
_dir_realpaths: dict[str, str] = {}
_lock = threading.Lock()
_identity_text: str | None = None


def key_material(path: str | os.PathLike[str], mode: str = "RGB") -> bytes | None:
    """The cache key material of ``path`` decoded to ``mode``, or None if the file cannot be stat'ed.

    The folder's resolved path is remembered per process; the file's own device, inode, size and times
    come from a ``stat`` on every call. A file whose times are too recent (:func:`racy`) gets material
    that :meth:`Store.put` declines. The clock is read before the ``stat``: the content read afterwards
    is then at least as new as what the times say.
    """
    global _identity_text
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
    if _identity_text is None:
        _identity_text = decoder_identity()
    material = (f"{_identity_text}\0{mode}\0{real}{os.sep}{name}\0{st.st_dev}:{st.st_ino}:{st.st_size}:"
                f"{st.st_mtime_ns}:{st.st_ctime_ns}").encode("utf-8", "surrogateescape")
    return RacyMaterial(material) if racy(st, now) else material


def content_material(data: bytes, mode: str = "RGB") -> bytes:
    """The cache key material of an image decoded from ``data`` (its whole file, as read) to ``mode``: the decoding
    stack and a SHA-256 of the bytes. For images whose bytes were read before the key is made (a lazy image's, read
    at ``convert``; bytes in memory): a key from the file's identity, taken after the read, could name content the
    file got since. Never racy: the key is the content."""
    import hashlib

    global _identity_text
    if _identity_text is None:
        _identity_text = decoder_identity()
    digest = hashlib.sha256(data).hexdigest()  # (hashlib lets go of the GIL for the bytes: a loader thread's work)
    return f"{_identity_text}\0{mode}\0content:{digest}:{len(data)}".encode()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
