"""The native resample against Pillow's and pillow-simd's resize, on the resizes pipelines do.

Cases: ``RandomResizedCrop(224)`` draws (seed 0) and ``Resize(256)`` of real photographs (the
photos that ship in scikit-learn and matplotlib, at 300-500 px), bilinear, as torchvision does
them: PIL crops and then resizes a PIL image; the native kernel resizes a view of the decoded
array (the crop costs nothing) straight into a new array. Columns: Pillow (this interpreter),
pillow-simd (``--simd-python``), and the native kernel at each instruction set this CPU runs. Each
column runs in its own process on one pinned core; ``--rounds`` rounds alternate the columns; the
figure is the median microseconds per resize. The native output is checked equal to Pillow's on
every case before timing. Results: ``benchmarks/results/resample.json`` and ``.png``.

    python benchmarks/resample.py --simd-python /path/to/venv-with-pillow-simd/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vision import RESULTS, grouped_bars, machine  # noqa: E402


def cases() -> tuple[list, list]:
    """The photos (RGB arrays) and (photo index, crop box, output size) for each resize."""
    import matplotlib
    import numpy as np
    import sklearn
    import torch
    import torchvision.transforms as T
    from PIL import Image

    sources = [Path(sklearn.__file__).parent / "datasets" / "images" / n for n in ("china.jpg", "flower.jpg")]
    sources.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    photos = []
    for src in sources:
        for side in (500, 420, 340):
            im = Image.open(src).convert("RGB")
            im.thumbnail((side, side), Image.LANCZOS)
            photos.append(im)
    torch.manual_seed(0)
    rrc = T.RandomResizedCrop(224)
    out = []
    for k in range(48):
        i, j, h, w = rrc.get_params(photos[k % len(photos)], rrc.scale, rrc.ratio)
        out.append(("RandomResizedCrop(224)", k % len(photos), (j, i, j + w, i + h), (224, 224)))
    for k, im in enumerate(photos):
        w, h = im.size
        size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
        out.append(("Resize(256)", k, (0, 0, w, h), size))
    return [np.asarray(p) for p in photos], out


def time_column(column: str, rounds_inner: int = 7) -> dict[str, float]:
    """Median microseconds per resize for each kind of case, in this process, one pinned core."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import numpy as np
    from PIL import Image

    arrays, todo = cases()
    photos = [Image.fromarray(a) for a in arrays]
    if column == "pil":
        def run(case):
            _, k, box, size = case
            return photos[k].crop(box).resize(size, Image.BILINEAR)
    else:
        from nano_patch.vision.kernels import native, native_kernels

        native._import().set_isa(column.split(":")[1])

        def run(case):
            _, k, (left, top, right, bottom), (w, h) = case
            return native_kernels.resample(arrays[k][top:bottom, left:right], (h, w), Image.BILINEAR)

        for case in todo:  # equal to Pillow's, or nothing to time
            _, k, box, size = case
            want = np.asarray(photos[k].crop(box).resize(size, Image.BILINEAR))
            if not np.array_equal(np.asarray(run(case)), want):
                raise SystemExit(f"the native resample differs from PIL on {case}")
    kinds = sorted({c[0] for c in todo})
    result = {}
    for kind in kinds:
        mine = [c for c in todo if c[0] == kind]
        for c in mine[:4]:
            run(c)
        samples = []
        for _ in range(rounds_inner):
            start = time.perf_counter()
            for c in mine:
                run(c)
            samples.append((time.perf_counter() - start) / len(mine) * 1e6)
        result[kind] = statistics.median(samples)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simd-python", help="an interpreter whose PIL is pillow-simd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--column", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.column:
        print(json.dumps(time_column(args.column)))
        return
    from nano_patch.vision.kernels import native

    isas = ["generic", "avx2", "avx512"]
    isas = isas[: isas.index(native._import().best_isa()) + 1]
    columns = [("Pillow", sys.executable, "pil")]
    if args.simd_python:
        columns.append(("pillow-simd", args.simd_python, "pil"))
    columns += [(f"native ({isa})", sys.executable, f"native:{isa}") for isa in isas]
    per_round = []
    for r in range(args.rounds):
        got = {}
        for label, python, column in (columns if r % 2 == 0 else columns[::-1]):
            out = subprocess.run([python, __file__, "--column", column], capture_output=True, text=True, check=True)
            got[label] = json.loads(out.stdout.strip().splitlines()[-1])
        per_round.append(got)
        print(f"round {r}: {got}", flush=True)
    kinds = list(per_round[0][columns[0][0]])
    medians = {label: {k: statistics.median(rd[label][k] for rd in per_round) for k in kinds}
               for label, _, _ in columns}
    result = {"machine": machine(), "rounds": args.rounds, "medians_us": medians, "per_round": per_round}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "resample.json").write_text(json.dumps(result, indent=2))
    lines = ["| resize (bilinear, real photos) | " + " | ".join(medians) + " |", "|---" * (len(medians) + 1) + "|"]
    for k in kinds:
        lines.append(f"| {k} | " + " | ".join(f"{medians[c][k]:.0f} us" for c in medians) + " |")
    if "pillow-simd" in medians:
        for c in medians:
            if c.startswith("native"):
                lines.append(f"{c} / pillow-simd: " + ", ".join(
                    f"{k} {medians['pillow-simd'][k] / medians[c][k]:.2f}x faster" for k in kinds))
    print("\n".join(lines))
    chart(result, RESULTS / "resample.png")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["medians_us"]
    cols = list(med)
    kinds = list(next(iter(med.values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    ticks = grouped_bars(ax, kinds, cols, lambda k, c: med[c][k])
    ax.set_xticks(ticks, kinds)
    ax.set_ylabel("microseconds per resize (lower is better)")
    ax.set_title(f"bilinear resize of real photos, one core\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
