"""Loader scaling on a many-core machine: stock's workers against the patch's loader threads and the
patch's workers, for N = 1, 2, 4, 8, 16 (capped at the cores there are), and the GIL time of each image.

One command, under 8 minutes on 16 cores; ``--quick`` for a 2-core machine (about 5 minutes when idle):

    python benchmarks/scaling.py [--quick] [--per-class 400] [--seconds 2]

**Sweep.** Pipelines pets and (b) (``benchmarks/vision.py``), batch 64, over an ImageFolder of real-photo JPEGs
(``examples/make_photo_folder.py``; 3 classes of ``--per-class``), ``shuffle=True``, for:

- ``stock, num_workers=N``: stock torch/torchvision, ``persistent_workers=True``, stock's defaults otherwise;
- ``threads``: the patch, ``num_workers=0``, ``loader_threads=N``;
- ``workers``: the patch, ``num_workers=N`` (``persistent_workers=True``);
- ``auto``: the patch, ``num_workers=0``, ``loader_threads="auto"`` (it should never lose to a fixed count);

the patch with its decoded-image cache off and warm (one cache folder for every run: the first warm run's
first epoch fills it). Each configuration runs once in a fresh process: a first epoch (starts the workers,
fills the page cache and the cache), then whole epochs until ``--seconds`` have passed; images/s is over those.
The patched runs set ``torch.set_num_threads(--torch-threads)`` (1, as a DataLoader worker has: collation on
16 OpenMP threads beside 16 loader threads oversubscribes the cores); stock keeps its defaults.

**GIL per image.** For pets, (b) and (c), cache off and warm, the patch with ``--gil-threads`` loader threads
(2) and batch ``--gil-batch`` (16), and stock pets one by one for reference (all with ``--torch-threads``: idle
OpenMP threads spinning beside the loader would count as CPU time of the images): after the first epoch the process
starts ``py-spy record --gil --idle --nonblocking`` on itself for ``--gil-seconds`` and loads batches until
py-spy exits. py-spy reads the interpreter's GIL state at each of its ``rate x seconds`` ticks and records a
sample only when some thread holds the GIL, so samples / ticks is the share of wall time the GIL is held;
divided by the images/s over the same window it is the GIL time per image. The CPU time per image is the
process's user + system time over the window. The GIL stays held while its holder waits for a core, so on a
machine with other load the GIL time grows: the table also gives the time per image the process's threads
waited for a core (``/proc/self/task/*/schedstat``), to tell such a run from a quiet one. ``f`` = GIL / CPU,
and N threads give at most ``1 / (f + (1 - f) / N)`` (Amdahl). Checked against a thread that holds the GIL a
known share of the time (pure-Python spins between hashlib calls, which release it): py-spy's share within 0.01
at shares 0.007-0.72. The window is 8 s: on the 2-core VM, 3 s windows read high (one configuration: 52 us per
image at 3 s, 41-43 at 6 and 10 s, two runs each). ``--gil-rounds`` interleaved rounds, medians. py-spy is a
dependency of the ``bench`` extra (pinned in constraints.txt); where it is missing, the sweep still runs and the
GIL table is skipped with one warning (copy the wheel
``py_spy-0.4.1-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl``
to an offline machine, ``pip install`` it, or pass ``--py-spy PATH``). ``--gil-only`` runs only this part.

Results: ``benchmarks/results/scaling[-quick].{json,png}`` (``--stem`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from loader_threads import LOADER_SETUP, run_child  # this folder is the script's: first on sys.path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
PY_SPY_WHEEL = "py_spy-0.4.1-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl"
BOUNDS_AT = (4, 8, 16)

#: The GIL probe (a process of its own): at random times (exponential gaps, ``rate`` a second on average, so that
#: nothing periodic in the loader beats with it) it reads the 8-byte word of the loader process that names the
#: thread holding the GIL (CPython 3.11's ``_PyRuntime.gilstate.tstate_current``: NULL while nobody holds it), and
#: prints py-spy's summary line, with its tick count. The read is all it does: no stack is walked, so nothing of
#: the loader is paused or parsed.
GIL_PROBE = r"""
import os, random, sys, time
pid, word, rate, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
held = ticks = errors = 0
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    try:
        held += os.pread(fd, 8, word) != bytes(8)
        ticks += 1
    except OSError:
        errors += 1
    time.sleep(random.expovariate(rate))
