"""Sequences of DataLoader operations, stock against patched: every sequence ends, with stock's batches and generators.

Random sequences (reproducible from their seeds) over up to four ImageFolder loaders, each with its own
``num_workers`` (0-8), ``persistent_workers``, batch size, shuffling and transform: epochs started, batches taken,
epochs left early, epochs of one loader inside another's, loaders made mid-epoch, epochs finished. Each sequence
runs stock (unpatched) and patched from the same seeds, at 2, 4 and 16 usable cores (``sysinfo.usable_cores``,
where the producer pool's size comes from), and every batch and the three global generators after every operation
must be stock's. Focused cases cover loaders that share the producer pool across epochs: a persistent loader used
again after a loader with more workers, a loader's whole epoch inside another's, Lightning's validation/training
alternation, and four loaders open at once.

A hang cannot be interrupted inside the test process, so each run happens in a child process forked from a helper
that has the libraries imported (this file, run as a script): a run whose operations stop advancing is killed with
its whole process group, its threads' stacks are kept for the failure message, and the test fails with the
operation it stopped at.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: a run in which no operation finishes for this long does not end
STALL_S = 15.0
#: a run longer than this does not end either, however it advances
TOTAL_S = 90.0
CORES = (2, 4, 16)
SEEDS = range(12)
IMAGES = 10
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TRANSFORMS = ("resized_crop", "crop", "resized_crop_normalize", "crop_jitter")

pytestmark = pytest.mark.timeout(2 * TOTAL_S + 60)

#: ("make", k) | ("start", k) | ("next", k, n) | ("drop", k) | ("finish", k)
Op = tuple[Any, ...]
Config = dict[str, Any]


# --- the sequences ------------------------------------------------------------------------------------------------


def _loader_config(rng: random.Random) -> Config:
    workers = rng.choices(range(9), weights=[3, 5, 4, 3, 1, 1, 1, 1, 1])[0]
    return {"workers": workers, "persistent": workers > 0 and rng.random() < 0.5, "batch_size": rng.randint(2, 4),
            "shuffle": rng.random() < 0.7, "transform": rng.choice(TRANSFORMS)}


def _epoch_length(config: Config) -> int:
    return math.ceil(IMAGES / config["batch_size"])


def random_sequence(seed: int) -> tuple[list[Config], list[Op]]:
    """Loaders and the operations over them, from ``seed`` alone (never from what a run gives)."""
    rng = random.Random(seed)
    configs = [_loader_config(rng) for _ in range(rng.choice([2, 3, 3, 4, 4, 4]))]
    if rng.random() < 0.5:  # made from fewer workers to more, as a validation loader often comes first
        configs.sort(key=lambda c: c["workers"])
    ops: list[Op] = [("make", 0)]
    made = 1
    left: dict[int, int] = {}  # open epochs: loader -> batches not taken yet

    def apply(op: Op) -> None:
        nonlocal made
        kind, k = op[0], op[1]
        if kind == "make":
            made += 1
        elif kind == "start":
            left[k] = _epoch_length(configs[k])
        elif kind == "next":
            if op[2] > left[k]:  # StopIteration: the epoch ends
                del left[k]
            else:
                left[k] -= op[2]
        elif kind in ("drop", "finish"):
            del left[k]
        ops.append(op)

    for _ in range(rng.randint(12, 20)):
        moves: list[Op] = []
        if made < len(configs):
            moves += [("make", made)] * 2
        moves += [("start", k) for k in range(made)] * 2
        for k, n in sorted(left.items()):
            if n:
                moves += [("next", k, rng.randint(1, 2))] * 3
            moves += [("drop", k), ("finish", k)]
        apply(rng.choice(moves))
    for k in rng.sample(sorted(left), len(left)):
        apply(("finish", k))
    return configs, ops


def _config(workers: int, persistent: bool = False, batch_size: int = 3, shuffle: bool = True,
            transform: str = "resized_crop") -> Config:
    return {"workers": workers, "persistent": persistent, "batch_size": batch_size, "shuffle": shuffle,
            "transform": transform}


def _describe(configs: list[Config], ops: list[Op], at: int | None = None) -> str:
    lines = [f"  loader {k}: " + ", ".join(f"{key}={value}" for key, value in c.items())
             for k, c in enumerate(configs)]
    lines += [f"  {'>>' if i == at else '  '} op {i}: {op}" for i, op in enumerate(ops)]
    return "\n".join(lines)


# --- a run, in the child ------------------------------------------------------------------------------------------


def _transform(name: str) -> Any:
    from torchvision import transforms as T

    return {
        "resized_crop": lambda: T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor()]),
        "crop": lambda: T.Compose([T.RandomCrop(32), T.ToTensor()]),
        "resized_crop_normalize": lambda: T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                                                     T.ToTensor(), T.Normalize(MEAN, STD)]),
        "crop_jitter": lambda: T.Compose([T.RandomCrop(32), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                                          T.ToTensor()]),
    }[name]()


def play(folder: str, configs: list[Config], ops: list[Op], seed: int, progress: Any) -> list[dict[str, Any]]:
    """Run ``ops`` from ``seed``: per operation, the batches it took (copied), whether its epoch ended, the iterator
    class an epoch started with, and the three generators' states after it."""
    from _rng import rng_state, seed_all
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    seed_all(seed)
    loaders: dict[int, Any] = {}
    epochs: dict[int, Iterator[Any]] = {}
    events: list[dict[str, Any]] = []
    for i, op in enumerate(ops):
        kind, k = op[0], op[1]
        event: dict[str, Any] = {"batches": [], "ended": False, "iterator": None}
        if kind == "make":
            c = configs[k]
            loaders[k] = DataLoader(ImageFolder(folder, transform=_transform(c["transform"])),
                                    batch_size=c["batch_size"], shuffle=c["shuffle"], num_workers=c["workers"],
                                    persistent_workers=c["persistent"])
        elif kind == "start":
            epochs[k] = iter(loaders[k])
            event["iterator"] = type(epochs[k]).__name__
        elif kind in ("next", "finish"):
            want = op[2] if kind == "next" else -1
            while want != len(event["batches"]):
                try:
                    x, y = next(epochs[k])
                except StopIteration:
                    event["ended"] = True
                    del epochs[k]
                    break
                event["batches"].append((x.clone(), y.clone()))
                del x, y
        elif kind == "drop":
            del epochs[k]
        event["rng"] = rng_state()
        events.append(event)
        progress.write(f"{i}\n")
        progress.flush()
    for k in sorted(loaders):  # the end of the script: its loaders and their iterators go, one by one
        epochs.pop(k, None)
        del loaders[k]
        progress.write(f"deleted {k}\n")
        progress.flush()
    return events


