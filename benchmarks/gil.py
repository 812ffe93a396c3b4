"""Do the decoders and kernels scale on threads? Two threads calling each one against two processes.

For each decoder and kernel the loader's render phase calls, on a real photo (scikit-learn's ``china.jpg``
re-encoded at 500 x 375, quality 90): calls/s in one thread, in two threads of one process, and in two
independent processes, all in one run, interleaved rounds, medians. A function that holds the GIL scales
~1.0x on threads whatever two processes reach; the target is threads >= 90% of the processes' scaling.
Results: ``benchmarks/results/gil.{json,png}``.

    python benchmarks/gil.py [--seconds 1.0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _calls():
    """name -> a function doing one call, on one photo (made once per process)."""
    import numpy as np
    import simplejpeg
    from PIL import Image
    from sklearn.datasets import load_sample_image

    from nano_patch.vision.kernels import functional as K
    from nano_patch.vision.kernels import native, native_kernels

    photo = np.ascontiguousarray(Image.fromarray(load_sample_image("china.jpg")).resize((500, 375)))
    data = simplejpeg.encode_jpeg(photo, quality=90)
    table = np.linspace(-2, 2, 3 * 256, dtype=np.float32).reshape(3, 256)
    calls = {
        "simplejpeg decode": lambda: simplejpeg.decode_jpeg(data, colorspace="RGB"),
        "resize 500x375 -> 224 (bilinear)": lambda: K.resize(photo, [224, 298], Image.BILINEAR),
        "brightness": lambda: K.adjust_brightness(photo, 1.2),
        "contrast": lambda: K.adjust_contrast(photo, 1.2),
        "saturation": lambda: K.adjust_saturation(photo, 1.2),
        "hue": lambda: K.adjust_hue(photo, 0.1),
        "rotate 10 deg (bilinear)": lambda: K.rotate(photo, 10.0, Image.BILINEAR),
        "ToTensor + Normalize table": lambda: K.image_through_tables(photo, table),
    }
    if native.available("crop_decode"):
        calls["crop decode 300x200 window"] = lambda: native_kernels.decode_jpeg_region(data, 50, 60, 200, 300)
    return calls


def _rate(fn, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def _threads(fn, seconds: float, k: int) -> float:
    rates = [0.0] * k
    barrier = threading.Barrier(k)

    def work(i: int) -> None:
        barrier.wait()
        rates[i] = _rate(fn, seconds)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(rates)


def _process_worker(name: str, seconds: float, barrier, out) -> None:
    fn = _calls()[name]
    fn()
    barrier.wait()
    out.put(_rate(fn, seconds))


def _processes(name: str, seconds: float, k: int) -> float:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(k), ctx.Queue()
    ps = [ctx.Process(target=_process_worker, args=(name, seconds, barrier, out)) for _ in range(k)]
    for p in ps:
        p.start()
    rates = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return sum(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from train import _cpu_name

    calls = _calls()
    for fn in calls.values():  # load and check the kernels before any timing
        fn()
    runs: dict[str, dict[str, list[float]]] = {n: {"1 thread": [], "2 threads": [], "2 processes": []} for n in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            runs[name]["1 thread"].append(_rate(fn, args.seconds))
            runs[name]["2 threads"].append(_threads(fn, args.seconds, 2))
            runs[name]["2 processes"].append(_processes(name, args.seconds, 2))
    rows = {}
    for name, r in runs.items():
        one, two, procs = (statistics.median(r[k]) for k in ("1 thread", "2 threads", "2 processes"))
        rows[name] = {"calls_per_s_1_thread": one, "threads_scaling": two / one, "processes_scaling": procs / one,
                      "ratio": (two / one) / (procs / one)}
    result = {"machine": _cpu_name(), "rounds": args.rounds, "seconds": args.seconds, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gil.json").write_text(json.dumps(result, indent=2))
    _chart(result, RESULTS / "gil.png")
    print(f"{result['machine']}; medians of {args.rounds} interleaved rounds")
    print("| call | calls/s, 1 thread | 2 threads x | 2 processes x | threads / processes |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['calls_per_s_1_thread']:.0f} | {r['threads_scaling']:.2f} | "
              f"{r['processes_scaling']:.2f} | {r['ratio']:.0%} |")


def _chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars  # benchmarks/vision.py, beside this script

    names = list(result["rows"])
    fig, ax = plt.subplots(figsize=(9, 4))
    series = {"2 threads": "threads_scaling", "2 processes": "processes_scaling"}
    ticks = grouped_bars(ax, names, list(series), lambda n, c: result["rows"][n][series[c]])
    ax.set_xticks(ticks)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speed-up over one thread")
    ax.set_title(f"Decoders and kernels on two threads vs two processes\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