print(f"Samples: {held} Errors: {errors} Ticks: {ticks}")
"""

CHILD = "import json, os, re, subprocess, sys, time\n" + f"GIL_PROBE = {GIL_PROBE!r}\n" + LOADER_SETUP + r"""
def gil_word():
    # CPython 3.11 keeps the thread state holding the GIL in _PyRuntime.gilstate.tstate_current (NULL while it is
    # free), at offset 0x240 (what py-spy reads for 3.11); checked here: it must name this thread, which holds the
    # GIL now. Elsewhere (another Python, a build laid out otherwise): None, and py-spy measures.
    if sys.version_info[:2] != (3, 11):
        return None
    import ctypes
    try:
        base = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
        ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
        me = ctypes.pythonapi.PyThreadState_Get()
    except (AttributeError, ValueError, OSError):
        return None
    word = base + 0x240
    return word if ctypes.c_void_p.from_address(word).value == me else None


for _ in loader:  # the first epoch: workers started, page cache and decoded-image cache filled
    pass
me = psutil.Process()

def cpu_s():
    total = 0.0
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total

def run_delay_s():  # time this process's threads were ready to run but waited for a core (other load)
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9

out = {}
n, cpu0, wait0, t = 0, cpu_s(), run_delay_s(), time.perf_counter()
main_cpu0 = sum(me.cpu_times()[:2])
if cfg["mode"] == "gil":
    try:  # Yama's ptrace_scope 1 lets only an ancestor attach: let py-spy (a child) attach to this process
        import ctypes
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
    except (OSError, AttributeError):
        pass
    word = gil_word() if cfg.get("probe") == "word" else None
    if word is not None:  # the GIL holder's word, read from another process (GIL_PROBE)
        cmd = [sys.executable, "-c", GIL_PROBE, str(os.getpid()), str(word), str(cfg["rate"]), str(cfg["seconds"])]
    else:
        # (py-spy's default mode pauses the process at each sample, as a user runs it; --nonblocking does not)
        cmd = [cfg["py_spy"], "record", "--pid", str(os.getpid()), "--gil", "--idle", "--rate", str(cfg["rate"]),
               "--duration", str(cfg["seconds"]), "--format", "raw", "--output", cfg["spy_out"]]
        if cfg.get("probe") == "py-spy-nonblocking":
            cmd.insert(6, "--nonblocking")
    spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # (summary on stdout)
    while spy.poll() is None:
        for x, y in loader:
            n += len(y)
            if spy.poll() is not None:
                break
    err = spy.stdout.read()
    found = re.search(r"Samples: (\d+) Errors: (\d+)(?: Ticks: (\d+))?", err)
    if spy.returncode != 0 or found is None:
        raise SystemExit("%s failed (exit %s): %s" % (cmd[0], spy.returncode, err[-2000:]))
    out.update(gil_samples=int(found.group(1)), spy_errors=int(found.group(2)),
               ticks=int(found.group(3)) if found.group(3) else cfg["rate"] * cfg["seconds"],
               probe="word" if word is not None else cfg.get("probe", "py-spy"))
else:
    while True:
        for x, y in loader:
            n += len(y)
        if time.perf_counter() - t >= cfg["seconds"]:
            break
seconds = time.perf_counter() - t
main_cpu = me.cpu_times()
tree = [me] + me.children(recursive=True)
out.update(images=n, seconds=seconds, images_per_s=n / seconds, cpu_s_per_image=(cpu_s() - cpu0) / n,
           main_cpu_s_per_image=(main_cpu.user + main_cpu.system - main_cpu0) / n,
           run_delay_s_per_image=(run_delay_s() - wait0) / n,
           tree_rss_mb=sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20,
           # (PSS counts a page shared by forked processes once, split among them: a tree's real footprint)
           tree_pss_mb=sum(p.memory_full_info().pss for p in tree if p.is_running()) / 2**20)
