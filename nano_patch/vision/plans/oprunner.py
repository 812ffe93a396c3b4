"""A sample's recorded operations as one native call: the op runner (``csrc/oplist.c``).

A batch's draw writes each sample's pixel operations down as typed ops (``recording.Recording``). Where every op of
a sample has a native record (crop, resize, flips, ColorJitter's operations, grey, per-value point ops,
sharpness) and the recording ends in the plan's tensor tail, the render makes them all, and the tail, in one call
of the extension with the GIL released once, on the decoded array or the cache's view. The kernels are the ones
the Python path calls (each checked against the installed PIL before use), called in the same order with the same
deferred geometry, so the pixels are the Python path's, and so stock's, bit for bit. Anything else (a user's
Lambda, a histogram op, a warp, a recording ending in an image) keeps the Python path (``recording.render``), and
the run report counts those samples and says why.

Where every sample of a batch runs here and ends in the same shape and dtype, the tails write straight into the
sample's slot of one preallocated batch tensor, laid out as ``default_collate``'s ``torch.stack`` lays it out;
``data/collate.py`` then hands that tensor to the batch instead of stacking (the collation costs nothing).
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import forks, report
from ..kernels import native, native_checks, native_kernels
from .batch_memory import batch_memory
from .batch_slots import mark_slot
from .pixel_ops import OP_CROP, OP_KERNELS, RenderFailed, TensorTail
from .recording import Recording

_code = operator.itemgetter(0)  # a record's op code

#: The native tail kinds (``native.h``'s NANO_TAIL_*).
BYTES, PLANES_F32, PLANES_F64, PIXELS_F32, PIXELS_F64 = range(5)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
#: Where a sample's render is counted in the run report, and how a sample the op runner renders is counted.
REPORT_KEY = "vision_transforms"
ONE_CALL = "sample rendered by the native op runner (one call)"


@dataclass(slots=True)
class NativeRun:
    """What one sample's native render needs, worked out in the draw."""

    records: tuple[tuple[Any, ...], ...]
    kind: int
    table: np.ndarray | None
    shape: tuple[int, int, int]  # the final image: height, width, channels
    #: the sample's slot of a batch tensor (a view of it), returned as the sample's image; None: a tensor of its own
    slot_tensor: Any = None
    #: the batch tensor's memory as one flat array, and the slot's place in it, in bytes (:func:`batch_tensor`):
    #: the tail writes there (:func:`_output`)
    flat: np.ndarray | None = None
    offset: int = 0
    #: the batch tensor the slot is of (None: no slot)
    batch: Any = None

    @property
    def planes(self) -> bool:
        return self.kind in (PLANES_F32, PLANES_F64)


_ready_lock = threading.Lock()
#: kernels, or op codes -> "" (all checked, the runner there) or why not
_ready: dict[frozenset[Any], str] = {}


def _why_kernels(names: frozenset[str]) -> str:
    """Why the op runner cannot run ops needing ``names`` here ("" where it can)."""
    with _ready_lock:
        why = ""
        for name in sorted(names):
            try:
                mod = native.kernel(name)
            except native.NativeUnavailable as exc:
                why = f"the {name} kernel is not used here: {exc}"
                break
            if not hasattr(mod, "run_ops"):
                why = "the compiled kernels predate the op runner (reinstall nano-patch)"
                break
    return why


def reset() -> None:
    """Forget which kernels were found usable (tests that reset ``native``)."""
    with _ready_lock:
        _ready.clear()


def prepare(recording: Recording) -> NativeRun | str:
    """The native run of ``recording``, or why it keeps the Python path."""
    ops = recording.ops
    records = [op.record for op in ops]
    if None in records:
        return ops[records.index(None)].why
    tail = ops[-1] if ops else None
    if not isinstance(tail, TensorTail):
        return "the recording does not end in the tensor tail"
    records.pop()  # the tail's: its table and output go to the runner apart
    why = why_not_native(frozenset(map(_code, records)))
    if why:
        return why
    h, w = recording.hw
    channels = 1 if recording.mode == "L" else 3
    runner_tail = tail.runner_tail
    if runner_tail is None:  # (the op is shared by a run's recordings: once per run)
        runner_tail = tail.runner_tail = runner_tail_of(tail)
    if type(runner_tail) is str:
        return runner_tail
    kind, table = runner_tail
    return NativeRun(tuple(records), kind, table, (h, w, channels))


def why_not_native(codes: frozenset[int]) -> str:
    """Why the op runner cannot run ops of these codes here ("" where it can); worked out once per set."""
    why = _ready.get(codes)
    if why is None:
        kernels = {"tables"}
        for code in codes:
            kernels.update(OP_KERNELS[code])
        why = _why_kernels(frozenset(kernels))
        with _ready_lock:
            _ready[codes] = why
    return why


