"""``nano-patch run --report``: what the patches did in a run, where the time went, what to try next.

Bookkeeping only: the patches call :func:`count` and :func:`add_seconds` when :data:`stats` is set,
which happens only when the run asked for a report (``_NANO_PATCH_REPORT_DIR`` in the environment).
With the report off, each call site pays one ``is not None`` test and nothing else.

Counts come from every process of the run (DataLoader workers, ranks): each writes its own totals to
``counts-<pid>.json`` in the report folder, about once a second and at its exit; the Lightning part
(rank 0's profiler figures) goes to ``lightning-<pid>.json``. The process that started the run
merges them at its end, in :func:`compose`.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import threading
import time
import weakref
from collections import Counter
from typing import Any

#: The folder every process of a reporting run writes its figures to.
REPORT_DIR_ENV = "_NANO_PATCH_REPORT_DIR"
FLUSH_SECONDS = 1.0
#: Share of the step spent waiting for data above which the report suggests DataLoader workers.
DATA_WAIT_ADVICE = 0.20
#: Share of image loading time spent resizing above which the report says how to make resizes faster.
RESIZE_ADVICE = 0.10
#: Loader figures merged across processes by their largest value, not their sum.
_MAX_KEYS = ("max_workers", "parallel_threads")
#: Sections whose accelerated paths the report lists too: the lazy images' (a user's own dataset: which path it took).
_PATHS_SHOWN = ("pil_images",)


class Stats:
    """This process's counts of accelerated and fallback calls, with reasons, and timed sections."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.counts: Counter[tuple[str, bool, str]] = Counter()
        self.seconds: Counter[str] = Counter()
        self.loader: Counter[str] = Counter()
        #: the decoded-image cache: hits, misses, stored, bytes, decode seconds and pixels
        #: (vision/images/cache/figures.py)
        self.cache: Counter[str] = Counter()
        #: decisions made once in a run (``num_processes="auto"``'s figures), by name
        self.sections: dict[str, Any] = {}
        self.iterators: list[weakref.ref[Any]] = []
        self._flushed = time.monotonic()
        # The loader's threads count too: counters are updated under a lock, never relying on the GIL.
        self._lock = threading.Lock()
        self._register_exit()

    def _register_exit(self) -> None:
        from multiprocessing import util

        atexit.register(self.flush)
        self._flush_at_process_exit()
        # A multiprocessing child (a DataLoader worker, a forked rank) drops its parent's finalizers when it
        # starts, then runs these; it ends with os._exit, where atexit does not run.
        util.register_after_fork(self, Stats._flush_at_process_exit)

    def _flush_at_process_exit(self) -> None:
        from multiprocessing import util

        util.Finalize(None, self.flush, exitpriority=100)

    def reset_in_child(self) -> None:
        """After fork: the child counts its own calls, not a copy of its parent's."""
        self.counts.clear()
        self.seconds.clear()
        self.loader.clear()
        self.cache.clear()
        self.sections.clear()
        self.iterators.clear()
        self._flushed = time.monotonic()
        self._lock = threading.Lock()  # a lock held by a thread of the parent's stays held in the child

    def count(self, patch: str, fast: bool, reason: str) -> None:
        with self._lock:
            self.counts[(patch, fast, reason)] += 1
        self._maybe_flush()

    def count_many(self, counts: dict[tuple[str, bool, str], int]) -> None:
        """:meth:`count` for each key, as often as its value (a batch's samples counted at once)."""
        with self._lock:
            self.counts.update(counts)
        self._maybe_flush()

    def add_seconds(self, key: str, seconds: float) -> None:
        with self._lock:
            self.seconds[key] += seconds

    def add_cache(self, figures: dict[str, float]) -> None:
        """Add to the decoded-image cache's figures (hits, misses, stored, bytes, decode seconds and pixels)."""
        with self._lock:
            for key, value in figures.items():
                self.cache[key] += value

    def add_loader(self, figures: dict[str, float]) -> None:
        """Add to the loader's figures (``parallel_threads`` keeps the largest)."""
        with self._lock:
            for key, value in figures.items():
                if key in _MAX_KEYS:
                    self.loader[key] = max(self.loader[key], value)
                else:
                    self.loader[key] += value
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._flushed > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self._flushed = time.monotonic()
        with self._lock:
            if not (self.counts or self.seconds or self.loader or self.cache or self.sections):
                return
            data = {"counts": [[p, f, r, n] for (p, f, r), n in self.counts.items()],
                    "seconds": dict(self.seconds), "loader": dict(self.loader), "cache": dict(self.cache),
                    "sections": dict(self.sections)}
        _write_json(os.path.join(self.directory, f"counts-{os.getpid()}.json"), data)


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass  # the run's folder is gone (the run ended): nothing to report to


