"""The native warp against Pillow's and pillow-simd's ``Image.transform``, on the warps pipelines do.

Cases, on 224 x 224 crops of real photographs (the photos that ship in scikit-learn and matplotlib,
thumbnailed to 500, 420 and 340 px, centre-cropped): rotate 15 degrees bilinear, rotations drawn by
``RandomRotation(30)`` bicubic, a sheared ``RandomAffine`` matrix bilinear, ``RandomPerspective``
draws bilinear and bicubic, and rotate 15 degrees nearest (what the auto-augment policies do by
default). PIL runs ``Image.transform`` on a PIL image with the matrix ``Image.rotate`` or torchvision
computes; the native kernel runs the same transform on the array straight into a new array. Columns:
Pillow (this interpreter), pillow-simd (``--simd-python``: an interpreter with pillow-simd and NumPy
only), and the native kernel at each instruction set this CPU runs. Each column runs in its own
process on one pinned core; ``--rounds`` rounds alternate the columns; within a round a column's
figure is its fastest of several timed passes (the machine may be shared: the fastest pass is the
least disturbed), and the table gives the median over rounds, in microseconds per warp. The
native output is checked equal to Pillow's on every case before timing, and pillow-simd's output is
compared with Pillow's too. Results: ``benchmarks/results/warp.json`` and ``.png``.

    python benchmarks/warp.py --simd-python /path/to/venv-with-pillow-simd/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vision import RESULTS, grouped_bars, machine  # noqa: E402

#: case kind -> (filter number, perspective)
KINDS = {
    "rotate 15 bilinear": (2, False),
    "rotate bicubic": (3, False),
    "affine shear bilinear": (2, False),
    "perspective bilinear": (2, True),
    "perspective bicubic": (3, True),
    "rotate 15 nearest": (0, False),
}


def make_cases(path: Path) -> None:
    """Write the photo crops and each case's coefficients to ``path`` (an .npz), for every column to load."""
    import matplotlib
    import numpy as np
    import sklearn
    import torch
    import torchvision.transforms as T
    from PIL import Image

    from nano_patch.vision.kernels import native_checks

    F = T.functional
    sources = [Path(sklearn.__file__).parent / "datasets" / "images" / n for n in ("china.jpg", "flower.jpg")]
    sources.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    crops = []
    for src in sources:
        for side in (500, 420, 340):
            im = Image.open(src).convert("RGB")
            im.thumbnail((side, side), Image.LANCZOS)
            left, top = (im.width - 224) // 2, (im.height - 224) // 2
            crops.append(np.asarray(im.crop((left, top, left + 224, top + 224))))
    torch.manual_seed(0)
    rotation, affine = T.RandomRotation(30), T.RandomAffine(10, shear=(-20, 20, -10, 10))
    cases = []  # (kind, crop index, 8 coefficients)
    for k in range(len(crops)):
        rot15 = native_checks.rotate_data(224, 224, 15.0)[0]
        drawn = native_checks.rotate_data(224, 224, float(rotation.get_params(rotation.degrees)) % 360.0)[0]
        angle, translations, scale, shear = affine.get_params(affine.degrees, affine.translate, affine.scale,
                                                              affine.shear, [224, 224])
        sheared = F._get_inverse_affine_matrix([112.0, 112.0], angle, list(translations), scale, list(shear))
        start, end = T.RandomPerspective.get_params(224, 224, 0.5)
        persp = F._get_perspective_coeffs(start, end)
        start, end = T.RandomPerspective.get_params(224, 224, 0.5)
        persp2 = F._get_perspective_coeffs(start, end)
        for kind, coeffs in (("rotate 15 bilinear", rot15), ("rotate bicubic", drawn),
                             ("affine shear bilinear", sheared), ("perspective bilinear", persp),
                             ("perspective bicubic", persp2), ("rotate 15 nearest", rot15)):
            cases.append((kind, k, list(coeffs) + [0.0] * (8 - len(coeffs))))
    np.savez(path, crops=np.stack(crops), kinds=np.array([c[0] for c in cases]),
             which=np.array([c[1] for c in cases]), coeffs=np.array([c[2] for c in cases], dtype=np.float64))