def runner_tail_of(tail: TensorTail) -> tuple[int, Any] | str:
    """The op runner's tail kind and table for ``tail``, or why it has none."""
    if tail.to_bytes:
        return BYTES, None
    table = tail.table
    dtype = table.dtype
    if dtype != _F32 and dtype != _F64:
        return f"a tensor tail of {dtype}"
    f64 = dtype == _F64
    return ((PLANES_F64 if f64 else PLANES_F32) if tail.planes else (PIXELS_F64 if f64 else PIXELS_F32)), table


def _settings() -> tuple[int, int, int, int]:
    found = native_checks.found
    order_rule, weights = found.resample
    return order_rule, weights, found.grey, found.saturation


def _own_output(job: NativeRun) -> tuple[np.ndarray, Any]:
    """A new array for the tail, and the tensor over it in stock's layout (as ``plan.Tail.tensor_from``)."""
    import torch

    h, w, c = job.shape
    if job.kind == BYTES:
        out = np.empty((h, w, c), np.uint8)
        return out, torch.from_numpy(out).permute(2, 0, 1)  # PILToTensor: channels-last strides
    dtype = job.table.dtype  # type: ignore[union-attr]
    if job.planes:
        rows = job.table.shape[0]  # type: ignore[union-attr]
        out = np.empty((rows, h, w), dtype)
        t = torch.from_numpy(out)
        if rows == 1:  # stock's strides for one channel: an (H, W, 1) array seen as (1, H, W)
            t = t[0].unsqueeze(2).permute(2, 0, 1)
        return out, t
    out = np.empty((h, w, c), dtype)
    return out, torch.from_numpy(out).permute(2, 0, 1)


def _output(job: NativeRun) -> tuple[np.ndarray, Any]:
    """The array the tail writes and the sample's tensor: the job's slot of the batch tensor (its dense block of
    the batch's memory, seen as the tail's array), else its own (:func:`_own_output`)."""
    if job.flat is None:
        return _own_output(job)
    h, w, c = job.shape
    dims = (job.table.shape[0], h, w) if job.planes else (h, w, c)  # type: ignore[union-attr]
    start = job.offset // job.flat.itemsize
    return job.flat[start:start + dims[0] * dims[1] * dims[2]].reshape(dims), job.slot_tensor


def run(job: NativeRun, a: np.ndarray) -> Any:
    """``job``'s ops and tail on the H x W (x 3) uint8 array ``a``: the sample's tensor."""
    mod = native.kernel("tables")
    out, tensor = _output(job)
    mod.run_ops(a, job.records, job.kind, job.table, out, job.shape, _settings())
    return tensor


def _starts_with_crop(records: tuple[tuple[Any, ...], ...]) -> bool:
    return bool(records) and records[0][0] == OP_CROP


def _window_first(records: tuple[tuple[Any, ...], ...], size: tuple[int, int]) -> tuple[tuple[Any, ...], ...]:
    """A file's records for the native calls, which decode the window of their first crop: as they are where they
    start with one, else behind a crop of the whole ``size`` image."""
    if _starts_with_crop(records):
        return records
    return ((OP_CROP, 0, 0, size[0], size[1], 0.0, None), *records)


#: Files larger than this are read by Python (its read decides what happens).
_FILE_MAX_BYTES = 1 << 30


def run_file(job: NativeRun, path: Any, size: tuple[int, int]) -> Any:
    """``job`` on the JPEG file at ``path`` as one native call, the GIL released once: read, checked as
    ``sample_source.read_indexed`` checks it (still a whole, plain JPEG of the draw's ``size``), its first crop's
    window decoded alone (or the whole image, where the ops do not start with a crop), then the ops and the tail.
    The sample's tensor; or the file's bytes, where it was read but is left to the Python path (another size,
    truncated, damaged, a JPEG not region-decoded here); or None (not read: the Python path reads it, and meets
    its error)."""
    try:
        jpeg = native.kernel("crop_decode")
    except native.NativeUnavailable:
        return None
    api = getattr(jpeg, "file_api", None)
    mod = native.kernel("tables")
    if api is None or not hasattr(mod, "run_ops_file"):
        return None  # (compiled kernels from before this path)
    window = _starts_with_crop(job.records)
    records = _window_first(job.records, size)
    out, tensor = _output(job)
    got = mod.run_ops_file(api, path, size, (True, native_kernels.crop_multiscan()), _FILE_MAX_BYTES, records, job.kind,
                           job.table, out, job.shape, _settings())
    if got is True:
        if report.stats is not None:
            report.stats.count("vision_datasets", True, DECODED[window])
        return tensor
    return got if got is not False else None


#: What the run report counts for a file decoded by :func:`run_file`: its first crop's window, or all of it.
DECODED = {True: "JPEG window decoded by libjpeg-turbo (crop region)", False: "JPEG decoded by libjpeg-turbo"}


