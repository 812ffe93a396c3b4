"""A user's own dataset: its lazy JPEG images through a patched ``Compose``, their pixel work deferred to the batch.

``Image.open(...).convert("RGB")`` in a user's ``__getitem__`` gives a lazy image (``vision/images/lazy_jpeg.py``).
Where a stock ``Compose`` whose plan starts with a crop is called on it (:func:`call_by_plan`):

- **one sample** (no batch is being fetched in this thread): the crop is drawn from the size, as stock draws it,
  and only its window is decoded (``compose_plan.JpegPixels``), the rest of the plan on the kernels;
- **in a batch** (the DataLoader's fetch of a map-style dataset whose ``__getitem__`` is the user's:
  :func:`fetched`): the plan's draws are made at once, in the user's ``__getitem__``, in stock's order and from
  the generators stock draws from, and the call returns the sample's tensor with its pixels not yet written.
  The batch's samples are rendered together at the end of the fetch, on the loader's threads (``loader_threads``;
  one in a worker process), before anything else sees the batch. While the fetch runs, a torch function mode in
  the fetching thread sees every torch operation: one that reads a tensor not rendered yet renders that sample
  first, in that thread (user code that looks at its sample inside ``__getitem__`` sees stock's values).

A decode that fails (a stream libjpeg-turbo's strict decode refuses) falls back to PIL's full decode of the same
bytes, and the same draws, so the pixels stay stock's. Everything else (another first step, another output, a
``Compose`` the plan does not know, an image that was read) is the patched ``Compose``'s ordinary call.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import config, report
from ...vision.images import cache, decode, lazy_jpeg
from ...vision.images.cache import fill
from ...vision.images.image import plain
from ...vision.kernels import native, torch_draws
from ...vision.plans import compose_call, compose_plan, draw_program, oprunner
from ...vision.plans.compose_state import ComposeState
from ...vision.plans.thread_setting import ThreadSetting
from .. import collate
from ..batches import generator_states
from ..threads import exit_gate, loader_threads, render_pool, thread_modes

_NOT_TAKEN = object()
#: The op runner's table dtypes as torch's (the tensor a ToTensor tail makes has the table's dtype).
_TORCH_DTYPES: dict[type, Any] = {}
#: The batch this thread is fetching, whose samples' pixel work waits (:func:`deferring`), or None.
_sink: ThreadSetting[Any] = ThreadSetting(None)
REPORT_KEY = lazy_jpeg.REPORT_KEY


def call_by_plan(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """v1's ``Compose.__call__`` wrapper: a lazy image the plan can crop before decoding runs here; everything
    else is ``compose_call.call_by_plan``'s."""
    if len(args) == 1 and not kwargs:
        pending = lazy_jpeg.pending_of(args[0])
        if pending is None and type(args[0]).__name__ == "JpegImageFile" and config.current().lazy_images:
            pending = lazy_jpeg.load_lazily(args[0])  # an opened JPEG handed as it is: loaded as stock's transform
        if pending is not None:
            out = _run_lazy(instance, args[0], pending)
            if out is not _NOT_TAKEN:
                return out
    return compose_call.call_by_plan(wrapped, instance, args, kwargs)


def check_kernels() -> None:
    """Check the kernels a lazy image's path uses, once (before worker processes fork: they inherit the verdicts
    instead of each checking them again), where lazy images and the patched transforms are on."""
    if config.current().lazy_images and compose_call.active():
        native.check_all()  # (the op runner's records need most of them: 0.15 s once per process, checked here)


