"""``num_processes="auto"``: decided at ``Trainer.fit`` from a measurement of the job (``train/instance_count.py``,
``train/job_measure.py``), leaving the user's module, optimizer and every generator as they were."""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _procs import assert_clean_exit
from _rng import rng_differences, rng_state, seed_all
from torch.utils.data import DataLoader, Dataset

import nano_patch
from nano_patch import report
from nano_patch.train import auto_trainer, instance_count, job_measure, topology

pl = pytest.importorskip("pytorch_lightning")

SCRIPTS = Path(__file__).parent / "scripts"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.fixture(autouse=True)
def _no_decision(monkeypatch):
    """No count decided before the test, and none left after it."""
    monkeypatch.setenv(instance_count.AUTO_ENV, "0")
    monkeypatch.delenv(instance_count.AUTO_ENV)


def _fake_cores(monkeypatch, n: int) -> None:
    """A machine of ``n`` physical cores on one node, as topology sees it."""
    cores = [topology.Core(cpu=i, node=0, core_key=(0, i)) for i in range(n)]
    monkeypatch.setattr(topology, "physical_cores", lambda cpus=None: list(cores))


class TinyModule(pl.LightningModule):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(width, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class RandomDataset(Dataset):
    """Each sample draws from torch's, Python's and NumPy's global generators, as augmentations do."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        noise = torch.rand(8) + random.random() + float(np.random.rand())
        return noise, i % 3


def _loader() -> DataLoader:
    return DataLoader(RandomDataset(), batch_size=16, shuffle=True)


def _trainer(**kwargs):
    nano_patch.patch_torch(num_processes="auto")
    return pl.Trainer(accelerator="cpu", max_epochs=50, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def _decide_at_fit(trainer, model, loader) -> None:
    """What the patched ``Trainer.fit`` does before Lightning's launcher runs."""
    auto_trainer.decide_at_fit(trainer, vars(trainer).pop("_nano_auto"), model, (model, loader), {}, False)


def _fake_measurement(monkeypatch, step_s, allreduce_s: float, sample_s: float = 0.0) -> None:
    """Measurements replaced: ``step_s(threads)`` seconds per step, ``allreduce_s`` per all-reduce."""
    info = job_measure.BatchInfo(("seq", [("tensor", (16, 8), torch.float32), ("tensor", (16,), torch.int64)]),
                                 16, 1000, 0, sample_s)
    monkeypatch.setattr(job_measure, "first_batch", lambda *a, **k: info)
    monkeypatch.setattr(instance_count, "startup_seconds", lambda: 4.0)

    class FakeTimer:
        def __init__(self, model, args, kwargs, bf16=False, channels_last=False, notes=None):
            self.params = list(model.parameters())

        def warm_up(self):
            return step_s(torch.get_num_threads())

        def seconds(self, threads, min_steps, min_s, cap_s):
            return step_s(threads), step_s(threads)

        def concurrent_seconds(self, copies, threads, steps=1):
            return step_s(threads)

        def memory_per_copy(self):
            return 1

        def gradient_bytes(self, bf16):
            return sum(p.numel() for p in self.params) * 4

        def release(self):
            pass

    monkeypatch.setattr(job_measure, "StepTimer", FakeTimer)
    monkeypatch.setattr(job_measure, "allreduce_seconds", lambda groups, numel, bf16, timeout=60: allreduce_s)


# -- the decision ------------------------------------------------------------------------------------------------


def test_auto_picks_one_process_where_the_prediction_says_more_lose(monkeypatch):
    """16 cores, a step that keeps speeding up with threads and a large all-reduce: one process. (The old rule
    took one process per 4 cores on nodes of 8 or more: 4 here.)"""
    _fake_cores(monkeypatch, 16)
    _fake_measurement(monkeypatch, step_s=lambda t: 0.01 + 1.6 / t, allreduce_s=0.08)
    trainer, model = _trainer(), TinyModule()
    _decide_at_fit(trainer, model, _loader())
    assert trainer.world_size == 1 and "NanoDDP" not in type(trainer.strategy).__name__
    assert os.environ[instance_count.AUTO_ENV] == "1"


def test_a_small_model_that_barely_speeds_up_with_threads_gets_several_processes(monkeypatch, caplog):
    """4 cores (the old rule: 1 process below 8 cores), a step 5% faster on 4 threads than on 1, few parameters:
    more than one process, Lightning's DDP strategy with nano-patch's pinning, and one log line with the figures."""
    _fake_cores(monkeypatch, 4)
    _fake_measurement(monkeypatch, step_s=lambda t: 0.1 * (1 - 0.05 * (t - 1) / 3), allreduce_s=0.001)
    trainer, model = _trainer(), TinyModule()
    with caplog.at_level(logging.WARNING, logger="nano_patch"):
        _decide_at_fit(trainer, model, _loader())
    n = trainer.world_size
    assert n > 1 and type(trainer.strategy).__name__ == "NanoDDPStrategy" and trainer.num_devices == n
    assert os.environ[instance_count.AUTO_ENV] == str(n)
    lines = [r.getMessage() for r in caplog.records if "num_processes='auto'" in r.getMessage()]
    assert len(lines) == 1 and f"-> {n} processes" in lines[0] and "predicted samples/s" in lines[0], lines


def test_predict_and_choose_apply_the_margin():
    f = instance_count.Figures(cores=4, threads={1: 4, 2: 2, 4: 1}, batch_size=10,
                               step_s={1: 0.1, 2: 0.18, 4: 0.4}, allreduce_s={2: 0.0, 4: 0.0})
    predicted = instance_count.predict(f)
    assert predicted[1] == pytest.approx(100) and predicted[2] == pytest.approx(2 * 10 / 0.18)
    assert predicted[4] == pytest.approx(100)
    assert instance_count.choose(predicted) == 2  # 1.11x
    f.allreduce_s[2] = 0.01  # 1.05x: under the margin
    assert instance_count.choose(instance_count.predict(f)) == 1
    f.sample_s, f.allreduce_s = 0.01, {2: 0.0, 4: 0.0}  # loading in the training process narrows the margin
    assert instance_count.choose(instance_count.predict(f)) == 1
    f.sample_s, f.steps_total, f.startup_s = 0.0, 20, 5.0  # a short run cannot repay the ranks' start
    assert instance_count.choose(instance_count.predict(f)) == 1


def test_an_explicit_count_is_never_second_guessed(monkeypatch):
    monkeypatch.setattr(instance_count, "decide", lambda *a, **k: pytest.fail("measured an explicit count"))
    nano_patch.patch_torch(num_processes=2)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.world_size == 2 and "_nano_auto" not in vars(trainer)


def test_a_rank_takes_the_count_its_launcher_chose_without_measuring(monkeypatch):
    monkeypatch.setenv(instance_count.AUTO_ENV, "2")
    monkeypatch.setattr(instance_count, "decide", lambda *a, **k: pytest.fail("a rank measured again"))
    trainer = _trainer()
    assert trainer.world_size == 2 and "_nano_auto" not in vars(trainer)


def test_the_decision_goes_to_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "stats", report.Stats(str(tmp_path)))
    f = instance_count.Figures(cores=2, threads={1: 2, 2: 1}, batch_size=16, step_s={1: 0.07, 2: 0.12})
    decision = instance_count.Decision(1, "2 processes of 1 cores predicted 0.90x one process, under the 1.10x "
                                          "needed", f, instance_count.predict(f), 0.8)
    instance_count.publish(decision)
    out = report.compose(1.0, [], [], [], False, False)
    assert out["num_processes"]["processes"] == 1 and out["num_processes"]["figures"]["step_s"] == {"1": 0.07,
                                                                                                    "2": 0.12}
    text = report.render(out)
    assert "num_processes='auto': 1 (2 processes of 1 cores predicted 0.90x" in text and "predicted samples/s" in text


