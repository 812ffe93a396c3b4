"""The loader's daemon threads ended before the interpreter finalizes.

When Python finalizes, a daemon thread that takes the GIL back is ended where it stands (``pthread_exit``). If that
happens inside torch's C++ code, the unwinding meets a frame that cannot unwind and the process aborts ("terminate
called without an active exception", exit status -6). Torch's code releases the GIL in more places than its ops:
freeing a tensor does too (``THPVariable_clear``), so a thread that merely returns from a function whose locals hold
a batch is inside torch's code for a moment. A script that ends (a ``break``, an exception, Ctrl-C) while a loader
thread works, or only drops its last batch, would crash where stock, which runs no thread of its own, exits cleanly.

So every long-lived thread of the loader (batches made ahead, the virtual workers' producers, the parked render
helpers) is started here, with a way to wake it from its wait. At exit (``atexit``: after the script's own
non-daemon threads were joined, so that a thread of the user's still loading gets its batches) no new work starts
(:func:`exiting`), every thread is woken, and every thread is joined, within :data:`EXIT_WAIT_S` in all: a joined
thread has returned and freed what it held while the interpreter was whole. The loader starts no thread any other
way (no standard-library pool: ``render_pool`` says why).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections.abc import Callable

from ... import forks

#: Seconds the exit waits, for all threads together, for work under way (a batch's draws and renders: bounded
#: CPU work) to finish
EXIT_WAIT_S = 10.0

_lock = threading.Lock()
_exiting = False
_registered = False
#: the threads started here and alive, each with the call that wakes it from its wait (None: it needs none)
_threads: list[tuple[threading.Thread, Callable[[], None] | None]] = []


def exiting() -> bool:
    """Whether the interpreter is exiting: a loader thread takes no new work, and none is started."""
    return _exiting


def start(target: Callable[[], None], name: str, wake: Callable[[], None] | None) -> threading.Thread | None:
    """A daemon thread running ``target``, ended at exit before the finalization: ``wake()`` (called from another
    thread, perhaps more than once) makes it leave its wait, after which ``target`` returns once :func:`exiting`
    is true. None where the interpreter is exiting already (the caller does the work itself)."""
    global _registered
    with _lock:
        if _exiting:
            return None
        if not _registered:
            atexit.register(end_threads)
            _registered = True
        _threads[:] = [(t, w) for t, w in _threads if t.is_alive()]
        thread = threading.Thread(target=target, name=name, daemon=True)
        _threads.append((thread, wake))  # (before it starts: a Ctrl-C inside start() leaves it known)
        thread.start()
    return thread


def end_threads(timeout: float = EXIT_WAIT_S) -> list[str]:
    """No new work; every thread woken and joined, within ``timeout`` s in all. Returns the names of the threads
    still alive then (none, unless a piece of work outlasted the bound)."""
    global _exiting
    with _lock:
        _exiting = True
        members = list(_threads)
    for _, wake in members:
        if wake is not None:
            wake()
    deadline = time.monotonic() + timeout
    for thread, _ in members:
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                thread.join(max(0.0, deadline - time.monotonic()))
            except KeyboardInterrupt:  # a second Ctrl-C: the exit still waits (bounded) rather than abort
                continue
    if getattr(sys, "last_type", None) is KeyboardInterrupt:
        _note_ctrl_c_again()
    return [t.name for t, _ in members if t.is_alive()]


def _note_ctrl_c_again() -> None:
    """The script ended with an uncaught KeyboardInterrupt (``sys.last_type``): Python then ends the process by
    SIGINT (status 130), as stock's does. But the interpreter's note of it is cleared by any code evaluated from a
    string since, in any thread; a loader thread that imports a module on its first image (PIL's plugins build named
    tuples with ``eval``) would make the status 1. Code evaluated from a string that raises KeyboardInterrupt
    notes it again."""
    with contextlib.suppress(KeyboardInterrupt):
        eval("(_ for _ in ()).throw(KeyboardInterrupt)")  # noqa: S307 - a constant expression of our own


forks.fresh_in_child(globals(), _lock=threading.Lock, _threads=list)
