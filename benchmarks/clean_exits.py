"""Repeat finished 2-process runs and count the clean exits: status 0 and no ``terminate called`` line.

Each mode runs an unchanged script to its end: the Trainer under the popen (script re-run), spawn and
fork start methods, ``@nano`` (script re-run) and ``TorchNano`` (spawn), and, for comparison, stock
Lightning's own ``strategy="ddp"`` with no nano-patch at all. Rounds are interleaved.

    python benchmarks/clean_exits.py --repeat 10      # -> benchmarks/results/clean_exits.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train import _cpu_name  # noqa: E402

SCRIPTS = HERE.parent / "tests" / "scripts"
LIGHTNING = str(SCRIPTS / "digits_lightning.py")
FABRIC = str(SCRIPTS / "digits_fabric.py")
NANO_RUN = [sys.executable, "-m", "nano_patch", "run"]

MODES = {
    "Trainer, popen (nano-patch run)": (NANO_RUN + [LIGHTNING], ["max_steps=3"], {"NANO_PATCH_NUM_PROCESSES": "2"}),
    "Trainer, spawn": (NANO_RUN + [LIGHTNING], ["max_steps=3", "strategy=nano_ddp_spawn"],
                       {"NANO_PATCH_NUM_PROCESSES": "2"}),
    "Trainer, fork": (NANO_RUN + [LIGHTNING], ["max_steps=3", "strategy=nano_ddp_fork"],
                      {"NANO_PATCH_NUM_PROCESSES": "2"}),
    "@nano, popen": ([sys.executable, FABRIC], ["api=nano", "processes=2", "steps=3"], {}),
    "TorchNano, spawn": ([sys.executable, FABRIC], ["api=torchnano", "processes=2", "steps=3",
                                                    "start_method=spawn"], {}),
    "stock Lightning strategy='ddp' (no nano-patch)": ([sys.executable, LIGHTNING],
                                                       ["max_steps=3", "strategy=ddp", "devices=2"], {}),
}


def run_once(cmd: list[str], args: list[str], extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env.update(extra_env)
    with tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        proc = subprocess.run([*cmd[:-1], cmd[-1], out, *args], env=env, capture_output=True, text=True,
                              timeout=600, cwd=out)
        seconds = time.monotonic() - start
    aborted = "terminate called" in proc.stderr
    return {"returncode": proc.returncode, "terminate_called": aborted, "clean": proc.returncode == 0 and not aborted,
            "seconds": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "clean_exits.json")
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.repeat):
        for mode, (cmd, args, env) in MODES.items():
            result = run_once(cmd, args, env)
            runs[mode].append(result)
            print(f"round {r} {mode}: {result}", flush=True)
    summary = {m: {"clean": sum(x["clean"] for x in v), "runs": len(v),
                   "terminate_called": sum(x["terminate_called"] for x in v)} for m, v in runs.items()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "summary": summary,
                                 "runs": runs}, indent=2))
    for mode, s in summary.items():
        print(f"{mode}: {s['clean']}/{s['runs']} clean, {s['terminate_called']} with 'terminate called'")


if __name__ == "__main__":
    main()
