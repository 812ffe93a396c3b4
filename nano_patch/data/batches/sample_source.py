"""A sample's source for the batch path: where its pixels come from, under PIL's guards, before its draws.

Per sample, in the thread that draws (``data/batches/batch_loader.py``) and in stock's order: a decoded-image cache
hit, a
miss to decode and store, or a file to decode (whole, or only a crop's window), with its size from the JPEG header
or the dataset's header index after PIL's open checks (``MAX_IMAGE_PIXELS``, truncated files, what PIL would
refuse). A guard that raises is stock's error at stock's sample (:class:`GuardRaised`); a file stock's own code
must open (:class:`OneByOne`) loads one by one, having warned nothing twice. :class:`Tables` holds what a run of
samples reads for it, the same for the thread path and the virtual workers' drawn batches.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...vision.images import cache, decode, file_index, source
from ...vision.kernels import native
from ...vision.plans import compose_call, compose_plan, oprunner

#: A sample's pixels, as the draw found them: one of these kinds, with what the render needs.
ARRAY, JPEG_WINDOW, DECODE = "array", "jpeg window", "decode"


@dataclass(slots=True)
class SampleJob:
    """One sample of a batch, between its draw and its render."""

    kind: str
    path: Any
    recording: compose_plan.Recording | None
    array: np.ndarray | None = None
    data: bytes | None = None
    size: tuple[int, int] | None = None
    #: the decoded-image cache's key material, where a miss should be stored
    material: bytes | None = None
    #: stock's ``Image.open(path).info``, where the sample can be an image (None where no image leaves the plan)
    info: dict[Any, Any] | None = None
    #: the recording as one native call (``oprunner``), or None: ``plan.render`` in Python
    native: oprunner.NativeRun | None = None
    #: the array is the decoded-image cache's (a hit)
    hit: bool = False
    #: seconds the decoded-image cache's look-up took in the draw (None: no cache)
    lookup_s: float = 0.0


def one_reusing(one: Callable[[int], Any], k: int, job: SampleJob) -> Any:
    """``one(k)``, its file's open stage not run again (it ran when ``job`` was made: PIL's warnings were given)."""
    if job.data is None and job.kind != ARRAY:
        job.data = decode.read_bytes(job.path)  # the header index answered its draw: its bytes, read now
    with decode.reusing_open(job.path, job.data, job.array if job.kind == ARRAY else None, job.info):
        return one(k)


class OneByOne(Exception):
    """A sample stock's own code must load, found before its open stage ran."""


class GuardRaised(Exception):
    """PIL's guard raised in the draw: stock's error at stock's point (the earlier samples' draws are stock's)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def guard(check: Callable[..., Any], *args: Any) -> Any:
    try:
        return check(*args)
    except Exception as exc:
        raise GuardRaised(exc) from exc


def _guarded_size_rule(height: int, width: int) -> None:
    guard(decode.check_size, height, width)


def _quiet_size_rule(height: int, width: int) -> None:
    """A size PIL's rule would act on (warn or raise): not for a virtual worker, which must never warn here."""
    raise OneByOne("an image above PIL's size limit")


