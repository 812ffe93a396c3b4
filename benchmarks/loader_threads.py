"""Loader threads: a num_workers=0 DataLoader whose batches load on threads, against one thread,
against two independent processes doing the same work, and against stock's own parallel loader.

For pipelines pets, (b) and (c) (benchmarks/vision.py), with the decoded-image cache off and warm, batch 16 and
64, over an ImageFolder of real-photo JPEGs (``examples/make_photo_folder.py``). Each configuration runs in
fresh processes; images/s is measured over the epochs after a first one (which starts workers, fills the page
cache, and the decoded-image cache where it is on). Rounds are interleaved, medians reported.

- ``1 thread``: the patch with ``loader_threads=1`` (samples one by one, today's path);
- ``2 threads``: ``loader_threads=2``;
- ``2 processes``: two ``1 thread`` processes at once, each on its own copy of the work (their summed rate):
  what the machine gives two independent loaders. Threads should reach 90% of that scaling;
- ``stock, 2 workers``: stock with ``DataLoader(num_workers=2, persistent_workers=True)`` (pets);
- memory: resident memory summed over the loader's processes (RSS and PSS); first batch: seconds from
  ``iter(loader)`` to the first batch of the first epoch, in a fresh process.

The patched configurations run torch's own ops (collation) on one thread (``torch.set_num_threads(1)``, as in a
DataLoader worker): two processes with two OpenMP threads each on two cores oversubscribe and spin, which
measured the processes 3-5x below one process and says nothing about loading. Stock keeps its defaults.

Results: ``benchmarks/results/loader_threads.{json,png}``.

    python benchmarks/loader_threads.py [--per-class 96] [--epochs 2] [--rounds 3] [--quick]
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

#: The child's set-up, shared with scaling.py: the options, the pipeline, the loader (``cfg`` read from argv).
LOADER_SETUP = r"""
cfg = json.loads(sys.argv[1])
if cfg.get("start_method"):  # (Python 3.14's default is forkserver: stood in for here)
    import multiprocessing
    multiprocessing.set_start_method(cfg["start_method"])
if cfg["side"] == "patched":
    import nano_patch
    extra = {"virtual_workers": False} if cfg.get("virtual") is False else {}  # (an older checkout lacks it)
    nano_patch.patch_torch(loader_threads=cfg["threads"], cache_decoded="on" if cfg["cache"] == "warm" else "off",
                           cache_dir=cfg["cache_dir"], **extra)
import psutil, torch
if cfg.get("torch_threads"):
    torch.set_num_threads(cfg["torch_threads"])
import torchvision.transforms as T
from torchvision.datasets import ImageFolder
from torch.utils.data import DataLoader
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
tf = {
    "pets": [T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), norm],
    "b": [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm],
    "c": [T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm],
}[cfg["pipeline"]]
kw = dict(num_workers=cfg["workers"], persistent_workers=cfg.get("persistent", True)) if cfg["workers"] else {}
loader = DataLoader(ImageFolder(cfg["root"], transform=T.Compose(tf)), batch_size=cfg["batch"], shuffle=True, **kw)
torch.manual_seed(0)
"""

CHILD = "import json, os, sys, time\n" + LOADER_SETUP + r"""
t = time.perf_counter()
it = iter(loader)
next(it)
first = time.perf_counter() - t
for _ in it:
    pass
# the warm-up's garbage now: the first full collection (0.15 s with torch loaded) falls in the first epoch or the
# second, by how many objects each side allocated; timed, it moved a 3-epoch rate by a third, either way
import gc
gc.collect()
if cfg.get("barrier"):  # two processes at once: start timing together
    open(cfg["barrier"] + f".{cfg['rank']}", "w").close()
    while not all(os.path.exists(cfg["barrier"] + f".{r}") for r in range(2)):
        time.sleep(0.001)
n = 0
t = time.perf_counter()
for _ in range(cfg["epochs"]):
    for x, y in loader:
        n += len(y)
seconds = time.perf_counter() - t
me = psutil.Process()
procs = [me] + me.children(recursive=True)
rss = sum(p.memory_info().rss for p in procs)
pss = sum(p.memory_full_info().pss for p in procs)
out = {"images_per_s": n / seconds, "first_batch_s": first, "rss": rss, "pss": pss}
if cfg["side"] == "patched":
    out["nano_patch"] = os.path.dirname(nano_patch.__file__)