#: Set in every process of a run that asked for a report; None otherwise.
stats: Stats | None = None


def activate_from_env() -> None:
    """Start counting if this process belongs to a run that asked for a report."""
    global stats
    directory = os.environ.get(REPORT_DIR_ENV)
    if directory and stats is None and os.path.isdir(directory):
        stats = Stats(directory)


def _after_fork_in_child() -> None:
    if stats is not None:
        stats.reset_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def count(patch: str, fast: bool, reason: str) -> None:
    """Record one call of ``patch`` on its accelerated path (``fast``) or a fallback, and why."""
    if stats is not None:
        stats.count(patch, fast, reason)


def note(section: str, value: dict[str, Any]) -> None:
    """Record a decision made once in the run (JSON-able), shown in the report under ``section``."""
    if stats is not None:
        with stats._lock:
            stats.sections[section] = value
        stats.flush()


def write_training(figures: dict[str, Any]) -> None:
    """Rank 0's training figures (Lightning profiler), for the process that composes the report."""
    if stats is not None:
        _write_json(os.path.join(stats.directory, f"lightning-{os.getpid()}.json"), figures)


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (lists, tuples and dicts searched)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size(item)
            if n:
                return n
    return 0


class TimedBatches:
    """A DataLoader iterator that records time waiting in ``next()``, time between batches, and samples."""

    def __init__(self, iterator: Any, num_workers: int, loader_iterator: Any = None) -> None:
        self._iterator = iterator
        self._last: float | None = None
        if stats is not None:
            stats.loader["max_workers"] = max(stats.loader["max_workers"], num_workers)
            if num_workers > 0 and loader_iterator is not None:
                stats.iterators.append(weakref.ref(loader_iterator))

    def __iter__(self) -> TimedBatches:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        batch = next(self._iterator)
        end = time.perf_counter()
        if stats is not None:
            loader = stats.loader
            loader["wait_s"] += end - start
            if self._last is not None:
                loader["step_s"] += start - self._last
            loader["samples"] += batch_size(batch)
        self._last = end
        return batch

    def __len__(self) -> int:
        return len(self._iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)


