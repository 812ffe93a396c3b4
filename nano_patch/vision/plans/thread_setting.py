"""A value each thread sets for the length of a ``with`` block, for the code that block runs to read."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ThreadSetting(Generic[T]):
    """A per-thread value: :attr:`default` until :meth:`set` sets it, for this thread, while a ``with`` block runs
    (blocks nest: each puts back the value it found)."""

    def __init__(self, default: T) -> None:
        self.default = default
        self._here = threading.local()

    def get(self) -> T:
        """This thread's value."""
        return getattr(self._here, "value", self.default)

    @contextlib.contextmanager
    def set(self, value: T) -> Iterator[None]:
        """While this runs, this thread's value is ``value``."""
        previous = self.get()
        self._here.value = value
        try:
            yield
        finally:
            self._here.value = previous
