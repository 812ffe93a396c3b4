"""The render step: one native call per sample against the Python path, per sample.

The loader's threads render each sample of a batch from its decoded array (the decoded-image cache's view, or the
decode): today's Python path makes each recorded op a call (``pixels.render``); the op runner makes them all, and
the tensor tail, in one native call, into the batch tensor (``vision/plans/oprunner.py``). This measures, per sample,
in one thread, from decoded arrays (no JPEG decode: the warm-cache case):

- ``CPU``: the render's CPU time (``time.thread_time``);
- ``kernels``: the part spent inside the extension's calls, which release the GIL (every function of
  ``nano_patch.vision._native`` is wrapped to add up its thread time; their argument parsing counts here too);
- ``GIL``: CPU minus kernels: the render's time holding the GIL, and ``f`` = GIL / CPU for the render step;
- ``collate``: ``default_collate`` of the batch's samples (a ``torch.stack`` copy, or nothing where the op
  runner wrote the batch tensor), and freeing the batch and its samples, apart.

Draws are made once, before (the calling thread's part; not measured here). The Python path and the op runner run
in one fresh process per round, epoch by epoch interleaved; medians over rounds. ``--baseline DIR`` also runs the
Python path of another checkout (its ``nano_patch`` first on ``PYTHONPATH``, a process of its own), e.g. the
previous release. Results: ``benchmarks/results/op_runner.{json,png}``.

    python benchmarks/op_runner.py [--folder DIR] [--images 192] [--reps 5] [--rounds 3] [--baseline DIR]
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
sys.path.insert(0, str(Path(__file__).parent))

CHILD = r"""
import json, sys, time
from pathlib import Path
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["benchmarks"])
import nano_patch
nano_patch.patch_torch(loader_threads=2)
import torch
torch.set_num_threads(1)
from torch.utils.data import default_collate
from nano_patch.vision.plans import compose_call, compose_plan
from nano_patch.vision.images import decode
from nano_patch.vision.kernels import native
from nano_patch.vision.images.image import FastImage, plain
from vision import torchvision_pipeline

native.check_all()
mod = native._import()
inside = [0.0]
def wrapped(fn):
    def call(*a, **k):
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            inside[0] += time.thread_time() - t
    return call
for name in dir(mod):
    fn = getattr(mod, name)
    if callable(fn) and not name.startswith("_") and name not in ("isa", "best_isa", "set_isa") and \
            not isinstance(fn, type):
        setattr(mod, name, wrapped(fn))

files = sorted(Path(cfg["folder"]).rglob("*.jpg"))[: cfg["images"]]
arrays = [decode.decode_rgb(p) for p in files]
tf = torchvision_pipeline(cfg["pipeline"])
torch.manual_seed(0)
recs = [compose_call.run_compose(tf, compose_plan.Recording(a.shape[:2])) for a in arrays]
B = 64
def render_python(r, a):
    return [plain(compose_plan.render(x, compose_plan.Pixels.of(FastImage.wrap(y)))) for x, y in zip(r, a)]
sides = {"python": render_python}
try:
    from nano_patch.vision.plans import oprunner
except ImportError:  # a checkout from before the op runner
    oprunner = None
if oprunner is not None and cfg["native"]:
    def render_native(r, a):
        return [oprunner.run(j, x) for j, x in zip(oprunner.prepare_batch(r), a)]
    sides["native"] = render_native
def epoch(render):
    cpu = coll = 0.0
    inside[0] = 0.0
    for i in range(0, len(arrays), B):
        t = time.thread_time()
        out = render(recs[i:i + B], arrays[i:i + B])
        t2 = time.thread_time()
        batch = default_collate(out)
        del out, batch  # freed here (a big tensor's pages go back to the OS): counted with the collation
        cpu += t2 - t
        coll += time.thread_time() - t2
    return cpu, inside[0], coll
totals = {side: [0.0, 0.0, 0.0] for side in sides}
for render in sides.values():
    epoch(render)
for _ in range(cfg["reps"]):  # the sides interleaved, epoch by epoch, in this one process
    for side, render in sides.items():
        for k, v in enumerate(epoch(render)):
            totals[side][k] += v