def time_column(column: str, cases_path: str, rounds_inner: int = 7) -> dict[str, object]:
    """The fastest pass's microseconds per warp for each kind, in this process on one pinned core, and
    a digest of the outputs (to compare PIL builds)."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import numpy as np
    from PIL import Image

    data = np.load(cases_path)
    crops = list(data["crops"])
    todo = [(str(kind), int(k), [float(c) for c in coeffs])
            for kind, k, coeffs in zip(data["kinds"], data["which"], data["coeffs"])]
    photos = [Image.fromarray(a) for a in crops]

    def pil(case):
        kind, k, coeffs = case
        f, persp = KINDS[kind]
        method = Image.Transform.PERSPECTIVE if persp else Image.Transform.AFFINE
        return photos[k].transform((224, 224), method, coeffs[: 8 if persp else 6], f)

    if column == "pil":
        run = pil
    else:
        from nano_patch.vision.kernels import native, native_kernels

        native._import().set_isa(column.split(":")[1])

        def run(case):
            kind, k, coeffs = case
            f, persp = KINDS[kind]
            return native_kernels.warp(crops[k], (224, 224), coeffs[: 8 if persp else 6], persp, f, b"\0\0\0")

        for case in todo:  # equal to Pillow's, or nothing to time
            if not np.array_equal(np.asarray(run(case)), np.asarray(pil(case))):
                raise SystemExit(f"the native warp differs from PIL on {case}")
    digest = hashlib.sha256(b"".join(np.asarray(run(c)).tobytes() for c in todo)).hexdigest()
    result: dict[str, object] = {"digest": digest}
    by_kind = {kind: [c for c in todo if c[0] == kind] for kind in KINDS}
    warm_until = time.perf_counter() + 0.5  # the core's clock up and the caches warm before any timing
    while time.perf_counter() < warm_until:
        for c in todo:
            run(c)
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(rounds_inner):  # the kinds take turns, so that none is timed only early or late
        for kind, mine in by_kind.items():
            start = time.perf_counter()
            for c in mine:
                run(c)
            samples[kind].append((time.perf_counter() - start) / len(mine) * 1e6)
    for kind in KINDS:
        result[kind] = min(samples[kind])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simd-python", help="an interpreter whose PIL is pillow-simd (NumPy is all it needs besides)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--column", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.column:
        print(json.dumps(time_column(args.column, args.cases)))
        return
    from nano_patch.vision.kernels import native

    isas = ["generic", "avx2", "avx512"]
    isas = isas[: isas.index(native._import().best_isa()) + 1]
    columns = [("Pillow", sys.executable, "pil")]
    if args.simd_python:
        columns.append(("pillow-simd", args.simd_python, "pil"))
    columns += [(f"native ({isa})", sys.executable, f"native:{isa}") for isa in isas]
    with tempfile.TemporaryDirectory(prefix="nano-patch-warp-") as tmp:
        cases_path = str(Path(tmp) / "cases.npz")
        make_cases(Path(cases_path))
        per_round, digests = [], {}
        for r in range(args.rounds):
            got = {}
            for label, python, column in (columns if r % 2 == 0 else columns[::-1]):
                out = subprocess.run([python, __file__, "--column", column, "--cases", cases_path],
                                     capture_output=True, text=True, check=True)
                got[label] = json.loads(out.stdout.strip().splitlines()[-1])
                digests[label] = got[label].pop("digest")
            per_round.append(got)
            print(f"round {r}: " + json.dumps({k: {c: round(v) for c, v in d.items()} for k, d in got.items()}),
                  flush=True)
    medians = {label: {k: statistics.median(rd[label][k] for rd in per_round) for k in KINDS}
               for label, _, _ in columns}
    same = {label: digests[label] == digests["Pillow"] for label in digests}
    result = {"machine": machine(), "rounds": args.rounds, "crop": "224 x 224", "medians_us": medians,
              "outputs_equal_to_pillow": same, "per_round": per_round}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "warp.json").write_text(json.dumps(result, indent=2))
    lines = ["| warp, 224 px real photo crops | " + " | ".join(medians) + " |", "|---" * (len(medians) + 1) + "|"]
    for k in KINDS:
        lines.append(f"| {k} | " + " | ".join(f"{medians[c][k]:.0f} us" for c in medians) + " |")
    best = [c for c in medians if c.startswith("native")][-1]
    for ref in ("Pillow", "pillow-simd"):
        if ref in medians:
            lines.append(f"{best} / {ref}: " + ", ".join(f"{k} {medians[ref][k] / medians[best][k]:.1f}x faster"
                                                         for k in KINDS))
    lines.append("outputs equal to Pillow's: " + ", ".join(f"{c} {'yes' if v else 'NO'}" for c, v in same.items()))
    print("\n".join(lines))
    chart(result, RESULTS / "warp.png")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["medians_us"]
    cols = list(med)
    kinds = list(next(iter(med.values())))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ticks = grouped_bars(ax, kinds, cols, lambda k, c: med[c][k])
    ax.set_xticks(ticks, kinds, fontsize=8)
    ax.set_ylabel("microseconds per warp (lower is better)")
    ax.set_title(f"Image.transform of 224 px real photo crops, one core\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
