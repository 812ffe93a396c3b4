"""Where the time goes, per image, on one core: stock's steps against the patched plan's parts.

Stock: the PIL decode, then each transform of the Compose, each timed on its own. Patched: the
libjpeg-turbo decode, each native kernel the plan calls (timed by wrapping the kernel functions),
the stock random draws (each planned transform's ``get_params`` and ``torch.rand``, timed by
calling them the same number of times on their own), and the rest: the plan's own Python work.
Photos and pipelines as ``benchmarks/vision.py``; medians over ``--passes`` passes, in ms per
image. Results: ``benchmarks/results/vision_steps.json``.

    python benchmarks/vision_steps.py [--pipelines pets b c a]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import vision as bench

RESULTS = Path(__file__).parent / "results"
KERNELS = ("resample", "saturation", "blend_const", "contrast_mean", "rgb_to_l", "hue_shift", "planes_lut",
           "pixels_lut", "lut")


def stock_pass(pipe, files: list[str], acc: dict[str, float]) -> None:
    from torchvision.datasets.folder import default_loader

    for path in files:
        start = time.perf_counter()
        x = default_loader(path)
        acc["decode (PIL)"] += time.perf_counter() - start
        for i, t in enumerate(pipe.transforms):
            start = time.perf_counter()
            x = t(x)
            acc[f"{i}: {type(t).__name__}"] += time.perf_counter() - start


def draws_pass(pipe, files: list[str]) -> float:
    """Seconds the stock random draws of the planned transforms take, called on their own."""
    import torch
    import torchvision.transforms as T
    from PIL import Image

    proxy = Image.new("RGB", (400, 300))
    start = time.perf_counter()
    for _ in files:
        for t in pipe.transforms:
            if type(t) is T.RandomResizedCrop:
                t.get_params(proxy, t.scale, t.ratio)
            elif type(t) is T.RandomCrop:
                t.get_params(Image.new("RGB", (300, 300)), t.size)
            elif type(t) in (T.RandomHorizontalFlip, T.RandomVerticalFlip, T.RandomGrayscale):
                torch.rand(1) < t.p  # noqa: B015 - the draw is the point
            elif type(t) is T.ColorJitter:
                t.get_params(t.brightness, t.contrast, t.saturation, t.hue)
    return time.perf_counter() - start


def patched_pass(pipe, files: list[str], acc: dict[str, float]) -> None:
    from nano_patch.vision.images import decode
    from nano_patch.vision.images.image import FastImage

    total = 0.0
    for path in files:
        start = time.perf_counter()
        arr = decode.decode_rgb(path)
        mid = time.perf_counter()
        pipe(FastImage.wrap(arr))
        end = time.perf_counter()
        acc["decode (libjpeg-turbo)"] += mid - start
        total += end - mid
    acc["_transforms"] += total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--pipelines", nargs="*", default=["pets", "b", "c", "a"])
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    import nano_patch
    from nano_patch.vision.kernels import native_kernels

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from make_photo_folder import build

    spent: dict[str, float] = defaultdict(float)
    for name in KERNELS:  # every kernel call, timed (the wrapper costs well under a microsecond)
        original = getattr(native_kernels, name)

        def timed(*a, _f=original, _n=name, **k):
            start = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                spent[_n] += time.perf_counter() - start

        setattr(native_kernels, name, timed)

    out: dict = {"machine": bench.machine(), "passes": args.passes, "pipelines": {}}
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), per_class=40)
        from torchvision.datasets import ImageFolder

        files = [p for p, _ in ImageFolder(str(Path(tmp) / "train")).samples]
        for name in args.pipelines:
            columns = {}
            for column in ("stock", "patched"):
                pipe = bench.torchvision_pipeline(name)
                if column == "patched":
                    nano_patch.patch_torch()
                per_pass: list[dict[str, float]] = []
                for p in range(args.passes + 1):
                    torch.manual_seed(p)
                    acc: dict[str, float] = defaultdict(float)
                    spent.clear()
                    (patched_pass if column == "patched" else stock_pass)(pipe, files, acc)
                    if column == "patched":
                        kernels = dict(spent)
                        draws = draws_pass(pipe, files)
                        acc.update({f"kernel {k}": v for k, v in kernels.items()})
                        acc["stock random draws"] = draws
                        acc["plan (Python)"] = acc.pop("_transforms") - sum(kernels.values()) - draws
                    if p:  # the first pass warms up
                        per_pass.append({k: 1e3 * v / len(files) for k, v in acc.items()})
                nano_patch.unpatch_torch()
                columns[column] = {k: statistics.median(r.get(k, 0.0) for r in per_pass) for k in per_pass[0]}
            out["pipelines"][name] = columns
            print(f"({name})")
            for column, steps in columns.items():
                total = sum(steps.values())
                print(f"  {column:8s} total {total:.3f} ms: " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vision_steps.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
