"""The slots of a batch tensor: the mark a sample's image carries while it is the view of its place in the batch.

The native op runner (``oprunner.batch_tensor``) renders a batch's samples straight into one tensor laid out as
``default_collate``'s ``torch.stack`` lays it out, and marks each sample's image (a view of its slot) with the
batch and its place there. The DataLoader's collation (``data/collate.py``) reads the marks: a batch that is
exactly the marked slots of one tensor, in order, is that tensor, returned instead of stacked.
"""

from __future__ import annotations

from typing import Any

#: The attribute a slot's tensor carries: ``(batch tensor, place)``.
SLOT_MARK = "_nano_patch_batch_slot"


def mark_slot(slot: Any, base: Any, k: int) -> Any:
    """Mark ``slot`` as sample ``k`` of the batch tensor ``base``; returns it."""
    setattr(slot, SLOT_MARK, (base, k))
    return slot


def slot_of(t: Any) -> tuple[Any, int] | None:
    """``(batch tensor, place)`` where ``t`` is marked as a slot, else None."""
    return getattr(t, SLOT_MARK, None)


def unmark(t: Any) -> None:
    """Take the mark off (the batch is handed over: a second collation of the same samples stacks them)."""
    delattr(t, SLOT_MARK)