def _run_lazy(compose: Any, img: Any, pending: lazy_jpeg.PendingDecode) -> Any:
    plan = compose_plan.plan_for(compose)
    if not plan.crop_first or not native.available("crop_decode"):
        return _NOT_TAKEN
    uint8 = compose_call.uint8_tail(compose) is not None
    sink = _sink.get()
    if sink is not None and not uint8:
        out = _defer(sink, compose, pending)
        if out is not _NOT_TAKEN:
            return out
    px = _pixels_outside_a_batch(pending, img.info)
    if px is None:
        return _NOT_TAKEN
    beyond = compose_plan.draws_from_python(compose)
    states = generator_states.take(beyond)
    try:
        out = compose_call.run_compose(compose, px)
    except compose_plan.DecodeFailed:
        generator_states.put_back(states)  # stock's own path on the image: PIL's decode, the same draws again
        return _NOT_TAKEN
    if report.stats is not None:
        report.count(REPORT_KEY, True, "lazy image: crop-region decode in the transform")
    return plain(out)


def _pixels_outside_a_batch(pending: lazy_jpeg.PendingDecode, info: dict[Any, Any]) -> Any:
    """What a render outside a batch reads: the JPEG's bytes (a first crop decodes only its window); the pixels,
    where the image holds them, or is rendered a second time (it is kept: stock decoded it once, at ``convert``);
    None where PIL holds them now (the transform's ordinary call)."""
    if pending.pixels is None and pending.renders:
        pending.kept_pixels()
    pending.renders += 1
    pixels, data = pending.pixels, pending.data
    if pixels is not None:
        return compose_plan.Pixels(pixels, info)
    if data is None:
        return None
    px = compose_plan.JpegPixels(data, pending.hw, None)
    px.info = info
    return px


def _defer(sink: _Batch, compose: Any, pending: lazy_jpeg.PendingDecode) -> Any:
    """The sample's draws now, its tensor with the render to come at the end of the batch; or not taken (nothing
    drawn: the generators are where they were)."""
    import torch

    with torch._C.DisableTorchFunction():  # the draws' own torch calls: not the batch's mode
        job: Any = _drawn_natively(sink, compose, pending.hw)
        if job is None:
            beyond = compose_plan.draws_from_python(compose)
            states = generator_states.take(beyond)
            try:
                recording = compose_call.run_compose(compose, compose_plan.Recording(pending.hw))
            except compose_plan.NotSplittable as exc:
                generator_states.put_back(states)
                if report.stats is not None:
                    report.count(REPORT_KEY, False, f"sample rendered in __getitem__: {exc}")
                return _NOT_TAKEN
            job = oprunner.prepare(recording) if isinstance(recording, compose_plan.Recording) else "no tensor"
        deferrable = not isinstance(job, str) and job.planes and job.table is not None and job.table.shape[0] == 3
        if deferrable:
            h, w, _ = job.shape
            dtype = _TORCH_DTYPES.get(job.table.dtype.type)
            if dtype is None:
                dtype = _TORCH_DTYPES[job.table.dtype.type] = torch.from_numpy(job.table[:0]).dtype
            tensor = torch.empty((3, h, w), dtype=dtype)
            job.flat, job.offset, job.slot_tensor = tensor.numpy().reshape(-1), 0, tensor
    if deferrable:
        if not sink.add(tensor, job, pending):
            _render(job, pending)
        return tensor
    # drawn, but not a three-channel float tensor: rendered here, from the same draws
    if report.stats is not None:
        why = job if isinstance(job, str) else "not a three-channel float tensor"
        report.count(REPORT_KEY, False, f"sample rendered in __getitem__: {why}")
    if isinstance(job, str):
        return plain(_render_recording(recording, pending))
    return _render(job, pending)


def _drawn_natively(sink: _Batch, compose: Any, hw: tuple[int, int]) -> oprunner.NativeRun | None:
    """The sample's native run, its draws made natively from a copy of torch's generator and handed back to it
    (``draw_program``, as the batch path draws); None, torch's generator untouched, where the plan's own draws must
    run (a step the program does not know, a draw it gives back, another thread drawing meanwhile)."""
    bound = sink.program_for(compose)
    if bound is None:
        return None
    draws, program = bound
    run = program.draw(hw)
    if run is None or not draws.to_torch_unless_moved():
        return None
    if report.stats is not None:
        report.stats.count_many(dict.fromkeys(program.report_counts(), 1))
    return run


