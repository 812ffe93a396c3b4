"""Where the time goes: each step of the vision pipelines, stock against patched, on one core.

The same photos and pipelines as ``benchmarks/vision.py``. Every image is decoded and then passed
through the pipeline one step at a time, each step timed on its own; the patched column runs the
steps the way the patched ``Compose`` does (the image carried as a ``FastImage``, ToTensor +
Normalize fused into one step, v2's tensor tail fused into one step). Medians per step in ms, over
``--passes`` passes of all photos. Results go to ``benchmarks/results/vision_steps[-simd].json``.

    python benchmarks/vision_steps.py                     # this interpreter's PIL
    /path/to/pillow-simd/python benchmarks/vision_steps.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import vision as bench

RESULTS = Path(__file__).parent / "results"


def _step_name(t) -> str:
    return type(t).__name__


def stock_steps(pipe, path: str, acc: dict[str, list[float]]) -> None:
    from torchvision.datasets.folder import default_loader

    start = time.perf_counter()
    x = default_loader(path)
    acc.setdefault("decode (PIL)", []).append(time.perf_counter() - start)
    for i, t in enumerate(pipe.transforms):
        start = time.perf_counter()
        x = t(x)
        acc.setdefault(f"{i}: {_step_name(t)}", []).append(time.perf_counter() - start)


def patched_steps(pipe, path: str, acc: dict[str, list[float]]) -> None:
    import torchvision.transforms as T

    from nano_patch.vision import decode
    from nano_patch.vision import functional as K
    from nano_patch.vision.image import FastImage

    start = time.perf_counter()
    x = FastImage.wrap(decode.decode_rgb(path))
    acc.setdefault("decode (libjpeg-turbo)", []).append(time.perf_counter() - start)
    items = list(pipe.transforms)
    v2_tail = _v2_tail(pipe)
    i = 0
    while i < len(items):
        t = items[i]
        start = time.perf_counter()
        if type(t) is T.ToTensor and i + 1 < len(items) and type(items[i + 1]) is T.Normalize:
            x = K.to_tensor_normalized(K.from_pil(x), items[i + 1].mean, items[i + 1].std)
            name, step = f"{i}: ToTensor + Normalize (fused)", 2
        else:
            fused = v2_tail.run(items[i:], x) if v2_tail is not None else None
            if fused is not None:
                name = f"{i}: " + " + ".join(_step_name(s) for s in items[i:]) + " (fused)"
                x, step = fused, len(items) - i
            else:
                x, name, step = t(x), f"{i}: {_step_name(t)}", 1
        acc.setdefault(name, []).append(time.perf_counter() - start)
        i += step


def _v2_tail(pipe):
    if not type(pipe).__module__.startswith("torchvision.transforms.v2"):
        return None
    import torchvision.transforms.v2 as v2

    from nano_patch.patches.vision_transforms_v2 import _TensorTail

    return _TensorTail(v2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--pipelines", nargs="*", default=["a", "b", "c", "d", "v2 b"])
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    import nano_patch
    from nano_patch import sysinfo

    with tempfile.TemporaryDirectory() as tmp:
        files = bench.make_photos(Path(tmp))["pet"]
        pipes = bench.torchvision_pipelines()
        out: dict = {"machine": f"{bench._cpu_name()}, {os.cpu_count()} CPUs",
                     "pil": "{} {}".format(*sysinfo.pillow_distribution()), "passes": args.passes, "pipelines": {}}
        for name in args.pipelines:
            pipe = pipes[name]
            columns = {}
            for column, run in (("stock", stock_steps), ("patched", patched_steps)):
                if column == "patched":
                    nano_patch.patch_torch()
                acc: dict[str, list[float]] = {}
                for f in files[:4]:
                    run(pipe, f, {})  # warm up
                for _ in range(args.passes):
                    torch.manual_seed(0)
                    for f in files:
                        run(pipe, f, acc)
                columns[column] = {k: 1e3 * statistics.median(v) for k, v in acc.items()}
                nano_patch.unpatch_torch()
            out["pipelines"][name] = columns
            print(f"({name})")
            for column, steps in columns.items():
                total = sum(steps.values())
                print(f"  {column:8s} total {total:.3f} ms: " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
    simd = "simd" in out["pil"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"vision_steps{'-simd' if simd else ''}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
