"""Collation that costs nothing: a batch whose samples were rendered into one batch tensor is that tensor.

The native op runner (``vision/plans/oprunner.py``) writes each sample's image tensor straight into its slot of a batch
tensor laid out as ``torch.stack`` lays the samples out, and marks each slot (``vision/plans/batch_slots.py``).
``default_collate`` stacks tensors through ``default_collate_fn_map[torch.Tensor]``; while the DataLoader patch is
applied that entry is :func:`collate_tensor` (put there, and back at revert, through the patch's record): where
``batch`` is exactly the marked slots of one batch tensor, in order, each still a view of its place, the stack's
result is already there (the same values, dtype, shape and strides), so it is returned instead of copied. Anything
else is stock's ``collate_tensor_fn``. The marks are taken off as the batch is handed over, so a second collation of
the same samples stacks them as stock does. The batch and its samples share memory (stock's stack is a copy): a
``collate_fn`` of your own that calls ``default_collate`` and then writes into its result in place writes into the
samples too; torch's own fetcher drops the samples once collated.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

from ..registry import AttributeRecord
from ..vision.plans.batch_slots import slot_of, unmark

_stock_collate_tensor: Any = None
#: where :func:`install` was called without the patch's record: what :func:`uninstall` puts back
_unrecorded = AttributeRecord()
#: per thread, the batch a batch loader just made whole (:func:`hand_over`), until the fetch takes it
_handed = threading.local()


def hand_over(base: Any, slots: tuple[Any, ...]) -> None:
    """A batch loader's note that ``slots`` (marked, in order) are all of the batch tensor ``base``, just written, with
    no user code run since: the fetch that called it (``fetch.py``) takes it (:func:`take_handed`) and, where its
    samples are these very tensors, collates them without :func:`batch_of`'s checks of each slot."""
    _handed.batch = (base, slots)


def take_handed() -> tuple[Any, tuple[Any, ...]] | None:
    """The batch :func:`hand_over` noted in this thread since the last call, or None; the note is cleared."""
    got = getattr(_handed, "batch", None)
    if got is not None:
        _handed.batch = None
    return got


def batch_of(batch: list[Any]) -> Any:
    """The batch tensor ``batch`` is the slots of, in order, or None."""
    import torch

    if not batch or type(batch[0]) is not torch.Tensor:
        return None
    info = slot_of(batch[0])
    if info is None:
        return None
    base = info[0]
    if len(batch) != base.shape[0] or (torch.utils.data.get_worker_info() is not None and not base.is_shared()):
        return None  # (a worker process: stock collates into shared memory; a batch tensor made there is in it)
    step = base.stride(0) * base.element_size()
    start = base.data_ptr()
    shape, strides, dtype = base.shape[1:], base.stride()[1:], base.dtype
    tensor = torch.Tensor
    for k, t in enumerate(batch):
        mark = slot_of(t) if type(t) is tensor else None
        if mark is None or mark[0] is not base or mark[1] != k:
            return None
        if t.data_ptr() != start + k * step or t.shape != shape or t.dtype != dtype or t.requires_grad:
            return None  # no longer the view of its place
        own = t.stride()
        if own != strides and any(a != b and n != 1 for n, a, b in zip(shape, own, strides)):
            return None
    return base


def collate_pairs(data: Any, handed: tuple[Any, tuple[Any, ...]] | None = None) -> Any:
    """``default_collate(data)`` for the common batch, a list of ``(image, int)`` tuples whose images are the
    marked slots of one batch tensor: ``[batch tensor, torch.tensor(targets)]``, as stock's walk gives it (its tuple
    branch collates each column: the tensors through :func:`collate_tensor`, the ints by ``collate_int_fn``), without
    the walk's type tests per level. None (nothing done) for any other batch, or where ``default_collate_fn_map``
    is not the patch's for tensors and stock's for ints and tuples. ``handed``: the fetch's :func:`take_handed`;
    where the images are its slots themselves (no user code ran since they were written), they are not checked
    one by one."""
    import torch
    from torch.utils.data._utils import collate

    if type(data) is not list or not data:
        return None
    for pair in data:
        if type(pair) is not tuple or len(pair) != 2:
            return None
    fn_map = collate.default_collate_fn_map
    if fn_map.get(torch.Tensor) is not collate_tensor or fn_map.get(int) is not collate.collate_int_fn or \
            type(data[0][1]) is not int or any(isinstance(data[0], kind) for kind in fn_map):
        return None  # (stock's walk would give a tuple to a collate function of the map)
    images, targets = zip(*data)
    if slot_of(images[0]) is None:
        return None
    if handed is not None and len(images) == len(handed[1]) and all(map(operator.is_, images, handed[1])) \
            and (torch.utils.data.get_worker_info() is None or handed[0].is_shared()):
        base = handed[0]
    else:
        base = batch_of(images)
    if base is None:
        return None
    for t in images:
        unmark(t)
    return [base, collate.collate_int_fn(targets, collate_fn_map=fn_map)]


def collate_tensor(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s tensor collation: the batch tensor itself where ``batch`` is its slots, else stock's."""
    base = batch_of(batch)
    if base is None:
        return _stock_collate_tensor(batch, collate_fn_map=collate_fn_map)
    for t in batch:
        unmark(t)
    return base


def install(record: AttributeRecord | None = None) -> None:
    """Put :func:`collate_tensor` in ``default_collate_fn_map`` (the DataLoader patch), in the patch's ``record``,
    which puts stock's back at revert."""
    global _stock_collate_tensor
    import torch
    from torch.utils.data._utils import collate

    current = collate.default_collate_fn_map.get(torch.Tensor)
    if current is collate_tensor:
        return
    _stock_collate_tensor = current
    (_unrecorded if record is None else record).replace_item(collate.default_collate_fn_map, torch.Tensor,
                                                             collate_tensor)


def uninstall() -> None:
    """Put stock's tensor collation back where :func:`install` was given no record (a patch's record puts it back
    itself)."""
    _unrecorded.restore()
