"""The wheel's kernels against a source build's, side by side: ``benchmarks/resample.py`` and
``benchmarks/crop_decode.py`` run in two interpreters, one with the wheel installed and one with a source
build (``pip install .`` with the system's compiler and libjpeg-turbo), alternating within each round so that
a shared machine's drift hits both alike. Prints the medians and their ratios (wheel / source: above 1 is
slower). The benchmarks run from a copy, so their result files stay out of the source tree.

    python scripts/bench_wheel.py --wheel-python V1/bin/python --source-python V2/bin/python [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def describe(python: str) -> str:
    code = ("import nano_patch.vision._native as n, nano_patch.vision._jpeg as j, os\n"
            "print(os.path.basename(n.__file__), n.best_isa(), j.LIBJPEG_VERSION)")
    # from an empty folder: ``python -c`` puts the current folder first on sys.path (a source tree would win)
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                              cwd=empty).stdout.strip()


def resample(copy: Path, pythons: dict[str, str], rounds: int) -> dict[str, dict[str, list[float]]]:
    """{label: {"isa kind": [us per round]}} from resample.py's own column timer."""
    isas = ["generic", "avx2", "avx512"]
    best = describe(next(iter(pythons.values()))).split()[1]
    isas = isas[: isas.index(best) + 1]
    out: dict[str, dict[str, list[float]]] = {label: {} for label in pythons}
    order = list(pythons.items())
    for r in range(rounds):
        for label, python in order if r % 2 == 0 else order[::-1]:
            for isa in isas:
                run = subprocess.run([python, str(copy / "benchmarks" / "resample.py"), "--column", f"native:{isa}"],
                                     capture_output=True, text=True, check=True, cwd=copy)
                for kind, us in json.loads(run.stdout.strip().splitlines()[-1]).items():
                    out[label].setdefault(f"{isa}, {kind}", []).append(us)
    return out


def crop_decode(copy: Path, pythons: dict[str, str], rounds: int, inner: int) -> dict[str, dict[str, list[float]]]:
    """{label: {"case, column": [us per run]}} from whole crop_decode.py runs (``inner`` rounds each)."""
    out: dict[str, dict[str, list[float]]] = {label: {} for label in pythons}
    order = list(pythons.items())
    for r in range(rounds):
        for label, python in order if r % 2 == 0 else order[::-1]:
            stem = f"bench-{label}-{r}"
            subprocess.run([python, str(copy / "benchmarks" / "crop_decode.py"), "--rounds", str(inner),
                            "--stem", stem], capture_output=True, text=True, check=True, cwd=copy)
            result = json.loads((copy / "benchmarks" / "results" / f"{stem}.json").read_text())
            for case, cols in result["us_per_image"].items():
                for col, us in cols.items():
                    out[label].setdefault(f"{case} | {col}", []).append(us)
    return out


def extension_path(python: str) -> str:
    code = "import nano_patch.vision._native as n; print(n.__file__)"
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                              cwd=empty).stdout.strip()


def resample_direct(copy: Path, pythons: dict[str, str], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Both builds' ``_native`` loaded into this one process, on one pinned core, taking turns case by case over
    resample.py's cases (so both see the same machine from moment to moment); their outputs must be equal."""
    import importlib.util
    import os
    import sys
    import time

    import numpy as np

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    sys.path.insert(0, str(copy / "benchmarks"))
    import resample as bench  # benchmarks/resample.py: its photos and RandomResizedCrop / Resize(256) cases

    mods = {}
    for label, python in pythons.items():
        spec = importlib.util.spec_from_file_location(f"{label}_build._native", extension_path(python))
        assert spec is not None and spec.loader is not None
        mods[label] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[label])
    arrays, todo = bench.cases()
    isas = ["generic", "avx2", "avx512"]
    isas = isas[: isas.index(next(iter(mods.values())).best_isa()) + 1]
    out: dict[str, dict[str, list[float]]] = {label: {} for label in mods}
    order = list(mods)
    for isa in isas:
        for mod in mods.values():
            mod.set_isa(isa)
        # per case and build the fastest of `rounds` calls, the builds taking turns call by call: on a shared
        # machine a call that lost the core to another process is slower, never faster, so the minimum is what
        # the code itself costs; each kind's figure is the mean of its cases' minima
        best: dict[tuple[str, int], float] = {}
        for r in range(rounds):
            for i, (_, k, (left, top, right, bottom), (w, h)) in enumerate(todo):
                for label in order if (r + i) % 2 == 0 else order[::-1]:
                    dst = np.empty((h, w, 3), np.uint8)
                    start = time.perf_counter()
                    mods[label].resample(arrays[k][top:bottom, left:right], dst, 2,
                                         (0.0, 0.0, float(right - left), float(bottom - top)), False, (1, 0),
                                         (w, h), (0, 0))
                    elapsed = (time.perf_counter() - start) * 1e6
                    best[label, i] = min(best.get((label, i), elapsed), elapsed)
        for label in mods:
            for kind in sorted({c[0] for c in todo}):
                mine = [best[label, i] for i, c in enumerate(todo) if c[0] == kind]
                out[label].setdefault(f"{isa}, {kind}", []).append(sum(mine) / len(mine))
        for _, k, (left, top, right, bottom), (w, h) in todo:
            got = []
            for mod in mods.values():
                dst = np.empty((h, w, 3), np.uint8)
                mod.resample(arrays[k][top:bottom, left:right], dst, 2,
                             (0.0, 0.0, float(right - left), float(bottom - top)), False, (1, 0), (w, h), (0, 0))
                got.append(dst)
            if not all(np.array_equal(got[0], g) for g in got[1:]):
                raise SystemExit(f"the two builds' resample differ ({isa}, photo {k}, {(left, top, right, bottom)})")
    return out


def report(title: str, data: dict[str, dict[str, list[float]]]) -> None:
    wheel, source = data["wheel"], data["source"]
    print(f"\n{title}\n| case | wheel (us) | source (us) | wheel / source | per-round ratios |\n|---|---|---|---|---|")
    for key in wheel:
        w, s = statistics.median(wheel[key]), statistics.median(source[key])
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(wheel[key], source[key]))
        print(f"| {key} | {w:.0f} | {s:.0f} | {w / s:.3f} | {ratios} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel-python", required=True)
    ap.add_argument("--source-python", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--crop-rounds", type=int, default=3, help="alternations of whole crop_decode.py runs")
    ap.add_argument("--crop-inner", type=int, default=3, help="crop_decode.py --rounds for each run")
    ap.add_argument("--only", choices=("resample", "resample-direct", "crop_decode"))
    args = ap.parse_args()
    pythons = {"wheel": args.wheel_python, "source": args.source_python}
    for label, python in pythons.items():
        print(f"{label}: {python}: {describe(python)}")
    with tempfile.TemporaryDirectory(prefix="nano-patch-bench-") as tmp:
        copy = Path(tmp)
        for name in ("benchmarks", "examples"):
            shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("results", "data", "__pycache__"))
        if args.only in (None, "resample-direct"):
            report(f"the two _native builds in one process, taking turns, fastest of {args.rounds} calls per case "
                   "(mean us per resize)",
                   resample_direct(copy, pythons, args.rounds))
        if args.only in (None, "resample"):
            report(f"resample.py --column native:ISA, {args.rounds} interleaved rounds (median us per resize)",
                   resample(copy, pythons, args.rounds))
        if args.only in (None, "crop_decode"):
            report(f"crop_decode.py --rounds {args.crop_inner}, {args.crop_rounds} interleaved runs (us per image)",
                   crop_decode(copy, pythons, args.crop_rounds, args.crop_inner))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