def source_of(path: Any, store: cache.Store | None, crop_window: bool, index: file_index.FileIndex | None = None,
              headers: file_index.HeaderIndex | None = None, quiet: bool = False,
              identity: Any = file_index.UNREAD) -> SampleJob:
    """Where the sample's pixels come from (``source.look_up``: a cache hit, a miss to decode and store, or no
    cache), and, for a JPEG to decode, its size from the header, after PIL's open checks. ``headers``: where the
    image is not cached, the dataset's index of plain JPEGs' sizes (the file is then read on the render's thread).
    ``quiet``: anything that would give a warning or need PIL here (a size PIL's rule acts on, a JPEG with EXIF or
    MPF data, another kind of file, a truncated one) raises :class:`OneByOne` instead, having warned nothing.
    ``identity``: the file's identity, where the caller stat'ed it just now (``file_index.identities``).
    """
    material = None  # a miss to store, or None
    if store is not None:
        start = time.perf_counter()
        found = source.look_up(store, path, index=index, size_rule=_quiet_size_rule if quiet else _guarded_size_rule,
                               budget=store.fill_budget)
        if found.kind == source.HIT:  # stock's size rule applied, as its open of the file
            return SampleJob(ARRAY, path, None, array=found.array, hit=True, lookup_s=time.perf_counter() - start)
        material = found.material
        lookup_s = time.perf_counter() - start
    else:
        lookup_s = 0.0
    if material is None and headers is not None:
        indexed = headers.size_of(path, identity)
        if indexed is not None:  # a plain, whole JPEG, unchanged: its open checks come down to the size rule
            if not decode.below_size_limit(*indexed):
                if quiet:
                    raise OneByOne("an image above PIL's size limit")
                guard(decode.check_size, *indexed)
            return SampleJob(JPEG_WINDOW if crop_window else DECODE, path, None, size=indexed, lookup_s=lookup_s)
    if material is not None or headers is None:
        identity = None
    elif identity is file_index.UNREAD:
        identity = file_index.identity_of(path)
    data = decode.read_bytes(path)
    size = decode.jpeg_size(data)
    truncated = size is not None and decode.looks_truncated(data)
    plain: bool | None = None  # (read once, where it is needed)
    if quiet:
        plain = size is not None and not truncated and decode.plain_open(data)
        if not plain or not decode.below_size_limit(*size):  # type: ignore[misc]
            raise OneByOne("a file PIL must open or decode")
    # PIL's guards on the header, in this thread, in stock's order (before this sample's draws)
    if truncated:
        # stock raises for it (or, with LOAD_TRUNCATED_IMAGES, decodes PIL's fill) before its draws: stock's own
        # code loads it, before its open stage has run here
        raise OneByOne("a truncated JPEG")
    if size is not None and not guard(decode.check_open, data, *size, path):
        size = None  # PIL's open rejects the bytes: PIL decodes the file below and raises stock's error
    if identity is not None and size is not None and (plain if plain is not None else decode.plain_open(data)):
        headers.add(path, identity, size)  # (stat'ed before it was read: a later change is seen)
    if size is None:
        # not a JPEG libjpeg-turbo takes like PIL: PIL decodes it now, in this thread, as one by one
        start = time.perf_counter()
        a, reproducible = decode.decode_rgb_reproducibly(path, data=data)
        if material is not None:
            source.record_miss(store, material, a, time.perf_counter() - start, reproducible)
        return SampleJob(ARRAY, path, None, array=a, data=data, lookup_s=lookup_s)
    if material is None and crop_window:
        return SampleJob(JPEG_WINDOW, path, None, data=data, size=size, lookup_s=lookup_s)
    return SampleJob(DECODE, path, None, data=data, size=size, material=material, lookup_s=lookup_s)


def read_indexed(job: SampleJob, data: bytes | None = None) -> None:
    """The bytes of a JPEG the header index answered for (on the render's thread; ``data``: already read): still
    the whole, plain JPEG of the size the draw used, or :class:`compose_plan.RenderFailed` (the sample then loads
    one by one, from stock's state before it)."""
    if data is None:
        data = decode.read_bytes(job.path)
    if decode.jpeg_size(data) != tuple(job.size) or decode.looks_truncated(data):
        raise compose_plan.RenderFailed("the file changed after its size was read")
    job.data = data


@dataclass
class Tables:
    """What a run of samples reads for its sources and draws: the dataset's decoded-image cache, its file and header
    indexes, and the transform's plan. The same for the thread path and the virtual workers' drawn batches."""

    store: cache.Store | None
    index: file_index.FileIndex | None
    headers: file_index.HeaderIndex | None
    #: a sample may be an image, which needs its file's ``info`` (read in the draw: such samples take the full path)
    with_info: bool
    plan: compose_plan.Plan | None
    #: the plan's first step is a crop that crop-region decode can make
    crop_window: bool

    @classmethod
    def of(cls, dataset: Any, transform: Any, plan: compose_plan.Plan | None = None) -> Tables:
        """The tables of ``dataset`` under ``transform``: the last ones made for it while the transform, its plan
        and the dataset's store are the same objects (a batch asks once; they change only with those)."""
        from . import sample_loading as loading

        store = cache.store_for(dataset)
        if plan is None:
            plan = compose_call.plan_of(transform)
        kept = _made.get(dataset) if _weakly_keyed(dataset) else None
        if kept is not None and kept[0] is transform and kept[1].store is store and kept[1].plan is plan:
            return kept[1]
        with_info = loading.needs_info(transform, plan)
        tables = cls(store, file_index.for_dataset(dataset) if store is not None else None,
                     # sizes from the header index where the images are not cached
                     file_index.headers_for(dataset) if not with_info else None,
                     with_info, plan, plan is not None and plan.crop_first and native.available("crop_decode"))
        if _weakly_keyed(dataset):
            _made[dataset] = (transform, tables)
        return tables


#: per dataset, the transform its tables were last made for, and the tables (:meth:`Tables.of`)
_made: weakref.WeakKeyDictionary[Any, tuple[Any, Tables]] = weakref.WeakKeyDictionary()


def _weakly_keyed(dataset: Any) -> bool:
    try:
        weakref.ref(dataset)
        hash(dataset)
    except TypeError:
        return False
    return True
