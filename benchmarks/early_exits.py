"""Scripts that stop early, each run many times in a fresh interpreter: their exit statuses, stock against patched.

The script loads an ImageFolder (RandomResizedCrop 64, flip, ToTensor, Normalize; batch 8, ``shuffle=True``) and
leaves its loop at the second batch by ``break``, by an uncaught exception, or by Ctrl-C (SIGINT sent to itself
while the loop runs), at each ``num_workers``. A busy process takes one core meanwhile (``--busy``, on by default),
as the rest of a machine's work would. An abort (status -6, "terminate called without an active exception") is
counted apart.

    python benchmarks/early_exits.py [--runs 20] [--modes break,raise,sigint] [--workers 0,2]

Results: ``benchmarks/results/early_exits.{json,png}`` (``--stem`` to change).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import _env  # noqa: E402

RESULTS = Path(__file__).parent / "results"

SCRIPT = r'''
import os, signal, sys, threading
if sys.argv[4] == "patched":
    import nano_patch
    nano_patch.patch_torch()
import torch
from torchvision import datasets, transforms as T
root, nw, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
dl = torch.utils.data.DataLoader(datasets.ImageFolder(root, tf), batch_size=8, shuffle=True, num_workers=nw)
if mode == "sigint":
    threading.Timer(float(sys.argv[5]), os.kill, (os.getpid(), signal.SIGINT)).start()
for i, (x, y) in enumerate(dl):
    if mode == "break" and i == 1:
        break
    if mode == "raise" and i == 1:
        raise RuntimeError("the script's own error")
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--modes", default="break,raise,sigint")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--photos", type=int, default=40, help="photos per class, 3 classes")
    ap.add_argument("--no-busy", dest="busy", action="store_false")
    ap.add_argument("--stem", default="early_exits")
    args = ap.parse_args()

    from make_photo_folder import build
    from train import _cpu_name

    modes = args.modes.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    result: dict = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
                    "python": platform.python_version(), "runs": args.runs, "busy_core": args.busy,
                    "statuses": {}, "aborts": {}}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = build(tmp / "photos", args.photos) / "train"
        script = tmp / "stops_early.py"
        script.write_text(SCRIPT)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
        try:
            configs = [(mode, w, side) for mode in modes for w in workers for side in ("stock", "patched")]
            for r in range(args.runs):
                for mode, w, side in configs if r % 2 == 0 else configs[::-1]:
                    delay = f"{0.05 + 0.05 * (r % 8):.2f}"
                    proc = subprocess.run([sys.executable, str(script), str(root), str(w), mode, side, delay],
                                          capture_output=True, text=True, env=_env(), cwd=tmp, timeout=300)
                    name = f"{mode} | num_workers={w} | {side}"
                    result["statuses"].setdefault(name, []).append(proc.returncode)
                    aborted = proc.returncode == -6 or "terminate called" in proc.stderr
                    result["aborts"][name] = result["aborts"].get(name, 0) + int(aborted)
                print(f"round {r}: " + ", ".join(f"{k}: {v[-1]}" for k, v in result["statuses"].items()),
                      flush=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    result["counts"] = {k: dict(collections.Counter(v)) for k, v in result["statuses"].items()}
    result["total_s"] = time.perf_counter() - began
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print(f"\n{result['machine']}; {args.runs} fresh runs each, a busy core: {args.busy}")
    print("| how the loop ends | num_workers | stock's statuses | patched statuses | patched aborts |")
    print("|---|---|---|---|---|")
    for mode in modes:
        for w in workers:
            s, p = (result["counts"][f"{mode} | num_workers={w} | {side}"] for side in ("stock", "patched"))
            print(f"| {mode} | {w} | {_fmt(s)} | {_fmt(p)} | {result['aborts'][f'{mode} | num_workers={w} | patched']}"
                  f" |")


def _fmt(counts: dict[int, int]) -> str:
    return ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["statuses"])
    statuses = sorted({s for v in result["statuses"].values() for s in v})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(names) + 2), 4.2))
    bottom = [0] * len(names)
    for k, status in enumerate(statuses):
        counts = [result["statuses"][n].count(status) for n in names]
        ax.bar(range(len(names)), counts, bottom=bottom, color="C3" if status == -6 else f"C{k}",
               label=f"status {status}" + (" (abort)" if status == -6 else ""))
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel(f"runs of {result['runs']}")
    ax.set_title(f"Scripts that stop early: exit statuses, stock against patched\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