def run_jpeg(job: NativeRun, data: bytes, size: tuple[int, int], path: Any, *, check_rest: bool = True) -> Any:
    """``job`` on a JPEG not decoded yet: its first crop decoded alone where it can be (as ``pixels.JpegPixels``),
    else the whole file decoded first. ``check_rest=False``: the rows below the crop are not decoded to check the
    stream (``native_kernels.decode_jpeg_region``; for bytes whose markers were checked to the end of the image)."""
    from ..images import decode

    first = job.records[0] if job.records else None
    if first is not None and first[0] == OP_CROP:
        _, top, left, height, width = first[:5]
        try:
            region = native_kernels.decode_jpeg_region(data, top, left, height, width, check_rest=check_rest)
        except (native.NativeUnavailable, native_kernels.JpegRegionError):
            pass  # the whole file, as without crop decoding: its own rules, its own errors
        else:
            if report.stats is not None:
                report.stats.count("vision_datasets", True, DECODED[True])
            rest = NativeRun(job.records[1:], job.kind, job.table, job.shape, job.slot_tensor, job.flat, job.offset)
            return run(rest, region)
    a = decode.decode_rgb(path, data=data, checked=True)
    if a.shape[:2] != tuple(size):
        raise RenderFailed("the decode's size is not the header's")
    return run(job, a)


# --- the batch tensor -----------------------------------------------------------------------------------

_layouts: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...]] | None] = {}
_layouts_lock = threading.Lock()
#: batch layouts whose first slot was found to be the start of the batch's memory, dense (:func:`batch_tensor`)
_dense_layouts: set[tuple[Any, ...]] = set()


def _sample_layout(job: NativeRun) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """The shape, strides and dtype of the sample tensor stock's tail gives for ``job``."""
    import torch

    h, w, c = job.shape
    if job.kind == BYTES:
        return (c, h, w), (1, w * c, c), torch.uint8
    dtype = torch.float64 if job.table.dtype == np.float64 else torch.float32  # type: ignore[union-attr]
    if job.planes:
        rows = job.table.shape[0]  # type: ignore[union-attr]
        return (rows, h, w), ((1, w, 1) if rows == 1 else (h * w, w, 1)), dtype
    return (c, h, w), (1, w * c, c), dtype