n = cfg["reps"] * len(arrays)
print(json.dumps({side: {"cpu_us": c / n * 1e6, "kernels_us": k / n * 1e6, "collate_us": o / n * 1e6,
                         "nano_patch": nano_patch.__file__} for side, (c, k, o) in totals.items()}))
"""


def run_child(pipeline: str, args: argparse.Namespace, pythonpath: str | None, native: bool) -> dict:
    """One fresh process: the Python path's render and (``native``) the op runner's, interleaved."""
    cfg = {"pipeline": pipeline, "folder": str(args.folder), "images": args.images, "reps": args.reps,
           "benchmarks": str(Path(__file__).parent), "native": native}
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    # outside the checkout: ``python -c`` puts the working directory before PYTHONPATH on sys.path
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env,
                         check=False, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise SystemExit(f"{pipeline} failed:\n{out.stderr[-3000:]}")
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for r in results.values():
        r["gil_us"] = r["cpu_us"] - r["kernels_us"]
    return results


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars

    med = result["medians"]
    pipelines = list(med)
    sides = list(next(iter(med.values())))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "gil_us", "GIL held, µs per sample (render step)"),
                           (axes[1], "cpu_us", "CPU, µs per sample (render step)")):
        ticks = grouped_bars(ax, pipelines, sides, lambda p, s, key=key: med[p][s][key])
        ax.set_xticks(ticks, pipelines)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"the render step, one thread, from decoded arrays\n{result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from vision import machine

    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", type=Path, default=None, help="a folder of JPEGs (default: made from the photos)")
    ap.add_argument("--images", type=int, default=192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pipelines", default="pets,b,c,reference")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout: its Python path, side by side")
    args = ap.parse_args()
    if args.folder is None:
        sys.path.insert(0, str(ROOT / "examples"))
        import make_photo_folder

        args.folder = Path(tempfile.mkdtemp(prefix="op-runner-")) / "photos"
        make_photo_folder.build(args.folder, max(1, args.images // 4))
    here = os.environ.get("PYTHONPATH")
    sides = ["Python path", "op runner"]
    if args.baseline is not None:
        sides = ["Python path (baseline)", *sides]
    pipelines = args.pipelines.split(",")
    runs: dict[str, dict[str, list[dict]]] = {p: {s: [] for s in sides} for p in pipelines}
    for r in range(args.rounds):
        for p in pipelines:
            got = run_child(p, args, here, True)
            if args.baseline is not None:
                got["baseline"] = run_child(p, args, str(args.baseline), False)["python"]
            for side, key in (("Python path", "python"), ("op runner", "native"), ("Python path (baseline)",
                                                                                    "baseline")):
                if key in got and side in sides:
                    res = got[key]
                    runs[p][side].append(res)
                    print(f"round {r + 1} {p:10s} {side:24s} CPU {res['cpu_us']:7.1f} µs  GIL {res['gil_us']:6.1f} µs"
                          f"  collate {res['collate_us']:5.1f} µs  ({res['nano_patch']})", flush=True)
    medians = {p: {s: {k: statistics.median(x[k] for x in runs[p][s])
                       for k in ("cpu_us", "kernels_us", "gil_us", "collate_us")} for s in sides} for p in pipelines}
    for p in pipelines:
        for s in sides:
            m = medians[p][s]
            m["f"] = m["gil_us"] / m["cpu_us"] if m["cpu_us"] else 0.0
            print(f"{p:10s} {s:24s} CPU {m['cpu_us']:7.1f}  GIL {m['gil_us']:6.1f}  f {m['f']:.3f}  "
                  f"collate {m['collate_us']:5.1f} (µs per sample, medians)")
    result = {"machine": machine(), "load_average": os.getloadavg(), "images": args.images, "reps": args.reps,
              "rounds": args.rounds, "medians": medians, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "op_runner.json").write_text(json.dumps(result, indent=1))
    chart(result, RESULTS / "op_runner.png")
    print(f"wrote {RESULTS / 'op_runner.json'} and .png")


if __name__ == "__main__":
    main()