def _read_all(directory: str, pattern: str) -> list[dict[str, Any]]:
    """Every readable JSON file matching ``pattern``; one half-written by a dying process is skipped."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    return found


def _merge(directory: str) -> tuple[Counter, Counter, Counter, Counter, dict[str, Any] | None, dict[str, Any]]:
    counts: Counter[tuple[str, bool, str]] = Counter()
    sections: dict[str, Any] = {}
    seconds: Counter[str] = Counter()
    loader: Counter[str] = Counter()
    cache: Counter[str] = Counter()
    for data in _read_all(directory, "counts-*.json"):
        for p, fast, reason, n in data.get("counts", []):
            counts[(p, bool(fast), reason)] += int(n)
        seconds.update(data.get("seconds", {}))
        cache.update(data.get("cache", {}))
        sections.update(data.get("sections", {}))
        for k, v in data.get("loader", {}).items():
            loader[k] = max(loader[k], v) if k in _MAX_KEYS else loader[k] + v
    training = (_read_all(directory, "lightning-*.json") or [None])[-1]
    return counts, seconds, loader, cache, training, sections


def cache_summary(cache: Counter) -> dict[str, Any] | None:
    """Hits, misses, bytes and the decode time the hits saved (estimated from the full decodes timed on
    misses in this run, per pixel), or None when no image went through the decoded-image cache."""
    if not (cache.get("hits") or cache.get("misses")):
        return None
    per_px = cache["decode_s"] / cache["decode_px"] if cache.get("decode_px") else None
    return {"hits": int(cache["hits"]), "misses": int(cache["misses"]), "stored": int(cache["stored"]),
            "bytes_read": int(cache["hit_bytes"]), "bytes_stored": int(cache["stored_bytes"]),
            "decode_s_saved": None if per_px is None else cache["hit_px"] * per_px,
            "decode_s_spent": float(cache["decode_s"])}


def threads_summary(loader: Counter) -> dict[str, Any] | None:
    """The loader's threads (``data/batches/batch_loader.py``): batches split, the serial (draw) time per image, the
    render
    time per image, and how much faster the threads made loading; None when no batch was split."""
    n = loader.get("parallel_samples", 0)
    if not n:
        return None
    draw, render, wall = loader["draw_s"], loader["render_s"], loader["render_wall_s"]
    return {"threads": int(loader["parallel_threads"]), "batches": int(loader["parallel_batches"]),
            "samples": int(n), "serial_ms_per_image": 1000 * draw / n, "render_ms_per_image": 1000 * render / n,
            "render_speedup": render / wall if wall > 0 else 1.0,
            "loading_speedup": (draw + render) / (draw + wall) if draw + wall > 0 else 1.0}


def stop_workers() -> None:
    """End the run's DataLoader workers now (as interpreter exit would), so their last counts are written."""
    if stats is None:
        return
    for ref in stats.iterators:
        iterator = ref()
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):  # a report must never fail the run
                shutdown()


def compose(wall_time: float, patch_rows: list[dict[str, Any]], unused_knobs: list[str],
            trained: list[dict[str, Any]], has_native_bf16: bool, pillow_simd: bool,
            native_resample: str = "") -> dict[str, Any]:
    """The report as a dict: wall time, training time split, per-patch counts, next steps."""
    if stats is not None:
        stop_workers()
        stats.flush()
    counts, seconds, loader, cache, training, sections = _merge(stats.directory) if stats is not None else (
        Counter(), Counter(), Counter(), Counter(), None, {})
    if training is None and loader.get("samples"):
        wait, step = loader["wait_s"], loader["step_s"]
        training = {"source": "DataLoader iteration (all loaders, this process)", "data_wait_s": wait,
                    "step_s": step, "samples": int(loader["samples"]), "num_workers": int(loader["max_workers"])}
    if training is not None:
        busy = training["data_wait_s"] + training["step_s"]
        training["data_wait_share"] = training["data_wait_s"] / busy if busy > 0 else 0.0
        training["images_per_s"] = training["samples"] / busy if busy > 0 else 0.0

    patches = []
    for row in patch_rows:
        if row["state"] != "applied":
            continue
        mine = {k: n for k, n in counts.items() if k[0] == row["name"]}
        fallbacks = sorted(((r, n) for (_, fast, r), n in mine.items() if not fast), key=lambda x: -x[1])
        fast = sorted(((r, n) for (_, f, r), n in mine.items() if f), key=lambda x: -x[1])
        patches.append({
            "name": row["name"],
            "accelerated": sum(n for _, n in fast),
            "fallback": sum(n for _, n in fallbacks),
            "top_accelerated": [{"what": r, "count": n} for r, n in fast[:5]],
            "top_fallbacks": [{"reason": r, "count": n} for r, n in fallbacks[:5]],
        })

    advice = []
    resize_share = seconds.get("resize", 0.0) / seconds["load"] if seconds.get("load", 0) > 0 else 0.0
    if resize_share > RESIZE_ADVICE and native_resample.startswith("PIL's code") and not pillow_simd:
        # Only where the exact native resize cannot run (built without a compiler, say).
        advice.append(
            f"resizes took {resize_share:.0%} of image loading time on PIL's own code ({native_resample[12:]}): "
            "reinstall nano-patch where a C compiler is available to get its exact native resize; "
            "`nano-patch install-simd` is faster too, but pillow-simd's resized pixels differ from Pillow's "
            "(by up to 1 level on bilinear, more on bicubic and lanczos), so your pipeline's output changes")
    fp32 = [t for t in trained if t.get("precision") != "bf16"]
    if has_native_bf16 and fp32:
        advice.append("this CPU computes bf16 natively but the model trained in fp32: try `nano-patch run --fast` "
                      "(or --precision bf16)")
    if training is not None and training["data_wait_share"] > DATA_WAIT_ADVICE and training["num_workers"] == 0:
        advice.append(f"the training loop waited for data {training['data_wait_share']:.0%} of the time with "
                      "num_workers=0: give the DataLoader worker processes (num_workers=1 or more)")
    for knob in unused_knobs:
        advice.append(knob)
    return {"wall_time_s": wall_time, "training": training, "patches": patches,
            "seconds": {"resize": seconds.get("resize", 0.0), "image_loading": seconds.get("load", 0.0)},
            "decoded_cache": cache_summary(cache), "loader_threads": threads_summary(loader),
            "unused_knobs": unused_knobs, "advice": advice, "num_processes": sections.get("num_processes")}