if cfg["side"] == "patched":
    try:
        from nano_patch.data.threads import loader_threads
    except ImportError:  # a checkout from before the module's moves (data/loader_threads.py, data/loader_pool.py,
        try:             # data/parallel.py)
            from nano_patch.data import loader_threads
        except ImportError:
            try:
                from nano_patch.data import loader_pool as loader_threads
            except ImportError:
                from nano_patch.data import parallel as loader_threads
    out["loader_threads"] = loader_threads.describe()
    out["nano_patch"] = os.path.dirname(nano_patch.__file__)
print(json.dumps(out))
"""


def run(cfg: dict) -> dict:
    return run_child(CHILD, cfg)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def find_py_spy(given: str | None) -> str | None:
    """py-spy's executable: ``given``, beside this interpreter, or on PATH; None (one warning) where missing."""
    candidates = [given] if given else [str(Path(sys.executable).parent / "py-spy"), shutil.which("py-spy")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    warnings.warn(f"py-spy is not installed: the GIL table is skipped (pip install py-spy==0.4.1; offline, carry "
                  f"the wheel {PY_SPY_WHEEL} and pip install it, or pass --py-spy PATH)", stacklevel=1)
    return None


def amdahl(f: float, n: int) -> float:
    return 1.0 / (f + (1.0 - f) / n)


def sweep(args, root: str, cache_dir: str, ns: list[int], pipelines: list[str]) -> dict:
    """images/s for every (pipeline, cache, side, N), each in a fresh process, sides interleaved per N."""
    rows: dict[str, dict] = {}
    base = {"root": root, "batch": args.batch, "seconds": args.seconds, "cache_dir": cache_dir, "mode": "rate"}
    for pipeline in pipelines:
        for n in ns:
            for cache in ("off", "warm"):
                patched = {**base, "side": "patched", "pipeline": pipeline, "cache": cache,
                           "torch_threads": args.torch_threads or None}
                if cache == "off":
                    key = f"{pipeline} | stock | workers | {n}"
                    rows[key] = run({**base, "side": "stock", "pipeline": pipeline, "cache": "off", "threads": 1,
                                     "workers": n})
                    _progress(key, rows[key])
                key = f"{pipeline} | cache {cache} | threads | {n}"
                rows[key] = run({**patched, "threads": n, "workers": 0})
                _progress(key, rows[key])
                key = f"{pipeline} | cache {cache} | workers | {n}"
                rows[key] = run({**patched, "threads": 1, "workers": n})
                _progress(key, rows[key])
        for cache in ("off", "warm"):  # --loader-threads auto: it should never lose to fewer threads
            key = f"{pipeline} | cache {cache} | threads | auto"
            rows[key] = run({**base, "side": "patched", "pipeline": pipeline, "cache": cache, "threads": "auto",
                             "workers": 0, "torch_threads": args.torch_threads or None})
            _progress(key, rows[key])
    return rows


def _progress(key: str, r: dict) -> None:
    auto = r.get("loader_threads", {}).get("auto")
    chose = f" (auto: {auto['threads']} threads, rates {auto['images_per_s']})" if auto else ""
    print(f"  {key}: {r['images_per_s']:.0f} images/s, {r['cpu_s_per_image'] * 1e3:.2f} ms CPU/image{chose}",
          flush=True)


def gil_configs(args) -> list[tuple[str, str, int]]:
    """(pipeline, cache, batch) for the GIL table: each pipeline, cache off and warm, each batch; stock pets."""
    pipelines = [p for p in args.gil_pipelines.split(",") if p]
    batches = [int(b) for b in args.gil_batches.split(",") if b]
    return [(p, c, b) for p in pipelines for c in ("off", "warm") for b in batches] + [("pets", "stock", batches[0])]


def gil_key(pipeline: str, cache: str, batch: int) -> str:
    return f"{pipeline} | {'stock, one by one' if cache == 'stock' else f'cache {cache}'} | batch {batch}"


def gil_table(args, root: str, cache_dir: str, py_spy: str, tmp: Path) -> dict:
    """GIL and CPU time per image for each pipeline, cache and batch (and stock pets), read by each probe in turn
    (the GIL holder's word from another process, py-spy --gil as a user runs it), medians of interleaved rounds."""
    runs: dict[str, dict[str, list[dict]]] = {}
    probes = [p for p in args.probes.split(",") if p]
    configs = [(c, probe) for c in gil_configs(args) for probe in probes]
    for rnd in range(args.gil_rounds):
        for (pipeline, cache, batch), probe in configs if rnd % 2 == 0 else configs[::-1]:
            stock = cache == "stock"
            cfg = {"root": root, "pipeline": pipeline, "batch": batch, "cache_dir": cache_dir,
                   "mode": "gil", "py_spy": py_spy, "rate": args.rate, "seconds": args.gil_seconds, "probe": probe,
                   "spy_out": str(tmp / f"spy-{rnd}-{pipeline}-{cache}-{batch}-{probe}.txt"), "workers": 0,
                   "side": "stock" if stock else "patched", "cache": "off" if stock else cache,
                   "threads": 1 if stock else args.gil_threads, "torch_threads": args.torch_threads or None}
            r = run(cfg)
            share = r["gil_samples"] / max(1, r["ticks"] - r["spy_errors"])
            r.update(gil_share=share, gil_s_per_image=share / r["images_per_s"])
            key = gil_key(pipeline, cache, batch)
            runs.setdefault(key, {}).setdefault(r["probe"], []).append(r)
            print(f"  {key} | {r['probe']}: GIL held {share:.0%} of the time, {r['gil_s_per_image'] * 1e6:.1f} "
                  f"us/image, {r['cpu_s_per_image'] * 1e6:.0f} us CPU/image, {r['images_per_s']:.0f} images/s, "
                  f"{r['run_delay_s_per_image'] * 1e6:.0f} us/image waiting for a core", flush=True)
    table = {}
    for key, by_probe in runs.items():
        table[key] = {}
        for probe, rs in by_probe.items():
            gil = statistics.median(r["gil_s_per_image"] for r in rs)
            cpu = statistics.median(r["cpu_s_per_image"] for r in rs)
            f = gil / cpu
            table[key][probe] = {
                "gil_us_per_image": gil * 1e6, "cpu_us_per_image": cpu * 1e6, "f": f,
                # other load only adds to the GIL time (a preempted holder keeps it): the least is a bound
                "gil_us_per_image_min": min(r["gil_s_per_image"] for r in rs) * 1e6,
                "gil_us_per_image_max": max(r["gil_s_per_image"] for r in rs) * 1e6,
                "run_delay_us_per_image": statistics.median(r["run_delay_s_per_image"] for r in rs) * 1e6,
                "images_per_s": statistics.median(r["images_per_s"] for r in rs),
                "gil_share_of_wall": statistics.median(r["gil_share"] for r in rs),
                "amdahl_bound": {str(n): amdahl(f, n) for n in BOUNDS_AT}, "runs": rs}
    return table


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, ns, pipelines = result["rows"], result["ns"], result["pipelines"]
    if not rows:
        return
    fig, axes = plt.subplots(len(pipelines), 2, figsize=(10, 3.6 * len(pipelines)), squeeze=False)
    for i, pipeline in enumerate(pipelines):
        for j, cache in enumerate(("off", "warm")):
            ax = axes[i][j]
            lines = {"stock, num_workers=N": f"{pipeline} | stock | workers",
                     "patch, loader_threads=N": f"{pipeline} | cache {cache} | threads",
                     "patch, num_workers=N": f"{pipeline} | cache {cache} | workers"}
            for label, prefix in lines.items():
                ax.plot(ns, [rows[f"{prefix} | {n}"]["images_per_s"] for n in ns], marker="o", label=label)
            auto = rows.get(f"{pipeline} | cache {cache} | threads | auto")
            if auto:
                ax.axhline(auto["images_per_s"], color="C1", ls="--", lw=1, label="patch, loader_threads=auto")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns, [str(n) for n in ns])
            ax.set_xlabel("N")
            ax.set_ylabel("images / s")
            ax.set_title(f"{pipeline}, patch's cache {cache}", fontsize=9)
            ax.legend(fontsize=7)
    fig.suptitle(f"Loader scaling, batch {result['batch']}\n{result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def chart_gil(result: dict, path: Path) -> None:
    """The GIL table: GIL time per image by configuration, one bar per probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gil = result["gil"]
    keys = list(gil)
    probes = sorted({p for g in gil.values() for p in g})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(keys) + 2), 4.2))
    width = 0.8 / len(probes)
    for i, probe in enumerate(probes):
        ax.bar([k + i * width for k in range(len(keys))],
               [gil[key][probe]["gil_us_per_image"] if probe in gil[key] else 0 for key in keys], width,
               label=_probe_name(probe))
    ax.axhline(15, color="k", lw=0.8, ls="--", label="15 us (f = 0.05 at 300 us of CPU)")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
    ax.set_xticklabels(keys, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("GIL held per image, us (median)")
    ax.set_title(f"GIL time per image, {result['gil_setup']}\n{result['machine']}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_tables(result: dict) -> None:
    rows, ns = result["rows"], result["ns"]
    print(f"\n{result['machine']}; images/s, one fresh process per configuration, batch {result['batch']}")
    for pipeline in result["pipelines"] if rows else []:
        for cache in ("off", "warm"):
            print(f"\n{pipeline}, the patch's cache {cache}")
            print("| N | stock, `num_workers=N` | patch, `num_workers=0`, `loader_threads=N` | "
                  "patch, `num_workers=N` |")
            print("|---|---|---|---|")
            for n in ns:
                s, t, w = (rows[f"{pipeline} | {k} | {n}"]["images_per_s"]
                           for k in ("stock | workers", f"cache {cache} | threads", f"cache {cache} | workers"))
                print(f"| {n} | {s:.0f} | {t:.0f} ({t / s:.2f}x) | {w:.0f} ({w / s:.2f}x) |")
            auto = rows.get(f"{pipeline} | cache {cache} | threads | auto")
            if auto:
                best = max(rows[f"{pipeline} | cache {cache} | threads | {n}"]["images_per_s"] for n in ns)
                chose = auto.get("loader_threads", {}).get("auto", {})
                print(f"`loader_threads=auto`: {auto['images_per_s']:.0f} images/s ({auto['images_per_s'] / best:.2f}x "
                      f"the best fixed count; settled on {chose.get('threads')} threads, "
                      f"rates {chose.get('images_per_s')})")
    gil = result.get("gil")
    if gil:
        probes = sorted({p for g in gil.values() for p in g})
        print(f"\nGIL per image, {result['gil_setup']}; medians of {result['gil_rounds']} rounds (the range in "
              "brackets); f and the bounds from py-spy's reading where it was taken")
        print("| pipeline | " + " | ".join(f"GIL per image, {_probe_name(p)} | images/s" for p in probes)
              + " | CPU per image | f | bound at 4 | 8 | 16 threads | waiting for a core |")
        print("|---" * (2 * len(probes) + 7) + "|")
        for key, g in gil.items():
            main = g.get("py-spy") or next(iter(g.values()))
            b = main["amdahl_bound"]
            cells = " | ".join(_gil_cells(g[p]) if p in g else " | " for p in probes)
            print(f"| {key} | {cells} | {main['cpu_us_per_image']:.0f} us | {main['f']:.3f} | {b['4']:.1f}x | "
                  f"{b['8']:.1f}x | {b['16']:.1f}x | {main['run_delay_us_per_image']:.0f} us |")
        print("(waiting for a core: the time per image the process's threads were ready to run but other load held "
              "the cores. The GIL stays held while its holder waits, so where this is not small next to the GIL time, "
              "the GIL time is inflated by other load: measure on a quiet machine.)")
    elif "gil_skipped" in result:
        print(f"\nGIL table skipped: {result['gil_skipped']}")


def _gil_cells(g: dict) -> str:
    return (f"{g['gil_us_per_image']:.1f} us ({g['gil_us_per_image_min']:.1f}-{g['gil_us_per_image_max']:.1f}) | "
            f"{g['images_per_s']:.0f}")


def _probe_name(probe: str) -> str:
    return {"word": "the holder's word", "py-spy": "py-spy --gil", "py-spy-nonblocking": "py-spy --nonblocking"}[probe]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2-core run: fewer photos, shorter windows")
    ap.add_argument("--per-class", type=int, default=None, help="photos per class, 3 classes (400; quick 100)")
    ap.add_argument("--seconds", type=float, default=None, help="timed window per configuration (2; quick 1.5)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-n", type=int, default=16)
    ap.add_argument("--torch-threads", type=int, default=1, help="the patched runs' torch threads (0: default)")
    ap.add_argument("--gil-only", action="store_true", help="only the GIL table")
    ap.add_argument("--no-gil", action="store_true", help="only the sweep")
    ap.add_argument("--gil-threads", type=int, default=2)
    ap.add_argument("--gil-batches", default="16,64", help="the GIL table's batch sizes, comma-separated")
    ap.add_argument("--gil-pipelines", default="pets,b", help="the GIL table's pipelines, comma-separated")
    ap.add_argument("--gil-seconds", type=int, default=None, help="py-spy's window (8)")
    ap.add_argument("--gil-rounds", type=int, default=1)
    ap.add_argument("--rate", type=int, default=263, help="py-spy's samples per second (not a round number: no "
                    "beat with a timer's period)")
    ap.add_argument("--probes", default="word,py-spy",
                    help="the GIL probes, comma-separated, each in its own window: word (the GIL holder's word read "
                         "from another process; CPython 3.11, elsewhere py-spy), py-spy (py-spy --gil as a user runs "
                         "it: the process paused at each sample), py-spy-nonblocking")
    ap.add_argument("--py-spy", default=None, help="py-spy's executable (default: beside python, or on PATH)")
    ap.add_argument("--stem", default=None)
    args = ap.parse_args()
    per_class = args.per_class or (100 if args.quick else 400)
    args.seconds = args.seconds or (1.5 if args.quick else 2.0)
    args.gil_seconds = args.gil_seconds or 8
    stem = args.stem or ("scaling-quick" if args.quick else "scaling")
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(Path(__file__).parent))
    from make_photo_folder import build
    from train import _cpu_name

    import nano_patch

    cores = usable_cores()
    ns = [n for n in (1, 2, 4, 8, 16) if n <= min(cores, args.max_n)]
    pipelines = ["pets", "b"]
    began = time.perf_counter()
    result = {"machine": f"{_cpu_name()}, {cores} usable CPUs", "python": platform.python_version(),
              "nano_patch": str(Path(nano_patch.__file__).parent), "batch": args.batch, "per_class": per_class,
              "seconds": args.seconds, "torch_threads_patched": args.torch_threads, "ns": ns,
              "pipelines": pipelines, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        root = str(build(tmp / "photos", per_class) / "train")
        cache_dir = str(tmp / "cache")
        print(f"{per_class * 3} photos built in {time.perf_counter() - began:.0f} s; N = {ns}", flush=True)
        RESULTS.mkdir(exist_ok=True)
        if not args.gil_only:
            result["rows"] = sweep(args, root, cache_dir, ns, pipelines)
            (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))  # kept if the GIL part fails
        if not args.no_gil:
            py_spy = find_py_spy(args.py_spy)
            if py_spy is None:
                result["gil_skipped"] = f"py-spy not installed (needs {PY_SPY_WHEEL})"
            else:
                result.update(gil_setup=f"{args.gil_threads} loader threads, batch {args.gil_batches}, sampled at "
                                        f"{args.rate}/s for {args.gil_seconds} s per run",
                              gil_rounds=args.gil_rounds)
                try:
                    result["gil"] = gil_table(args, root, cache_dir, py_spy, tmp)
                except RuntimeError as exc:  # py-spy could not attach (permissions), or a run failed
                    result["gil_skipped"] = str(exc)[-2000:]
                    warnings.warn(f"the GIL table failed: {result['gil_skipped']}", stacklevel=1)
    runs = list(result["rows"].values()) + [r for g in result.get("gil", {}).values() for by in g.values()
                                            for r in by["runs"]]
    result["children_nano_patch"] = sorted({r["nano_patch"] for r in runs if "nano_patch" in r})
    result["total_s"] = time.perf_counter() - began
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    if result.get("gil"):
        chart_gil(result, RESULTS / f"{stem}-gil.png")
    print_tables(result)
    print(f"\nthe patched runs imported nano_patch from {', '.join(result['children_nano_patch'])}")
    print(f"{result['total_s']:.0f} s in all; results/{stem}.json and .png")


if __name__ == "__main__":
    main()