def _child(request: dict[str, Any]) -> None:
    """A forked run: its output to its log, stacks on SIGUSR1, the events to ``request["out"]``; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process ends with os._exit
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        import torch

        import nano_patch
        from nano_patch import sysinfo

        if request["cores"] is not None:
            cores = int(request["cores"])
            sysinfo.usable_cores = lambda: cores
        if request["side"] == "patched":
            nano_patch.patch_torch()
        with open(request["progress"], "w") as progress:
            events = play(request["folder"], request["configs"], [tuple(op) for op in request["ops"]],
                          request["seed"], progress)
        torch.save(events, request["out"])
        code = 0
    except BaseException:  # noqa: BLE001 - the parent reads it in the log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# --- the helper that forks the runs (this file as a script) -------------------------------------------------------


_current = 0  # the run being watched: its pid (and process group)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _reap_all(deadline_s: float = 5.0) -> None:
    """Reap every child left (the run's own children come here: this process is their subreaper); any still alive
    at the deadline is killed."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > end:
            for kid in _children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kid, signal.SIGKILL)
            end = time.monotonic() + deadline_s
        time.sleep(0.02)


def _children() -> list[int]:
    out = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return out


def _watch(request: dict[str, Any]) -> dict[str, Any]:
    """Fork a run and wait for it; kill it (and its process group) once it stops advancing."""
    global _current
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(request)
    _current = pid
    with contextlib.suppress(OSError):  # (the run sets it too: whichever comes first)
        os.setpgid(pid, pid)
    progress = Path(request["progress"])
    size, last, status = -1, started, None
    try:
        while True:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = raw
                break
            now = time.monotonic()
            try:
                grown = progress.stat().st_size
            except OSError:
                grown = -1
            if grown != size:
                size, last = grown, now
            if now - last > request["stall_s"] or now - started > request["total_s"]:
                os.kill(pid, signal.SIGUSR1)  # the stacks of its threads, into its log
                time.sleep(1.0)
                _kill_group(pid)
                os.waitpid(pid, 0)
                return {"status": "hung", "seconds": now - started, "since_last_op": now - last}
            time.sleep(0.02)
    finally:
        _kill_group(pid)
        _reap_all()
        _current = 0
    code = os.waitstatus_to_exitcode(status)
    return {"status": "ok" if code == 0 else "failed", "code": code, "seconds": time.monotonic() - started}


