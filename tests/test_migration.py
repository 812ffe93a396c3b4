"""Trainer arguments of BigDL-Nano and Lightning 1.x, under both Lightning namespaces."""

from __future__ import annotations

import warnings

import pytest
import torch

import nano_patch
from nano_patch.config import ConfigError
from nano_patch.train import legacy

NAMESPACES = ["pytorch_lightning", "lightning.pytorch"]
COMMON = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}


@pytest.fixture(params=NAMESPACES)
def pl(request):
    import importlib

    module = importlib.import_module(request.param)
    nano_patch.patch_torch()
    legacy._warn_once.cache_clear()
    yield module
    legacy._warn_once.cache_clear()


def _trainer(pl, **kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = pl.Trainer(**COMMON, **kwargs)
    return trainer, [str(w.message) for w in seen if issubclass(w.category, legacy.NanoPatchMigrationWarning)]


def test_use_ipex_is_accepted_and_bf16_still_autocasts(pl):
    t, said = _trainer(pl, use_ipex=True, precision="bf16", accelerator="cpu")
    assert t.precision == "bf16-mixed"
    assert len(said) == 1 and "IPEX is retired" in said[0] and "use_ipex=True" in said[0]
    _, again = _trainer(pl, use_ipex=True, accelerator="cpu")
    assert again == [], "each argument warns once"


@pytest.mark.parametrize(("backend", "method"), [("subprocess", "popen"), ("spawn", "spawn"), ("ddp", "popen")])
def test_distributed_backend_chooses_the_start_method(pl, backend, method):
    t, said = _trainer(pl, distributed_backend=backend, num_processes=2)
    assert type(t.strategy).__name__.startswith("NanoDDPStrategy") and t.num_devices == 2
    assert t.strategy._start_method == method
    assert len(said) == 1 and f"distributed_backend={backend!r}" in said[0]


@pytest.mark.parametrize("backend", ["ray", "k8s"])
def test_backends_beyond_one_machine_name_torchrun_and_slurm(pl, backend):
    with pytest.raises(ConfigError, match="torchrun") as exc:
        pl.Trainer(**COMMON, distributed_backend=backend, num_processes=2)
    assert "SLURM" in str(exc.value) and backend in str(exc.value)
    with pytest.raises(ConfigError, match="accepted values"):
        pl.Trainer(**COMMON, distributed_backend="horovod")


def test_lightning_1x_ddp_and_dp(pl):
    t, said = _trainer(pl, distributed_backend="ddp", accelerator="cpu", devices=2)
    assert type(t.strategy) is pl.strategies.DDPStrategy and t.num_devices == 2
    assert "now strategy='ddp'" in said[0]
    t, said = _trainer(pl, distributed_backend="dp", accelerator="cpu", devices=2)
    assert type(t.strategy) is pl.strategies.DDPStrategy
    assert any("per process" in s for s in said)
    with pytest.raises(ConfigError, match="strategy"):
        pl.Trainer(**COMMON, distributed_backend="ddp", strategy="ddp_spawn")


def _outcome(make):
    try:
        return type(make().strategy).__name__
    except Exception as exc:  # noqa: BLE001 - comparing what stock does
        return type(exc)


@pytest.mark.parametrize("gpus", [2, [0, 1]])
def test_gpus_become_accelerator_and_devices_with_stocks_own_outcome(pl, gpus):
    got = _outcome(lambda: _trainer(pl, gpus=gpus)[0])
    nano_patch.unpatch_torch()
    stock = _outcome(lambda: pl.Trainer(**COMMON, accelerator="gpu", devices=gpus))
    assert got == stock  # on a machine without CUDA: stock's own exception class for accelerator="gpu"
    if not torch.cuda.is_available():
        assert isinstance(stock, type) and issubclass(stock, Exception)


def test_gpus_zero_means_the_cpu(pl):
    t, said = _trainer(pl, gpus=0)
    assert t.accelerator.__class__.__name__ == "CPUAccelerator" and "ignored" in said[0]


def test_use_amp_is_bf16_on_the_cpu_and_amp_level_is_ignored(pl):
    t, said = _trainer(pl, use_amp=True, amp_level="O2", accelerator="cpu")
    assert t.precision == "bf16-mixed"
    assert any("precision='bf16-mixed'" in s for s in said) and any("apex" in s for s in said)
    with pytest.raises(ConfigError, match="precision"):
        pl.Trainer(**COMMON, use_amp=True, precision="32-true")


def test_use_amp_is_16_mixed_on_a_gpu():
    kwargs = {"accelerator": "gpu"}
    assert legacy.translate(kwargs, {"use_amp": True}, multi_instance=False, cuda=False) is None
    assert kwargs["precision"] == "16-mixed"
    kwargs = {}
    legacy.translate(kwargs, {"use_amp": True}, multi_instance=False, cuda=True)
    assert kwargs["precision"] == "16-mixed"


def test_nb_gpu_nodes_is_num_nodes(pl):
    t, said = _trainer(pl, nb_gpu_nodes=2, accelerator="cpu")
    assert t.num_nodes == 2 and "num_nodes=2" in said[0]
    with pytest.raises(ConfigError, match="num_nodes"):
        pl.Trainer(**COMMON, nb_gpu_nodes=2, num_nodes=3)


def test_any_other_unknown_argument_keeps_stocks_type_error(pl):
    with pytest.raises(TypeError, match="no_such_argument"):
        pl.Trainer(**COMMON, no_such_argument=1)
    nano_patch.unpatch_torch()
    with pytest.raises(TypeError, match="use_ipex"):
        pl.Trainer(**COMMON, use_ipex=True)  # stock rejects it: accepting it changes no script that runs today
