"""``@nano``, ``TorchNano`` and ``Trainer.compile`` on real processes: averaged gradients, pinned ranks, accuracy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _procs import assert_clean_exit

import nano_patch
from nano_patch.config import ConfigError

SCRIPT = Path(__file__).parent / "scripts" / "digits_fabric.py"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def _run(out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=out)
    assert_clean_exit(proc)  # rank 0 waits for the ranks it started: its status covers them
    return proc


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _max_diff(a: str, b: str) -> float:
    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    """One process, plain PyTorch, global batch 32: the reference for two ranks of batch 16."""
    out = tmp_path_factory.mktemp("single")
    _run(out, "api=plain", "batch=32", "steps=6")
    return _json(out / "rank0.json")


def _check_two_ranks(out: Path, single: dict) -> None:
    r0, r1 = _json(out / "rank0.json"), _json(out / "rank1.json")
    assert r0["world"] == r1["world"] == 2 and r0["pid"] != r1["pid"]
    assert r0["steps"] == r1["steps"] == single["steps"] == 6
    assert r0["affinity"] and r1["affinity"] and not set(r0["affinity"]) & set(r1["affinity"])
    for r in (r0, r1):
        assert r["threads"] == len(r["affinity"])
        assert all(a == r["affinity"] for a in r["task_affinity"]), "a thread escaped the pinning"
    assert _max_diff(r0["weights"], r1["weights"]) == 0.0
    # Averaged gradients: two ranks of 16 equal one process over the same 32 samples.
    assert _max_diff(r0["weights"], single["weights"]) < 1e-5
    assert _max_diff(single["weights"], str(Path(single["weights"]).parent / "init.pt")) > 1e-3
    returned = _json(out / "returned.json")
    assert returned["rank"] == 0 and returned["pid"] == r0["pid"]


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_nano_decorator_two_ranks_average_gradients(tmp_path, single):
    """@nano(num_processes=2) with positional arguments, started by Lightning's script re-run."""
    _run(tmp_path, "api=nano", "processes=2", "batch=16", "steps=6")
    _check_two_ranks(tmp_path, single)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_nano_decorator_finds_keyword_arguments_under_fork(tmp_path, single):
    """Model, optimizer and loader passed by keyword are found; fork returns rank 0's value through a queue."""
    _run(tmp_path, "api=nano_kw", "processes=2", "batch=16", "steps=6", "start_method=fork")
    _check_two_ranks(tmp_path, single)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_torchnano_two_ranks_under_spawn(tmp_path, single):
    """A TorchNano subclass defined in the script, pickled to spawned ranks."""
    _run(tmp_path, "api=torchnano", "processes=2", "batch=16", "steps=6", "start_method=spawn")
    _check_two_ranks(tmp_path, single)


def test_nano_bf16_and_channels_last_reach_fp32_accuracy(tmp_path):
    """bf16 autocast and channels-last really run (conv output dtype, input layout), within 5 points of fp32."""
    fp32, fast = tmp_path / "fp32", tmp_path / "fast"
    _run(fp32, "api=nano", "epochs=3", "steps=100000", "batch=32")
    _run(fast, "api=nano", "epochs=3", "steps=100000", "batch=32", "precision=bf16", "channels_last=1")
    a, b = _json(fp32 / "returned.json"), _json(fast / "returned.json")
    assert a["conv_output_dtype"] == "torch.float32" and b["conv_output_dtype"] == "torch.bfloat16"
    assert not a["channels_last_weights"] and b["channels_last_weights"] and b["conv_input_channels_last"]
    assert a["accuracy"] > 0.7, a["accuracy"]  # 3 epochs of SGD over unshuffled digits: about 0.8
    assert b["accuracy"] > a["accuracy"] - 0.05, (a["accuracy"], b["accuracy"])


def test_torchnano_auto_lr_scales_and_warms_up(monkeypatch):
    """World size 4 (faked): lr x4, warming up linearly from the original lr over one epoch of 4 steps."""
    from torch.utils.data import DataLoader, TensorDataset

    from nano_patch import TorchNano

    class Probe(TorchNano):
        def train(self):
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            seen = []
            inner = opt.step

            def step(*a, **k):  # what the optimizer really uses, inside the warmup wrap
                seen.append(opt.param_groups[0]["lr"])
                return inner(*a, **k)

            opt.step = step
            loader = DataLoader(TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1)), batch_size=2)
            model, opt, loader = self.setup(model, opt, loader)
            for x, y in loader:
                opt.zero_grad()
                self.backward(torch.nn.functional.mse_loss(model(x), y))
                opt.step()
            return seen, opt.param_groups[0]["lr"]

    monkeypatch.setattr(TorchNano, "world_size", property(lambda self: 4))
    seen, lr_after = Probe(auto_lr=True).train()
    assert lr_after == pytest.approx(0.4)
    assert seen == pytest.approx([0.1, 0.1 + 0.3 / 4, 0.1 + 0.3 / 2, 0.1 + 0.3 * 3 / 4])


def test_nano_errors_name_the_argument():
    from nano_patch import TorchNano, nano

    with pytest.raises(ConfigError, match="num_processes"):
        TorchNano(num_processes=0)
    with pytest.raises(ConfigError, match="precision"):
        TorchNano(precision="16")
    with pytest.raises(ConfigError, match="devices"):
        TorchNano(num_processes=2, devices=3)
    with pytest.raises(ConfigError, match="start_method"):
        TorchNano(start_method="thread")

    @nano()
    def no_model(loader):
        return loader

    with pytest.raises(TypeError, match="no nn.Module with parameters"):
        no_model([1, 2])


def test_trainer_compile_trains_digits():
    """A plain nn.Module, loss and optimizer through Trainer.compile reach 90% on held-out digits."""
    import pytorch_lightning as pl
    import torchmetrics
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, TensorDataset

    nano_patch.patch_torch(vision=False, dataloader=False)
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    module = pl.Trainer.compile(model, torch.nn.CrossEntropyLoss(), opt, scheduler=sched,
                                metrics=[torchmetrics.Accuracy(task="multiclass", num_classes=10)])
    assert isinstance(module, pl.LightningModule) and module.model is model
    assert pl.Trainer.compile(module, None, None) is module  # a LightningModule comes back as it is
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    val = DataLoader(TensorDataset(x[1400:], y[1400:]), batch_size=64)
    trainer.fit(module, DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=32, shuffle=True), val)
    metrics = trainer.callback_metrics
    assert {"train/loss", "val/loss", "val/accuracy"} <= set(metrics)
    assert metrics["val/accuracy"] > 0.9, metrics
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)  # the scheduler stepped per epoch
    with torch.no_grad():
        manual = (model(x[1400:]).argmax(1) == y[1400:]).float().mean()
    assert metrics["val/accuracy"] == pytest.approx(manual.item(), abs=1e-6)
    with pytest.raises(TypeError, match="optimizer"):
        pl.Trainer.compile(model, torch.nn.CrossEntropyLoss(), None)
    nano_patch.unpatch_torch()
    assert not hasattr(pl.Trainer, "compile")
