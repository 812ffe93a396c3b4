"""Decoded-image cache benchmark: warm and cold epochs against stock, the cache off, and the decode-only rate.

Each pipeline runs as a training script runs it: ``ImageFolder`` over real photographs (JPEGs of
300-500 px made from the photos that ship in scikit-learn and matplotlib) and ``DataLoader(batch_size=16,
shuffle=True)``. Sides, each (pipeline, side) in a fresh process, interleaved within each round:

- ``stock``: no patch;
- ``cache off``: ``patch_torch()`` (crop-region decode where the kernel is built);
- ``cold cache``: ``patch_torch(cache_decoded="on")`` on an empty store: the first epoch, which decodes
  every file and adds it;
- ``warm cache``: the same on a store filled beforehand: epochs after the first.

``--workers 0``: one pinned core, one thread; images/s is the median over epochs 2..N (the cold side:
epoch 1, compared with the first epoch of ``cache off``). ``--workers 2``: ``DataLoader(num_workers=2)``
on both cores, the store shared by the workers. ``--memory``: each worker's resident memory over a
folder of at least 1 GB decoded, 2 workers, stock against the warm cache: each worker's anonymous
memory (``RssAnon``: what must not grow with the dataset) apart from its file-backed pages
(``RssFile``: the store's pages, which live in the shared, reclaimable page cache).

``--cold-first-epoch``: what ``--fast``'s cache costs a user's first epoch: ``num_workers=0`` on the loader threads
(``--threads``, default ``auto``), batch 16, the first epoch with an empty store against the same first epoch with
the cache off, each in a fresh process, interleaved rounds (``cache-cold-first-epoch.json``).

``--open-check GB [GB ...]``: what the check before a run's first read costs (``cache.check_store``:
a child process that verifies the store offline and walks every key through LMDB), on stores filled
with pet-photo-sized entries (500 x 375 x 3) one commit each, as a first epoch fills them: with the
store's pages in the page cache (warm) and after they are dropped from it (cold, ``POSIX_FADV_DONTNEED``
on the data file only). The stores are real files: a 20 GB one needs 20 GB of free disk.

Results: ``benchmarks/results/cache[-STEM].json`` and ``.png``.

    python benchmarks/cache.py --rounds 3 [--workers 0|2] [--memory]
    python benchmarks/cache.py --cold-first-epoch [--threads auto|N] [--per-class 40] [--rounds 3]
    python benchmarks/cache.py --open-check 1 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from vision import PIPELINES, decode_only, grouped_bars, machine, torchvision_pipeline  # noqa: E402

SIDES = ("stock", "cache off", "cold cache", "warm cache")


def worker(side: str, name: str, root: str, epochs: int, cache_dir: str, workers: int) -> dict:
    """One (pipeline, side) in this fresh process: images/s of each epoch through the DataLoader."""
    if workers == 0:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    torch.set_num_threads(1)
    if side != "stock":
        import nano_patch

        nano_patch.patch_torch(cache_decoded="off" if side == "cache off" else "on", cache_dir=cache_dir)
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(root, transform=torchvision_pipeline(name))
    # One-time start-up (imports, each kernel's check at load, the plan) on other files, so that the
    # first epoch measures what a first epoch costs, not what a first image costs.
    warm = ImageFolder(str(Path(root).parent / "val"), transform=torchvision_pipeline(name))
    for i in range(4):
        warm[i]
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=workers)
    torch.manual_seed(0)
    rates = []
    for _ in range(epochs):
        n, start = 0, time.perf_counter()
        for _, y in loader:
            n += len(y)
        rates.append(n / (time.perf_counter() - start))
    return {"rates": rates}


def run_side(side: str, name: str, root: str, epochs: int, cache_dir: Path, workers: int) -> list[float]:
    if side == "cold cache":
        shutil.rmtree(cache_dir, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    out = subprocess.run([sys.executable, __file__, "--worker", side, name, root, str(epochs), str(cache_dir),
                          str(workers)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["rates"]


def measure(names: list[str], root: str, rounds: int, epochs: int, workers: int, tmp: Path) -> dict:
    per_round: list[dict] = []
    for r in range(rounds):
        got: dict[str, dict[str, float]] = {}
        for name in names:
            cache_dir = tmp / f"cache-{name}"
            run_side("warm cache", name, root, 1, cache_dir, workers)  # fill the store for the warm side
            got[name] = {}
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for side in order:
                d = cache_dir if side == "warm cache" else tmp / f"cache-{name}-{side.replace(' ', '-')}"
                rates = run_side(side, name, root, 1 if side == "cold cache" else epochs, d, workers)
                if side == "cold cache":
                    got[name]["cold cache (epoch 1)"] = rates[0]
                else:
                    got[name][side] = statistics.median(rates[1:] or rates)
                    if side == "cache off":
                        got[name]["cache off (epoch 1)"] = rates[0]
            print(f"round {r}: {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in got[name].items()), flush=True)
        per_round.append(got)
    keys = per_round[0][names[0]].keys()
    medians = {n: {k: statistics.median(rd[n][k] for rd in per_round) for k in keys} for n in names}
    ratios = {n: {"warm / stock": [rd[n]["warm cache"] / rd[n]["stock"] for rd in per_round],
                  "cold / off (epoch 1)": [rd[n]["cold cache (epoch 1)"] / rd[n]["cache off (epoch 1)"]
                                           for rd in per_round],
                  "off / stock": [rd[n]["cache off"] / rd[n]["stock"] for rd in per_round]} for n in names}
    return {"medians": medians, "ratios": ratios, "per_round": per_round}


# --- the first epoch with the cache on, on the loader threads -------------------------------------

#: One first epoch in a fresh process: ``num_workers=0``, the loader threads ``cfg["threads"]`` ("auto": the
#: default), batch ``cfg["batch"]``, the cache ``off`` or ``cold``: an empty store at ``cfg["cache_dir"]``, which the
#: epoch fills, as ``--fast`` has it (``cache_decoded="auto"``; ``cfg["mode"]`` to set another). One-time start-up
#: (imports, the kernels' checks, the plan) is paid on the val split first.
COLD_CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
import nano_patch
nano_patch.patch_torch(cache_decoded=cfg.get("mode", "auto") if cfg["cache"] == "cold" else "off",
                       cache_dir=cfg["cache_dir"], loader_threads=cfg["threads"])
import torch
from pathlib import Path
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
tf = {"pets": lambda: [T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3)],
      "b": lambda: [T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
      "c": lambda: [T.Resize(256), T.CenterCrop(224)]}[cfg["pipeline"]]
make = lambda: T.Compose(tf() + [T.ToTensor(), T.Normalize(MEAN, STD)])
val = Path(cfg["root"]).parent / "val"
if val.is_dir():
    for _ in DataLoader(ImageFolder(str(val), transform=make()), batch_size=cfg["batch"]):
        break
loader = DataLoader(ImageFolder(cfg["root"], transform=make()), batch_size=cfg["batch"], shuffle=True)
# the start-up's garbage collected now: a full collection (about 0.15 s with torch loaded) lands in the timed epoch
# of one side or the other, by how many objects each allocated, and outweighs a 120-photo epoch
import gc
gc.collect()
torch.manual_seed(0)
n, start = 0, time.perf_counter()
for _, y in loader:
    n += len(y)
out = {"images_per_s": n / (time.perf_counter() - start), "images": n}
if cfg["cache"] == "cold":
    from nano_patch.vision.images import cache
    store = cache.store_for(loader.dataset)
    if store is not None and store.fill_budget is not None:
        out["fill_budget"] = store.fill_budget.describe()
print(json.dumps(out))
"""


