"""Accuracy benchmark: does training under nano-patch reach stock accuracy on real data?

The training benchmark's photo set is too small to tell accuracies apart (48 validation images,
random initial weights: no pretrained weights offline). Here a small CNN learns scikit-learn's
digits (1400 train / 397 validation images) with the unchanged Lightning script
``tests/scripts/digits_lightning.py``, stock and with bf16 + channels-last, over several seeds.
Results: ``benchmarks/results/accuracy.json``.

    python benchmarks/accuracy.py [--seeds 0 1 2] [--epochs 8]
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
SCRIPT = ROOT / "tests" / "scripts" / "digits_lightning.py"
CONFIGS = {
    "stock": ([], {}),
    "bf16 + channels_last (nano-patch)": (["-m", "nano_patch", "run"],
                                          {"NANO_PATCH_PRECISION": "bf16", "NANO_PATCH_CHANNELS_LAST": "1"}),
}


def val_acc(name: str, seed: int, epochs: int) -> float:
    prefix, extra = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env.update(extra)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, *prefix, str(SCRIPT), out, f"epochs={epochs}", "batch=32", "lr=0.01",
                        f"seed={seed}"], env=env, check=True, capture_output=True, cwd=out)
        return json.loads((Path(out) / "metrics.json").read_text())["val_acc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args()
    result: dict = {"epochs": args.epochs, "seeds": args.seeds, "configs": {}}
    for name in CONFIGS:
        accs = [val_acc(name, seed, args.epochs) for seed in args.seeds]
        result["configs"][name] = {"val_acc": accs, "mean": statistics.mean(accs)}
        print(name, accs, flush=True)
    stock = result["configs"]["stock"]["mean"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "accuracy.json").write_text(json.dumps(result, indent=2))
    print("| configuration | validation accuracy per seed | mean | vs stock (points) |")
    print("|---|---|---|---|")
    for name, r in result["configs"].items():
        accs = ", ".join(f"{a:.3f}" for a in r["val_acc"])
        print(f"| {name} | {accs} | {r['mean']:.3f} | {100 * (r['mean'] - stock):+.1f} |")


if __name__ == "__main__":
    main()
