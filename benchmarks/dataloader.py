"""DataLoader benchmark: a vision pipeline through a DataLoader, stock against patched, 0/1/2 workers.

``--pipeline b`` is RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize; ``pets``
is RandomResizedCrop(128), RandomHorizontalFlip, ColorJitter(0.3, 0.3, 0.3), ToTensor, Normalize;
over an ImageFolder of real-photo JPEGs (``examples/make_photo_folder.py``), batch size 64. Each
configuration runs in a fresh process; images/s is measured over full passes after a warm-up pass
(persistent workers stay up under the patch), and the image bytes each batch carries from the
workers to the main process are reported. Results: ``benchmarks/results/dataloader[-pets].{json,png}``.

    python benchmarks/dataloader.py [--pipeline b|pets] [--per-class 96] [--passes 3] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"

MODES = {
    "stock": None,
    "patched, float batches": {"uint8_batches": False},
    "patched, uint8 batches": {},
}

CHILD = r"""
import json, sys, time, torch
mode, root, workers, passes = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pipeline = sys.argv[5]
if mode is not None:
    import nano_patch
    nano_patch.patch_torch(**mode)
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
if pipeline == "pets":
    tf = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(),
                    norm])
else:
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
loader = DataLoader(ImageFolder(root, transform=tf), batch_size=64, shuffle=True, num_workers=workers)
torch.manual_seed(0)
def one_pass():
    n = carried = batches = 0
    it = iter(loader)
    for x, y in it:
        n += len(y); batches += 1
        if workers:
            carried += getattr(it, "last_image_bytes", 0) or x.nbytes
    return n, carried / max(batches, 1)
one_pass()  # warm-up: workers start, files enter the page cache
t = time.perf_counter(); n = 0
for _ in range(passes):
    k, carried = one_pass(); n += k
print(json.dumps({"images_per_s": n / (time.perf_counter() - t), "bytes_per_batch": carried,
                  "num_workers": loader.num_workers, "persistent": loader.persistent_workers}))
"""


def run(mode: dict | None, root: Path, workers: int, passes: int, pipeline: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(mode), str(root), str(workers), str(passes),
                           pipeline],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for i, mode in enumerate(MODES):
        vals = [result["rows"][f"{mode} | {w} workers"]["images_per_s"] for w in result["workers"]]
        ax.bar([w + (i - 1) * width for w in result["workers"]], vals, width, label=mode)
    ax.set_xticks(result["workers"])
    ax.set_xlabel("num_workers")
    ax.set_ylabel("images / s (median)")
    ax.set_title(f"Pipeline {result['pipeline']} through a DataLoader, batch 64\n{result['machine']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=96)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pipeline", choices=["b", "pets"], default="b")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    from make_photo_folder import build
    from train import _cpu_name  # benchmarks/train.py, beside this script

    workers = [0, 1, 2]
    result = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
              "pipeline": args.pipeline, "workers": workers, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = build(Path(tmp) / "photos", args.per_class) / "train"
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeat):  # interleaved, so drift hits every configuration alike
            for w in workers:
                for mode, opts in MODES.items():
                    runs.setdefault(f"{mode} | {w} workers", []).append(run(opts, root, w, args.passes,
                                                                            args.pipeline))
        for name, rs in runs.items():
            rates = [r["images_per_s"] for r in rs]
            result["rows"][name] = {**rs[0], "images_per_s": statistics.median(rates), "all": rates}
    RESULTS.mkdir(exist_ok=True)
    stem = "dataloader" if args.pipeline == "b" else f"dataloader-{args.pipeline}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    print("| workers | stock img/s | patched float img/s | patched uint8 img/s | uint8 / stock | "
          "bytes/batch stock | bytes/batch uint8 |")
    print("|---|---|---|---|---|---|---|")
    for w in workers:
        s, f, u = (result["rows"][f"{m} | {w} workers"] for m in MODES)
        print(f"| {w} | {s['images_per_s']:.0f} | {f['images_per_s']:.0f} | {u['images_per_s']:.0f} | "
              f"{u['images_per_s'] / s['images_per_s']:.2f}x | {s['bytes_per_batch']:.0f} | "
              f"{u['bytes_per_batch']:.0f} |")


if __name__ == "__main__":
    main()