# -- each case that is not measured, and why ---------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"accelerator": "gpu"}, "accelerator='gpu'"),
    ({"strategy": "deepspeed"}, "strategy='deepspeed' is not the plain data parallelism"),
    ({"num_nodes": 2}, "num_nodes=2"),
])
def test_trainer_arguments_that_leave_auto_one_process_say_why(monkeypatch, kwargs, reason):
    cls = type("Strategy", (), {})
    assert reason in auto_trainer.skip_reason(kwargs, True, "popen", cls)


def test_a_trainer_on_a_gpu_is_not_measured(monkeypatch, caplog):
    """What the Trainer runs on is known at fit: a GPU accelerator is one process, with the reason logged."""
    monkeypatch.setattr(job_measure, "first_batch", lambda *a, **k: pytest.fail("measured a GPU run"))
    trainer, model = _trainer(), TinyModule()
    monkeypatch.setattr(type(trainer), "accelerator", property(lambda self: type("CUDAAccelerator", (), {})()))
    with caplog.at_level(logging.WARNING, logger="nano_patch"):
        _decide_at_fit(trainer, model, _loader())
    assert os.environ[instance_count.AUTO_ENV] == "1"
    assert any("-> 1 process: the Trainer trains on its CUDAAccelerator (a GPU)" in r.getMessage()
               for r in caplog.records), caplog.text


