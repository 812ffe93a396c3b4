"""Training benchmark: the pets-style ResNet-18 fine-tune, stock Lightning against nano-patch features.

Each configuration runs ``examples/pets_finetune.py`` (unchanged, never importing nano_patch) in a
fresh process, over JPEGs of real photographs (``examples/make_photo_folder.py``), and reports
training samples/s measured end to end from JPEG, peak RSS and validation accuracy after the same
epochs. A compute-only bound (batches preloaded in memory, same model and precision as "all")
is measured in the same run. Each run gets its own empty decoded-image cache folder (the first
epoch fills it; the measured epochs, from the second on, read it). Results:
``benchmarks/results/train.json`` and ``train.png``.

    python benchmarks/train.py [--epochs 2] [--per-class 64]

``--multi-instance`` compares processes x cores each at the same total cores instead: ``nano-patch run --fast``
in 1 process on all cores (up to 16) against 2 and 4 pinned processes (``--num-processes``) sharing them, and
``--num-processes auto`` (the count it chose, and its measurement's line, are kept per round), on the main job
(96 px, batch 16) and on a larger one (224 px, batch 64); results ``multi_instance.json`` and ``.png``:

    python benchmarks/train.py --multi-instance        # 1 x 16, 2 x 8, 4 x 4, auto on 16 cores; 1 x 2, 2 x 1, auto on 2
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # this tree's nano_patch, also where it is not installed

from nano_patch.sysinfo import has_native_bf16  # noqa: E402

RESULTS = Path(__file__).parent / "results"

# "all" is every feature that pays on this CPU, as --fast picks: bf16 only where the CPU computes it natively
# (emulated bf16 is several times slower than fp32, so a bound and "all" in bf16 would say nothing there).
BF16 = has_native_bf16()
ALL = {"NANO_PATCH_PRECISION": "bf16" if BF16 else "32", "NANO_PATCH_CHANNELS_LAST": "1",
       "NANO_PATCH_CACHE_DECODED": "on"}
ALL_NAME = f"all ({'bf16' if BF16 else 'fp32'}, channels_last, vision, dataloader, decoded-image cache)"
ALL_2P_NAME = "all + 2 processes"
FAST_NAME = "nano-patch run --fast"
FAST_REPORT_NAME = "nano-patch run --fast --report"
FAST_FP32_NAME = "nano-patch run --fast --precision 32"
CONFIGS = {
    "stock": ([], {}),
    "vision+dataloader patch": (["-m", "nano_patch", "run"], {"NANO_PATCH_TRAINER": "0"}),
    "dataloader patch alone": (["-m", "nano_patch", "run"], {"NANO_PATCH_TRAINER": "0", "NANO_PATCH_VISION": "0"}),
    "stock Lightning bf16-mixed (PL_TRAINER_PRECISION)": ([], {"PL_TRAINER_PRECISION": "bf16-mixed"}),
    "bf16": (["-m", "nano_patch", "run"], {"NANO_PATCH_PRECISION": "bf16", "NANO_PATCH_VISION": "0",
                                          "NANO_PATCH_DATALOADER": "0"}),
    "channels_last": (["-m", "nano_patch", "run"], {"NANO_PATCH_CHANNELS_LAST": "1", "NANO_PATCH_VISION": "0",
                                                   "NANO_PATCH_DATALOADER": "0"}),
    "2 processes (fp32)": (["-m", "nano_patch", "run"], {"NANO_PATCH_NUM_PROCESSES": "2", "NANO_PATCH_VISION": "0",
                                                        "NANO_PATCH_DATALOADER": "0"}),
    ALL_NAME: (["-m", "nano_patch", "run"], ALL),
    ALL_2P_NAME: (["-m", "nano_patch", "run"], {**ALL, "NANO_PATCH_NUM_PROCESSES": "2"}),
    # The one-flag path a new user takes, and its report's cost (`--stem preset` keeps these apart).
    FAST_NAME: (["-m", "nano_patch", "run", "--fast"], {}),
    FAST_REPORT_NAME: (["-m", "nano_patch", "run", "--fast", "--report"], {}),
    # What --fast gives where the CPU has no native bf16 (it stays in fp32 there).
    FAST_FP32_NAME: (["-m", "nano_patch", "run", "--fast", "--precision", "32"], {}),
}

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
# `nano-patch init` candidates, each on top of "all" (run with --env-study; results/env.json).
ENV_STUDY = {
    "all, no init": {},
    "+ OMP_NUM_THREADS=physical cores": {"OMP_NUM_THREADS": str(psutil.cpu_count(logical=False) or 1)},
    "+ OMP_PROC_BIND=close, OMP_PLACES=cores": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "+ jemalloc (LD_PRELOAD, MALLOC_CONF)": {
        "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                                               "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
    "+ tcmalloc (LD_PRELOAD)": {"LD_PRELOAD": TCMALLOC},
}

SIZE = 96  # set from --size
COMPUTE_BOUND = r"""
import sys, time, torch
sys.path.insert(0, {examples!r})
from pets_finetune import PetsClassifier, loaders
torch.manual_seed(0)
train_dl = loaders({data!r}, {size}, 16, 0)[0]
batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in list(train_dl)[:4]]  # real photos
model = PetsClassifier(3).to(memory_format=torch.channels_last)
opt = torch.optim.Adam(model.parameters(), 1e-3)
def step(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled={bf16}):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
for x, y in batches: step(x, y)
n, t = 0, time.perf_counter()
while time.perf_counter() - t < {seconds}:
    for x, y in batches: step(x, y); n += len(y)
