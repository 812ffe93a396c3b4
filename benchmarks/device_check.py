"""The device check: every figure that needs a many-core CUDA machine, in one command of under 4 minutes.

    python benchmarks/device_check.py [--images 2400] [--quick] [--skip-tests]

It makes the photos in parallel (``examples/make_photo_folder.py``, re-encoded real photographs), then runs one
fresh process per row:

- **scaling** (``benchmarks/scaling.py``'s child; pipeline pets: RandomResizedCrop 128, flip, ColorJitter,
  ToTensor, Normalize; batch 64, ``shuffle=True``; images/s over ``--seconds`` after a first epoch, and the
  resident memory of the whole process tree): stock ``num_workers=N``; patched ``num_workers=N`` (virtual
  workers); patched ``num_workers=0`` with N loader threads and with ``auto``; N threads and ``num_workers=N`` with
  the decoded-image cache warm. N is the usable cores, at most 16;
- **forkserver** (``benchmarks/epochs.py``'s child: whole epochs, the workers' start included): stock, virtual
  workers and the patch's worker processes at ``num_workers=N``, non-persistent and persistent;
- **the cache's first epoch** (``benchmarks/cache.py``'s measure): the first epoch of a fresh store against the
  same first epoch with the cache off, ``num_workers=0``, N loader threads;
- **the GPU** (``benchmarks/gpu_feed.py``'s child: Lightning, ResNet bf16-mixed, channels-last, batch 128,
  RandomResizedCrop 224 + flip, ``pin_memory=True``, 3 epochs, the last 2 timed): ResNet-18 and ResNet-50,
  stock and patched with N-1 workers, and patched ``num_workers=0`` (``auto``), beside the data-free bound (the
  step alone) and each row's own step rate (samples/s over the time not waiting for data) against it;
- **the main job** (``examples/pets_finetune.py``, 5 epochs on the CPU): ``nano-patch run --fast`` against
  ``--num-processes auto``, 2 and 4 (``--skip-main-job`` to leave it out);
- **the CUDA tests** (``tests/test_device_tail_cuda.py``), unless ``--skip-tests``.

It prints each row as it ends, then the tables, and writes ``benchmarks/results/device_check.json`` (``--out`` to
change). Without CUDA it runs the CPU rows only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "examples"))


def _photo_class(args: tuple[str, str, int, int]) -> None:
    from make_photo_folder import build_class

    build_class(*args)


def photos(root: Path, images: int) -> Path:
    """The photo folder, each class built by a process of its own (``make_photo_folder.build``'s photos)."""
    from make_photo_folder import sources

    per_class = max(8, images // max(1, len(sources())))
    jobs = [(str(root), str(src), per_class, k) for k, src in enumerate(sources())]
    with ProcessPoolExecutor(len(jobs)) as pool:
        list(pool.map(_photo_class, jobs))
    return root / "train"


def _child(code: str, cfg: dict, timeout: float) -> dict:
    """``code`` in a fresh process with ``cfg``; its last line of output as JSON, with the process's wall seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True, env=env,
                          check=False, timeout=timeout, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:], "process_s": time.perf_counter() - start}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - start}


def scaling_rows(root: str, cache_dir: str, n: int, seconds: float) -> dict:
    from scaling import CHILD

    base = {"root": root, "batch": 64, "seconds": seconds, "cache_dir": cache_dir, "mode": "rate",
            "pipeline": "pets"}
    rows = {}
    configs = [
        (f"stock, num_workers={n}", {"side": "stock", "cache": "off", "threads": 1, "workers": n}),
        (f"patched, num_workers={n}", {"side": "patched", "cache": "off", "threads": "auto", "workers": n}),
        (f"patched, {n} threads", {"side": "patched", "cache": "off", "threads": n, "workers": 0}),
        ("patched, auto", {"side": "patched", "cache": "off", "threads": "auto", "workers": 0}),
        (f"patched, warm, {n} threads", {"side": "patched", "cache": "warm", "threads": n, "workers": 0}),
        (f"patched, warm, num_workers={n}", {"side": "patched", "cache": "warm", "threads": "auto", "workers": n}),
    ]
    for name, cfg in configs:
        row = _child(CHILD, {**base, **cfg, "torch_threads": 1 if cfg["side"] == "patched" else None}, 300)
        rows[name] = row
        print(f"  {name}: {row.get('images_per_s', 0):.0f} images/s, tree PSS {row.get('tree_pss_mb', 0):.0f} MB "
              f"(RSS summed {row.get('tree_rss_mb', 0):.0f} MB)"
              + (f"  ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
    return rows


def forkserver_rows(root: str, cache_dir: str, n: int) -> dict:
    """Whole epochs under forkserver (Python 3.14's default start method), the workers' start included
    (``epochs.py``'s child): stock, virtual workers and the patch's worker processes at ``num_workers=N``,
    non-persistent (2 epochs) and persistent (3 epochs)."""
    from epochs import CHILD

    rows = {}
    for persistent, epochs in ((False, 2), (True, 3)):
        base = {"root": root, "batch": 64, "cache_dir": cache_dir, "pipeline": "pets", "cache": "off",
                "threads": "auto", "workers": n, "persistent": persistent, "epochs": epochs,
                "start_method": "forkserver"}
        for name, cfg in (("stock", {"side": "stock"}), ("virtual workers", {"side": "patched"}),
                          ("processes", {"side": "patched", "virtual": False})):
            label = f"forkserver, {'persistent' if persistent else 'non-persistent'}, {name}, num_workers={n}"
            row = _child(CHILD, {**base, **cfg}, 400)
            rows[label] = row
            print(f"  {label}: {row.get('images_per_s', 0):.0f} images/s, first batch "
                  f"{row.get('first_batch_s') or 0:.2f} s" + (f"  ERROR {row['error'][-300:]}" if "error" in row
                                                             else ""), flush=True)
    return rows


def cold_cache_rows(root: str, tmp: Path, n: int) -> dict:
    from cache import COLD_CHILD

    rows = {}
    for k, cache in enumerate(("off", "cold")):
        cfg = {"root": root, "threads": n, "batch": 16, "pipeline": "pets", "cache": cache,
               "cache_dir": str(tmp / f"cold-{k}")}
        rows[cache] = _child(COLD_CHILD, cfg, 300)
        print(f"  first epoch, cache {cache}: {rows[cache].get('images_per_s', 0):.0f} images/s", flush=True)
    return rows


def gpu_rows(root: str, n: int, epochs: int) -> dict:
    from gpu_feed import GPU_CHILD

    rows = {}
    for model in ("resnet18", "resnet50"):
        # ("bound": no loader work, one batch resident on the GPU: the step alone, against which each row's own
        # step rate is set: samples/s over the share of time not waiting for data)
        # (the step's own time against the bound's: what loading beside the step costs it; step_pace.py's measure)
        configs = [("bound", 0), ("stock", n - 1), ("patched", n - 1), ("patched", 0)]
        bound = None
        for mode, w in configs:
            cfg = {"mode": mode, "workers": w, "model": model, "root": root, "batch": 128, "epochs": epochs}
            row = _child(GPU_CHILD, cfg, 400)
            if mode == "bound":
                bound = row
            elif bound is not None and "error" not in row and "error" not in bound:
                row["of_bound"] = row["samples_per_s"] / bound["samples_per_s"]
                row["step_vs_alone"] = row["step_ms"] / bound["step_ms"]
            rows[f"{model} | {mode} | {w} workers"] = row
            print(f"  {model} {mode} {w} workers: {row.get('samples_per_s', 0):.0f} samples/s "
                  f"({row.get('of_bound', 1.0):.2f}x the bound), waiting {row.get('waiting', 0):.0%}, step "
                  f"{row.get('step_vs_alone', 1.0):.2f}x alone"
                  + (f"  ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
    return rows


def main_job_rows(timeout: float = 300) -> dict:
    """The main job (``examples/pets_finetune.py`` on its own photo folder, CPU, 5 epochs) under ``nano-patch run
    --fast``, then with multi-instance training: ``--num-processes auto``, 2 and 4 (each rank pinned to its cores);
    its own "train samples/s (all ranks)" line."""
    import re

    rows = {}
    script = str(ROOT / "examples" / "pets_finetune.py")
    for name, extra in (("--fast", []), ("--fast --num-processes auto", ["--num-processes", "auto"]),
                        ("--fast --num-processes 2", ["--num-processes", "2"]),
                        ("--fast --num-processes 4", ["--num-processes", "4"])):
        cmd = [sys.executable, "-m", "nano_patch", "run", "--fast", *extra, script, "--epochs", "5"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=timeout,
                                  cwd=tempfile.gettempdir())
            found = re.search(r"train samples/s \(all ranks\): ([0-9.]+)", proc.stdout)
            row = {"samples_per_s": float(found.group(1))} if found else {"error": proc.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            row = {"error": f"timed out after {timeout} s"}
        row["process_s"] = time.perf_counter() - start
        rows[name] = row
        print(f"  main job {name}: {row.get('samples_per_s', 0):.1f} samples/s"
              + (f"  ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
    return rows


def cuda_tests(tmp: Path) -> dict:
    """The CUDA tests, from a copy of tests/ (the installed nano_patch under test, not the checkout's source)."""
    import shutil

    copy = tmp / "tests"
    shutil.copytree(ROOT / "tests", copy)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_device_tail_cuda.py"],
                          capture_output=True, text=True, check=False, cwd=copy, timeout=300)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    print(f"  CUDA tests: {tail}", flush=True)
    return {"returncode": proc.returncode, "summary": tail, "output": proc.stdout[-4000:]}


def machine() -> str:
    from gpu_feed import _machine  # the CPU, the usable cores and the GPU

    return _machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2400)
    ap.add_argument("--seconds", type=float, default=1.5, help="timed window of each scaling row")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each GPU row (the first not timed)")
    ap.add_argument("--max-n", type=int, default=16)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-main-job", action="store_true", help="without the main job's multi-instance rows")
    ap.add_argument("--out", default=str(RESULTS / "device_check.json"))
    args = ap.parse_args()
    import torch

    began = time.perf_counter()
    n = min(args.max_n, len(os.sched_getaffinity(0)))
    result: dict = {"machine": machine(), "python": platform.python_version(), "torch": torch.__version__,
                    "n": n, "images": args.images}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = str(photos(tmp / "photos", args.images))
        print(f"{result['machine']}: {args.images} photos in {time.perf_counter() - began:.0f} s", flush=True)
        result["scaling"] = scaling_rows(root, str(tmp / "cache"), n, args.seconds)
        result["forkserver"] = forkserver_rows(root, str(tmp / "cache"), n)
        result["cold_cache"] = cold_cache_rows(root, tmp, n)
        if not args.skip_main_job:
            result["main_job"] = main_job_rows()
        if torch.cuda.is_available():
            result["gpu"] = gpu_rows(root, n, args.epochs)
        if torch.cuda.is_available() and not args.skip_tests:
            result["cuda_tests"] = cuda_tests(tmp)
    result["total_s"] = time.perf_counter() - began
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    report(result)
    print(f"{result['total_s']:.0f} s in all; {args.out}")


def report(result: dict) -> None:
    n = result["n"]
    rows = result["scaling"]
    stock = rows.get(f"stock, num_workers={n}", {}).get("images_per_s", 0) or 1
    print(f"\n{result['machine']}; pets, batch 64, images/s against stock's num_workers={n}")
    print("| configuration | images/s | vs stock | tree PSS (MB) | tree RSS summed (MB) |\n|---|---|---|---|---|")
    for name, row in rows.items():
        ips = row.get("images_per_s", 0)
        print(f"| {name} | {ips:.0f} | {ips / stock:.2f}x | {row.get('tree_pss_mb', 0):.0f} | "
              f"{row.get('tree_rss_mb', 0):.0f} |")
    if "forkserver" in result:
        print("\n| whole epochs under forkserver | images/s | first batch |\n|---|---|---|")
        for name, row in result["forkserver"].items():
            print(f"| {name} | {row.get('images_per_s', 0):.0f} | {row.get('first_batch_s') or 0:.2f} s |")
    cold = result["cold_cache"]
    if cold.get("off", {}).get("images_per_s"):
        ratio = cold["cold"].get("images_per_s", 0) / cold["off"]["images_per_s"]
        print(f"\nfirst epoch with a fresh cache: {ratio:.2f}x the cache off")
    if "main_job" in result:
        print("\n| main job (CPU, 5 epochs) | samples/s |\n|---|---|")
        for name, row in result["main_job"].items():
            print(f"| nano-patch run {name} | {row.get('samples_per_s', 0):.1f} |")
    if "gpu" in result:
        print("\n| GPU row | samples/s | of the data-free bound | waiting | the step vs alone |")
        print("|---|---|---|---|---|")
        for name, row in result["gpu"].items():
            ips, waiting = row.get("samples_per_s", 0), row.get("waiting", 0)
            print(f"| {name} | {ips:.0f} | {row.get('of_bound', 1.0):.2f}x | {waiting:.0%} | "
                  f"{row.get('step_vs_alone', 1.0):.2f}x |")
    if "cuda_tests" in result:
        print(f"\nCUDA tests: {result['cuda_tests']['summary']}")


if __name__ == "__main__":
    main()