def _on_term(signum: int, frame: Any) -> None:
    if _current:
        _kill_group(_current)
    _reap_all()
    os._exit(0)


def helper_main() -> None:
    """Import what the runs use (nothing runs a thread or an OpenMP region here: forks stay sound), then fork one
    run per request line, replying with how it ended."""
    signal.signal(signal.SIGTERM, _on_term)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the runs' orphans are reaped here
    import _rng  # noqa: F401
    import numpy  # noqa: F401
    import torch.utils.data  # noqa: F401
    import torchvision.datasets  # noqa: F401
    import torchvision.transforms  # noqa: F401

    import nano_patch  # noqa: F401
    import nano_patch.data.workers.virtual_workers  # noqa: F401
    import nano_patch.patches.dataloader  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(_watch(json.loads(line))), flush=True)


# --- the parent's side --------------------------------------------------------------------------------------------


class Helper:
    """The helper process: runs are requested one at a time; the helper ends when the module's tests do."""

    def __init__(self, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NANO_PATCH_") and k != "_NANO_PATCH_STARTUP"}
        self.log = open(workdir / "helper.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, __file__, "--helper"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, start_new_session=True)
        self._buffer = b""
        if self._line(120.0) != "ready":
            self.close()
            raise RuntimeError(f"the helper did not start: {(workdir / 'helper.log').read_text()[-2000:]}")

    def _line(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = end - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        line = self._line(request["total_s"] + 30.0)
        if line is None:
            self.close()
            raise RuntimeError("the helper did not answer")
        return json.loads(line)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.terminate()  # it kills its run first
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Runs:
    """Stock and patched runs of sequences, compared; stock's events are kept per sequence (they do not depend on
    the core count)."""

    def __init__(self, helper: Helper, folder: Path, workdir: Path) -> None:
        self.helper, self.folder, self.workdir = helper, folder, workdir
        self.stock_events: dict[str, Path] = {}
        self.count = 0

    def _run(self, name: str, configs: list[Config], ops: list[Op], seed: int, side: str,
             cores: int | None) -> Path:
        self.count += 1
        base = self.workdir / f"run{self.count}"
        request = {"folder": str(self.folder), "configs": configs, "ops": ops, "seed": seed, "side": side,
                   "cores": cores, "out": f"{base}.pt", "log": f"{base}.log", "progress": f"{base}.progress",
                   "stall_s": STALL_S, "total_s": TOTAL_S}
        reply = self.helper.run(request)
        where = f"{name} at {cores} cores" if cores is not None else f"{name} (stock)"
        if reply["status"] == "hung":
            done = Path(request["progress"]).read_text().splitlines() if Path(request["progress"]).exists() else []
            at = len(done)
            stuck = f"it hangs at op {at}" if at < len(ops) else "it hangs deleting its loaders, after the last op"
            pytest.fail(f"{where} did not end within {reply['seconds']:.0f} s (nothing advanced in its last "
                        f"{reply['since_last_op']:.0f} s): the last op to finish was op {at - 1}; {stuck}:\n"
                        f"{_describe(configs, ops, at)}\nits threads then:\n{_stacks(Path(request['log']))}",
                        pytrace=False)
        if reply["status"] != "ok":
            pytest.fail(f"{where} failed (exit status {reply['code']}):\n{_describe(configs, ops)}\n"
                        f"{Path(request['log']).read_text()[-4000:]}", pytrace=False)
        return Path(request["out"])

    def check(self, name: str, configs: list[Config], ops: list[Op], seed: int, cores: int) -> None:
        import torch

        key = json.dumps([configs, ops, seed])
        if key not in self.stock_events:
            self.stock_events[key] = self._run(name, configs, ops, seed, "stock", None)
        stock = torch.load(self.stock_events[key], weights_only=False)
        patched = torch.load(self._run(name, configs, ops, seed, "patched", cores), weights_only=False)
        difference = first_difference(configs, ops, stock, patched)
        if difference is not None:
            at, what = difference
            pytest.fail(f"{name} at {cores} cores: {what}\n{_describe(configs, ops, at)}", pytrace=False)


def _stacks(log: Path, lines: int = 60) -> str:
    """The threads' stacks the run wrote when it was found stuck, the main thread's first."""
    text = log.read_text(errors="replace") if log.exists() else ""
    blocks = [b for b in text.split("\n\n") if b.lstrip().startswith(("Thread 0x", "Current thread 0x"))]
    blocks.sort(key=lambda b: not b.lstrip().startswith("Current thread"))
    return "\n".join("\n\n".join(blocks).splitlines()[:lines]) if blocks else "\n".join(text.splitlines()[-lines:])


def first_difference(configs: list[Config], ops: list[Op], stock: list[dict[str, Any]],
                     patched: list[dict[str, Any]]) -> tuple[int, str] | None:
    """(op, what) of the first way the patched run differs from stock's, or None."""
    import torch
    from _rng import rng_differences

    assert len(stock) == len(patched) == len(ops)
    for i, (op, want, got) in enumerate(zip(ops, stock, patched)):
        if op[0] == "start" and configs[op[1]]["workers"] > 0 and got["iterator"] != "VirtualWorkersIter":
            return i, f"op {i} {op}: the epoch ran on a {got['iterator']}, not on virtual workers"
        if len(want["batches"]) != len(got["batches"]) or want["ended"] != got["ended"]:
            return i, (f"op {i} {op}: {len(got['batches'])} batches (epoch ended: {got['ended']}), stock's "
                       f"{len(want['batches'])} (ended: {want['ended']})")
        for b, ((wx, wy), (gx, gy)) in enumerate(zip(want["batches"], got["batches"])):
            if wx.dtype != gx.dtype or wx.shape != gx.shape or wx.stride() != gx.stride() or not torch.equal(wx, gx):
                return i, f"op {i} {op}: batch {b} of the op: images differ from stock's"
            if not torch.equal(wy, gy):
                return i, f"op {i} {op}: batch {b} of the op: labels {gy.tolist()}, stock's {wy.tolist()}"
        differ = rng_differences(got["rng"], want["rng"])
        if differ:
            return i, f"after op {i} {op}: the {', '.join(differ)} generator(s) differ from stock's"
    return None


# --- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, photos: list[Any]) -> Path:
    """Ten JPEGs of the photos, 73-100 px on the longer side, in two classes."""
    root = tmp_path_factory.mktemp("sequences")
    for cls in ("a", "b"):
        (root / cls).mkdir()
    for k in range(IMAGES):
        im = photos[k % len(photos)]
        w, h = im.size
        im = im.crop((k * 9, k * 5, w - k * 4, h - k * 6))
        im.thumbnail((100 - 3 * k, 100 - 3 * k))
        im.save(root / "ab"[k % 2] / f"p{k}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[Runs]:
    workdir = tmp_path_factory.mktemp("sequence-runs")
    helper = Helper(workdir)
    try:
        yield Runs(helper, folder, workdir)
    finally:
        helper.close()


# --- the tests ----------------------------------------------------------------------------------------------------


def test_the_sequences_are_reproducible_and_varied() -> None:
    assert random_sequence(3) == random_sequence(3)
    sequences = [random_sequence(seed) for seed in SEEDS]
    kinds = {op[0] for _, ops in sequences for op in ops}
    assert kinds == {"make", "start", "next", "drop", "finish"}
    workers = {c["workers"] for configs, _ in sequences for c in configs}
    assert {0, 1, 2, 3} <= workers and max(workers) >= 4
    assert any(len(configs) == 4 for configs, _ in sequences)
    assert any(c["persistent"] for configs, _ in sequences for c in configs)


@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_sequences_end_with_stocks_batches_and_generators(runs: Runs, seed: int, cores: int) -> None:
    configs, ops = random_sequence(seed)
    runs.check(f"sequence {seed}", configs, ops, seed, cores)


def _epoch(k: int) -> list[Op]:
    return [("start", k), ("finish", k)]


FOCUSED: dict[str, tuple[list[Config], list[Op]]] = {
    # a persistent loader with one worker, one with two, then the first again
    "persistent loader used again after a larger one": (
        [_config(1, persistent=True), _config(2)],
        [("make", 0), *_epoch(0), ("make", 1), *_epoch(1), *_epoch(0)],
    ),
    # a two-worker loader's whole epoch inside an epoch of a one-worker loader
    "an epoch inside another loader's epoch": (
        [_config(1, batch_size=2), _config(2)],
        [("make", 0), ("make", 1), ("start", 0), ("next", 0, 1), *_epoch(1), ("next", 0, 2), ("finish", 0)],
    ),
    # Lightning's shape: the sanity check's two validation batches, then three epochs of training and validation
    "lightning's training and persistent validation": (
        [_config(1, persistent=True, shuffle=False, transform="crop"), _config(2, batch_size=4)],
        [("make", 0), ("make", 1), ("start", 0), ("next", 0, 2), ("drop", 0),
         *_epoch(1), *_epoch(0), *_epoch(1), *_epoch(0), *_epoch(1), *_epoch(0)],
    ),
}


@pytest.mark.parametrize("cores", [4, 16])
@pytest.mark.parametrize("case", list(FOCUSED))
def test_loaders_sharing_the_producers_end_with_stocks_batches(runs: Runs, case: str, cores: int) -> None:
    configs, ops = FOCUSED[case]
    runs.check(case, configs, ops, 17, cores)


def _round_robin() -> tuple[list[Config], list[Op]]:
    """Four loaders (0, 1, 2 and 3 workers, two persistent) open at once, a batch of each in turn, two epochs."""
    configs = [_config(0, batch_size=2), _config(1, persistent=True, batch_size=3, transform="crop"),
               _config(2, batch_size=4, transform="resized_crop_normalize"),
               _config(3, persistent=True, batch_size=2, transform="crop_jitter")]
    ops: list[Op] = [("make", k) for k in range(4)]
    for _ in range(2):
        ops += [("start", k) for k in range(4)]
        left = {k: _epoch_length(c) for k, c in enumerate(configs)}
        while left:
            for k in sorted(left):
                ops.append(("next", k, 1))
                left[k] -= 1
                if left[k] == 0:
                    del left[k]
        ops += [("finish", k) for k in range(4)]  # each one's StopIteration
    return configs, ops


@pytest.mark.parametrize("cores", CORES)
def test_four_loaders_open_at_once(runs: Runs, cores: int) -> None:
    configs, ops = _round_robin()
    runs.check("four loaders round-robin", configs, ops, 23, cores)


if __name__ == "__main__" and sys.argv[1:] == ["--helper"]:
    helper_main()