class _Bound:
    """A Compose's draw program, bound once per batch (its steps read the transforms' parameters then), with what
    it was bound to: used again for the batch's next sample only where nothing it read has changed since (user code
    runs between the samples: a changed parameter, list of transforms or default dtype binds it again)."""

    __slots__ = ("state", "draws", "program")

    def __init__(self, compose: Any, draws: Any, program: Any) -> None:
        self.state, self.draws, self.program = ComposeState(compose), draws, program

    def still(self, compose: Any) -> bool:
        return self.state.still(compose)


# The decoders below get no path: a strict decode that fails must not fall back to reading the file again (it may
# have changed since ``convert`` read it); PIL's decode of the bytes read then decides (:func:`_decoded`).


def _render_recording(recording: Any, pending: lazy_jpeg.PendingDecode) -> Any:
    pixels, data = pending.pixels, pending.data
    if pixels is None and data is not None:
        try:
            return compose_plan.render(recording, compose_plan.JpegPixels(data, pending.hw, None))
        except compose_plan.DecodeFailed:
            pass
    return compose_plan.render(recording, compose_plan.Pixels(pixels if pixels is not None else _decoded(pending)))


def _decoded(pending: lazy_jpeg.PendingDecode) -> np.ndarray:
    """PIL's decode of the bytes (stock's pixels, or stock's error), as an H x W x 3 array."""
    from PIL import Image

    img = Image.Image()._new(pending.core())
    return np.asarray(img)


def _render(job: oprunner.NativeRun, pending: lazy_jpeg.PendingDecode, keep: bool = False,
            store: cache.Store | None = None) -> Any:
    """The sample's tensor, its pixels written (into its slot, where it has one): from the pixels the image holds
    (``keep``: it is kept beyond the batch, so it decodes them once now, as stock's ``convert`` did); else through
    the decoded-image cache (``store``: :func:`_render_through`); else the crop's window decoded, else PIL's full
    decode of the bytes."""
    pixels = pending.kept_pixels() if keep else pending.pixels
    if pixels is not None:
        return oprunner.run(job, pixels)
    data = pending.data
    if data is not None and store is not None:
        out = _render_through(store, job, pending, data)
        if out is not None:
            return out
    return _render_bytes(job, pending, data)


def _render_bytes(job: oprunner.NativeRun, pending: lazy_jpeg.PendingDecode, data: bytes | None) -> Any:
    if data is not None:
        try:
            # (its markers were checked to the end of the image at convert: damage below the crop, which a strict
            # decode of the rest would find, leaves the crop's pixels as PIL's decode makes them)
            return oprunner.run_jpeg(job, data, pending.hw, None, check_rest=False)
        except Exception:  # noqa: BLE001 - a stream the strict decoders refuse: PIL decides, as stock's load
            pass
    return oprunner.run(job, _decoded(pending))


def _render_through(store: cache.Store, job: oprunner.NativeRun, pending: lazy_jpeg.PendingDecode,
                    data: bytes) -> Any:
    """The sample rendered through the decoded-image cache, keyed by the bytes the image was made of
    (``cache.content_material``: the file may have changed since ``convert`` read them): a hit renders from the
    store's view; a miss the store takes (within ``--fast``'s fill budget) is decoded in full, rendered from that
    and stored. None where the cache does not serve it (the caller renders it as with the cache off)."""
    start = time.perf_counter()
    material = cache.content_material(data)
    found = store.get(material)
    looked = time.perf_counter() - start
    budget = store.fill_budget
    if found is not None and found.shape == (*pending.hw, 3):
        out = oprunner.run(job, found)
        cache.count_hit(found)
        if budget is not None:
            budget.seen(fill.HIT, time.perf_counter() - start - looked, looked)
        return out
    start = time.perf_counter()
    if not store.accepting or (budget is not None and not budget.fill()):
        out = _render_bytes(job, pending, data)
        if budget is not None:
            budget.seen(fill.UNCACHED, time.perf_counter() - start, looked)
        return out
    try:
        pixels, reproducible = decode.decode_rgb_reproducibly(pending.path, data=data, checked=True)
    except Exception:  # noqa: BLE001 - a stream the strict decode refuses: rendered as with the cache off
        return None
    if pixels.shape != (*pending.hw, 3):
        return None
    decoded = time.perf_counter()
    out = oprunner.run(job, pixels)
    stored = reproducible and store.put(material, pixels)
    cache.count_miss(pixels, decoded - start, stored)
    if budget is not None:
        budget.seen(fill.FILLED, time.perf_counter() - start, looked)
    return out


