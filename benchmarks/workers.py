"""``num_workers=N`` and ``auto`` against stock and against N loader threads, with memory and the main process's CPU.

For the usable cores N (at most ``--max-n``), pipeline pets (RandomResizedCrop 128, flip, ColorJitter, ToTensor,
Normalize), batch 64, ``shuffle=True``, an ImageFolder of real-photo JPEGs (``examples/make_photo_folder.py``),
each configuration in a fresh process (``benchmarks/scaling.py``'s child: a first epoch, then whole epochs for
``--seconds``), rounds interleaved, medians:

- ``stock, num_workers=N``: stock, persistent workers;
- ``virtual workers``: the patch, ``num_workers=N`` (persistent): its virtual workers;
- ``worker processes``: the patch, ``num_workers=N``, ``virtual_workers=False`` (the workers take their batches
  whole and finish the tail; the main process only receives);
- ``N threads``: the patch, ``num_workers=0``, ``loader_threads=N``;
- ``auto, 40 batches``: the patch, ``num_workers=0``, ``loader_threads="auto"``, its first 40 batches after the
  first epoch (a short run: ``auto`` must not lose it to a measurement), against ``N threads`` over the same 40.

Each row gives images/s, the resident memory of the whole process tree (the main process and its workers) and
the main process's own CPU time per image (``virtual workers`` and threads load in the main process by design;
for worker processes it is what the main process pays per batch received).

    python benchmarks/workers.py [--rounds 3] [--per-class 200] [--seconds 3]

Results: ``benchmarks/results/workers.{json,png}`` (``--stem`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import LOADER_SETUP, run_child  # noqa: E402
from scaling import CHILD  # noqa: E402

RESULTS = Path(__file__).parent / "results"

#: The first ``cfg["batches"]`` batches after a first epoch, timed (``auto`` over a short run).
BATCHES_CHILD = "import json, os, sys, time\n" + LOADER_SETUP + r"""
for _ in loader:
    pass
import gc
gc.collect()
n, t = 0, time.perf_counter()
for b, (x, y) in enumerate(loader):
    n += len(y)
    if b + 1 == cfg["batches"]:
        break
print(json.dumps({"images_per_s": n / (time.perf_counter() - t), "batches": cfg["batches"]}))
"""


def configs(n: int) -> dict[str, dict]:
    patched = {"side": "patched", "cache": "off", "torch_threads": 1}
    return {
        f"stock, num_workers={n}": {"side": "stock", "cache": "off", "threads": 1, "workers": n},
        f"virtual workers, num_workers={n}": {**patched, "threads": "auto", "workers": n},
        f"worker processes, num_workers={n}": {**patched, "threads": "auto", "workers": n, "virtual": False},
        f"{n} threads, num_workers=0": {**patched, "threads": n, "workers": 0},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-class", type=int, default=200, help="photos per class, 3 classes")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batches", type=int, default=40, help="the short run of the auto rows")
    ap.add_argument("--max-n", type=int, default=16)
    ap.add_argument("--stem", default="workers")
    ap.add_argument("--before", metavar="CHECKOUT",
                    help="another nano-patch source tree (its compiled kernels built in place): its patched rows run "
                         "too, interleaved, as '... (before)'")
    ap.add_argument("--start-method", choices=["fork", "forkserver", "spawn"], default=None,
                    help="the multiprocessing start method of every row (default: the interpreter's)")
    args = ap.parse_args()
    from make_photo_folder import build
    from train import _cpu_name

    n = min(args.max_n, len(os.sched_getaffinity(0)))
    result: dict = {"machine": f"{_cpu_name()}, {n} usable CPUs", "python": platform.python_version(), "n": n,
                    "rounds": args.rounds, "seconds": args.seconds, "batches": args.batches, "runs": {}}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = str(build(Path(tmp) / "photos", args.per_class) / "train")
        base = {"root": root, "batch": 64, "seconds": args.seconds, "cache_dir": str(Path(tmp) / "cache"),
                "mode": "rate", "pipeline": "pets"}
        rows = {name: (cfg, None) for name, cfg in configs(n).items()}
        if args.before:
            rows.update({f"{name} (before)": (cfg, args.before) for name, cfg in configs(n).items()
                         if cfg["side"] == "patched"})
        if args.start_method:
            base["start_method"] = args.start_method
        short = {"auto, 40 batches": {"side": "patched", "cache": "off", "torch_threads": 1, "threads": "auto",
                                      "workers": 0},
                 f"{n} threads, 40 batches": {"side": "patched", "cache": "off", "torch_threads": 1, "threads": n,
                                              "workers": 0}}
        for r in range(args.rounds):
            order = list(rows) if r % 2 == 0 else list(rows)[::-1]
            for name in order:
                cfg, checkout = rows[name]
                got = run_child(CHILD, {**base, **cfg}, checkout)
                result["runs"].setdefault(name, []).append(got)
                print(f"round {r}: {name}: {got['images_per_s']:.0f} images/s, tree {got['tree_rss_mb']:.0f} MB "
                      f"RSS, {got['tree_pss_mb']:.0f} MB PSS, "
                      f"main process {got['main_cpu_s_per_image'] * 1e6:.0f} us CPU/image", flush=True)
            for name in (list(short) if r % 2 == 0 else list(short)[::-1]):
                got = run_child(BATCHES_CHILD, {**base, **short[name], "batches": args.batches})
                result["runs"].setdefault(name, []).append(got)
                print(f"round {r}: {name}: {got['images_per_s']:.0f} images/s", flush=True)
    result["medians"] = {name: {k: statistics.median(run[k] for run in runs) for k in runs[0]
                                if isinstance(runs[0][k], (int, float))} for name, runs in result["runs"].items()}
    result["total_s"] = time.perf_counter() - began
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print_table(result)


def print_table(result: dict) -> None:
    n, m = result["n"], result["medians"]
    stock = m[f"stock, num_workers={n}"]["images_per_s"]
    threads = m[f"{n} threads, num_workers=0"]["images_per_s"]
    print(f"\n{result['machine']}; pets, batch 64; medians of {result['rounds']} interleaved rounds")
    print("| configuration | images/s | vs stock | vs N threads | process tree PSS (RSS summed) | "
          "main process CPU/image |")
    print("|---|---|---|---|---|---|")
    for name, row in m.items():
        if "tree_rss_mb" not in row:
            continue
        ips = row["images_per_s"]
        print(f"| {name} | {ips:.0f} | {ips / stock:.2f}x | {ips / threads:.2f}x | {row['tree_pss_mb']:.0f} MB "
              f"({row['tree_rss_mb']:.0f} MB) | "
              f"{row['main_cpu_s_per_image'] * 1e6:.0f} us |")
    auto, fixed = m["auto, 40 batches"]["images_per_s"], m[f"{n} threads, 40 batches"]["images_per_s"]
    print(f"auto over {result['batches']} batches: {auto:.0f} images/s, {auto / fixed:.2f}x {n} fixed threads")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result["medians"]
    names = [k for k in m if "tree_rss_mb" in m[k]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.barh(names, [m[k]["images_per_s"] for k in names], color=["C7", "C0", "C1", "C2"][:len(names)])
    a.set_xlabel("images / s")
    b.barh(names, [m[k]["tree_rss_mb"] for k in names], color=["C7", "C0", "C1", "C2"][:len(names)])
    b.set_xlabel("process tree RSS (MB)")
    b.set_yticks([])
    fig.suptitle(f"num_workers against loader threads, pets, batch 64\n{result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
