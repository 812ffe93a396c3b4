"""Whole epochs as a script sees them (the workers' start included): stock's worker processes against the patch's
virtual workers, by start method, persistent or not, optionally with a JPEG the fast path cannot take in every
batch.

An ImageFolder of real-photo JPEGs (``examples/make_photo_folder.py``); with ``--mark exif`` or ``--mark cmyk``,
every ``--every``-th file is re-saved with EXIF data or as CMYK, so that with batch 64 every batch needs stock's
code for some samples (the virtual workers' stand-in processes load those batches). Pets pipeline,
``num_workers=--workers``, ``shuffle=True``, ``persistent_workers`` as ``--persistent`` says; each configuration
in a fresh process (``loader_threads.py``'s child set-up) with the start method set as a script sets it
(``--start-method``: forkserver is Python 3.14's default on Linux), timing ``--epochs`` whole epochs, rounds
interleaved, medians:

- ``stock``: stock's worker processes;
- ``patched``: the patch (virtual workers where they apply);
- ``patched, fork``: the patch under fork, where another start method was asked for (what the fresh-worker path
  gives against the fork path);
- ``patched (before)``, with ``--before CHECKOUT``: another source tree's patch, for a before/after comparison.

    python benchmarks/epochs.py [--start-method forkserver] [--persistent] [--mark none|exif|cmyk] [--rounds 3]

Every run is kept in the JSON; the summary gives the median and the slowest run, of whole epochs and of the epochs
after the first (a persistent loader's steady state), the latter against the fork path's median.

Results: ``benchmarks/results/epochs_<start method>_<persistent|fresh>_<mark>.{json,png}`` (``--stem``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import LOADER_SETUP, run_child  # noqa: E402

RESULTS = Path(__file__).parent / "results"

CHILD = "import json, os, sys, time\n" + LOADER_SETUP + r"""
torch.manual_seed(cfg["seed"])  # (a seed per round: a path that only some draws take shows in some runs)
n, t = 0, time.perf_counter()
first = None
ends = []
for _ in range(cfg["epochs"]):
    it = iter(loader)
    for x, y in it:
        n += len(y)
        if first is None:  # (the workers' start: iter() to the first batch)
            first = time.perf_counter() - t
    ends.append(time.perf_counter())
seconds = ends[-1] - t
per_epoch = n / cfg["epochs"]
later = (per_epoch * (cfg["epochs"] - 1) / (ends[-1] - ends[0])) if cfg["epochs"] > 1 else None
out = {"images_per_s": n / seconds, "epoch_s": seconds / cfg["epochs"], "first_batch_s": first,
       "later_epochs_images_per_s": later, "iterator": type(it).__name__}
if hasattr(it, "describe"):
    out["describe"] = it.describe()
