"""The training loop's pace: steps per second against the data-free bound, with loading beside the step.

A CPU stand-in for a GPU training loop. Each step launches ``L`` tiny torch ops in the training thread (holding the
GIL, as kernel launches hold it), then waits ``W`` ms with the GIL released (as a device synchronisation does). Its
**data-free bound** is the same loop over batches made beforehand, in a process that loads nothing. The data: the
pets pipeline at ``--size`` px (RandomResizedCrop, flip, ToTensor, Normalize), ``--batch``, 600 real photos
(``examples/make_photo_folder.py``), ``shuffle=True``, persistent workers; one epoch of warm-up, then ``--epochs``
timed, each configuration in a fresh process, rounds interleaved. Rows:

- ``bound``: the loop alone, over batches made beforehand;
- ``stock, num_workers=2``: stock's worker processes;
- ``patched, num_workers=0``: the patch, loader threads (``auto``), the next batches made ahead; and with
  ``batches_ahead=False``: each batch made at ``next()``, as stock makes it;
- ``patched, num_workers=2`` and ``=N``: virtual workers;
- ``patched, worker processes``: ``virtual_workers=False``, ``num_workers=2``.

For each: steps/s, its share of the bound, the share of wall time the loop waited for a batch, and the step's own
time (launches plus the wait, the GIL taken back included) against the same step in the bound's process.

    python benchmarks/step_pace.py [--launches 400] [--wait-ms 6] [--batch 16] [--size 112] [--rounds 2]

Results: ``benchmarks/results/step_pace_L<launches>_W<wait>.{json,png}``; every run is kept, the summary gives
the median and the slowest run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import run_child  # noqa: E402

RESULTS = Path(__file__).parent / "results"

CHILD = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
if cfg["side"] == "patched":
    import nano_patch
    nano_patch.patch_torch(loader_threads="auto", virtual_workers=cfg.get("virtual", True),
                           batches_ahead=cfg.get("ahead", True))
import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader

norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
tf = T.Compose([T.RandomResizedCrop(cfg["size"]), T.RandomHorizontalFlip(), T.ToTensor(), norm])
dataset = ImageFolder(cfg["root"], transform=tf)
workers = cfg["workers"]
kw = dict(num_workers=workers, persistent_workers=True) if workers else {}
torch.manual_seed(0)
loader = DataLoader(dataset, batch_size=cfg["batch"], shuffle=True, drop_last=True, **kw)
launches, wait_s = cfg["launches"], cfg["wait_ms"] / 1000
weight = torch.zeros(8)


def step(batch):
    # the launches: tiny ops, each holding the GIL as a kernel launch does; then the device's wait, GIL released
    y = weight
    for _ in range(launches):
        y = y + 1
    time.sleep(wait_s)
    return y


if cfg["bound"]:  # the same loop over batches made beforehand: nothing loads while it runs
    batches = [b for b in loader]
    def epoch_batches():
        return iter(batches)
else:
    def epoch_batches():
        return iter(loader)

for b in epoch_batches():  # warm-up: workers started, pages cached
    step(b)
steps, waited, stepping = 0, 0.0, 0.0
start = time.perf_counter()
for _ in range(cfg["epochs"]):
    it = epoch_batches()
    while True:
        t0 = time.perf_counter()
        b = next(it, None)
        t1 = time.perf_counter()
        if b is None:
            break
        step(b)
        t2 = time.perf_counter()
        waited += t1 - t0
        stepping += t2 - t1
        steps += 1
wall = time.perf_counter() - start
out = {"steps_per_s": steps / wall, "wait_share": waited / wall, "step_ms": 1000 * stepping / steps, "steps": steps}
it = getattr(loader, "_iterator", None)
if it is not None and hasattr(it, "describe"):
    out["describe"] = it.describe()
print(json.dumps(out))
"""


