"""A dataset that keeps its images in memory: stock torch against the patch, load and every epoch timed.

The Dataset class a user writes to decode once and crop every epoch: ``self.images = [Image.open(p).convert("RGB")
for p in paths]`` at construction, ``RandomResizedCrop(96)``, flip and ``ToTensor`` in ``__getitem__``; batch 32,
``shuffle=True``, four epochs, over real-photo JPEGs (``examples/make_photo_folder.py``, 3 classes of
``--per-class``). Each configuration is a fresh process (``torch.set_num_threads(1)``) that reports the load (the
list built), each epoch, the total and its peak memory (``ru_maxrss``); rounds are interleaved (the order reversed
every other round). Reported: medians, the slowest of the rounds, and patched / stock per figure.

    python benchmarks/kept_images.py [--rounds 5] [--per-class 100] [--workers 0,2]

Results: ``benchmarks/results/kept_images.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import run_child  # noqa: E402

RESULTS = Path(__file__).parent / "results"
EPOCHS = 4

CHILD = r'''
import json, resource, sys, time
cfg = json.loads(sys.argv[1])
if cfg["side"] == "patched":
    from nano_patch import patch_torch
    patch_torch()
import torch
import torchvision.transforms as T
from PIL import Image
torch.set_num_threads(1)


class Kept(torch.utils.data.Dataset):
    def __init__(self, files, labels):
        self.images = [Image.open(p).convert("RGB") for p in files]
        self.labels = labels
        self.tf = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor()])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.tf(self.images[i]), self.labels[i]


with open(cfg["files"]) as f:
    listing = json.load(f)
t = time.perf_counter()
ds = Kept(listing["files"], listing["labels"])
load = time.perf_counter() - t
torch.manual_seed(0)
loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=cfg["workers"])
epochs, check = [], 0.0
for _ in range(cfg["epochs"]):
    t = time.perf_counter()
    for x, _ in loader:
        check += float(x[:, :, 0, 0].sum())
    epochs.append(time.perf_counter() - t)
print(json.dumps({"load_s": load, "epochs_s": epochs, "total_s": load + sum(epochs), "check": check,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''

FIGURES = ("load_s", "first_epoch_s", "later_epoch_s", "total_s", "maxrss_mb")


def figures(run: dict) -> dict[str, float]:
    later = run["epochs_s"][1:]
    return {"load_s": run["load_s"], "first_epoch_s": run["epochs_s"][0],
            "later_epoch_s": statistics.mean(later), "total_s": run["total_s"], "maxrss_mb": run["maxrss_mb"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-class", type=int, default=100, help="photos per class, 3 classes")
    ap.add_argument("--workers", default="0,2", help="the num_workers values, comma-separated")
    args = ap.parse_args()

    from make_photo_folder import build
    from train import _cpu_name

    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    result: dict = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
                    "python": platform.python_version(), "epochs": EPOCHS, "rounds": args.rounds,
                    "workers": workers, "configs": {}}
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        train = build(tmp / "photos", args.per_class) / "train"
        classes = sorted(p.name for p in train.iterdir() if p.is_dir())
        files = sorted(str(p) for p in train.glob("*/*.jpg"))
        listing = {"files": files, "labels": [classes.index(Path(f).parent.name) for f in files]}
        (tmp / "files.json").write_text(json.dumps(listing))
        result["images"] = len(files)
        configs = [(side, w) for w in workers for side in ("stock", "patched")]
        for r in range(args.rounds):
            for side, w in configs if r % 2 == 0 else configs[::-1]:
                got = run_child(CHILD, {"files": str(tmp / "files.json"), "side": side, "workers": w,
                                        "epochs": EPOCHS})
                runs.setdefault(f"{side} | num_workers={w}", []).append(got)
                print(f"round {r}: {side} num_workers={w}: load {got['load_s']:.2f} s, epochs "
                      f"{', '.join(f'{e:.2f}' for e in got['epochs_s'])} s, {got['maxrss_mb']:.0f} MB", flush=True)
    for name, rs in runs.items():
        each = [figures(x) for x in rs]
        result["configs"][name] = {
            "median": {f: statistics.median(e[f] for e in each) for f in FIGURES},
            "slowest": {f: max(e[f] for e in each) for f in FIGURES},
            "checks": sorted({round(x["check"], 3) for x in rs}), "runs": rs}
    result["against_stock"] = {
        f"num_workers={w}": {f: result["configs"][f"patched | num_workers={w}"]["median"][f]
                             / result["configs"][f"stock | num_workers={w}"]["median"][f] for f in FIGURES}
        for w in workers}
    result["same_batches"] = all(result["configs"][f"stock | num_workers={w}"]["checks"]
                                 == result["configs"][f"patched | num_workers={w}"]["checks"] for w in workers)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kept_images.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / "kept_images.png")
    print_table(result)


def print_table(result: dict) -> None:
    print(f"\n{result['machine']}; images kept in memory, {result['images']} photos, {EPOCHS} epochs; seconds, "
          f"medians of {result['rounds']} interleaved rounds (slowest in brackets); same batches: "
          f"{result['same_batches']}")
    print("| num_workers | side | load | epoch 1 | later epochs (mean) | load + 4 epochs | peak memory MB |")
    print("|---|---|---|---|---|---|---|")
    for w in result["workers"]:
        for side in ("stock", "patched"):
            c = result["configs"][f"{side} | num_workers={w}"]
            cells = [f"{c['median'][f]:.2f} ({c['slowest'][f]:.2f})" for f in FIGURES[:4]]
            print(f"| {w} | {side} | {' | '.join(cells)} | {c['median']['maxrss_mb']:.0f} |")
        ratio = result["against_stock"][f"num_workers={w}"]
        print(f"| {w} | patched / stock | " + " | ".join(f"{ratio[f]:.2f}x" for f in FIGURES) + " |")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["workers"]), figsize=(5.2 * len(result["workers"]), 4.0), squeeze=False)
    for ax, w in zip(axes[0], result["workers"]):
        for k, side in enumerate(("stock", "patched")):
            runs = result["configs"][f"{side} | num_workers={w}"]["runs"]
            med = [statistics.median(r["load_s"] for r in runs)] + [
                statistics.median(r["epochs_s"][e] for r in runs) for e in range(EPOCHS)]
            bottom = 0.0
            for i, v in enumerate(med):
                ax.bar(k, v, bottom=bottom, color=f"C{i}", label=("load" if i == 0 else f"epoch {i}") if k == 0
                       else None)
                bottom += v
        ax.set_xticks([0, 1])
        ax.set_xticklabels(["stock", "patched"])
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"num_workers={w}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"A dataset that keeps its images in memory: load and {EPOCHS} epochs\n{result['machine']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
