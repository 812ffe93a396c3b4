"""Options, their environment variables, and errors that name the option and the accepted values."""

from __future__ import annotations

import pytest

import nano_patch
from nano_patch import config
from nano_patch.config import ConfigError


def test_environment_is_read_and_explicit_wins():
    env = {"NANO_PATCH_NUM_PROCESSES": "2", "NANO_PATCH_PRECISION": "bf16", "NANO_PATCH_CHANNELS_LAST": "yes",
           "NANO_PATCH_CPU_FOR_EACH_PROCESS": "0;1", "NANO_PATCH_AUTO_LR": '{"warmup_epochs": 3}'}
    opts = config.resolve({}, env)
    assert (opts.num_processes, opts.precision, opts.channels_last) == (2, "bf16", True)
    assert opts.cpu_for_each_process == ((0,), (1,)) and opts.auto_lr == {"warmup_epochs": 3}
    opts = config.resolve({"precision": "32", "channels_last": False, "num_processes": 2}, env)
    assert (opts.precision, opts.channels_last) == ("32", False)


@pytest.mark.parametrize(
    ("kwargs", "env", "names"),
    [
        ({"num_processes": 0}, {}, ["num_processes", "positive int"]),
        ({"num_processes": "many"}, {}, ["num_processes", '"auto"']),
        ({}, {"NANO_PATCH_NUM_PROCESSES": "-1"}, ["NANO_PATCH_NUM_PROCESSES", "positive int"]),
        ({"precision": "fp8"}, {}, ["precision", '"bf16"']),
        ({}, {"NANO_PATCH_PRECISION": "16"}, ["NANO_PATCH_PRECISION", '"bf16"']),
        ({"channels_last": "maybe"}, {}, ["channels_last", "bool"]),
        ({"cpu_for_each_process": [[0], []]}, {}, ["cpu_for_each_process", "non-empty"]),
        ({"cpu_for_each_process": [[0, 1], [1]]}, {}, ["cpu_for_each_process", "twice"]),
        ({"auto_lr": {"warmup": 1}}, {}, ["auto_lr", "warmup_epochs"]),
        ({"num_processes": 3, "cpu_for_each_process": [[0], [1]]}, {}, ["num_processes", "cpu_for_each_process"]),
        ({"colour": True}, {}, ["colour", "num_processes"]),
        ({}, {"NANO_PATCH_NUM_PROCESS": "2"}, ["NANO_PATCH_NUM_PROCESS", "NANO_PATCH_NUM_PROCESSES"]),
    ],
)
def test_bad_input_names_option_and_accepted_values(kwargs, env, names):
    with pytest.raises(ConfigError) as exc:
        config.resolve(kwargs, env)
    for n in names:
        assert n in str(exc.value)


def test_bad_option_patches_nothing(monkeypatch):
    import torchvision.transforms.functional as F

    before = F.to_tensor.__code__
    monkeypatch.setenv("NANO_PATCH_PRECISION", "fp8")
    with pytest.raises(ConfigError, match="NANO_PATCH_PRECISION"):
        nano_patch.patch_torch()
    assert not nano_patch.is_patched() and F.to_tensor.__code__ is before
    monkeypatch.delenv("NANO_PATCH_PRECISION")
    with pytest.raises(ConfigError, match="unknown nano-patch option 'precison'"):
        nano_patch.patch_torch(precison="bf16")
    assert F.to_tensor.__code__ is before


def test_switches_choose_groups():
    import torch.utils.data as tud
    import torchvision.transforms.functional as F

    before_loader, before_tt = vars(tud.DataLoader)["__init__"], F.to_tensor.__code__
    nano_patch.patch_torch(vision=False)
    assert F.to_tensor.__code__ is before_tt and vars(tud.DataLoader)["__init__"] is not before_loader
    states = {row["name"]: row["state"] for row in nano_patch.status()["patches"]}
    assert states["vision_transforms"] == "disabled" and states["dataloader"] == "applied"
    nano_patch.patch_torch(vision=True)
    assert F.to_tensor.__code__ is not before_tt