#: an entry's render: not started (and not for the early renders), queued for them, under way, done
UNQUEUED, QUEUED, RENDERING, DONE = 0, 1, 2, 3
#: seconds a wait on the early renders' helper sleeps before it looks at the interpreter's exit again
_WAKE_S = 1.0


class _Entry:
    """A sample of the batch whose pixels wait: its tensor, its native run, its image, and its render's state."""

    __slots__ = ("tensor", "job", "pending", "state", "error")

    def __init__(self, tensor: Any, job: oprunner.NativeRun, pending: lazy_jpeg.PendingDecode) -> None:
        self.tensor, self.job, self.pending = tensor, job, pending
        self.state = UNQUEUED
        self.error: BaseException | None = None


class _Batch:
    """The samples of one fetch whose pixels wait, by their tensors; the torch function mode that watches them is
    entered with the first (a fetch whose samples never wait pays nothing per torch call).

    Where the batch loads on more than one thread, a sample's render starts as soon as it waits, on a helper thread
    (:meth:`_render_early`), while the user's ``__getitem__`` goes on with the next sample: the serial part (the
    user's own code, each image's open and draws) and the pixel work overlap. Only images made in this fetch are
    rendered early (one the user kept from before holds its pixels: :meth:`finish`)."""

    def __init__(self, store: cache.Store | None = None, n_threads: int = 1) -> None:
        #: the decoded-image cache the samples' renders go through, or None
        self.store = store
        self.waiting: dict[int, _Entry] = {}
        self.lock = threading.Lock()
        #: the early renders' queue and its signal (under ``lock``)
        self.queue: collections.deque[_Entry] = collections.deque()
        self.ready = threading.Condition(self.lock)
        self.closed = False
        #: threads waiting for an early render to be done (:meth:`render_now`)
        self.awaited = 0
        #: the early renders' helper (``render_pool.Background``), and the torch state it renders in
        self.helper: Any = None
        self.state = thread_modes.capture() if n_threads > 1 else None
        #: lazy images made from here on are this fetch's own
        self.born = lazy_jpeg.made_so_far()
        #: the batch's draw programs by Compose (:meth:`program_for`), and what their tails share
        self.programs: dict[int, _Bound] = {}
        self.shared: dict[Any, Any] = {}
        self.mode: Any = None
        #: torch's function-mode stack depth when the fetch began: a mode of the user's entered since (inside their
        #: ``__getitem__``) would be popped by ours, so no sample waits then
        self.depth = _mode_depth()

    def program_for(self, compose: Any) -> tuple[Any, Any] | None:
        """``compose``'s draw program for this batch's next sample, its generator copy taken from torch's now; None
        where the plan's own draws run."""
        if not native.available("torch_draws"):
            return None
        bound = self.programs.get(id(compose))
        if bound is not None and bound.still(compose):
            bound.draws.from_torch()
            bound.program.resync()
            return bound.draws, bound.program
        self.shared.clear()  # (a tail's table shared under its plan's Tail: a Normalize changed makes it again)
        draws = torch_draws.start(native.kernel("torch_draws"))
        program = draw_program.bind(compose, draws, self.shared) if draws is not None else None
        if program is None:
            return None
        try:
            self.programs[id(compose)] = _Bound(compose, draws, program)
        except Exception:  # noqa: BLE001 - a transform whose state does not copy: bound for this sample only
            self.programs.pop(id(compose), None)
        return draws, program

    def add(self, tensor: Any, job: oprunner.NativeRun, pending: lazy_jpeg.PendingDecode) -> bool:
        """Let the sample wait (True), watched from now on, its render started early where it can be; or False (the
        caller renders it now)."""
        if self.mode is None:
            if _mode_depth() != self.depth:
                return False
            self.mode = _mode_cls(self)  # type: ignore[misc]
            self.mode.__enter__()
        entry = _Entry(tensor, job, pending)
        early = self.state is not None and pending.serial >= self.born and pending.pixels is None
        with self.lock:
            self.waiting[id(tensor)] = entry
            if early:
                entry.state = QUEUED
                self.queue.append(entry)
                if len(self.queue) == 1:  # (the helper waits only on an empty queue)
                    self.ready.notify()
        if early and self.helper is None:
            self.helper = render_pool.Background(self._render_early)
        return True

    def _render_early(self) -> None:
        """The helper's loop: the queued samples' renders, in order, until the batch is finished."""
        try:
            with thread_modes.entered(self.state):
                while True:
                    with self.lock:
                        while not self.queue and not self.closed:
                            if not self.ready.wait(_WAKE_S) and exit_gate.exiting():
                                return
                        if not self.queue:
                            return
                        entry = self.queue.popleft()
                        entry.state = RENDERING
                    try:
                        _render(entry.job, entry.pending, store=self.store)
                    except Exception as exc:  # noqa: BLE001 - raised by the fetch, in sample order (finish)
                        entry.error = exc
                    with self.lock:
                        entry.state = DONE
                        if self.awaited:
                            self.ready.notify_all()
                    del entry
        except thread_modes.NotEntered:
            return  # (the samples left queued are rendered by finish)

    def stop_watching(self) -> None:
        mode, self.mode = self.mode, None
        if mode is not None and _mode_depth() == self.depth + 1:
            mode.__exit__(None, None, None)

    def render_now(self, tensors: list[Any]) -> None:
        """Render these waiting samples in this thread (a torch operation reads them), or wait for the early render
        under way."""
        for t in tensors:
            with self.lock:
                entry = self.waiting.pop(id(t), None)
                if entry is None:
                    continue
                if entry.state == QUEUED:
                    self.queue.remove(entry)
                    entry.state = RENDERING
                elif entry.state == RENDERING:
                    self.awaited += 1
                    while entry.state != DONE:  # (the helper's render under way: it always ends)
                        self.ready.wait(_WAKE_S)
                    self.awaited -= 1
            if entry.state == DONE:
                if entry.error is not None:
                    raise entry.error
                continue
            _render(entry.job, entry.pending, store=self.store)
            entry.state = DONE

    def _end_early_renders(self) -> None:
        """No more early renders: the queued ones are taken back (``finish`` renders them), the one under way ends."""
        with self.lock:
            self.closed = True
            for entry in self.queue:
                entry.state = UNQUEUED
            self.queue.clear()
            self.ready.notify_all()
        helper, self.helper = self.helper, None
        if helper is not None:
            helper.join()

    def finish(self, n_threads: int, data: Any = None) -> None:
        """Render every waiting sample not rendered yet, on ``n_threads`` threads, into one batch tensor where
        ``data`` (the fetched samples) allows (:meth:`_into_batch`); a sample's error is raised once all are done."""
        self._end_early_renders()
        with self.lock:
            entries = list(self.waiting.values())
            whole = self._into_batch(data, entries) if data is not None else None
            self.waiting.clear()
        if not entries:
            return
        # an image still alive once its __getitem__ returned is kept by the user's code (a list of images loaded
        # once, a cache): it holds its pixels from now on, as stock's does
        kept = [_held(e.pending) > _ENTRY_ONLY for e in entries]  # (the shape _ENTRY_ONLY is measured in)
        jobs = [(e.job, e.pending, keep, self.store) for e, keep in zip(entries, kept) if e.state != DONE]
        for e, keep in zip(entries, kept):
            if e.state == DONE and keep and e.error is None:
                e.pending.kept_pixels()  # (rendered early from its bytes; kept, it holds its pixels as stock's)
        errors = [e.error for e in entries if e.state == DONE and e.error is not None]
        del entries
        parallel = n_threads > 1 and len(jobs) > 1
        outcomes = render_pool.map_outcomes(lambda e: _render(*e), jobs, n_threads if parallel else 1,
                                            thread_modes.capture() if parallel else None)
        for ok, error in outcomes:
            if not ok:
                errors.append(error)
        if errors:
            raise errors[0]
        if whole is not None:
            collate.hand_over(*whole)
        if report.stats is not None:
            where = "into the batch tensor" if whole is not None else "into each sample"
            threads = f"{n_threads} thread{'s' if n_threads != 1 else ''}"
            report.count(REPORT_KEY, True, f"lazy image: pixel work deferred to the batch, on {threads}, {where}")

    def _into_batch(self, data: Any, entries: list[_Entry]) -> tuple[Any, tuple[Any, ...]] | None:
        """Where every sample is a ``(tensor, int)`` tuple or a dict holding one waiting tensor, and nothing but the
        fetched list holds the samples and their tensors (so nothing of the user's can see the change): the samples
        become the slots of one batch tensor, which ``default_collate`` then takes as it is (``data/collate.py``),
        as the batch path renders ImageFolder's batches; a sample rendered early is copied into its slot. The batch
        tensor and its slots, or None (nothing changed)."""
        if type(data) is not list or len(data) != len(entries) or not data:
            return None
        waiting = self.waiting
        places: list[Any] = []
        for sample in data:
            if type(sample) is tuple and len(sample) == 2:
                key: Any = 0
            elif type(sample) is dict:
                keys = [k for k, v in sample.items() if id(v) in waiting]
                if len(keys) != 1:
                    return None
                key = keys[0]
            else:
                return None
            t = sample[key]
            entry = waiting.get(id(t))
            # held by the fetched list, the waiting entry and its job, and here: nothing of the user's
            if entry is None or entry.tensor is not t or _references(sample, t) != _UNSHARED:
                return None
            places.append((key, entry))
        jobs = [entry.job for _, entry in places]
        rendered = [(entry.tensor if entry.state == DONE else None) for _, entry in places]
        base = oprunner.batch_tensor(jobs)
        if base is None:
            return None
        slots = tuple(job.slot_tensor for job in jobs)
        for k, (key, entry) in enumerate(places):
            if rendered[k] is not None:
                slots[k].numpy()[...] = rendered[k].numpy()  # (its pixels, written before it had a slot)
            entry.tensor = slots[k]
            sample = data[k]
            if key == 0 and type(sample) is tuple:
                data[k] = (slots[k], sample[1])
            else:
                sample[key] = slots[k]
        return base, slots


