"""Crop-region JPEG decoding against the full decode, per image, on real photographs.

Files: the JPEGs ``examples/make_photo_folder.py`` makes (the photos that ship in scikit-learn and
matplotlib, random crops at 300-500 px, quality 80-95, 4:2:0; 3 classes of 40), plus the same photos at
1200 px (``large``) and at a shorter side of 256 (``short side 256``, for CenterCrop). Windows, drawn
from the image size alone as the pipeline draws them: ``RandomResizedCrop.get_params`` (scale 0.08-1,
seed 0), ``CenterCrop(224)``, small (64 x 64) and large (90% of each side) random windows, and bands in
the top and the bottom quarter of the rows (libjpeg still entropy-decodes every row above a window).

Columns, microseconds per image: ``full`` simplejpeg's decode (what nano-patch decodes with now);
``full, system libjpeg`` the region decode of the whole image (the same library as the crop columns,
to tell the crop's saving from the two libjpeg-turbo builds' speeds); ``crop`` the region decode
(``check_rest=True``, the default: the rows below are entropy-decoded too, so damage anywhere fails as
in the full decode); ``crop, stop after window`` (``check_rest=False``). One pinned core; within each of ``--rounds``
rounds the columns take turns file by file (in a rotating order), so that drift on a shared machine
hits them alike; the figure is, per file, the median over rounds, averaged over the files. Before timing, every crop is
checked equal to the full decode sliced.

``split``: where a cold image's time goes, from differences of decodes that stop at chosen rows (so
approximate: each part's boundary is rounded to libjpeg's iMCU rows): setup
(header, tables), entropy decoding of the rows above the window, the window's rows (entropy decoding
of whole rows, IDCT, upsampling and colour of the window's columns), and the rows below (entropy only).

Results: ``benchmarks/results/crop_decode.json`` and ``.png``.

    python benchmarks/crop_decode.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from vision import RESULTS, grouped_bars, machine  # noqa: E402

COLUMNS = ("full", "full, system libjpeg", "crop", "crop, stop after window")
Window = tuple[int, int, int, int]


def photo_files(tmp: Path) -> dict[str, list[bytes]]:
    """The benchmark's JPEG sets: the photo folder's files, the photos at 1200 px, and at a short side of 256."""
    from make_photo_folder import build, sources
    from PIL import Image

    build(tmp, per_class=40)
    folder = sorted((tmp / "train").rglob("*.jpg"))
    out: dict[str, list[bytes]] = {"photo folder (300-500 px)": [p.read_bytes() for p in folder]}
    large, short = [], []
    for src in sources():
        im = Image.open(src).convert("RGB")
        for k, quality in enumerate((85, 90, 95)):
            scale = (1200 - 60 * k) / max(im.size)
            big = im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)
            buf = io.BytesIO()
            big.save(buf, "JPEG", quality=quality)
            large.append(buf.getvalue())
            scale = (256 + 3 * k) / min(im.size)
            small = im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)
            buf = io.BytesIO()
            small.save(buf, "JPEG", quality=quality)
            short.append(buf.getvalue())
    out["large (1200 px)"] = large
    out["short side 256"] = short
    return out


def windows(sizes: list[tuple[int, int]], kind: str) -> list[Window]:
    """One window (top, left, height, width) per image for a kind of crop, drawn from its size alone."""
    import random

    import torch
    import torchvision.transforms as T

    torch.manual_seed(0)
    rng = random.Random(0)
    out = []
    for h, w in sizes:
        if kind == "RandomResizedCrop":
            out.append(tuple(T.RandomResizedCrop.get_params(torch.empty(1, h, w), (0.08, 1.0), (3 / 4, 4 / 3))))
        elif kind == "CenterCrop(224)":
            ch, cw = min(224, h), min(224, w)
            out.append((int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0)), ch, cw))
        elif kind == "small 64 x 64":
            ch, cw = min(64, h), min(64, w)
            out.append((rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw))
        elif kind == "large 90%":
            ch, cw = int(h * 0.9), int(w * 0.9)
            out.append((rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw))
        elif kind == "top quarter band":
            out.append((0, 0, max(1, h // 4), w))
        elif kind == "bottom quarter band":
            out.append((h - max(1, h // 4), 0, max(1, h // 4), w))
        else:
            raise ValueError(kind)
    return out


#: (file set, window kind) pairs measured.
CASES = [
    ("photo folder (300-500 px)", "RandomResizedCrop"),
    ("photo folder (300-500 px)", "small 64 x 64"),
    ("photo folder (300-500 px)", "large 90%"),
    ("photo folder (300-500 px)", "top quarter band"),
    ("photo folder (300-500 px)", "bottom quarter band"),
    ("short side 256", "CenterCrop(224)"),
    ("large (1200 px)", "RandomResizedCrop"),
]


def runners(files: list[bytes], wins: list[Window]) -> dict[str, Callable[[int], None]]:
    """Per column, a function decoding file ``k`` of the case the column's way."""
    import simplejpeg

    from nano_patch.vision.kernels import native_kernels

    sizes = [simplejpeg.decode_jpeg_header(d)[:2] for d in files]

    def full(k: int) -> None:
        simplejpeg.decode_jpeg(files[k], colorspace="RGB")

    def full_system(k: int) -> None:
        native_kernels.decode_jpeg_region(files[k], 0, 0, *sizes[k])

    def crop(check_rest: bool) -> Callable[[int], None]:
        def run(k: int) -> None:
            native_kernels.decode_jpeg_region(files[k], *wins[k], check_rest=check_rest)
        return run

    return {"full": full, "full, system libjpeg": full_system, "crop": crop(True),
            "crop, stop after window": crop(False)}