def cold_first_epoch(root: str, tmp: Path, rounds: int, threads: int | str, pipelines: list[str]) -> dict:
    """The first epoch with a fresh store against the same first epoch with the cache off, interleaved rounds."""
    ratios: dict[str, list[float]] = {p: [] for p in pipelines}
    rates: dict[str, dict[str, list[float]]] = {p: {"off": [], "cold": []} for p in pipelines}
    for r in range(rounds):
        for name in pipelines:
            got = {}
            for cache in (("off", "cold") if r % 2 == 0 else ("cold", "off")):
                d = tmp / f"cold-{name}-{r}-{cache}"
                shutil.rmtree(d, ignore_errors=True)
                cfg = {"root": root, "threads": threads, "batch": 16, "pipeline": name, "cache": cache,
                       "cache_dir": str(d)}
                env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
                out = subprocess.run([sys.executable, "-c", COLD_CHILD, json.dumps(cfg)], env=env,
                                     capture_output=True, text=True, check=True)
                got[cache] = json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]
                rates[name][cache].append(got[cache])
            ratios[name].append(got["cold"] / got["off"])
            print(f"round {r}: {name}: off {got['off']:.0f}, cold {got['cold']:.0f} images/s: "
                  f"{ratios[name][-1]:.2f}x", flush=True)
    return {"threads": threads, "rates": rates, "cold_over_off": ratios,
            "median_cold_over_off": {p: statistics.median(v) for p, v in ratios.items()}}


# --- memory ---------------------------------------------------------------------------------------