def _held(obj: Any) -> int:
    return sys.getrefcount(obj)


def _entry_only() -> int:
    """:func:`_held`'s count of a pending decode held by the batch's entry alone, where :meth:`_Batch.finish`
    counts it (measured in the same shape, not assumed: what a loop variable or an argument adds differs between
    Python versions)."""
    entries = list({0: _Entry(object(), None, object())}.values())  # type: ignore[arg-type]
    kept = [_held(e.pending) for e in entries]
    return kept[0]


_ENTRY_ONLY = _entry_only()


def _references(sample: Any, t: Any) -> tuple[int, int]:
    return sys.getrefcount(sample), sys.getrefcount(t)


def _unshared() -> tuple[int, int]:
    """:func:`_references` of a sample and its tensor held only as :meth:`_Batch._into_batch` finds them held where
    nothing of the user's holds them (measured, not assumed: the count a local or an argument adds differs between
    Python versions)."""
    t = object()
    job = oprunner.NativeRun((), 0, None, (0, 0, 0), slot_tensor=t)
    entry = _Entry(t, job, None)  # type: ignore[arg-type]
    data = [(t, 0)]
    for sample in data:
        t = sample[0]
        return _references(sample, t) if entry.tensor is t else (0, 0)
    return 0, 0


_UNSHARED = _unshared()