print(json.dumps(out))
"""


def mark(root: Path, kind: str, every: int) -> int:
    """Re-save every ``every``-th JPEG under ``root`` with EXIF data or as CMYK; how many were."""
    from PIL import Image

    files = sorted(root.rglob("*.jpg"))
    for path in files[::every]:
        im = Image.open(path)
        im.load()
        if kind == "cmyk":
            im.convert("CMYK").save(path, quality=90)
        else:
            exif = Image.Exif()
            exif[0x0112] = 1  # orientation: as stored (the pixels are unchanged; the file now carries EXIF data)
            exif[0x010F] = "camera"
            im.save(path, quality=90, exif=exif)
    return len(files[::every])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mark", choices=["none", "exif", "cmyk"], default="none")
    ap.add_argument("--every", type=int, default=16, help="with --mark: one file in this many is marked")
    ap.add_argument("--start-method", choices=["fork", "forkserver", "spawn"], default="fork")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-class", type=int, default=200, help="photos per class, 3 classes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--before", metavar="CHECKOUT", help="another nano-patch source tree, run as 'patched (before)'")
    ap.add_argument("--processes", action="store_true",
                    help="also 'patched, processes': the patch's worker processes (virtual_workers=False)")
    ap.add_argument("--stem", default=None)
    args = ap.parse_args()
    from make_photo_folder import build
    from train import _cpu_name

    result: dict = {"machine": _cpu_name(), "python": platform.python_version(), "mark": args.mark,
                    "every": args.every, "start_method": args.start_method, "persistent": args.persistent,
                    "rounds": args.rounds, "epochs": args.epochs, "workers": args.workers, "runs": {}}
    rows = {"stock": ({"side": "stock"}, None), "patched": ({"side": "patched"}, None)}
    if args.start_method != "fork":
        rows["patched, fork"] = ({"side": "patched", "start_method": "fork"}, None)
    if args.before:
        rows["patched (before)"] = ({"side": "patched"}, args.before)
    if args.processes:
        rows["patched, processes"] = ({"side": "patched", "virtual": False}, None)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = build(Path(tmp) / "photos", args.per_class) / "train"
        result["marked"] = mark(root, args.mark, args.every) if args.mark != "none" else 0
        base = {"root": str(root), "batch": 64, "cache_dir": str(Path(tmp) / "cache"), "pipeline": "pets",
                "cache": "off", "threads": "auto", "workers": args.workers, "persistent": args.persistent,
                "epochs": args.epochs, "start_method": args.start_method}
        for r in range(args.rounds):
            for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
                cfg, checkout = rows[name]
                got = run_child(CHILD, {**base, **cfg, "seed": r}, checkout)
                result["runs"].setdefault(name, []).append(got)
                print(f"round {r}: {name}: {got['images_per_s']:.0f} images/s, first batch "
                      f"{got['first_batch_s']:.2f} s ({got['iterator']}"
                      f"{', ' + json.dumps(got['describe']) if 'describe' in got else ''})", flush=True)
    result["medians"] = {name: statistics.median(run["images_per_s"] for run in runs)
                         for name, runs in result["runs"].items()}
    result["first_batch_medians"] = {name: statistics.median(run["first_batch_s"] for run in runs)
                                     for name, runs in result["runs"].items()}
    # every run counts: the slowest one too (a run that met a slow path is a finding, not noise)
    result["slowest"] = {name: min(run["images_per_s"] for run in runs) for name, runs in result["runs"].items()}
    if args.epochs > 1:
        result["later_medians"] = {name: statistics.median(run["later_epochs_images_per_s"] for run in runs)
                                   for name, runs in result["runs"].items()}
        result["later_slowest"] = {name: min(run["later_epochs_images_per_s"] for run in runs)
                                   for name, runs in result["runs"].items()}
    result["total_s"] = time.perf_counter() - began
    stem = args.stem or (f"epochs_{args.start_method}_{'persistent' if args.persistent else 'fresh'}_"
                         f"{args.mark}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    stock = result["medians"]["stock"]
    print(f"\n{result['machine']}; pets, batch 64, num_workers={args.workers}, {args.start_method}, "
          f"{'persistent' if args.persistent else 'non-persistent'}, {args.epochs} epochs"
          f"{f', one {args.mark} JPEG in {args.every}' if args.mark != 'none' else ''}; "
          f"medians of {args.rounds} interleaved rounds")
    for name, ips in result["medians"].items():
        print(f"| {name} | {ips:.0f} images/s (slowest run {result['slowest'][name]:.0f}) | {ips / stock:.2f}x stock "
              f"| first batch {result['first_batch_medians'][name]:.2f} s |")
    if args.epochs > 1:
        print(f"\nthe {args.epochs - 1} epochs after the first, images/s: median, slowest run, and against the "
              f"median of {'patched, fork' if 'patched, fork' in result['later_medians'] else 'stock'}")
        ref_name = "patched, fork" if "patched, fork" in result["later_medians"] else "stock"
        ref = result["later_medians"][ref_name]
        for name, ips in result["later_medians"].items():
            slow = result["later_slowest"][name]
            print(f"| {name} | {ips:.0f} | {slow:.0f} | median {ips / ref:.2f}x, slowest {slow / ref:.2f}x |")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["medians"])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, [result["medians"][n] for n in names], color="#4c72b0", label="median")
    ax.plot([result["slowest"][n] for n in names], names, "k|", markersize=14, label="slowest run")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("images/s (whole epochs, workers' start included)")
    ax.set_title(f"{result['start_method']}, {'persistent' if result['persistent'] else 'non-persistent'}, "
                 f"mark {result['mark']}, num_workers={result['workers']}: {result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
