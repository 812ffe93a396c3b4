"""``num_processes="auto"``: the process count, decided from a measurement of this job on this machine.

Lightning's launcher starts the ranks inside ``Trainer.fit``, and only there are the model and its data known. So a
Trainer asked for ``auto`` is built as one process, and at ``fit``, before Lightning's launcher runs, :func:`decide`
measures the job (``train/job_measure.py``: the step time on a copy of the model at the batch size with all cores and
with each candidate share of them, the gradient all-reduce between local processes, the loading time of a sample),
predicts each candidate count's throughput, and picks. ``train/auto_trainer.py`` then gives that Trainer nano-patch's
strategy for the count, and Lightning's launcher starts the ranks as it does for an explicit count. The count is kept
in :data:`AUTO_ENV`: the ranks Lightning starts re-run the script, and there (and for later Trainers of this process)
``auto`` means that count, without measuring again.

The prediction, per candidate count ``n`` of processes with ``t`` cores each (``t = cores / n``), batch ``B``:

    per-rank step = step(n copies at once, t threads each) + all-reduce(n) / accumulation + B x load(1 sample) / t
    throughput(n) = n x B / per-rank step                     (samples/s; n = 1 is one process with every core)

and, where the run's length is known, the ranks' start-up (about this process's own time to ``fit``: each rank
re-runs it) is spread over the run's samples. More than one process is chosen only where that is at least
:data:`MARGIN` times one process's throughput. The loading term counts only where the DataLoader loads in the
training process (``num_workers=0``); it costs the same per sample either way, so it only narrows the margins.

The step of ``n > 1`` is timed with ``n`` copies of the model stepping at the same time on their shares, not one
copy alone: ranks share the caches, the memory bandwidth and the clock, so a lone step on a share of the cores is
faster than each of ``n`` stepping at once, and that difference is what decides.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import job_measure, topology

log = logging.getLogger("nano_patch")

#: The count decided in the launching process, read by its ranks and its later Trainers.
AUTO_ENV = "_NANO_PATCH_AUTO_PROCESSES"
#: More than one process only where predicted at least this much faster than one.
MARGIN = 1.10
#: The measurement's budget: this share of the predicted run, and at most BUDGET_CAP_S seconds.
BUDGET_SHARE = 0.02
BUDGET_FLOOR_S = 1.0
BUDGET_CAP_S = 12.0
#: Rounds of steps at every thread count, where the budget allows.
ROUNDS = 3
#: A rank's start-up where this process's own cannot be read.
DEFAULT_STARTUP_S = 5.0
#: The least a rank started warm takes (fork, patch, the script's own start, joining the process group).
WARM_STARTUP_FLOOR_S = 0.5


def decided() -> int | None:
    """The count an earlier decision of this run chose (in a rank, or a later Trainer), else None."""
    value = os.environ.get(AUTO_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass
class TrainingJob:
    """What the decision needs to know about one ``Trainer.fit``."""

    model: Any
    train_dataloaders: Any = None
    datamodule: Any = None
    bf16: bool = False  # bf16-mixed on the CPU: bf16 compute, and gradients travel as bf16
    channels_last: bool = False
    max_steps: int = -1
    max_epochs: int | None = None
    limit_train_batches: int | float | None = None
    accumulate: int = 1
    skip: str | None = None  # why it must not be measured, as the caller found it


@dataclass
class Figures:
    """The measured figures a prediction is made from."""

    cores: int
    threads: dict[int, int]  # processes -> cores (threads) each
    batch_size: int
    #: processes -> seconds per step: one copy on every core (1), or the slowest of n copies stepping at once
    step_s: dict[int, float] = field(default_factory=dict)
    allreduce_s: dict[int, float] = field(default_factory=dict)  # processes -> seconds per all-reduce
    gradient_bytes: int = 0
    sample_s: float = 0.0  # loading one sample on one core, in the training process
    startup_s: float = 0.0  # starting the ranks
    steps_total: int | None = None  # optimizer-free steps of the run in one process, where known
    accumulate: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class Decision:
    processes: int
    reason: str
    figures: Figures | None = None
    predicted: dict[int, float] = field(default_factory=dict)  # processes -> samples/s
    measure_s: float = 0.0

    def line(self) -> str:
        """One log line: the count, why, and the figures."""
        head = f"nano-patch: num_processes='auto' -> {self.processes} process{'es' if self.processes > 1 else ''}: "
        f = self.figures
        if f is None or not f.step_s:
            return head + self.reason
        steps = ", ".join(f"{s:.3f} s as {n} x {f.threads[n]}" for n, s in sorted(f.step_s.items()))
        parts = [f"{f.cores} cores, batch {f.batch_size}: step {steps}"]
        if f.allreduce_s:
            parts.append(f"all-reduce of {f.gradient_bytes / 1e6:.0f} MB "
                         + ", ".join(f"{s * 1000:.0f} ms between {n}" for n, s in sorted(f.allreduce_s.items())))
        if f.sample_s:
            parts.append(f"loading {f.sample_s * 1000:.1f} ms/sample on a core")
        if self.predicted:
            parts.append("predicted samples/s " + ", ".join(
                f"{n} x {f.threads[n]}: {v:.1f}" for n, v in sorted(self.predicted.items())))
        parts.append(f"measured in {self.measure_s:.1f} s")
        return head + self.reason + " [" + "; ".join(parts) + "]"

    def as_dict(self) -> dict[str, Any]:
        """For ``--report``: JSON-able."""
        out: dict[str, Any] = {"processes": self.processes, "reason": self.reason, "measure_s": self.measure_s,
                               "predicted_samples_per_s": {str(n): v for n, v in self.predicted.items()}}
        if self.figures is not None:
            figures = asdict(self.figures)
            for key in ("threads", "step_s", "allreduce_s"):
                figures[key] = {str(k): v for k, v in figures[key].items()}
            out["figures"] = figures
        return out


def predict(f: Figures) -> dict[int, float]:
    """Samples/s for each count whose thread count was measured (see the module's docstring)."""
    samples_total = f.steps_total * f.batch_size if f.steps_total else None
    out = {}
    for n, t in f.threads.items():
        if n not in f.step_s:
            continue
        per_step = f.step_s[n] + f.batch_size * f.sample_s / t
        if n > 1:
            per_step += f.allreduce_s.get(n, 0.0) / max(1, f.accumulate)
        rate = n * f.batch_size / per_step
        if n > 1 and samples_total:
            rate = samples_total / (f.startup_s + samples_total / rate)
        out[n] = rate
    return out


def choose(predicted: dict[int, float]) -> int:
    """The fastest count, where it is at least :data:`MARGIN` times one process; else 1."""
    if 1 not in predicted:
        return 1
    best = max(predicted, key=lambda n: (predicted[n], -n))
    return best if best > 1 and predicted[best] >= MARGIN * predicted[1] else 1


def startup_seconds() -> float:
    """About what a rank takes to start: this process's own time from its start to now (``fit``), since each rank
    that Lightning starts re-runs the script to the same point; less the imports a warm interpreter has already
    made (``train/warm_start.py``), where one is ready."""
    from . import warm_start

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return DEFAULT_STARTUP_S
    imported = warm_start.ready_import_seconds()
    return age if imported is None else max(WARM_STARTUP_FLOOR_S, age - imported)


def steps_in_run(job: TrainingJob, steps_per_epoch: int | None) -> int | None:
    """Training steps of the run in one process, from the Trainer's limits; None where unbounded or unknown."""
    limits = []
    if job.max_steps is not None and job.max_steps > 0:
        limits.append(job.max_steps * max(1, job.accumulate))
    epochs = 1000 if job.max_epochs is None and not limits else job.max_epochs  # Lightning's default
    if epochs is not None and epochs > 0 and steps_per_epoch:
        per_epoch = steps_per_epoch
        limit = job.limit_train_batches
        if isinstance(limit, float) and limit <= 1.0:
            per_epoch = int(steps_per_epoch * limit)
        elif isinstance(limit, int) and limit > 0:
            per_epoch = min(steps_per_epoch, limit)
        limits.append(epochs * per_epoch)
    return min(limits) if limits else None


def decide(job: TrainingJob, cpus: list[int] | None = None) -> Decision:
    """Measure ``job`` and choose a process count; never raises (a failure is 1 process, with its reason)."""
    start = time.perf_counter()
    decision = _decide(job, cpus, start)
    decision.measure_s = time.perf_counter() - start
    return decision


def _decide(job: TrainingJob, cpus: list[int] | None, start: float) -> Decision:
    if job.skip:
        return Decision(1, job.skip)
    counts = topology.counts_to_try(cpus)
    cores = counts[1]
    if len(counts) < 2:
        return Decision(1, f"this process may use {cores} physical core{'s' if cores > 1 else ''}: each process "
                           f"needs at least {topology.MIN_CORES_PER_PROCESS}")
    timer = None
    try:
        import torch

        generator = torch.Generator().manual_seed(0)  # private: no global generator is drawn from
        notes: list[str] = []
        try:
            info: job_measure.BatchInfo | None = job_measure.first_batch(job.train_dataloaders, job.datamodule,
                                                                        job.model)
        except job_measure.MeasureError as exc:
            info = None
            notes.append(f"first batch not read ({exc})")
        example = getattr(job.model, "example_input_array", None)
        try:
            args, kwargs = job_measure.model_input(info, example, generator)
        except job_measure.MeasureError as exc:
            reason = notes[0] if notes else str(exc)
            return Decision(1, f"the input's shape is not known before training: {reason}; set the module's "
                               "example_input_array or give num_processes=N")
        timer = job_measure.StepTimer(job.model, args, kwargs, bf16=job.bf16, channels_last=job.channels_last,
                                      notes=notes)
        batch = _batch_size(info, args, kwargs)
        before = torch.get_num_threads()
        torch.set_num_threads(cores)
        try:
            cold = timer.warm_up()
        finally:
            torch.set_num_threads(before)
        steps_total = steps_in_run(job, info.steps_per_epoch if info else None)
        sample_s = (info.sample_s or 0.0) if info is not None else 0.0
        figures = Figures(cores=cores, threads=counts, batch_size=batch, sample_s=sample_s,
                          startup_s=startup_seconds(), steps_total=steps_total, accumulate=max(1, job.accumulate),
                          notes=notes)
        load_s = batch * sample_s / cores
        # The run as long as its first (cold, so slowest) step says: too short even so, or the budget from it.
        run_s = None if steps_total is None else steps_total * (cold + load_s)
        if _too_short(run_s, figures):
            return _short(run_s, figures)
        budget = _budget(run_s)
        _interleave(timer, figures, start + budget, cold)
        if len(figures.step_s) < 2:
            return Decision(1, f"no step on fewer cores fits the measurement's budget of {budget:.1f} s "
                               f"({BUDGET_SHARE:.0%} of the predicted run, at least {BUDGET_FLOOR_S:.0f} s; the first "
                               f"step took {cold:.2f} s)", figures)
        run_s = None if steps_total is None else steps_total * (figures.step_s[1] + load_s)
        if _too_short(run_s, figures):
            return _short(run_s, figures)
        missing = [n for n in counts if n not in figures.step_s]
        if missing:
            notes.append(f"{', '.join(map(str, missing))} processes not measured: over the measurement's budget of "
                         f"{budget:.1f} s ({BUDGET_SHARE:.0%} of the predicted run, {BUDGET_FLOOR_S:.0f} to "
                         f"{BUDGET_CAP_S:.0f} s) or the free memory")
        figures.gradient_bytes = timer.gradient_bytes(job.bf16)
        numel = figures.gradient_bytes // (2 if job.bf16 else 4)
        timer.release()
        timer = None
        predicted = predict(figures)
        # Only a count that beats one process even with free communication needs its all-reduce measured.
        for n in [n for n in predicted if n > 1 and predicted[n] >= MARGIN * predicted[1]]:
            figures.allreduce_s[n] = job_measure.allreduce_seconds(topology.split_cores(n, cpus), numel, job.bf16)
        predicted = predict(figures)
        n = choose(predicted)
        return Decision(n, _reason(n, predicted, counts), figures, predicted)
    except job_measure.MeasureError as exc:
        return Decision(1, str(exc))
    except Exception as exc:  # noqa: BLE001 - never fail the user's run over a measurement
        return Decision(1, f"the measurement failed ({type(exc).__name__}: {exc})")
    finally:
        if timer is not None:
            timer.release()


def _too_short(run_s: float | None, figures: Figures) -> bool:
    """Even ranks that scale perfectly would not end the run :data:`MARGIN` sooner, once started."""
    return run_s is not None and run_s * (1 / MARGIN - 1 / max(figures.threads)) < figures.startup_s


def _short(run_s: float | None, figures: Figures) -> Decision:
    return Decision(1, f"the run is too short to repay starting ranks: about {run_s:.0f} s of training steps in "
                       f"one process, against about {figures.startup_s:.1f} s to start the ranks", figures)


def _budget(run_s: float | None) -> float:
    if run_s is None:
        return BUDGET_CAP_S
    return min(BUDGET_CAP_S, max(BUDGET_FLOOR_S, BUDGET_SHARE * run_s))


def _interleave(timer: job_measure.StepTimer, figures: Figures, deadline: float, cold: float) -> None:
    """Time the step of each count, round after round (so that a slow moment on a shared machine hits them alike),
    keeping each count's fastest, until ``deadline``. A count is timed only where its step, at worst no faster than
    on every core scaled by the share, still fits, and where its copies fit in half the free memory."""
    import psutil

    free = psutil.virtual_memory().available
    per_copy = timer.memory_per_copy()
    for _ in range(ROUNDS):
        timed = False
        for n, t in sorted(figures.threads.items()):
            guess = figures.step_s.get(n) or figures.step_s.get(1, cold) * figures.cores / t
            if time.perf_counter() + guess > deadline or (n - 1) * per_copy > free / 2:
                continue
            if n == 1:
                seconds, _ = timer.seconds(t, 1, 0.05, 0.05)
            else:  # short steps are timed several times, as one step alone says little
                seconds = timer.concurrent_seconds(n, t, steps=max(1, min(20, int(0.05 / max(guess, 1e-4)))))
            figures.step_s[n] = min(seconds, figures.step_s.get(n, seconds))
            timed = True
        if not timed:
            return


def _batch_size(info: job_measure.BatchInfo | None, args: tuple, kwargs: dict) -> int:
    if info is not None and info.batch_size:
        return int(info.batch_size)
    t = job_measure.first_tensor([*args, *kwargs.values()])
    return int(t.shape[0]) if t is not None and t.dim() else 1


def _reason(n: int, predicted: dict[int, float], counts: dict[int, int]) -> str:
    one = predicted.get(1)
    others = {k: v for k, v in predicted.items() if k > 1}
    if n > 1 and one:
        return f"{n} processes of {counts[n]} cores predicted {predicted[n] / one:.2f}x one process"
    if not others or not one:
        return "no other count could be measured within the budget"
    best = max(others, key=lambda k: others[k])
    return (f"{best} processes of {counts[best]} cores predicted {others[best] / one:.2f}x one process, under the "
            f"{MARGIN:.2f}x needed")


def publish(decision: Decision) -> None:
    """Keep the count for the ranks and later Trainers, log the one line, and put the figures in the report."""
    from .. import report
    from . import warm_start

    os.environ[AUTO_ENV] = str(decision.processes)
    if decision.processes == 1:
        warm_start.stop()  # no rank will start
    log.warning("%s", decision.line())
    if report.stats is not None:
        report.note("num_processes", decision.as_dict())