def verify(files: list[bytes], wins: list[Window]) -> None:
    import numpy as np
    import simplejpeg

    from nano_patch.vision.kernels import native_kernels

    for d, (t, left, h, w) in zip(files, wins):
        want = simplejpeg.decode_jpeg(d, colorspace="RGB")[t:t + h, left:left + w]
        for check_rest in (True, False):
            if not np.array_equal(native_kernels.decode_jpeg_region(d, t, left, h, w, check_rest=check_rest), want):
                raise SystemExit(f"crop decode differs from the full decode: window {(t, left, h, w)}")


def split(files: list[bytes], wins: list[Window], rounds: int) -> dict[str, float]:
    """Microseconds per image of each part of a crop decode (medians of interleaved rounds): stopping after
    row 1 gives the setup; a 1-row window at the window's top (stopping there) adds the rows above; the
    window itself (stopping after it) adds its rows; the check of the rest adds the rows below."""
    import simplejpeg

    from nano_patch.vision.kernels import native_kernels

    sizes = [simplejpeg.decode_jpeg_header(d)[:2] for d in files]
    parts = {
        "setup": lambda d, t, left, h, w, H, W: native_kernels.decode_jpeg_region(d, 0, 0, 1, 1, check_rest=False),
        "to window top": lambda d, t, left, h, w, H, W: native_kernels.decode_jpeg_region(d, t, left, 1, w,
                                                                                           check_rest=False),
        "to window bottom": lambda d, t, left, h, w, H, W: native_kernels.decode_jpeg_region(d, t, left, h, w,
                                                                                     check_rest=False),
        "to image end": lambda d, t, left, h, w, H, W: native_kernels.decode_jpeg_region(d, t, left, h, w),
        "entropy of all rows": lambda d, t, left, h, w, H, W: native_kernels.decode_jpeg_region(d, H - 1, W - 1, 1, 1,
                                                                                         check_rest=False),
        "full": lambda d, t, left, h, w, H, W: simplejpeg.decode_jpeg(d, colorspace="RGB"),
    }
    seconds: dict[str, list[list[float]]] = {k: [[] for _ in files] for k in parts}
    clock = time.perf_counter
    names = list(parts)
    for r in range(rounds):
        for k, (d, (t, left, h, w), (H, W)) in enumerate(zip(files, wins, sizes)):
            for i in range(len(names)):
                name = names[(i + k + r) % len(names)]
                start = clock()
                parts[name](d, t, left, h, w, H, W)
                seconds[name][k].append(clock() - start)
    med = {k: statistics.fmean(statistics.median(t) for t in per_file) * 1e6 for k, per_file in seconds.items()}
    return {
        "setup (header, tables, first iMCU row)": med["setup"],
        "rows above the window (entropy decoding)": med["to window top"] - med["setup"],
        "the window's rows (entropy of whole rows; IDCT, upsampling, colour of its columns)":
            med["to window bottom"] - med["to window top"],
        "rows below (entropy decoding, check_rest)": med["to image end"] - med["to window bottom"],
        "crop decode, total": med["to image end"],
        "entropy decoding of every row (a 1-pixel window at the bottom-right corner)": med["entropy of all rows"],
        "full decode (simplejpeg)": med["full"],
    }


