"""torchvision's array datasets (CIFAR-10/100, SVHN, STL-10, the MNIST family) with their tutorials' transforms:
stock torch and torchvision against the patch.

The files are made from real photographs in each dataset's own format (``examples/make_array_datasets.py``). Each
row is a dataset with the transforms its tutorial uses, batch 128, ``shuffle=True``, ``torch.manual_seed(0)``:

- ``cifar10``, ``cifar100``: RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize;
- ``cifar10 test``: ToTensor, Normalize (the evaluation pipeline);
- ``svhn``: ToTensor, Normalize;
- ``stl10``: RandomCrop(96, padding=12), RandomHorizontalFlip, ToTensor, Normalize;
- ``mnist``, ``fashionmnist``, ``kmnist``, ``emnist``, ``qmnist``: ToTensor, Normalize((0.1307,), (0.3081,));
- ``fashionmnist totensor``: ToTensor alone;
- ``cifar10 jitter``: RandomCrop(32, padding=4), flip, ColorJitter(0.2, 0.2, 0.2), ToTensor, Normalize;
  ``cifar10 resize``: Resize(64), flip, ToTensor, Normalize; ``cifar10 ToTensor alone``: ``transform=ToTensor()``,
  no Compose (pipelines the array path does not take: never slower than stock).

Each configuration runs in a fresh process (``torch.set_num_threads(1)``, ``num_workers`` 0 and 2 with
``persistent_workers=True``): epoch 1 is the warm-up, epoch 2 onwards is timed for at least ``--seconds``. Rounds are
interleaved (the order reversed every other round); medians and the slowest run are reported, with patched / stock.

    python benchmarks/array_datasets.py [--rounds 3] [--images 20000] [--seconds 3] [--only cifar10] [--workers 0,2]

Results: ``benchmarks/results/array_datasets.{json,png}`` (``--stem`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from own_dataset import run_script  # noqa: E402

RESULTS = Path(__file__).parent / "results"

CHILD = r'''
import json, os, sys, time

cfg = json.loads(sys.argv[1])
if cfg["side"] == "patched":  # a user's script, patched: the line at its top
    from nano_patch import patch_torch
    patch_torch()

sys.path.insert(0, cfg["examples"])
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader
from make_array_datasets import open_dataset

RGB = ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])
GREY = ((0.1307,), (0.3081,))
PIPELINES = {
    "crop flip": lambda pad, side: [T.RandomCrop(side, padding=pad), T.RandomHorizontalFlip(), T.ToTensor(),
                                    T.Normalize(*RGB)],
    "tensor": lambda pad, side: [T.ToTensor(), T.Normalize(*RGB)],
    "grey": lambda pad, side: [T.ToTensor(), T.Normalize(*GREY)],
    "totensor": lambda pad, side: [T.ToTensor()],
    "jitter": lambda pad, side: [T.RandomCrop(side, padding=pad), T.RandomHorizontalFlip(),
                                 T.ColorJitter(0.2, 0.2, 0.2), T.ToTensor(), T.Normalize(*RGB)],
    "resize": lambda pad, side: [T.Resize(2 * side), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*RGB)],
    "single": None,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    make = PIPELINES[cfg["pipeline"]]
    tf = T.Compose(make(cfg["pad"], cfg["px"])) if make is not None else T.ToTensor()
    ds = open_dataset(cfg["kind"], cfg["root"], train=cfg["train"], transform=tf)
    kw = dict(num_workers=cfg["workers"], persistent_workers=True) if cfg["workers"] else {}
    loader = DataLoader(ds, batch_size=128, shuffle=True, **kw)
    torch.manual_seed(0)
    t = time.perf_counter()
    for _ in loader:  # epoch 1: the warm-up (workers start)
        pass
    first_epoch = time.perf_counter() - t
    n, epochs = 0, 0
    t = time.perf_counter()
    while True:
        for x, y in loader:
            n += len(y)
        epochs += 1
        if time.perf_counter() - t >= cfg["seconds"]:
            break
    seconds = time.perf_counter() - t
    print(json.dumps({"images_per_s": n / seconds, "images": n, "epochs": epochs, "seconds": seconds,
                      "first_epoch_s": first_epoch}), flush=True)
'''

#: row -> (the kind of files, train split, pipeline, padding, side)
ROWS = {
    "cifar10": ("cifar10", True, "crop flip", 4, 32),
    "cifar10 test": ("cifar10", False, "tensor", 0, 32),
    "cifar100": ("cifar100", True, "crop flip", 4, 32),
    "svhn": ("svhn", True, "tensor", 0, 32),
    "stl10": ("stl10", True, "crop flip", 12, 96),
    "mnist": ("mnist", True, "grey", 0, 28),
    "fashionmnist": ("fashionmnist", True, "grey", 0, 28),
    "fashionmnist totensor": ("fashionmnist", True, "totensor", 0, 28),
    "kmnist": ("kmnist", True, "grey", 0, 28),
    "emnist": ("emnist", True, "grey", 0, 28),
    "qmnist": ("qmnist", True, "grey", 0, 28),
    "cifar10 jitter": ("cifar10", True, "jitter", 4, 32),
    "cifar10 resize": ("cifar10", True, "resize", 0, 32),
    "cifar10 ToTensor alone": ("cifar10", True, "single", 0, 32),
}


def key(row: str, side: str, workers: int) -> str:
    return f"{row} | {side} | num_workers={workers}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=20000, help="training images per dataset (STL-10: a quarter)")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed window of whole epochs per configuration")
    ap.add_argument("--only", action="append", choices=list(ROWS), metavar="ROW", help=f"one of {list(ROWS)}")
    ap.add_argument("--workers", default="0,2", help="the num_workers values, comma-separated")
    ap.add_argument("--stem", default="array_datasets")
    ap.add_argument("--before", metavar="CHECKOUT", help="another nano-patch source tree, run as 'before'")
    args = ap.parse_args()
    from make_array_datasets import make
    from train import _cpu_name

    rows = args.only or list(ROWS)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    sides = ["stock", "patched"] + (["before"] if args.before else [])
    result: dict = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
                    "python": platform.python_version(), "batch": 128, "images": args.images,
                    "seconds": args.seconds, "rounds": args.rounds, "rows": rows, "workers": workers,
                    "sides": sides, "configs": {}}
    began = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    examples = str(Path(__file__).resolve().parent.parent / "examples")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for kind in sorted({ROWS[r][0] for r in rows}):
            make(tmp / "data", kind, args.images // 4 if kind == "stl10" else args.images)
        script = tmp / "array_datasets_child.py"
        script.write_text(CHILD)
        print(f"files made in {time.perf_counter() - began:.0f} s", flush=True)
        configs = [(row, side, w) for row in rows for w in workers for side in sides]
        for r in range(args.rounds):
            for row, side, w in configs if r % 2 == 0 else configs[::-1]:
                kind, train, pipeline, pad, side_px = ROWS[row]
                cfg = {"root": str(tmp / "data"), "kind": kind, "train": train, "pipeline": pipeline, "pad": pad,
                       "px": side_px, "workers": w, "seconds": args.seconds, "examples": examples,
                       "side": "stock" if side == "stock" else "patched"}
                got = run_script(script, cfg, args.before if side == "before" else None)
                runs.setdefault(key(row, side, w), []).append(got)
                print(f"round {r}: {key(row, side, w)}: {got['images_per_s']:.0f} images/s", flush=True)
    for name, rs in runs.items():
        result["configs"][name] = {"median_images_per_s": statistics.median(x["images_per_s"] for x in rs),
                                   "slowest_images_per_s": min(x["images_per_s"] for x in rs),
                                   "all_images_per_s": [x["images_per_s"] for x in rs], "runs": rs}
    med = {name: c["median_images_per_s"] for name, c in result["configs"].items()}
    result["against_stock"] = {f"{row} | num_workers={w}": {s: med[key(row, s, w)] / med[key(row, "stock", w)]
                                                           for s in sides if s != "stock"}
                               for row in rows for w in workers}
    result["total_s"] = time.perf_counter() - began
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print_table(result)


def print_table(result: dict) -> None:
    confs = result["configs"]
    before = "before" in result["sides"]
    print(f"\n{result['machine']}; batch 128, epoch 2 on; images/s, medians (slowest) of {result['rounds']} "
          "interleaved rounds of fresh processes")
    head = "| dataset, transforms | num_workers | stock | patched | patched / stock | slowest patched / stock |"
    head += " before / stock |" if before else ""
    print(head)
    print("|---" * head.count(" |") + "|")
    for row in result["rows"]:
        for w in result["workers"]:
            s, p = confs[key(row, "stock", w)], confs[key(row, "patched", w)]
            line = (f"| {row} | {w} | {s['median_images_per_s']:.0f} | {p['median_images_per_s']:.0f} | "
                    f"{p['median_images_per_s'] / s['median_images_per_s']:.2f}x | "
                    f"{p['slowest_images_per_s'] / s['median_images_per_s']:.2f}x |")
            if before:
                line += f" {confs[key(row, 'before', w)]['median_images_per_s'] / s['median_images_per_s']:.2f}x |"
            print(line)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars  # benchmarks/vision.py, beside this script

    med = {name: c["median_images_per_s"] for name, c in result["configs"].items()}
    groups = [(row, w) for row in result["rows"] for w in result["workers"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 2), 4.4))
    ticks = grouped_bars(ax, groups, result["sides"], lambda g, side: med[key(g[0], side, g[1])])
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{row}\nnum_workers={w}" for row, w in groups], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("images / s (median)")
    ax.set_title(f"Array datasets, tutorials' transforms, batch 128: stock against patch_torch()\n{result['machine']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
