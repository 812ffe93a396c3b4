"""The loader's daemon threads out of torch's code before the interpreter finalizes.

When Python finalizes, a daemon thread that takes the GIL back is ended where it stands (``pthread_exit``). If
that happens inside torch's C++ code (a tensor made or stacked, with the GIL released around it), the unwinding
meets a frame that cannot unwind and the process aborts ("terminate called without an active exception", exit
status -6): a script that ends with a loader's work under way would crash where stock, which runs no thread of
its own, exits cleanly. Each pool of such threads takes an :class:`ExitGate`: at exit (``atexit``, before the
finalization) the gate closes, work under way finishes, with a bound, and no new work starts.
"""

from __future__ import annotations

import atexit
import threading

#: Seconds the exit waits for work under way (a batch's draws and renders; bounded CPU work).
EXIT_WAIT_S = 10.0


class ExitGate:
    """Counts the work under way in a pool's threads; closed at the interpreter's exit."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        atexit.register(self.close)

    def enter(self) -> bool:
        """One piece of work starts; False once the interpreter is exiting (then the thread starts nothing)."""
        with self._cond:
            if self._closed:
                return False
            self._running += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = EXIT_WAIT_S) -> None:
        """No new work; wait (at most ``timeout`` s) until the work under way is done."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._running == 0, timeout)
