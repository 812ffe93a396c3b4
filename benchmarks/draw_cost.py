"""The draw step's cost per image: what the calling thread spends on each sample of a batch
before its pixels are rendered on the loader's threads.

Two parts, timed apart, per image, over an ImageFolder of real-photo JPEGs (``examples/make_photo_folder.py``),
with the decoded-image cache off and warm (filled by a first pass):

- ``source``: the sample's size and the cache's lookup (``data/batches/sample_source.py``'s ``source_of``): with the
  cache
  off, the header index's answer for a file seen before (a ``stat``), else the JPEG header and PIL's open checks;
  the key and the entry with it warm;
- ``draw``: ``_source`` and the plan's draws on a Recording (``_draw``), pipelines pets, (b) and (c): with torch's
  own draws (``draw_torch``), and with torch's draws made natively from a copy of its generator, as the batch
  path makes them (``draw_native``, ``vision/kernels/torch_draws.py``); and by the draw program (``draw_program``,
  ``vision/plans/draw_program.py``: each sample's op-runner records made straight from the native draws, so this part
  also covers what ``oprunner.prepare`` adds to the other two in the batch path).

Each (pipeline, cache) in a fresh process, 9 passes over the files after the first, the garbage collector off (as
``timeit``), the fastest pass (other load on the machine only adds time); rounds interleaved, medians. Run it
against another checkout with ``PYTHONPATH=/that/checkout`` to compare (a checkout whose ``_source`` takes the
dataset's file index is given it, as its batch path does).

    python benchmarks/draw_cost.py [--per-class 100] [--rounds 3] [--stem draw_cost]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"

CHILD = r"""
import gc, inspect, json, sys, time
cfg = json.loads(sys.argv[1])
import nano_patch
nano_patch.patch_torch(loader_threads=2, cache_decoded="on" if cfg["cache"] == "warm" else "off",
                       cache_dir=cfg["cache_dir"])
import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from nano_patch.data.batches import batch_loader, sample_source
from nano_patch.vision.images import cache
from nano_patch.vision.plans import compose_plan
from nano_patch.vision.kernels import native
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
tf = T.Compose({
    "pets": [T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), norm],
    "b": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm],
    "c": [T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm],
}[cfg["pipeline"]])
ds = ImageFolder(cfg["root"], transform=tf)
paths = [p for p, _ in ds.samples]
for _ in torch.utils.data.DataLoader(ds, batch_size=16):  # fills the cache where it is on
    pass
store = cache.store_for(ds)
crop_window = compose_plan.plan_for(tf).crop_first and native.available("crop_decode")
extra = ()
if "index" in inspect.signature(sample_source.source_of).parameters:  # the in-memory index of the dataset's files
    from nano_patch.vision.images import file_index
    extra = (file_index.for_dataset(ds) if store is not None else None,)
    if "headers" in inspect.signature(sample_source.source_of).parameters:  # and, uncached, of their JPEG headers
        extra += (file_index.headers_for(ds),)
out = {}
gc.disable()  # as timeit: a collection of the whole heap (torch's objects) would land on one pass or another
try:  # the draw program (vision/plans/draw_program.py): each sample's native run straight from the native draws
    from nano_patch.vision.plans import draw_program
except ImportError:
    draw_program = None
parts = ("source", "draw_torch", "draw_native") + (("draw_program",) if draw_program is not None else ())
for part in parts:
    passes = []
    for _ in range(10):
        t = time.perf_counter()
        if part == "source":
            for p in paths:
                sample_source.source_of(p, store, crop_window, *extra)
        elif part == "draw_program":  # its source, then its native run (records included, which the others
            draws = batch_loader._native_draws()  # leave to oprunner.prepare); a sample given back: the plan
            for k, p in enumerate(paths):
                if k % 64 == 0:
                    shared = {}
                    program = draw_program.bind(tf, draws, shared)
                job = sample_source.source_of(p, store, crop_window, *extra)
                hw = job.array.shape[:2] if job.array is not None else job.size
                if program is None or program.draw(hw) is None:
                    batch_loader._draw_sample(job, tf, draws, shared)
                    if program is not None:
                        program.resync()
            draws.to_torch()
        else:  # a batch run's draw step: its source, then its draws (torch's own, or made natively)
            draws = batch_loader._native_draws() if part == "draw_native" else None
            for k, p in enumerate(paths):
                if k % 64 == 0:  # a run's recordings share their tensor tail op and plan (batches of 64)
                    kw = {"shared": {}} if "shared" in inspect.signature(batch_loader._draw_sample).parameters else {}
                batch_loader._draw_sample(sample_source.source_of(p, store, crop_window, *extra), tf, draws, **kw)
            if draws is not None:
                draws.to_torch()
        passes.append((time.perf_counter() - t) / len(paths))
    out[part + "_us"] = min(passes[1:]) * 1e6  # the least disturbed pass: other load only adds time
out["native_draws"] = native.state()["torch_draws"]
out["nano_patch"] = nano_patch.__file__
print(json.dumps(out))
"""


def run(cfg: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    # cwd: not the checkout (``python -c`` puts the cwd first on sys.path, before PYTHONPATH)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env,
                          check=False, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stem", default="draw_cost")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(Path(__file__).parent))
    from make_photo_folder import build
    from train import _cpu_name


    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = str(build(tmp / "photos", args.per_class) / "train")
        for _ in range(args.rounds):
            for pipeline in ("pets", "b", "c"):
                for cache in ("off", "warm"):
                    cfg = {"root": root, "pipeline": pipeline, "cache": cache, "cache_dir": str(tmp / "cache")}
                    runs.setdefault(f"{pipeline} | cache {cache}", []).append(run(cfg))
    used = {r.pop("nano_patch") for rs in runs.values() for r in rs}
    rows = {k: {part: statistics.median(r[part] for r in rs) for part in rs[0] if part.endswith("_us")}
            for k, rs in runs.items()}
    native_state = sorted({r.pop("native_draws", "?") for rs in runs.values() for r in rs})
    result = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
              "nano_patch": sorted(used), "native_draws": native_state, "rounds": args.rounds, "rows": rows,
              "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    print(f"{result['machine']}; {result['nano_patch']}; native draws: {native_state}; medians of {args.rounds} "
          "rounds, us per image")
    print("| pipeline | cache | source (size + cache lookup) | draw, torch's draws | draw, native draws | "
          "draw program (with the records) |")
    print("|---|---|---|---|---|---|")
    for key, r in rows.items():
        pipeline, cache = key.split(" | ")
        print(f"| {pipeline} | {cache.split()[-1]} | {r['source_us']:.1f} | {r['draw_torch_us']:.1f} | "
              f"{r.get('draw_native_us', float('nan')):.1f} | {r.get('draw_program_us', float('nan')):.1f} |")


if __name__ == "__main__":
    main()