print(f"compute-only samples/s: {{n / (time.perf_counter() - t):.1f}}")
"""


AUTO_NAME = "auto"
#: The jobs of --multi-instance: (input size, batch size).
MULTI_INSTANCE_JOBS = {"main job (96 px, batch 16)": (96, 16), "larger job (224 px, batch 64)": (224, 64)}


def multi_instance_shapes(max_cores: int = 16) -> list[tuple[int, int]]:
    """(processes, cores each) for 1, 2 and 4 processes over the same cores: this process's usable CPUs, at most
    ``max_cores``; shapes that would leave a process without a core are left out."""
    total = min(len(os.sched_getaffinity(0)), max_cores)
    return [(p, total // p) for p in (1, 2, 4) if total // p >= 1]


def multi_instance_name(processes: int, cores: int) -> str:
    return f"{processes} x {cores}"


def run_config(name: str, data: Path, epochs: int, size: int | None = None, batch: int | None = None,
               cpus: list[int] | None = None) -> dict:
    if name in ENV_STUDY:
        prefix, env_extra = ["-m", "nano_patch", "run"], {**ALL, **ENV_STUDY[name]}
    elif " x " in name:  # --multi-instance: "P x C", `--fast` in P pinned processes on the cpus given
        processes = int(name.split(" x ")[0])
        prefix = ["-m", "nano_patch", "run", "--fast"] + (["--num-processes", str(processes)] if processes > 1 else [])
        env_extra = {}
    elif name == AUTO_NAME:  # --multi-instance: `--fast --num-processes auto`
        prefix, env_extra = ["-m", "nano_patch", "run", "--fast", "--num-processes", "auto"], {}
    else:
        prefix, env_extra = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_", "KMP_"))
           and k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(env_extra)
    if " x " in name or name == AUTO_NAME:  # this tree's nano-patch, in every rank, however it is installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cache_dir = tempfile.mkdtemp(prefix="nano-patch-bench-cache-")
    env["NANO_PATCH_CACHE_DIR"] = os.path.join(cache_dir, "c")  # each run starts with an empty cache
    cmd = [sys.executable, *prefix, str(ROOT / "examples" / "pets_finetune.py"), str(data), "--epochs", str(epochs),
           "--size", str(size or SIZE)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    # The run sees only these CPUs (the launcher splits them between its ranks); default: all of this process's.
    bind = None if cpus is None else functools.partial(os.sched_setaffinity, 0, cpus)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = psutil.Popen(cmd, env=env, stdout=out, stderr=err, text=True, preexec_fn=bind)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc))  # every rank and worker, summed
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall = time.perf_counter() - start
    shutil.rmtree(cache_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-3000:]}")
    m = re.search(r"train samples/s \(all ranks\): ([\d.]+)\s+val_acc: ([\d.]+)", stdout)
    out = {"samples_per_s": float(m.group(1)), "val_acc": float(m.group(2)), "peak_rss_mb": peak / 2**20,
           "wall_s": wall}
    decision = re.search(r"nano-patch: num_processes='auto' -> (\d+) process.*", stderr)
    if decision:  # the count auto chose, and its figures
        out["auto_processes"], out["auto_line"] = int(decision.group(1)), decision.group(0)
    return out


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def compute_bound(seconds: float, data: Path) -> float:
    code = COMPUTE_BOUND.format(examples=str(ROOT / "examples"), data=str(data), seconds=seconds, size=SIZE,
                                 bf16=BF16)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().split(":")[1])


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["configs"])
    vals = [result["configs"][n]["samples_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.barh(names, vals, color=["grey"] + ["tab:blue"] * (len(names) - 1))
    precision = "bf16" if BF16 else "fp32"
    ax.axvline(result["compute_only_bound"], color="k", ls="--", lw=1, label=f"compute-only bound ({precision}, CL)")
    ax.set_xlabel("training samples / s, end to end from JPEG")
    ax.set_title(f"ResNet-18, 128 px, batch 16\n{result['machine']}")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--size", type=int, default=96, help="input size (the example's default is 96)")
    ap.add_argument("--per-class", type=int, default=64)
    ap.add_argument("--only", nargs="*", help="run only these configurations")
    ap.add_argument("--env-study", action="store_true", help="measure each `nano-patch init` setting instead")
    ap.add_argument("--repeat", type=int, default=1, help="runs per configuration; the median is reported")
    ap.add_argument("--stem", default=None, help="results file name (default: train, or env with --env-study)")
    ap.add_argument("--multi-instance", action="store_true",
                    help="compare 1, 2 and 4 pinned processes (`--fast`) over the same cores on the main job and a "
                         "larger one (224 px, batch 64); defaults then: --epochs 3 --per-class 256")
    ap.add_argument("--max-cores", type=int, default=16, help="--multi-instance: cores to share out (at most)")
    args = ap.parse_args()
    global SIZE
    SIZE = args.size
    sys.path.insert(0, str(ROOT / "examples"))
    from make_photo_folder import build

    if args.multi_instance:
        multi_instance(args, build)
        return

    with tempfile.TemporaryDirectory() as tmp:
        data = build(Path(tmp) / "photos", args.per_class)
        result = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
                  "epochs": args.epochs, "size": args.size, "per_class": args.per_class, "configs": {}}
        names = args.only or (ENV_STUDY if args.env_study else CONFIGS)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        bounds = []
        for _ in range(args.repeat):  # interleaved, so drift on a shared VM hits every configuration alike
            bounds.append(compute_bound(20, data))
            print("compute-only bound", bounds[-1], flush=True)
            for name in names:
                runs[name].append(run_config(name, data, args.epochs))
                print(name, runs[name][-1], flush=True)
        for name, rs in runs.items():
            # per_round keeps the run order, so each run can be compared with its round's bound
            result["configs"][name] = {**_middle(rs, key=lambda r: r["samples_per_s"]),
                                       "per_round": [r["samples_per_s"] for r in rs]}
        result["compute_only_bound"] = _middle(bounds)
        result["compute_only_bounds"] = bounds
    RESULTS.mkdir(exist_ok=True)
    stem = args.stem or ("env" if args.env_study else "train")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    chart(result, RESULTS / f"{stem}.png")
    stock = next(iter(result["configs"].values()))["samples_per_s"]
    print("| configuration | samples/s | vs first row | % of compute bound | val acc | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for name, r in result["configs"].items():
        print(f"| {name} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / stock:.2f}x | "
              f"{100 * r['samples_per_s'] / result['compute_only_bound']:.0f}% | {r['val_acc']:.3f} | "
              f"{r['peak_rss_mb']:.0f} |")
    print(f"compute-only bound: {result['compute_only_bound']:.1f} samples/s")
    for name, r in result["configs"].items():
        pct = ", ".join(f"{100 * v / b:.0f}%" for v, b in zip(r["per_round"], bounds))
        print(f"{name}: per round {r['per_round']} = {pct} of that round's bound")
    configs = result["configs"]
    for a, b in (("stock", FAST_NAME), (FAST_NAME, FAST_REPORT_NAME)):
        if {a, b} <= configs.keys():
            ratios = [y / x for x, y in zip(configs[a]["per_round"], configs[b]["per_round"])]
            print(f"{b} / {a}, per round:", ", ".join(f"{r:.3f}" for r in ratios), f"(median {_middle(ratios):.3f})")
    if {ALL_NAME, ALL_2P_NAME} <= configs.keys():
        ratios = [b / a for a, b in zip(configs[ALL_NAME]["per_round"], configs[ALL_2P_NAME]["per_round"])]
        print("all + 2 processes / all, per round:", ", ".join(f"{r:.2f}" for r in ratios),
              f"(median {_middle(ratios):.2f})")


def multi_instance(args: argparse.Namespace, build) -> None:
    """``--multi-instance``: P x C (processes x cores each) at the same total cores, per job, interleaved rounds."""
    epochs = args.epochs if "--epochs" in sys.argv else 3
    per_class = args.per_class if "--per-class" in sys.argv else 256
    shapes = multi_instance_shapes(args.max_cores)
    cpus = sorted(os.sched_getaffinity(0))[:shapes[0][1]]
    names = [multi_instance_name(p, c) for p, c in shapes] + [AUTO_NAME]
    result = {"machine": f"{_cpu_name()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
              "epochs": epochs, "per_class": per_class, "cpus": cpus, "bf16": BF16, "jobs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = build(Path(tmp) / "photos", per_class)
        runs = {job: {n: [] for n in names} for job in MULTI_INSTANCE_JOBS}
        for _ in range(args.repeat):  # interleaved, so drift on a shared VM hits every shape alike
            for job, (size, batch) in MULTI_INSTANCE_JOBS.items():
                for name in names:
                    runs[job][name].append(run_config(name, data, epochs, size, batch, cpus))
                    print(job, name, runs[job][name][-1], flush=True)
    for job, by_name in runs.items():
        result["jobs"][job] = {n: {**_middle(rs, key=lambda r: r["samples_per_s"]),
                                   "per_round": [r["samples_per_s"] for r in rs]} for n, rs in by_name.items()}
    RESULTS.mkdir(exist_ok=True)
    stem = args.stem or "multi_instance"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    multi_instance_chart(result, names, RESULTS / f"{stem}.png")
    print(f"`nano-patch run --fast`, {len(cpus)} cores, {result['machine']}")
    print("| job | processes x cores | samples/s | vs 1 process | wall s | val acc | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for job, by_name in result["jobs"].items():
        one = by_name[names[0]]["samples_per_s"]
        for name, r in by_name.items():
            chose = f" (chose {r['auto_processes']})" if "auto_processes" in r else ""
            print(f"| {job} | {name}{chose} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / one:.2f}x | "
                  f"{r['wall_s']:.0f} | {r['val_acc']:.3f} | {r['peak_rss_mb']:.0f} |")
    for job, by_name in runs.items():
        # auto against one process, round by round: drift on a shared machine hits a round's runs alike
        ratios = [a["samples_per_s"] / o["samples_per_s"] for a, o in zip(by_name[AUTO_NAME], by_name[names[0]])]
        best = max((n for n in names if n != AUTO_NAME), key=lambda n: result["jobs"][job][n]["samples_per_s"])
        print(f"{job}: auto / {names[0]} per round {', '.join(f'{r:.3f}' for r in ratios)} (median "
              f"{_median(ratios):.3f}); auto chose {[r.get('auto_processes') for r in by_name[AUTO_NAME]]}; "
              f"best fixed count {best}")
        for r in by_name[AUTO_NAME]:
            print("   ", r.get("auto_line", "(no decision line)"))
        result["jobs"][job][AUTO_NAME]["vs_one_process_per_round"] = ratios
        result["jobs"][job][AUTO_NAME]["chose_per_round"] = [r.get("auto_processes") for r in by_name[AUTO_NAME]]
        result["jobs"][job][AUTO_NAME]["lines"] = [r.get("auto_line") for r in by_name[AUTO_NAME]]
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))


def multi_instance_chart(result: dict, names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from vision import grouped_bars

    jobs = list(result["jobs"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ticks = grouped_bars(ax, jobs, names, lambda j, n: result["jobs"][j][n]["samples_per_s"])
    ax.set_xticks(ticks, jobs, fontsize=8)
    ax.set_ylabel("training samples / s, end to end from JPEG")
    ax.set_title(f"nano-patch run --fast: processes x cores each, same cores\n{result['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _middle(values: list, key=None):
    """The median element itself (the upper one of an even count), so a whole run can be reported."""
    return sorted(values, key=key)[len(values) // 2]


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


if __name__ == "__main__":
    main()
