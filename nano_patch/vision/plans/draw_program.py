"""A plan's draws as a program: each sample's native run made straight from its native draws.

The draw step of a batch (``batch_loader.py``) runs each sample's Compose on a :class:`recording.Recording`: every
step's runner makes its draws, then writes its operations down as typed ops, which ``oprunner.prepare`` turns into
the op runner's records. That generality costs Python per sample, all of it holding the GIL. Most
pipelines are a few known steps in a row (RandomResizedCrop, flips, ColorJitter, Resize, CenterCrop, RandomCrop,
then ToTensor [+ Normalize]); for them this module binds the plan once per run of samples (no user code runs
between a run's draws, so the transforms' parameters cannot change among them) and makes each sample's records
straight from the native draws (``torch_draws``), with the same checks the step runners make, in the same order.

Under ``--report`` a program counts what the plan's path counts for each sample it makes (each step, the tensor
tail, the op runner's one call: :meth:`Program.report_counts`), so that the report describes the path that runs
without it.

What a step runner would do differently for some sample (a native draw that declines, a crop outside the image, a
crop box PIL's size check warns or raises for, a hue factor stock rejects, an output size of zero) makes
:meth:`Program.draw` give the sample back untouched: the generator copy is put back where it was before the sample
(from the last checkpoint, by drawing the samples since then again: draws run no user code and are deterministic),
and the caller draws that sample by the plan, as before. Anything this module does not know at bind time (another
step, a step's parameters the runner would not take, ``--report``'s per-step counts, pillow-simd's grey) gives no
program: the plan's own path runs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels.functional import crop_checked
from ..kernels.pil_filters import FILTERS
from . import compose_call, compose_plan, oprunner, steps, stock
from . import pixel_ops as P
from .compose_state import ComposeState
from .pixels import UseStock, grey_by_position
from .recording import NotSplittable

#: the records every flip shares (they have no parameters)
_HFLIP_RECORD = P.HFLIP.record
_VFLIP_RECORD = P.VFLIP.record
_JITTER_CODES = (P.OP_BRIGHTNESS, P.OP_CONTRAST, P.OP_SATURATION, P.OP_HUE)

#: a step of a bound program: ``(st, hw, records) -> hw`` after the step, or None (the sample goes back)
Step = Callable[[np.ndarray, tuple[int, int], list[Any]], "tuple[int, int] | None"]


@dataclass(slots=True)
class _Bound:
    steps: list[Step]
    codes: frozenset[int]
    kind: int
    table: Any
    #: what the run report counts per sample the plan's path draws and renders (``compose_plan.run``'s counts)
    reasons: tuple[tuple[str, bool, str], ...] = ()


class Program:
    """A plan bound to one run of samples' draws (``bind``): :meth:`draw` per sample, in stock's order."""

    __slots__ = ("_steps", "_kind", "_table", "_st", "_checkpoint", "_since", "_reasons", "made")

    def __init__(self, bound: _Bound, draws: Any) -> None:
        self._steps, self._kind, self._table, self._reasons = bound.steps, bound.kind, bound.table, bound.reasons
        #: samples drawn by the program so far
        self.made = 0
        self._st = draws.words
        self._checkpoint = self._st.copy()
        #: sizes of the samples drawn since the checkpoint (to draw them again, where a sample goes back)
        self._since: list[tuple[int, int]] = []

    def draw(self, hw: tuple[int, int]) -> oprunner.NativeRun | None:
        """The native run of the next sample, of source size ``hw``, its draws made; or None: nothing drawn (the
        caller draws this sample by the plan, then calls :meth:`resync`)."""
        records = self._records(hw)
        if records is None:
            self._st[:] = self._checkpoint
            for done in self._since:
                self._records(done)
            return None
        self._since.append(hw)
        self.made += 1
        out_hw = records.pop()
        return oprunner.NativeRun(tuple(records), self._kind, self._table, (out_hw[0], out_hw[1], 3))

    def report_counts(self) -> dict[tuple[str, bool, str], int]:
        """The run report's counts for the samples made so far, as the plan's path counts each sample."""
        return {reason: self.made for reason in self._reasons} if self.made else {}

    def resync(self) -> None:
        """The generator copy moved outside this program (a sample drawn by the plan): checkpoint it."""
        self._checkpoint[:] = self._st
        self._since.clear()

    def _records(self, hw: tuple[int, int]) -> list[Any] | None:
        st = self._st
        records: list[Any] = []
        for step in self._steps:
            hw = step(st, hw, records)  # type: ignore[assignment]
            if hw is None:
                return None
        records.append(hw)
        return records


def bind(compose: Any, draws: Any, shared: dict[Any, Any] | None) -> Program | None:
    """``compose``'s plan as a program for one run of samples whose torch draws ``draws`` (a
    ``torch_draws.TorchDraws``) makes; None where the plan's own path must run. The steps bound for a Compose are
    kept for its next runs while nothing they read has changed (``compose_state``): a batch binds them once, not
    every batch."""
    if draws is None:
        return None
    spec = compose_call.uint8_tail(compose)
    if spec is not None and spec.erasers:
        return None
    key = (draws.kernel, draws.fused, spec is not None)
    kept = _kept.get(compose)
    if kept is not None and kept[0] == key and kept[1].still(compose):
        return Program(kept[2], draws) if kept[2] is not None else None
    state = ComposeState(compose)
    try:
        known = shared.get(id(compose)) if shared is not None else None  # (the run's plan, where the run has it)
        plan = known[1] if known is not None and known[0] is compose else compose_plan.plan_for(compose)
        bound = _bind(plan, draws, shared, spec is not None)
    except (UseStock, NotSplittable, TypeError, ValueError, AttributeError):
        bound = None
    if bound is not None and oprunner.why_not_native(bound.codes):
        bound = None
    with contextlib.suppress(TypeError):  # (a Compose that is not weakly referenceable: bound every run)
        _kept[compose] = (key, state, bound)
    return Program(bound, draws) if bound is not None else None


#: per Compose, the steps last bound for it: ((kernel, fused draws, uint8 tail), its state then, the steps or None)
_kept: weakref.WeakKeyDictionary[Any, tuple[Any, ComposeState, _Bound | None]] = weakref.WeakKeyDictionary()


def _bind(plan: compose_plan.Plan, draws: Any, shared: dict[Any, Any] | None, uint8: bool) -> _Bound | None:
    items, n = plan.items, len(plan.items)
    out: list[Step] = []
    codes: set[int] = set()
    i = 0
    while i < n:
        tail = plan.tails.get(i)
        if tail is not None:
            if i + len(tail) != n:
                return None  # steps after the tail: stock's code on the tensor
            end = _tensor_tail(tail, uint8, shared)
            if end is None:
                return None
            key = oprunner.REPORT_KEY  # (where ``compose_plan.run`` counts each step it ran, too)
            reasons = (*((key, True, type(t).__name__) for t in items[:i]),
                       (key, True, " + ".join(type(s).__name__ for s in tail.steps)), (key, True, oprunner.ONE_CALL))
            return _Bound(out, frozenset(codes), *end, reasons)
        maker = _MAKERS.get(plan.runners[i])  # type: ignore[arg-type]
        if maker is None:
            return None
        out.append(maker(items[i], draws, codes))
        i += 1
    return None  # no tensor tail: the run ends in an image


def _tensor_tail(tail: compose_plan.Tail, uint8: bool, shared: dict[Any, Any] | None) -> tuple[int, Any] | None:
    """The op runner's tail kind and table, as ``compose_plan._record_tail`` and ``oprunner.prepare`` make them
    for an RGB image (the run's tail op shared as the plan shares it)."""
    key = (tail, uint8, 3)
    end = shared.get(key) if shared is not None else None
    if end is None:
        end = P.TensorTail(*key)
        if shared is not None:
            shared[key] = end
    if end.record is None or (not end.to_bytes and end.table is None):
        return None
    if end.runner_tail is None:
        end.runner_tail = oprunner.runner_tail_of(end)
    if type(end.runner_tail) is str:
        return None
    return end.runner_tail  # type: ignore[return-value]


# --- the steps: each checks what its runner checks before any draw, once per run ----------------------------


def _make_resize_to(size: Any, interpolation: Any, max_size: Any, antialias: Any,
                    codes: set[int]) -> Callable[[tuple[int, int], list[Any]], tuple[int, int] | None]:
    """``steps.resize_arguments``' checks, once; per sample, its resize record (or nothing where the size stays)."""
    f, request = steps.resize_arguments(size, interpolation, max_size, antialias)
    if f not in FILTERS:
        raise UseStock  # a resize the op runner does not make (nearest): the plan's path
    codes.add(P.OP_RESIZE)
    fixed = tuple(request) if len(request) == 2 and max_size is None else None
    compute = stock.functional()._compute_resized_output_size

    def resize(hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
        out = fixed if fixed is not None else tuple(compute(hw, request, max_size))
        if out == hw:
            return hw
        if out[0] <= 0 or out[1] <= 0:
            return None
        records.append((P.OP_RESIZE, out[0], out[1], f, 0, 0.0, None))
        return out  # type: ignore[return-value]

    return resize


def _crop(records: list[Any], hw: tuple[int, int], top: int, left: int, height: int, width: int) -> bool:
    """``Recording.crop``'s record, where the crop lies inside the image (else False: PIL's zero fill) and PIL's
    size check of its box cannot act (else False: the plan's path gives the sample to stock's code, which makes
    that check where stock makes it; a quiet load gives its batch back)."""
    h, w = hw
    if not (top >= 0 and left >= 0 and height > 0 and width > 0 and top + height <= h and left + width <= w):
        return False
    if crop_checked(hw, top, left, height, width):
        return False
    records.append((P.OP_CROP, top, left, height, width, 0.0, None))
    return True


def _random_resized_crop(t: Any, draws: Any, codes: set[int]) -> Step:
    from ..kernels import torch_draws

    resize = _make_resize_to(t.size, t.interpolation, None, t.antialias, codes)
    scale, ratio = t.scale, t.ratio
    lr = torch_draws.log_ratio(ratio)
    if lr is None:
        raise UseStock
    lr0, lr1 = lr
    fn, fused, exp = draws.kernel.draws_resized_crop, draws.fused, torch_draws.exact_exp
    codes.add(P.OP_CROP)

    def step(st: np.ndarray, hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
        got = fn(st, hw[0], hw[1], scale, ratio, lr0, lr1, fused, exp)
        if got is None or not _crop(records, hw, *got):
            return None
        return resize((got[2], got[3]), records)

    return step


def _resize(t: Any, draws: Any, codes: set[int]) -> Step:
    resize = _make_resize_to(t.size, t.interpolation, t.max_size, t.antialias, codes)
    return lambda st, hw, records: resize(hw, records)


def _center_crop(t: Any, draws: Any, codes: set[int]) -> Step:
    size = steps.center_crop_size(t.size)
    codes.add(P.OP_CROP)
    box_of = steps.center_crop_box

    def step(st: np.ndarray, hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
        box = box_of(hw, size)
        if box is None or not _crop(records, hw, *box):
            return None  # (stock pads first)
        return size

    return step


def _random_crop(t: Any, draws: Any, codes: set[int]) -> Step:
    size = steps.random_crop_size(t)
    pads = steps.random_crop_pads
    fn = draws.kernel.draws_crop
    codes.add(P.OP_CROP)

    def step(st: np.ndarray, hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
        if pads(t, hw):
            return None
        got = fn(st, hw[0], hw[1], size)
        if got is None or not _crop(records, hw, *got):
            return None
        return (got[2], got[3])

    return step


def _flip(record: tuple[Any, ...], code: int) -> Callable[[Any, Any, set[int]], Step]:
    def make(t: Any, draws: Any, codes: set[int]) -> Step:
        p = t.p
        fn = draws.kernel.draws_below
        codes.add(code)

        def step(st: np.ndarray, hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
            got = fn(st, p)
            if got is None:
                return None
            if got:
                records.append(record)
            return hw

        return step

    return make


def _color_jitter(t: Any, draws: Any, codes: set[int]) -> Step:
    ranges = (t.brightness, t.contrast, t.saturation, t.hue)
    if grey_by_position() and (ranges[1] is not None or ranges[2] is not None):
        raise UseStock  # pillow-simd's grey depends on the pixel's place: the Python path
    fn, fused = draws.kernel.draws_jitter, draws.fused
    codes.update(code for code, r in zip(_JITTER_CODES, ranges) if r is not None)
    plain, hue_record = P.plain_factor, P.hue_record

    def step(st: np.ndarray, hw: tuple[int, int], records: list[Any]) -> tuple[int, int] | None:
        got = fn(st, *ranges, fused)
        if got is None:
            return None
        for fn_id in got[0]:
            factor = got[1 + fn_id]
            if factor is None:
                continue
            f = plain(factor)
            if f is None:
                return None
            if fn_id == 3:
                hue = hue_record(f)
                if hue is None:
                    return None  # stock raises: the plan's path gets there
                records.append(hue)
            else:
                records.append((_JITTER_CODES[fn_id], 0, 0, 0, 0, f, None))
        return hw

    return step


_MAKERS: dict[Any, Callable[[Any, Any, set[int]], Step]] = {
    steps.run_random_resized_crop: _random_resized_crop,
    steps.run_resize: _resize,
    steps.run_center_crop: _center_crop,
    steps.run_random_crop: _random_crop,
    steps.run_hflip: _flip(_HFLIP_RECORD, P.OP_HFLIP),
    steps.run_vflip: _flip(_VFLIP_RECORD, P.OP_VFLIP),
    steps.run_color_jitter: _color_jitter,
}