print(json.dumps(out))
""".replace("import json, sys, time", "import json, os, sys, time")


def _env(checkout: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([checkout] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_child(child: str, cfg: dict, checkout: str | None = None) -> dict:
    """``child`` (Python source) in a fresh process with ``cfg`` as its argument; its last line of output, as JSON.
    ``checkout``: a nano-patch source tree to import instead of the installed one (before/after comparisons).
    (Shared with scaling.py.)"""
    # cwd: not the checkout (``python -c`` puts the cwd first on sys.path, before PYTHONPATH): the children import
    # the nano_patch on PYTHONPATH, so that ``PYTHONPATH=/other/checkout`` measures that checkout
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(cfg)], capture_output=True, text=True,
                          env=_env(checkout), check=False, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(cfg: dict, checkout: str | None = None) -> dict:
    return run_child(CHILD, cfg, checkout)


def run_two(cfg: dict, tmp: Path, tag: str) -> dict:
    """Two independent processes at once, each doing ``cfg``'s work: their summed rate."""
    barrier = str(tmp / f"barrier-{tag}")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, json.dumps({**cfg, "barrier": barrier, "rank": r})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                              cwd=tempfile.gettempdir())
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(err[-3000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    for r in range(2):
        Path(f"{barrier}.{r}").unlink(missing_ok=True)
    return {"images_per_s": sum(o["images_per_s"] for o in outs), "each": [o["images_per_s"] for o in outs]}


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars  # benchmarks/vision.py, beside this script

    rows = result["scaling"]
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    series = {"2 threads / 1": "threads_scaling", "2 processes / 1": "processes_scaling"}
    ticks = grouped_bars(ax, labels, list(series), lambda k, c: rows[k][series[c]])
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speed-up over one (median)")
    ax.set_title(f"Loader threads against independent processes\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=96)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="pets only, batch 64")
    ap.add_argument("--stem", default="loader_threads")
    ap.add_argument("--before", metavar="CHECKOUT",
                    help="another nano-patch source tree (its compiled kernels built in place): its 1- and 2-thread "
                         "rows run too, interleaved, as '... (before)'")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(Path(__file__).parent))
    from make_photo_folder import build
    from train import _cpu_name

    pipelines = ["pets"] if args.quick else ["pets", "b", "c"]
    batches = [64] if args.quick else [16, 64]
    caches = ["off", "warm"]
    result = {"machine": f"{_cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs",
              "python": platform.python_version(), "epochs": args.epochs, "rounds": args.rounds, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = str(build(tmp / "photos", args.per_class) / "train")
        runs: dict[str, list[dict]] = {}

        def add(key: str, value: dict) -> None:
            runs.setdefault(key, []).append(value)

        for rnd in range(args.rounds):  # interleaved, so drift hits every configuration alike
            for pipeline in pipelines:
                for cache in caches:
                    cache_dir = str(tmp / f"cache-{pipeline}")
                    for batch in batches:
                        base = {"side": "patched", "root": root, "pipeline": pipeline, "batch": batch,
                                "cache": cache, "cache_dir": cache_dir, "epochs": args.epochs, "workers": 0,
                                "torch_threads": 1}
                        key = f"{pipeline} | cache {cache} | batch {batch}"
                        add(f"{key} | 1 thread", run({**base, "threads": 1}))
                        add(f"{key} | 2 threads", run({**base, "threads": 2}))
                        if args.before:
                            add(f"{key} | 1 thread (before)", run({**base, "threads": 1}, args.before))
                            add(f"{key} | 2 threads (before)", run({**base, "threads": 2}, args.before))
                        add(f"{key} | 2 processes", run_two({**base, "threads": 1}, tmp, f"{rnd}-{key}"))
                        if pipeline == "pets" and cache == "off":
                            stock = {**base, "side": "stock", "threads": 1, "torch_threads": None}
                            add(f"pets | stock | batch {batch} | 0 workers", run(stock))
                            add(f"pets | stock | batch {batch} | 2 workers", run({**stock, "workers": 2}))
        for key, rs in runs.items():
            result["rows"][key] = {k: statistics.median(r[k] for r in rs) for k in rs[0]
                                   if k not in ("each", "nano_patch")}
            result["rows"][key]["all_images_per_s"] = [r["images_per_s"] for r in rs]
    rows = result["rows"]
    result["scaling"] = {}
    for pipeline in pipelines:
        for cache in caches:
            for batch in batches:
                key = f"{pipeline} | cache {cache} | batch {batch}"
                one, two, procs = (rows[f"{key} | {c}"]["images_per_s"] for c in ("1 thread", "2 threads",
                                                                                  "2 processes"))
                result["scaling"][key] = {"threads_scaling": two / one, "processes_scaling": procs / one,
                                          "share_of_process_scaling": (two / one - 1) / (procs / one - 1)
                                          if procs > one else None,
                                          "ratio_of_scalings": (two / one) / (procs / one)}
    result["against_stock"] = {}
    for batch in batches:
        stock2 = rows[f"pets | stock | batch {batch} | 2 workers"]
        for cache in caches:
            mine = rows[f"pets | cache {cache} | batch {batch} | 2 threads"]
            result["against_stock"][f"pets | cache {cache} | batch {batch}"] = {
                "speedup_vs_stock_2_workers": mine["images_per_s"] / stock2["images_per_s"],
                "rss_patched_mb": mine["rss"] / 1e6, "rss_stock_2_workers_mb": stock2["rss"] / 1e6,
                "pss_patched_mb": mine["pss"] / 1e6, "pss_stock_2_workers_mb": stock2["pss"] / 1e6,
                "first_batch_patched_s": mine["first_batch_s"],
                "first_batch_stock_2_workers_s": stock2["first_batch_s"]}
    result["nano_patch"] = sorted({r["nano_patch"] for rs in runs.values() for r in rs if "nano_patch" in r})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{args.stem}.png")
    print(f"{result['machine']}; medians of {args.rounds} interleaved rounds, images/s over {args.epochs} epochs; "
          f"nano_patch from {result['nano_patch']}")
    print("| pipeline | cache | batch | 1 thread | 2 threads | 2 processes | threads x | processes x | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, s in result["scaling"].items():
        pipeline, cache, batch = (part.split()[-1] for part in key.split(" | "))
        one, two, procs = (rows[f"{key} | {c}"]["images_per_s"] for c in ("1 thread", "2 threads", "2 processes"))
        print(f"| {pipeline} | {cache} | {batch} | {one:.0f} | {two:.0f} | {procs:.0f} | {s['threads_scaling']:.2f} | "
              f"{s['processes_scaling']:.2f} | {s['ratio_of_scalings']:.0%} |")
    print()
    print("| pets | vs stock 2 workers | RSS MB (patched / stock 2w) | PSS MB | first batch s (patched / stock 2w) |")
    print("|---|---|---|---|---|")
    for key, a in result["against_stock"].items():
        print(f"| {key} | {a['speedup_vs_stock_2_workers']:.2f}x | {a['rss_patched_mb']:.0f} / "
              f"{a['rss_stock_2_workers_mb']:.0f} | {a['pss_patched_mb']:.0f} / {a['pss_stock_2_workers_mb']:.0f} | "
              f"{a['first_batch_patched_s']:.2f} / {a['first_batch_stock_2_workers_s']:.2f} |")
    if args.before:
        print()
        print("| row | after, images/s | before, images/s | after / before |")
        print("|---|---|---|---|")
        for key in rows:
            if key.endswith(" (before)"):
                after, before = rows[key[:-len(" (before)")]]["images_per_s"], rows[key]["images_per_s"]
                print(f"| {key[:-len(' (before)')]} | {after:.0f} | {before:.0f} | {after / before:.2f} |")
    for batch in batches:
        s0, s2 = (rows[f"pets | stock | batch {batch} | {w} workers"]["images_per_s"] for w in (0, 2))
        print(f"stock pets batch {batch}: {s0:.0f} img/s with 0 workers, {s2:.0f} with 2")


if __name__ == "__main__":
    main()
