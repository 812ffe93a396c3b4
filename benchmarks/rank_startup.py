"""Rank start-up: wall time from `nano-patch run` to every rank's first training step, for 1, 2 and 4 ranks.

The main job (``examples/pets_finetune.py``, its default photo folder) runs under ``nano-patch run
[--num-processes N]``; a driver sets the example's ``on_train_batch_start`` to print the time of each rank's
first step and end that rank there. Several code trees (``--code NAME=PATH``, put first on PYTHONPATH) run interleaved,
round by round, so that drift on a shared machine hits them alike; the table gives each count's median and the
median over rounds of its difference to 1 rank in the same round. Counts above the usable cores are left out (a
rank gets at least one core). Results: ``results/rank_startup.json``.

    python benchmarks/rank_startup.py --code before=/path/to/old/tree --code after=. [--ranks 1 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"

# Each rank ends at its first step: no collective runs between the last one before training (all ranks leave it
# together) and a rank's first on_train_batch_start, so no rank's exit can hold another back.
DRIVER = r"""
import os, sys, time
sys.path.insert(0, {examples!r})
import pets_finetune

def on_train_batch_start(self, batch, batch_idx):
    print(f"FIRST_STEP rank={{self.global_rank}} t={{time.time():.3f}}", flush=True)
    sys.stderr.flush()
    os._exit(0)

pets_finetune.PetsClassifier.on_train_batch_start = on_train_batch_start
pets_finetune.main()
"""


def run_once(code: Path, ranks: int, driver: Path, extra: list[str]) -> dict:
    # Run from the driver's folder: a working directory holding a nano_patch would come first on the path.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "nano_patch", "run", *(["--num-processes", str(ranks)] if ranks > 1 else []),
           *extra, str(driver), "--epochs", "1"]
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=driver.parent)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{code} with {ranks} ranks failed:\n{proc.stderr[-3000:]}")
    firsts = {int(r): float(t) for r, t in re.findall(r"FIRST_STEP rank=(\d+) t=([\d.]+)", proc.stdout)}
    if len(firsts) != ranks:
        raise RuntimeError(f"expected {ranks} first steps, got {firsts}:\n{proc.stdout[-2000:]}")
    return {"to_every_first_step_s": max(firsts.values()) - start, "to_rank0_first_step_s": firsts[0] - start,
            "wall_s": ended - start}  # wall: to the last rank's end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", required=True, metavar="NAME=PATH",
                    help="a code tree to measure, first on PYTHONPATH (repeat to compare)")
    ap.add_argument("--ranks", type=int, nargs="+", default=None, help="default: 1 2 4, capped at the cores")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fast", action="store_true", help="run with --fast")
    ap.add_argument("--stem", default="rank_startup")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = args.ranks or [n for n in (1, 2, 4) if n <= cores]
    codes = {name: Path(path).resolve() for name, path in (c.split("=", 1) for c in args.code)}
    runs: dict[str, dict[int, list[dict]]] = {name: {n: [] for n in counts} for name in codes}
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "first_step.py"
        driver.write_text(DRIVER.format(examples=str(ROOT / "examples")))
        for _ in range(args.rounds):
            for n in counts:
                for name, code in codes.items():
                    runs[name][n].append(run_once(code, n, driver, ["--fast"] if args.fast else []))
                    print(name, n, runs[name][n][-1], flush=True)
    from train import _cpu_name  # this folder is the script's: first on sys.path

    result = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
              "rounds": args.rounds, "fast": args.fast, "codes": {k: str(v) for k, v in codes.items()},
              "runs": {name: {str(n): rs for n, rs in by_n.items()} for name, by_n in runs.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    print("| code | ranks | launch to every rank's first step, s (median) | over 1 rank, s (median of the rounds' "
          "differences) | launch to the end, s |")
    print("|---|---|---|---|---|")
    for name, by_n in runs.items():
        ones = [r["to_every_first_step_s"] for r in by_n[counts[0]]]
        for n, rs in by_n.items():
            first = statistics.median(r["to_every_first_step_s"] for r in rs)
            over = statistics.median(r["to_every_first_step_s"] - one for r, one in zip(rs, ones))
            wall = statistics.median(r["wall_s"] for r in rs)
            print(f"| {name} | {n} | {first:.2f} | {over:+.2f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
