"""Accuracy benchmark: does training under nano-patch reach stock accuracy on real data?

Two unchanged Lightning scripts, each run stock and with everything on (bf16, channels-last, the
vision and DataLoader patches), over several seeds:

- ``digits``: a small CNN on scikit-learn's digits (1400 train / 397 validation images),
  ``tests/scripts/digits_lightning.py``.
- ``photos``: the training benchmark's pets-style ResNet-18 (``examples/pets_finetune.py``) on the
  real-photo JPEG folder, from random weights (no pretrained weights offline), trained long enough
  to converge, since its 48 validation images cannot tell apart runs that are still moving.

Results: ``benchmarks/results/accuracy.json``.

    python benchmarks/accuracy.py [--tasks digits photos] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
DIGITS = ROOT / "tests" / "scripts" / "digits_lightning.py"
PETS = ROOT / "examples" / "pets_finetune.py"
CONFIGS = {
    "stock": ([], {}),
    "bf16 + channels_last (nano-patch)": (["-m", "nano_patch", "run"],
                                          {"NANO_PATCH_PRECISION": "bf16", "NANO_PATCH_CHANNELS_LAST": "1"}),
}
EPOCHS = {"digits": 8, "photos": 12}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env.update(extra)
    return env


def digits_acc(name: str, seed: int, epochs: int, _data: Path | None) -> float:
    prefix, extra = CONFIGS[name]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, *prefix, str(DIGITS), out, f"epochs={epochs}", "batch=32", "lr=0.01",
                        f"seed={seed}"], env=_env(extra), check=True, capture_output=True, cwd=out)
        return json.loads((Path(out) / "metrics.json").read_text())["val_acc"]


def photos_acc(name: str, seed: int, epochs: int, data: Path | None) -> float:
    prefix, extra = CONFIGS[name]
    proc = subprocess.run([sys.executable, *prefix, str(PETS), str(data), "--epochs", str(epochs),
                           "--seed", str(seed)], env=_env(extra), check=True, capture_output=True, text=True)
    return float(re.search(r"val_acc: ([\d.]+)", proc.stdout).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="*", choices=sorted(EPOCHS), default=sorted(EPOCHS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, help="override every task's epochs")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    from make_photo_folder import build

    result: dict = {"seeds": args.seeds, "tasks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = build(Path(tmp) / "photos", 64) if "photos" in args.tasks else None
        for task in args.tasks:
            epochs = args.epochs or EPOCHS[task]
            run = digits_acc if task == "digits" else photos_acc
            configs = {}
            for name in CONFIGS:
                accs = [run(name, seed, epochs, data) for seed in args.seeds]
                configs[name] = {"val_acc": accs, "mean": statistics.mean(accs)}
                print(task, name, accs, flush=True)
            result["tasks"][task] = {"epochs": epochs, "configs": configs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "accuracy.json").write_text(json.dumps(result, indent=2))
    print("| task | configuration | validation accuracy per seed | mean | vs stock (points) |")
    print("|---|---|---|---|---|")
    for task, t in result["tasks"].items():
        stock = t["configs"]["stock"]["mean"]
        for name, r in t["configs"].items():
            accs = ", ".join(f"{a:.3f}" for a in r["val_acc"])
            print(f"| {task} ({t['epochs']} epochs) | {name} | {accs} | {r['mean']:.3f} | "
                  f"{100 * (r['mean'] - stock):+.1f} |")


if __name__ == "__main__":
    main()