def discard() -> None:
    """The report is out: stop counting and remove the run's folder."""
    global stats
    if stats is not None:
        import shutil

        directory, stats = stats.directory, None
        shutil.rmtree(directory, ignore_errors=True)


def render(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    lines = ["nano-patch report", f"  wall time: {report['wall_time_s']:.1f} s"]
    t = report["training"]
    if t is None:
        lines.append("  training: no batches seen")
    else:
        lines.append(
            f"  training: {t['data_wait_s']:.1f} s waiting for data, {t['step_s']:.1f} s in training steps "
            f"({t['data_wait_share']:.0%} waiting); {t['samples']} samples, {t['images_per_s']:.1f} images/s "
            f"[{t['source']}]")
    for p in report["patches"]:
        if p["name"].startswith("trainer"):
            built = ", ".join(f"{a['count']} x {a['what']}" for a in p["top_accelerated"]) or "no Trainer built"
            lines.append(f"  {p['name']}: {built}")
            continue
        lines.append(f"  {p['name']}: {p['accelerated']} accelerated, {p['fallback']} fallback")
        if p["name"] in _PATHS_SHOWN:  # (which path each sample took, not only why some did not)
            lines += [f"      + {a['count']} x {a['what']}" for a in p["top_accelerated"]]
        lines += [f"      {f['count']} x {f['reason']}" for f in p["top_fallbacks"]]
    lt = report.get("loader_threads")
    if lt is not None:
        lines.append(
            f"  loader threads: {lt['threads']}; {lt['batches']} batches ({lt['samples']} images) drawn in stock's "
            f"order and rendered in parallel; serial (draws, GIL held) {lt['serial_ms_per_image']:.2f} ms/image, "
            f"render {lt['render_ms_per_image']:.2f} ms/image; loading {lt['loading_speedup']:.2f}x faster than "
            "one thread")
    auto = report.get("num_processes")
    if auto is not None:
        lines.append(f"  num_processes='auto': {auto['processes']} ({auto['reason']}; measured in "
                     f"{auto['measure_s']:.1f} s)")
        predicted = auto.get("predicted_samples_per_s") or {}
        if predicted:
            lines.append("      predicted samples/s: " + ", ".join(f"{n} process{'es' if n != '1' else ''} {v:.1f}"
                                                                    for n, v in predicted.items()))
    c = report.get("decoded_cache")
    if c is not None:
        saved = "" if c["decode_s_saved"] is None else f", about {c['decode_s_saved']:.1f} s of decoding saved"
        lines.append(f"  decoded-image cache: {c['hits']} hits, {c['misses']} misses ({c['stored']} stored, "
                     f"{c['bytes_stored'] / 1e6:.0f} MB); {c['bytes_read'] / 1e6:.0f} MB read from it{saved}")
    if report["advice"]:
        lines.append("  next steps:")
        lines += [f"    - {a}" for a in report["advice"]]
    return "\n".join(lines)