def _batch_layout(n: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
                  ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The shape and strides of ``torch.stack`` of ``n`` such samples (what ``default_collate`` makes), found on
    the meta device (no memory), or None where a slot of it would not have the sample's own strides."""
    import torch

    key = (n, shape, strides, dtype)
    with _layouts_lock:
        if key in _layouts:
            return _layouts[key]
    proto = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    stacked = torch.stack([proto] * n, 0)
    layout = (tuple(stacked.shape), tuple(stacked.stride()))
    if tuple(stacked[0].stride()) != tuple(strides) and not _same_dense(shape, stacked[0].stride(), strides):
        layout = None
    with _layouts_lock:
        _layouts[key] = layout
    return layout


def _same_dense(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Strides that differ only on dimensions of size 1 (where no element ever steps)."""
    return all(x == y or n == 1 for n, x, y in zip(shape, a, b))


def batch_tensor(jobs: list[NativeRun]) -> Any:
    """Where every sample's tail is the same tensor: one batch tensor in ``default_collate``'s layout, each job's
    slot set to its sample's place in it and marked (``batch_slots``: ``data/collate.py`` recognises the slots).
    Else None (nothing set)."""
    first = jobs[0]
    kind, out_shape, table = first.kind, first.shape, first.table
    for j in jobs:  # (a run's samples share their tail's table: the identity answers)
        if j.kind != kind or j.shape != out_shape or (j.table is not table and (
                j.table is None or table is None or j.table.shape != table.shape)):
            return None  # stock's collate raises, or stacks other shapes: each sample its own tensor
    shape, strides, dtype = _sample_layout(first)
    layout = _batch_layout(len(jobs), shape, strides, dtype)
    if layout is None:
        return None
    base = batch_memory(layout[0], layout[1], dtype)
    # stack's layout is dense: its memory, in order, is one flat array, each slot a block of it (the tails write
    # there: run_batch's dst, _output's view); the first slot's array checks that, for all (they share a layout),
    # once per layout
    flat = base.as_strided((base.numel(),), (1,)).numpy()
    dense_key = (layout, first.planes)
    if dense_key not in _dense_layouts:
        first_view = base[0].numpy() if first.planes else base[0].numpy().transpose(1, 2, 0)
        if not first_view.flags.c_contiguous or first_view.ctypes.data != flat.ctypes.data:
            return None
        with _layouts_lock:
            _dense_layouts.add(dense_key)
    step = base.stride(0) * base.element_size()
    slots = base.unbind(0)
    if tuple(slots[0].stride()) != strides:  # they differ on a size-1 dimension: the sample's own strides
        slots = tuple(slot.as_strided(shape, strides) for slot in slots)
    mark = mark_slot
    for k, (job, slot) in enumerate(zip(jobs, slots)):
        job.slot_tensor, job.flat, job.offset, job.batch = mark(slot, base, k), flat, k * step, base
    return base


class NativeBatch:
    """A batch whose every sample renders natively into its slot of the batch tensor, with one native call per
    loader thread (``_native.run_batch``): each call takes the next sample until none is left, with the GIL
    released once. A sample is the cache's array, or a JPEG file (read, checked and window-decoded there, as
    :func:`run_file` does); its ops were parsed once for the batch. What the call leaves (a file of another size,
    truncated, damaged, unreadable) comes back from :meth:`result` for the Python path."""

    def __init__(self, handle: Any, jobs: list[NativeRun]) -> None:
        self._handle, self.jobs = handle, jobs
        mod = native.kernel("tables")
        self._run, self._done, self._result = mod.run_batch, mod.batch_done, mod.batch_result
        self._run_on = getattr(mod, "run_batch_on", None)

    def run(self) -> int:
        """Render samples until none is left (call from each loader thread); how many this call rendered."""
        return self._run(self._handle)

    def run_on(self, n_threads: int) -> int:
        """Render every sample on ``n_threads`` threads, this one and native helpers that never take the GIL (it is
        released once); how many threads ran (fewer where a helper could not be started), or 0 where this build
        has no such helpers (nothing run: call :meth:`run` from each thread)."""
        if self._run_on is None:
            return 0
        return self._run_on(self._handle, n_threads)[0]

    def done(self) -> bytes:
        """Per sample, 1 where it was written to its slot (its tensor is ``jobs[k].slot_tensor``), else 0."""
        return self._done(self._handle)

    def result(self, k: int) -> Any:
        """Sample ``k``'s tensor (its slot); or its file's bytes (read, but left to the Python path); or None (its
        file not read). Raises what the op runner raises for its ops. Call once every :meth:`run` returned."""
        got = self._result(self._handle, k)
        if got is True:
            return self.jobs[k].slot_tensor
        return got if got is not False else None


def native_batch(jobs: list[NativeRun | None], sources: list[Any]) -> NativeBatch | None:
    """The batch as :class:`NativeBatch`, where every sample runs natively into the batch tensor and its source is
    an array or an indexed JPEG file (``(path, (height, width))``; its ops starting with a crop, or the whole
    image then); else None (each sample renders on its own)."""
    if not jobs or any(j is None or j.flat is None for j in jobs):
        return None
    first = jobs[0]
    files = any(type(s) is tuple for s in sources)
    api = None
    if files:
        try:
            api = getattr(native.kernel("crop_decode"), "file_api", None)
        except native.NativeUnavailable:
            return None
        if api is None:
            return None
    mod = native.kernel("tables")
    if not hasattr(mod, "prepare_batch"):
        return None  # (compiled kernels from before this path)
    items = []
    for job, source in zip(jobs, sources):
        records = job.records  # type: ignore[union-attr]
        if type(source) is tuple:
            records = _window_first(records, source[1])
        items.append((source, records, job.offset))  # type: ignore[union-attr]
    handle = mod.prepare_batch(api, items, first.kind, first.table, first.flat, first.shape, _settings(),
                               (True, native_kernels.crop_multiscan()), _FILE_MAX_BYTES)
    return NativeBatch(handle, jobs)  # type: ignore[arg-type]


def prepare_batch(recordings: list[Recording | NativeRun | None]) -> list[NativeRun | None]:
    """Per sample, its native run (a recording's, or one the draw made: ``draw_program``), or None where it keeps
    the Python path (counted in the run report, with why); where all of them run natively, into one batch tensor
    (:func:`batch_tensor`)."""
    stats = report.stats
    jobs: list[NativeRun | None] = []
    for recording in recordings:
        if recording is None:  # no transform, or a sample loaded one by one: nothing to render
            jobs.append(None)
            continue
        if type(recording) is NativeRun:  # (made by the draw program, which counts its samples for the report)
            jobs.append(recording)
            continue
        job = prepare(recording)
        if isinstance(job, str):
            if stats is not None:
                stats.count(REPORT_KEY, False, f"sample rendered by the Python path: {job}")
            jobs.append(None)
        else:
            if stats is not None:
                stats.count(REPORT_KEY, True, ONE_CALL)
            jobs.append(job)
    if jobs and all(j is not None for j in jobs):
        batch_tensor(jobs)  # type: ignore[arg-type]
    return jobs


forks.fresh_in_child(globals(), _ready_lock=threading.Lock, _layouts_lock=threading.Lock)