MEMORY_CHILD = r"""
import sys, time, torch
side, root, cache_dir = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
if side != "stock":
    import nano_patch
    nano_patch.patch_torch(cache_decoded="on", cache_dir=cache_dir)
sys.path.insert(0, sys.argv[4])
from vision import torchvision_pipeline
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
loader = DataLoader(ImageFolder(root, transform=torchvision_pipeline("b")), batch_size=16, shuffle=True,
                    num_workers=2, persistent_workers=True)
for epoch in range(int(sys.argv[5])):
    for x, y in loader:
        pass
    print("epoch", epoch, flush=True)
"""


def _status_kb(pid: int) -> dict[str, int]:
    """RssAnon (private heap: what must not grow with the dataset), RssFile (file pages mapped: the store's
    page-cache pages, reclaimable) and RssShmem, in bytes, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                out[key] = int(line.split()[1]) * 1024
    return out


def memory(root: str, tmp: Path, epochs: int) -> dict:
    """Each DataLoader worker's memory, sampled while it reads the whole folder: anonymous (private) memory
    and file-backed pages (the store's pages in the shared page cache) apart."""
    import psutil

    out = {}
    cache_dir = tmp / "cache-memory"
    for side in ("warm cache (filling)", "stock", "warm cache"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
        proc = psutil.Popen([sys.executable, "-c", MEMORY_CHILD, side.split(" (")[0], root, str(cache_dir), str(HERE),
                             str(1 if "filling" in side else epochs)], env=env, stdout=subprocess.PIPE, text=True)
        peak: dict[int, dict[str, int]] = {}
        first: dict[int, int] = {}
        while proc.poll() is None:
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error, OSError):
                    m = _status_kb(child.pid)
                    first.setdefault(child.pid, m["RssAnon"])
                    p = peak.setdefault(child.pid, {k: 0 for k in m})
                    for k, v in m.items():
                        p[k] = max(p[k], v)
            time.sleep(0.2)
        if "filling" in side:
            continue
        workers = sorted(peak.items(), key=lambda kv: -kv[1]["VmRSS"])[:2]
        out[side] = {"workers": [{**p, "RssAnon_first": first[pid]} for pid, p in workers],
                     "max_anon_mb": max(p["RssAnon"] for _, p in workers) / 2**20,
                     "max_anon_growth_mb": max(p["RssAnon"] - first[pid] for pid, p in workers) / 2**20,
                     "max_file_mb": max(p["RssFile"] for _, p in workers) / 2**20}
        print(side, out[side], flush=True)
    from nano_patch.vision.images import cache

    out["store_bytes"] = cache.store_bytes(cache_dir)
    return out


def big_folder(root: Path, images: int) -> int:
    """A folder of real-photo JPEGs at 1024 x 768: ``images`` of them; returns the decoded bytes."""
    from make_photo_folder import sources
    from PIL import Image

    srcs = [Image.open(p).convert("RGB") for p in sources()]
    total = 0
    for i in range(images):
        im = srcs[i % len(srcs)]
        w, h = im.size
        box = (i % 7 * w // 40, i % 5 * h // 40, w - i % 3 * w // 40, h - i % 4 * h // 40)
        out = root / f"c{i % len(srcs)}"
        out.mkdir(parents=True, exist_ok=True)
        im.crop(box).resize((1024, 768), Image.BICUBIC).save(out / f"{i:05d}.jpg", quality=90)
        total += 1024 * 768 * 3
    return total


# --- the open-time check ---------------------------------------------------------------------------


def open_check(sizes_gb: list[float], tmp: Path, rounds: int) -> dict:
    """Seconds of ``cache.check_store`` on stores of ``sizes_gb``, warm and cold, with the fill time."""
    import numpy as np

    from nano_patch.vision.images import cache

    out: dict = {"machine": machine(), "rounds": rounds, "stores": {}}
    image = np.random.default_rng(0).integers(0, 255, (375, 500, 3), dtype=np.uint8)
    for gb in sizes_gb:
        folder = tmp / f"check-{gb:g}GB"
        entries = int(gb * 1e9 // image.nbytes)
        store = cache.open_store(folder, int(gb * 1e9 * 1.05) + 64 * 1024**2)
        start = time.perf_counter()
        for i in range(entries):
            if not store.put(b"open-check entry %d" % i, image):  # one commit each, as a first epoch adds them
                raise SystemExit(f"the store stopped taking entries at {i} of {entries} (disk space?)")
        fill_s = time.perf_counter() - start
        store.close_for_fork()
        data = store.path / "data.mdb"
        warm, cold = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            verdict = cache.check_store(store.path)
            warm.append(time.perf_counter() - start)
            assert verdict == ("sound", ""), verdict
            fd = os.open(data, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # this file's pages only, not the machine's
            os.close(fd)
            start = time.perf_counter()
            verdict = cache.check_store(store.path)
            cold.append(time.perf_counter() - start)
        row = {"entries": entries, "bytes": data.stat().st_size, "fill_s": fill_s,
               "warm_s": statistics.median(warm), "cold_s": statistics.median(cold), "warm_all": warm,
               "cold_all": cold}
        out["stores"][f"{gb:g} GB"] = row
        print(f"{gb:g} GB ({entries} entries, {row['bytes'] / 1e9:.2f} GB): check {row['warm_s']:.2f} s warm, "
              f"{row['cold_s']:.2f} s cold (filled in {fill_s:.0f} s)", flush=True)
        shutil.rmtree(folder)
    return out


# --- output -----------------------------------------------------------------------------------------


def table(result: dict) -> str:
    med = result["medians"]
    cols = list(next(iter(med.values())))
    lines = ["| pipeline | " + " | ".join(cols) + " | warm / stock | warm / decode-only | cold / off (epoch 1) "
             "| off / stock |", "|---|" + "---|" * (len(cols) + 4)]
    for name, v in med.items():
        r = result["ratios"][name]
        lines.append(f"| {name} | " + " | ".join(f"{v[c]:.0f}" for c in cols)
                     + f" | {statistics.median(r['warm / stock']):.2f}x"
                     + f" | {v['warm cache'] / result['decode_only']:.2f}x"
                     + f" | {statistics.median(r['cold / off (epoch 1)']):.2f}x"
                     + f" | {statistics.median(r['off / stock']):.2f}x |")
    lines.append(f"\ndecode only (simplejpeg, one core): {result['decode_only']:.0f} images/s; {result['machine']}")
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = result["medians"]
    names = list(med)
    cols = list(next(iter(med.values())))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ticks = grouped_bars(ax, names, cols, lambda n, c: med[n][c])
    if result["workers"] == 0:
        ax.axhline(result["decode_only"], color="k", ls="--", lw=1, label="decode only")
    ax.set_xticks(ticks, names)
    ax.set_ylabel("images / s through the DataLoader")
    where = "one core" if result["workers"] == 0 else f"{result['workers']} workers"
    ax.set_title(f"decoded-image cache, {where}\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--workers", type=int, default=0, choices=[0, 2])
    ap.add_argument("--only", nargs="*", default=["pets", "b", "c"], choices=list(PIPELINES))
    ap.add_argument("--memory", action="store_true", help="measure worker memory over >= 1 GB decoded instead")
    ap.add_argument("--memory-images", type=int, default=480)
    ap.add_argument("--open-check", nargs="+", type=float, metavar="GB",
                    help="time the check made before a run's first read, on stores of these sizes")
    ap.add_argument("--cold-first-epoch", action="store_true",
                    help="the first epoch of a fresh store against the cache off, num_workers=0 on the loader threads")
    ap.add_argument("--threads", default="auto", help="--cold-first-epoch: the loader threads (default auto)")
    ap.add_argument("--stem", default=None)
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        side, name, root, epochs, cache_dir, workers = args.worker
        print(json.dumps(worker(side, name, root, int(epochs), cache_dir, int(workers))))
        return
    from make_photo_folder import build

    RESULTS.mkdir(exist_ok=True)
    if args.open_check:
        # Beside the results (a large store may not fit a tmpfs /tmp); removed after each size.
        with tempfile.TemporaryDirectory(dir=RESULTS) as tmp_name:
            result = open_check(args.open_check, Path(tmp_name), args.rounds)
        stem = args.stem or "cache-open-check"
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.memory:
            decoded = big_folder(tmp / "big", args.memory_images)
            result = {"machine": machine(), "decoded_bytes": decoded, "images": args.memory_images,
                      **memory(str(tmp / "big"), tmp, args.epochs)}
            stem = args.stem or "cache-memory"
            (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
            print(json.dumps(result, indent=2))
            return
        build(tmp / "photos", per_class=args.per_class)
        root = str(tmp / "photos" / "train")
        if args.cold_first_epoch:
            threads = int(args.threads) if args.threads.isdigit() else args.threads
            result = {"machine": machine(), "rounds": args.rounds, "images": 3 * args.per_class,
                      **cold_first_epoch(root, tmp, args.rounds, threads, args.only)}
            stem = args.stem or "cache-cold-first-epoch"
            (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
            print(json.dumps(result["median_cold_over_off"], indent=2))
            return
        result = {"machine": machine(), "rounds": args.rounds, "epochs": args.epochs, "workers": args.workers,
                  "pipelines": {n: PIPELINES[n] for n in args.only}, "decode_only": decode_only(root)}
        result.update(measure(args.only, root, args.rounds, args.epochs, args.workers, tmp))
    stem = args.stem or ("cache" if args.workers == 0 else f"cache-{args.workers}-workers")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    print(table(result))


if __name__ == "__main__":
    main()