def _mode_depth() -> int:
    import torch

    return torch._C._len_torch_function_stack()


def _waiting_in(batch: _Batch, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
    """The waiting tensors among a torch call's arguments (one level of lists, tuples and dicts)."""
    waiting = batch.waiting
    found = []
    for a in (*args, *(kwargs.values() if kwargs else ())):
        if id(a) in waiting:
            found.append(a)
        elif type(a) in (list, tuple):
            found.extend(x for x in a if id(x) in waiting)
        elif type(a) is dict:
            found.extend(x for x in a.values() if id(x) in waiting)
    return found


def _metadata_calls() -> frozenset[Any]:
    import torch

    T = torch.Tensor
    getters = [getattr(T, n).__get__ for n in ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda",
                                                "layout", "is_sparse", "is_quantized", "is_meta", "grad_fn")]
    return frozenset([*getters, T.size, T.dim, T.numel, T.nelement, T.stride, T.is_contiguous, T.element_size,
                      T.is_floating_point, T.is_complex, T.__len__])


_METADATA: frozenset[Any] | None = None


def _mode_class() -> type:
    from torch.overrides import TorchFunctionMode

    class RenderOnRead(TorchFunctionMode):
        """While a batch is fetched: a torch call that reads a waiting sample renders it first."""

        def __init__(self, batch: _Batch) -> None:
            super().__init__()
            self.batch = batch

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            if self.batch.waiting and func not in _METADATA:  # type: ignore[operator]
                found = _waiting_in(self.batch, args, kwargs)
                if found:
                    self.batch.render_now(found)
            return func(*args, **(kwargs or {}))

    return RenderOnRead


