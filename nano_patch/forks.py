"""What a forked child must not inherit as it is: locks a thread of the parent's may hold at the fork.

A fork copies one thread, the forking one. A lock another thread held at that moment stays held forever in the
child, and the first use there hangs. DataLoader workers and the virtual workers' stand-ins are forks of a process
whose loader threads take these locks, so each module names its locks once here and the child gets new ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def fresh_in_child(namespace: dict[str, Any], **factories: Callable[[], Any]) -> None:
    """After every fork, in the child: ``namespace[name] = factory()`` for each name given (a module passes its
    ``globals()`` and its module-level locks' constructors)."""
    def renew() -> None:
        for name, make in factories.items():
            namespace[name] = make()

    os.register_at_fork(after_in_child=renew)