def test_skip_reasons_reach_the_decision(monkeypatch, caplog):
    """A GPU, a strategy that is not data parallel, a model that cannot be copied, one core, forked ranks, a run too
    short to repay starting ranks: each is one process, with its reason in the log line."""
    _fake_cores(monkeypatch, 4)
    cases = []

    def decide(job):
        d = instance_count.decide(job)
        cases.append(d)
        return d

    # a GPU (what the Trainer patch finds at fit) and a strategy (what it finds in the arguments)
    gpu = "the Trainer trains on its CUDAAccelerator (a GPU), and auto counts CPU processes"
    assert "a GPU" in decide(instance_count.TrainingJob(TinyModule(), skip=gpu)).reason
    # a model that cannot be copied
    unpicklable = TinyModule()
    unpicklable.lock = threading.Lock()
    d = decide(instance_count.TrainingJob(unpicklable, _loader()))
    assert d.processes == 1 and "the model cannot be copied" in d.reason, d.reason
    # too few cores to share out
    _fake_cores(monkeypatch, 3)
    assert "3 physical cores: each process needs at least 2" in decide(
        instance_count.TrainingJob(TinyModule(), _loader())).reason
    # a short run: 2 epochs of 4 steps cannot repay seconds of start-up
    _fake_cores(monkeypatch, 4)
    d = decide(instance_count.TrainingJob(TinyModule(), _loader(), max_epochs=2))
    assert d.processes == 1 and "too short to repay starting ranks" in d.reason, d.reason
    assert all(c.processes == 1 for c in cases)
    assert "forked from this process" in auto_trainer.skip_reason({}, True, "fork", type("S", (), {}))


def test_a_forward_that_draws_from_a_global_generator_is_refused_before_it_draws(monkeypatch):
    class Noisy(TinyModule):
        def __init__(self, draw):
            super().__init__()
            self.draw = draw

        def forward(self, x):
            return self.net(x) + self.draw(x)

    _fake_cores(monkeypatch, 4)
    for draw, what in ((lambda x: torch.randn_like(x[:, :3]), "torch's"),
                       (lambda x: random.random(), "Python's random")):
        model, loader = Noisy(draw), _loader()
        seed_all(3)
        before = rng_state()
        d = instance_count.decide(instance_count.TrainingJob(model, loader, max_epochs=100))
        assert d.processes == 1 and what in d.reason and "even in eval mode" in d.reason, d.reason
        assert rng_differences(rng_state(), before) == []


# -- the measurement ------------------------------------------------------------------------------------------------


def test_the_measurement_gives_sane_figures_on_a_tiny_model():
    model = TinyModule(width=64)
    info = job_measure.first_batch(_loader(), None, model)
    assert info.batch_size == 16 and info.steps_per_epoch == 4 and info.num_workers == 0
    assert info.spec == ("seq", [("tensor", (16, 8), torch.float32), ("tensor", (16,), torch.int64)])
    assert 0 <= info.sample_s < 0.1
    args, kwargs = job_measure.model_input(info, None, torch.Generator().manual_seed(0))
    assert args[0].shape == (16, 8) and not kwargs
    timer = job_measure.StepTimer(model, args, kwargs)
    threads = torch.get_num_threads()
    assert 0 < timer.warm_up() < 5
    for t in (2, 1):
        step, spent = timer.seconds(t, 2, 0.0, 1.0)
        assert 1e-6 < step < 0.5 and spent >= step
        assert torch.get_num_threads() == threads
    together = timer.concurrent_seconds(2, 1, steps=3)  # two copies stepping at once, one thread each
    assert 1e-6 < together < 0.5 and len(timer.others) == 1 and torch.get_num_threads() == threads
    assert timer.memory_per_copy() >= 2 * sum(p.numel() * 4 for p in model.parameters())
    assert timer.gradient_bytes(False) == sum(p.numel() * 4 for p in model.parameters())
    assert timer.gradient_bytes(True) == sum(p.numel() * 2 for p in model.parameters())
    seconds = job_measure.allreduce_seconds([[c] for c in sorted(os.sched_getaffinity(0))[:2]] if TWO_CORES
                                            else [[0], [0]], 1_000_000, False)
    assert 1e-6 < seconds < 2.0