def rows(n_workers: int) -> dict[str, dict]:
    return {
        "bound": {"side": "stock", "workers": 0, "bound": True},
        "stock, num_workers=2": {"side": "stock", "workers": 2},
        "patched, num_workers=0": {"side": "patched", "workers": 0},
        "patched, num_workers=0, batches_ahead off": {"side": "patched", "workers": 0, "ahead": False},
        "patched, num_workers=2": {"side": "patched", "workers": 2},
        f"patched, num_workers={n_workers}": {"side": "patched", "workers": n_workers},
        "patched, worker processes": {"side": "patched", "workers": 2, "virtual": False},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=400, help="tiny torch ops per step (L)")
    ap.add_argument("--wait-ms", type=float, default=6.0, help="the device's wait per step, GIL released (W)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-class", type=int, default=200, help="photos per class, 3 classes")
    ap.add_argument("--workers-n", type=int, default=4, help="the N of the num_workers=N row")
    ap.add_argument("--only", default=None, help="row names separated by ; (the bound always runs)")
    ap.add_argument("--stem", default=None)
    args = ap.parse_args()
    from make_photo_folder import build
    from train import _cpu_name

    table = rows(args.workers_n)
    if args.only:
        wanted = {"bound", *args.only.split(";")}
        table = {k: v for k, v in table.items() if k in wanted}
    result: dict = {"machine": _cpu_name(), "python": platform.python_version(), "launches": args.launches,
                    "wait_ms": args.wait_ms, "batch": args.batch, "size": args.size, "epochs": args.epochs,
                    "rounds": args.rounds, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = build(Path(tmp) / "photos", args.per_class) / "train"
        base = {"root": str(root), "batch": args.batch, "size": args.size, "epochs": args.epochs,
                "launches": args.launches, "wait_ms": args.wait_ms, "bound": False}
        for r in range(args.rounds):
            for name in (list(table) if r % 2 == 0 else list(table)[::-1]):
                got = run_child(CHILD, {**base, **table[name]})
                result["runs"].setdefault(name, []).append(got)
                print(f"round {r}: {name}: {got['steps_per_s']:.1f} steps/s, waiting {got['wait_share']:.0%}, "
                      f"step {got['step_ms']:.2f} ms", flush=True)
    summarise(result)
    stem = args.stem or f"step_pace_L{args.launches}_W{args.wait_ms:g}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    print(f"\n{result['machine']}; L={args.launches}, W={args.wait_ms:g} ms, batch {args.batch}, {args.size} px; "
          f"medians of {args.rounds} interleaved rounds (slowest run in brackets)")
    print("| loader | steps/s | of the bound | waiting | step vs alone |")
    print("|---|---|---|---|---|")
    for name, s in result["summary"].items():
        print(f"| {name} | {s['steps_per_s']:.1f} ({s['slowest_steps_per_s']:.1f}) | {s['of_bound']:.2f}x "
              f"({s['slowest_of_bound']:.2f}x) | {s['wait_share']:.0%} | {s['step_vs_alone']:.2f}x |")


def summarise(result: dict) -> None:
    bound_runs = result["runs"]["bound"]
    bound = statistics.median(r["steps_per_s"] for r in bound_runs)
    alone = statistics.median(r["step_ms"] for r in bound_runs)
    result["summary"] = {}
    for name, runs in result["runs"].items():
        sps = statistics.median(r["steps_per_s"] for r in runs)
        slowest = min(r["steps_per_s"] for r in runs)
        result["summary"][name] = {
            "steps_per_s": sps, "slowest_steps_per_s": slowest, "of_bound": sps / bound,
            "slowest_of_bound": slowest / bound, "wait_share": statistics.median(r["wait_share"] for r in runs),
            "step_ms": statistics.median(r["step_ms"] for r in runs),
            "step_vs_alone": statistics.median(r["step_ms"] for r in runs) / alone}


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["summary"])
    fig, ax = plt.subplots(figsize=(6.5, 3))
    ax.barh(names, [result["summary"][n]["of_bound"] for n in names], color="#4c72b0", label="median")
    ax.plot([result["summary"][n]["slowest_of_bound"] for n in names], names, "k|", markersize=14,
            label="slowest run")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("steps/s against the data-free bound")
    ax.set_title(f"L={result['launches']}, W={result['wait_ms']:g} ms: {result['machine']}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
