"""A user's own ``torch.utils.data.Dataset`` class (not torchvision's ImageFolder): stock torch against the patch.

Real-photo JPEGs (``examples/make_photo_folder.py``: 3 classes of ``--per-class``, 600 by default) are listed
and loaded by a Dataset class written the way user scripts write them, through pipeline pets
(RandomResizedCrop 128, flip, ColorJitter 0.3, ToTensor, Normalize), batch 64, ``shuffle=True``. The rows:

- ``path``: ``Image.open(path).convert("RGB")``, returns ``(tensor, label)``;
- ``dict, file object``: ``with open(path, "rb") as f: Image.open(f).convert("RGB")``, returns
  ``{"pixel_values": ..., "label": ...}``;
- ``dict, load() in the with``: the same, the image loaded inside the block (``img = Image.open(f); img.load();
  img = img.convert("RGB")``), as scripts do to read it before the file closes;
- ``bytes in memory``: the JPEG bytes read into a list at construction, ``Image.open(io.BytesIO(raw))``;
- ``Hugging Face-style``: rows ``{"image": {"bytes": raw, "path": None}, "label": k}`` (as ``datasets`` stores an
  Image feature), returns ``{"pixel_values": ..., "labels": ...}``;
- ``heavy numpy``: ``path``, then numpy work of its own per sample (an FFT and a sort of a 256x256 float array,
  about the image pipeline's CPU time), returns ``(tensor, torch.from_numpy(small result), label)``.

Each row runs ``stock`` (torch and torchvision as installed) and ``patched`` (``from nano_patch import
patch_torch; patch_torch()`` at the top of the script, nothing else changed) with ``num_workers`` 0 and 2
(``persistent_workers=True``), every configuration in a fresh process running a script file (its Dataset classes
at module level, so workers can pickle them) with ``torch.set_num_threads(1)``: a first epoch (warm-up), then whole
epochs until ``--seconds`` have passed; images/s is over those. Rounds are interleaved (the order reversed every
other round), medians reported; ``against_stock`` is patched / stock for each row and ``num_workers``.

    python benchmarks/own_dataset.py [--rounds 3] [--per-class 200] [--seconds 4] [--only path] [--workers 0,2]
                                     [--before CHECKOUT]

Results: ``benchmarks/results/own_dataset.{json,png}`` (``--stem`` to change).
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from loader_threads import _env  # noqa: E402

RESULTS = Path(__file__).parent / "results"

#: The child script, written to a file (its Dataset classes at module level: workers pickle them by name, under any
#: start method); ``cfg`` (JSON) is its argument, its last stdout line is its result (JSON).
CHILD = r'''
import io, json, os, sys, time

cfg = json.loads(sys.argv[1])
if cfg["side"] == "patched":  # a user's script, patched: the line at its top
    from nano_patch import patch_torch
    patch_torch(**({"cache_decoded": cfg["cache_mode"], "cache_dir": cfg["cache_dir"]} if cfg.get("cache_dir") else {}))

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class PathDataset(Dataset):
    def __init__(self, files, labels, transform):
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        return self.transform(img), self.labels[i]


class DictFileDataset(Dataset):
    def __init__(self, files, labels, transform):
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i], self.labels[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        return {"pixel_values": self.transform(img), "label": label}


class DictLoadDataset(DictFileDataset):
    def __getitem__(self, i):
        path, label = self.files[i], self.labels[i]
        with open(path, "rb") as f:
            img = Image.open(f)
            img.load()
            img = img.convert("RGB")
        return {"pixel_values": self.transform(img), "label": label}


class BytesDataset(Dataset):
    def __init__(self, files, labels, transform):
        self.raw = []
        for path in files:
            with open(path, "rb") as f:
                self.raw.append(f.read())
        self.labels, self.transform = labels, transform

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.raw[i])).convert("RGB")
        return self.transform(img), self.labels[i]


class HFStyleDataset(Dataset):
    def __init__(self, files, labels, transform):
        self.rows = []
        for path, k in zip(files, labels):
            with open(path, "rb") as f:
                self.rows.append({"image": {"bytes": f.read(), "path": None}, "label": k})
        self.transform = transform

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        img = Image.open(io.BytesIO(row["image"]["bytes"])).convert("RGB")
        return {"pixel_values": self.transform(img), "labels": row["label"]}


class HeavyNumpyDataset(PathDataset):
    def __getitem__(self, i):
        x, label = super().__getitem__(i)
        a = np.random.default_rng(i).standard_normal((256, 256))
        a = np.abs(np.fft.fft2(a))
        a = np.sort(a, axis=None).reshape(256, 256)
        a /= a.max()
        b = np.abs(np.fft.rfft(a, axis=1))
        return x, torch.from_numpy(np.ascontiguousarray(b[:4, :4], dtype=np.float32)), label


DATASETS = {"path": PathDataset, "dict, file object": DictFileDataset, "dict, load() in the with": DictLoadDataset,
            "bytes in memory": BytesDataset,
            "Hugging Face-style": HFStyleDataset, "heavy numpy": HeavyNumpyDataset}


def count(batch):
    if isinstance(batch, dict):
        return len(batch["label"] if "label" in batch else batch["labels"])
    return len(batch[-1])


if __name__ == "__main__":
    torch.set_num_threads(1)
    with open(cfg["files"]) as f:
        listing = json.load(f)
    tf = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = DATASETS[cfg["row"]](listing["files"], listing["labels"], tf)
    kw = dict(num_workers=cfg["workers"], persistent_workers=True) if cfg["workers"] else {}
    loader = DataLoader(ds, batch_size=cfg["batch"], shuffle=True, **kw)
    torch.manual_seed(0)
    t = time.perf_counter()
    for _ in loader:  # the warm-up epoch: starts the workers, fills the page cache
        pass
    first_epoch = time.perf_counter() - t
    import gc
    gc.collect()
    n, epochs = 0, 0
    t = time.perf_counter()
    while True:
        for batch in loader:
            n += count(batch)
        epochs += 1
        if time.perf_counter() - t >= cfg["seconds"]:
            break
    seconds = time.perf_counter() - t
    out = {"images_per_s": n / seconds, "images": n, "epochs": epochs, "seconds": seconds,
           "first_epoch_s": first_epoch}
    if cfg["side"] == "patched":
        import nano_patch
        out["nano_patch"] = os.path.dirname(nano_patch.__file__)
    print(json.dumps(out), flush=True)
'''

ROWS = ["path", "dict, file object", "dict, load() in the with", "bytes in memory", "Hugging Face-style",
        "heavy numpy"]


def run_script(script: Path, cfg: dict, checkout: str | None = None) -> dict:
    """``script`` in a fresh process with ``cfg`` as its argument; its last stdout line starting with ``{`` (the
    patched side may print a warning or report of its own). ``checkout``: a nano-patch source tree to import
    instead of the installed one (``loader_threads._env``)."""
    proc = subprocess.run([sys.executable, str(script), json.dumps(cfg)], capture_output=True, text=True,
                          env=_env(checkout), check=False, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg}: {proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{cfg}: no JSON line in the output: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def key(row: str, side: str, workers: int) -> str:
    return f"{row} | {side} | num_workers={workers}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-class", type=int, default=200, help="photos per class, 3 classes")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed window of whole epochs per configuration")
    ap.add_argument("--only", action="append", choices=ROWS, metavar="ROW",
                    help=f"only this row (repeatable): one of {ROWS}")
    ap.add_argument("--workers", default="0,2", help="the num_workers values, comma-separated")
    ap.add_argument("--stem", default="own_dataset")
    ap.add_argument("--cache", choices=["on", "auto"],
                    help="also run 'cache on': patched with cache_decoded='on' (or 'auto', --fast's), from an empty "
                         "store each run (epoch 1 fills it: cold; the timed epochs after it: warm)")
    ap.add_argument("--before", metavar="CHECKOUT",
                    help="another nano-patch source tree (its compiled kernels built in place): its patched rows run "
                         "too, interleaved, as 'before'")
    args = ap.parse_args()
    from make_photo_folder import build
    from train import _cpu_name

    rows = args.only or ROWS
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    sides = ["stock", "patched"] + (["cache on"] if args.cache else []) + (["before"] if args.before else [])
    result: dict = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
                    "python": platform.python_version(), "pipeline": "pets", "batch": 64,
                    "per_class": args.per_class, "seconds": args.seconds, "rounds": args.rounds, "rows": rows,
                    "workers": workers, "sides": sides, "configs": {}}
    if args.before:
        result["before"] = args.before
    began = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        train = build(tmp / "photos", args.per_class) / "train"
        classes = sorted(p.name for p in train.iterdir() if p.is_dir())
        files = sorted(str(p) for p in train.glob("*/*.jpg"))
        listing = {"files": files, "labels": [classes.index(Path(f).parent.name) for f in files]}
        (tmp / "files.json").write_text(json.dumps(listing))
        script = tmp / "own_dataset_child.py"
        script.write_text(CHILD)
        result["images"] = len(files)
        print(f"{len(files)} photos in {len(classes)} classes, built in {time.perf_counter() - began:.0f} s",
              flush=True)
        base = {"files": str(tmp / "files.json"), "batch": 64, "seconds": args.seconds}
        configs = [(row, side, w) for row in rows for w in workers for side in sides]
        for r in range(args.rounds):  # interleaved, so drift on a shared VM hits every configuration alike
            for row, side, w in configs if r % 2 == 0 else configs[::-1]:
                cfg = {**base, "row": row, "workers": w, "side": "stock" if side == "stock" else "patched"}
                if side == "cache on":
                    cfg["cache_dir"] = str(tmp / f"store-{r}-{w}-{rows.index(row)}")  # (empty: a cold first epoch)
                    cfg["cache_mode"] = args.cache
                got = run_script(script, cfg, args.before if side == "before" else None)
                runs.setdefault(key(row, side, w), []).append(got)
                print(f"round {r}: {key(row, side, w)}: {got['images_per_s']:.0f} images/s "
                      f"({got['epochs']} epochs)", flush=True)
    for name, rs in runs.items():
        result["configs"][name] = {
            "median_images_per_s": statistics.median(x["images_per_s"] for x in rs),
            "all_images_per_s": [x["images_per_s"] for x in rs],
            "median_first_epoch_s": statistics.median(x["first_epoch_s"] for x in rs),
            "runs": rs}
    med = {name: c["median_images_per_s"] for name, c in result["configs"].items()}
    if args.cache:
        result["cache_mode"] = args.cache
    if args.cache:  # the cache against the cache off: the first epoch (cold) and the timed ones (warm)
        first = {name: c["median_first_epoch_s"] for name, c in result["configs"].items()}
        result["cache_against_off"] = {
            f"{row} | num_workers={w}": {"cold": first[key(row, "patched", w)] / first[key(row, "cache on", w)],
                                         "warm": med[key(row, "cache on", w)] / med[key(row, "patched", w)]}
            for row in rows for w in workers}
    result["against_stock"] = {
        f"{row} | num_workers={w}": {side: med[key(row, side, w)] / med[key(row, "stock", w)]
                                     for side in sides if side != "stock"}
        for row in rows for w in workers}
    result["nano_patch"] = sorted({x["nano_patch"] for rs in runs.values() for x in rs if "nano_patch" in x})
    result["total_s"] = time.perf_counter() - began
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print_table(result)


def print_table(result: dict) -> None:
    med = {name: c["median_images_per_s"] for name, c in result["configs"].items()}
    before = "before" in result["sides"]
    print(f"\n{result['machine']}; your own Dataset, pets, batch 64, {result['images']} photos; images/s, medians of "
          f"{result['rounds']} interleaved rounds; nano_patch from {result['nano_patch']}")
    head = "| row | num_workers | stock | patched | patched / stock |"
    head += " before | before / stock |" if before else ""
    print(head)
    print("|---" * head.count(" |") + "|")
    for row in result["rows"]:
        for w in result["workers"]:
            s, p = med[key(row, "stock", w)], med[key(row, "patched", w)]
            line = f"| {row} | {w} | {s:.0f} | {p:.0f} | {p / s:.2f}x |"
            if before:
                b = med[key(row, "before", w)]
                line += f" {b:.0f} | {b / s:.2f}x |"
            print(line)
    for name, ratio in result.get("cache_against_off", {}).items():
        print(f"cache on against off, {name}: epoch 1 (cold) {ratio['cold']:.2f}x, later epochs (warm) "
              f"{ratio['warm']:.2f}x")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars  # benchmarks/vision.py, beside this script

    med = {name: c["median_images_per_s"] for name, c in result["configs"].items()}
    groups = [(row, w) for row in result["rows"] for w in result["workers"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4.4))
    ticks = grouped_bars(ax, groups, result["sides"], lambda g, side: med[key(g[0], side, g[1])])
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{row}\nnum_workers={w}" for row, w in groups], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("images / s (median)")
    ax.set_title(f"Your own Dataset class, pets, batch 64: stock against patch_torch()\n{result['machine']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
