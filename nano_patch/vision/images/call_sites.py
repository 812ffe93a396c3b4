"""Whether the code that called a function drops its result: ``img.load()`` written as a statement.

PIL's ``load()`` returns a pixel-access object. Where the caller's next instruction after the call pops the result
unused, nothing can ever observe that object, so a lazy image may stay lazy; anywhere else (the result assigned,
returned, printed by an interactive prompt, or a caller this cannot read) the caller gets stock's object.
"""

from __future__ import annotations

import dis
import sys
import threading
import weakref
from types import CodeType, FrameType

#: Per code object: the offsets of the calls whose result the next instruction pops unused.
_dropping: weakref.WeakKeyDictionary[CodeType, frozenset[int]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
#: Modules whose frames stand between the caller and the wrapper (``wrapt``'s pure-Python fallback).
_BETWEEN = ("wrapt",)


def _offsets_dropping(code: CodeType) -> frozenset[int]:
    with _lock:
        known = _dropping.get(code)
    if known is not None:
        return known
    calls: set[int] = set()
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname == "POP_TOP" and previous is not None and previous.opname.startswith("CALL"):
            calls.add(previous.offset)
        previous = ins
    found = frozenset(calls)
    with _lock:
        _dropping[code] = found
    return found


def caller(depth: int) -> FrameType | None:
    """The frame ``depth`` levels up from the one calling this, past any frame of :data:`_BETWEEN`."""
    try:
        frame: FrameType | None = sys._getframe(depth + 1)
    except ValueError:
        return None
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_BETWEEN):
        frame = frame.f_back
    return frame


def result_dropped(frame: FrameType | None) -> bool:
    """True where ``frame`` is in a call whose result its next instruction pops unused; False wherever unsure."""
    if frame is None:
        return False
    try:
        return frame.f_lasti in _offsets_dropping(frame.f_code)
    except Exception:  # noqa: BLE001 - bytecode this cannot read: the caller keeps stock's result
        return False