_mode_cls: type | None = None


def _store_of(dataset: Any) -> cache.Store | None:
    if dataset is None:
        return None
    try:
        return cache.store_for_own(dataset)
    except Exception:  # noqa: BLE001 - the cache is an optimisation: a store that cannot open is none
        return None


def hold_pixels_before_fork(n_threads: int) -> None:
    """Before worker processes fork: every lazy image alive holds its pixels (decoded on ``n_threads`` threads).
    Images alive now are the script's own (a list of images loaded once): stock decoded them at ``convert``, so
    its forked workers inherit pixels; decoded in each worker instead, they would be decoded again in every
    epoch's workers."""
    pending = lazy_jpeg.undecoded_alive()
    if not pending:
        return
    outcomes = render_pool.map_outcomes(lambda p: p.kept_pixels(), pending, n_threads,
                                        thread_modes.capture() if n_threads > 1 else None)
    del outcomes  # (an image that fails to decode raises where its pixels are read, as stock's would)


def fetched(load: Callable[[], Any], dataset: Any = None) -> Any:
    """``load()`` (the fetch's call of the user's ``__getitem__`` or ``__getitems__`` on ``dataset``), with lazy
    images' pixel work waiting until it returns, then rendered on the loader's threads (also when it raises: a
    sample the user kept is whole), through the decoded-image cache where it is on."""
    global _METADATA, _mode_cls
    if _sink.get() is not None or not config.current().lazy_images or not loader_threads.batch_path_on():
        return load()
    if _mode_cls is None:
        _METADATA, _mode_cls = _metadata_calls(), _mode_class()
    batch = _Batch(_store_of(dataset), loader_threads.threads())
    with _sink.set(batch):
        try:
            data = load()
        except BaseException:
            batch.stop_watching()
            with contextlib.suppress(Exception):
                batch.finish(1)
            raise
        batch.stop_watching()
    batch.finish(loader_threads.threads(), data)
    return data