def measure(rounds: int) -> dict:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import simplejpeg

    from nano_patch.vision.kernels import native

    native.kernel("crop_decode")  # the check at load runs once, outside the timings
    with tempfile.TemporaryDirectory() as tmp:
        sets = photo_files(Path(tmp))
    plans = {}
    for set_name, kind in CASES:
        files = sets[set_name]
        wins = windows([simplejpeg.decode_jpeg_header(d)[:2] for d in files], kind)
        verify(files, wins)
        plans[f"{kind}, {set_name}"] = runners(files, wins)
    n_files = {f"{k}, {s}": len(sets[s]) for s, k in CASES}
    # seconds[case][column][file]: one time per round
    seconds = {case: {c: [[] for _ in range(n_files[case])] for c in COLUMNS} for case in plans}
    clock = time.perf_counter
    for r in range(rounds):
        for case, run in plans.items():
            # file by file, every column in turn (in a rotating order): drift on a shared machine hits all alike
            for k in range(n_files[case]):
                for i in range(len(COLUMNS)):
                    column = COLUMNS[(i + k + r) % len(COLUMNS)]
                    start = clock()
                    run[column](k)
                    seconds[case][column][k].append(clock() - start)
    # per file the median over rounds (robust to bursts of load from other processes), then the mean per image
    medians = {case: {c: statistics.fmean(statistics.median(t) for t in per_file) * 1e6
                      for c, per_file in cols.items()} for case, cols in seconds.items()}
    times = {case: {c: [sum(t[r] for t in per_file) / len(per_file) * 1e6 for r in range(rounds)]
                    for c, per_file in cols.items()} for case, cols in seconds.items()}
    folder = sets["photo folder (300-500 px)"]
    rrc = windows([simplejpeg.decode_jpeg_header(d)[:2] for d in folder], "RandomResizedCrop")
    return {
        "machine": machine(),
        "libjpeg": f"crop: {native.kernel('crop_decode').LIBJPEG_VERSION} (system); full: simplejpeg "
                   f"{simplejpeg.__version__} (its own libjpeg-turbo)",
        "rounds": rounds,
        "files": {k: len(v) for k, v in sets.items()},
        "us_per_image": medians,
        "per_round": times,
        "split_random_resized_crop": split(folder, rrc, rounds),
    }


def table(result: dict) -> str:
    lines = ["| case | " + " | ".join(COLUMNS) + " | crop / full | stop after window / full |",
             "|---|" + "---|" * (len(COLUMNS) + 2)]
    for case, v in result["us_per_image"].items():
        cells = [f"{v[c]:.0f}" for c in COLUMNS]
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {v['crop'] / v['full']:.2f} | "
                     f"{v['crop, stop after window'] / v['full']:.2f} |")
    lines.append("\nmicroseconds per image (per file the median of interleaved rounds, then the mean), one core")
    lines.append("\n| where a RandomResizedCrop decode's time goes (photo folder) | us / image |\n|---|---|")
    for part, us in result["split_random_resized_crop"].items():
        lines.append(f"| {part} | {us:.0f} |")
    lines.append(f"\n{result['libjpeg']}; {result['machine']}")
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["us_per_image"]
    cases = list(med)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1]})
    ticks = grouped_bars(ax, cases, list(COLUMNS), lambda k, c: med[k][c] / med[k]["full"])
    ax.set_xticks(ticks,
                  [k.replace(", ", ",\n", 1) + f"\n(full: {med[k]['full']:.0f} us)" for k in cases], fontsize=6.5)
    ax.set_ylabel("time per image / simplejpeg's full decode, one core")
    ax.set_title("crop-region decode against the full decode", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    parts = result["split_random_resized_crop"]
    stack = list(parts.items())[:4]
    bottom = 0.0
    for name, us in stack:
        bx.bar([0], [us], 0.5, bottom=bottom, label=name.split(" (")[0])
        bottom += us
    bx.bar([1], [parts["full decode (simplejpeg)"]], 0.5, color="grey", label="full decode")
    entropy = parts["entropy decoding of every row (a 1-pixel window at the bottom-right corner)"]
    bx.axhline(entropy, color="k", ls="--", lw=1, label="entropy decoding of every row")
    bx.set_xticks([0, 1], ["crop", "full"])
    bx.set_title("RandomResizedCrop, photo folder:\nwhere the time goes (us per image)", fontsize=9)
    bx.set_ylim(0, parts["full decode (simplejpeg)"] * 1.5)
    bx.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"{result['libjpeg']}\n{result['machine']}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stem", default="crop_decode")
    args = ap.parse_args()
    result = measure(args.rounds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print(table(result))


if __name__ == "__main__":
    main()