def test_decide_measures_a_real_job_end_to_end(monkeypatch):
    _fake_cores(monkeypatch, 4)  # candidates 1 x 4 and 2 x 2 (on however many cores there are)
    monkeypatch.setattr(instance_count, "startup_seconds", lambda: 0.1)  # not this test process's age
    d = instance_count.decide(instance_count.TrainingJob(TinyModule(width=64), _loader(), max_epochs=1000))
    f = d.figures
    assert f is not None and f.batch_size == 16 and f.steps_total == 4000, d.line()
    assert set(f.step_s) == {1, 2} and all(0 < s < 1 for s in f.step_s.values()), d.line()
    assert d.processes in f.threads and d.measure_s < 10, d.line()
    assert "num_processes='auto' ->" in d.line() and "step" in d.line()


def test_the_measurement_leaves_the_module_optimizer_and_every_generator_untouched(monkeypatch):
    """State dicts, gradients, train/eval mode, optimizer state and the torch, Python and NumPy generators are the
    same after the measurement; torch's global generator never changes while it runs (no save and restore)."""
    monkeypatch.setattr(instance_count, "startup_seconds", lambda: 0.1)  # a run long enough to be measured
    _fake_cores(monkeypatch, 4)
    model = TinyModule()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.rand(4, 8)).sum().backward()
    optimizer.step()  # optimizer state exists
    state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    model.eval()
    seed_all(7)
    before = rng_state()
    seen, stop = [], threading.Event()
    # The measurement forks. A fork while the watcher is inside get_rng_state copies the generator's mutex held,
    # and the child would wait on it forever (as a stock fork worker would): the watcher reads only between forks.
    between_forks = threading.Lock()
    watching = [True]
    os.register_at_fork(before=lambda: watching[0] and between_forks.acquire(),
                        after_in_parent=lambda: watching[0] and between_forks.release(),
                        after_in_child=lambda: watching[0] and between_forks.release())

    def watch():
        while not stop.is_set():
            with between_forks:
                seen.append(torch.get_rng_state())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        d = instance_count.decide(instance_count.TrainingJob(model, _loader(), max_epochs=1000))
    finally:
        stop.set()
        watcher.join()
        watching[0] = False
    assert d.figures is not None and d.figures.step_s, d.line()
    assert rng_differences(rng_state(), before) == []
    assert seen and all(torch.equal(s, before[0]) for s in seen)
    assert not model.training
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    after = optimizer.state_dict()
    assert after["param_groups"] == opt_state["param_groups"]
    assert all(torch.equal(opt_state["state"][i][k], v) for i, s in after["state"].items() for k, v in s.items()
               if isinstance(v, torch.Tensor))


def test_example_input_array_stands_in_for_an_unreadable_batch():
    class WithExample(TinyModule):
        def __init__(self):
            super().__init__()
            self.example_input_array = torch.zeros(1, 8)

    info = job_measure.BatchInfo(("map", {"x": ("tensor", (5, 8), torch.float32)}), 5, None, 0, None)
    args, _ = job_measure.model_input(info, WithExample().example_input_array, torch.Generator())
    assert args[0].shape == (5, 8)
    with pytest.raises(job_measure.MeasureError, match="example_input_array"):
        job_measure.model_input(info, None, torch.Generator())


# -- in real processes ----------------------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_a_count_chosen_at_fit_starts_lightnings_ranks(tmp_path):
    """The decision (forced to 2 here) gives the Trainer nano-patch's strategy at fit; Lightning's launcher starts
    the second rank, which takes the count without measuring: two pinned ranks, equal weights."""
    cmd = [sys.executable, "-m", "nano_patch", "run", "--num-processes", "auto", str(SCRIPTS / "auto_forced.py"),
           str(tmp_path), "max_steps=4", "batch=16"]
    proc = subprocess.run(cmd, env=_env(FORCED_PROCESSES="2"), capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert_clean_exit(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 and r["strategy"] == "NanoDDPStrategy" for r in ranks)
    assert not set(ranks[0]["affinity"]) & set(ranks[1]["affinity"])
    w0, w1 = (torch.load(r["weights"], weights_only=True) for r in ranks)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert proc.stderr.count("num_processes='auto' -> 2 processes: forced to 2 by the test") == 1


def test_auto_runs_an_unchanged_script_and_says_what_it_chose(tmp_path):
    cmd = [sys.executable, "-m", "nano_patch", "run", "--num-processes", "auto", str(SCRIPTS / "digits_lightning.py"),
           str(tmp_path), "epochs=1", "batch=16"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert_clean_exit(proc)
    lines = [ln for ln in proc.stderr.splitlines() if "num_processes='auto' ->" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    world = json.loads((tmp_path / "rank0.json").read_text())["world"]
    assert f"-> {world} process" in lines[0]
