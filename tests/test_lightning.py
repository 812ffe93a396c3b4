"""The Trainer patch in real processes: pinned ranks, averaged gradients, bf16, channels-last, crashes."""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _procs import assert_clean_exit

import nano_patch
from nano_patch.config import ConfigError

SCRIPT = Path(__file__).parent / "scripts" / "digits_lightning.py"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _run(out: Path, *args: str, via_nano: bool = True, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nano_patch", "run"] if via_nano else [sys.executable]
    return subprocess.run([*cmd, str(SCRIPT), str(out), *args], env=_env(**env), capture_output=True, text=True,
                          timeout=timeout, cwd=out)


def _ranks(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _weights(path: str) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_unchanged_script_two_pinned_ranks_average_gradients(tmp_path):
    """`nano-patch run` + NANO_PATCH_NUM_PROCESSES=2: disjoint cores, 1 thread each, identical weights,
    equal to one process over the same global batch."""
    multi, single = tmp_path / "multi", tmp_path / "single"
    multi.mkdir(), single.mkdir()
    proc = _run(multi, "max_steps=6", "batch=16", NANO_PATCH_NUM_PROCESSES="2")
    assert_clean_exit(proc)  # popen: the run waits for the re-run rank, so this covers both ranks
    r0, r1 = _ranks(multi, 2)
    assert r0["world"] == r1["world"] == 2 and r0["pid"] != r1["pid"]
    assert r0["strategy"] == "NanoDDPStrategy"
    assert r0["affinity"] and r1["affinity"] and not set(r0["affinity"]) & set(r1["affinity"])
    for r in (r0, r1):
        assert r["threads"] == len(r["affinity"]) == int(r["omp"])
        assert all(a == r["affinity"] for a in r["task_affinity"]), "a thread escaped the pinning"
    w0, w1 = _weights(r0["weights"]), _weights(r1["weights"])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    proc = _run(single, "max_steps=6", "batch=32", "order=ddp", via_nano=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ws = _weights(_ranks(single, 1)[0]["weights"])
    for k in ws:
        torch.testing.assert_close(w0[k], ws[k], rtol=1e-4, atol=1e-5)
    moved = [k for k in ws if not torch.allclose(ws[k], _initial_weights()[k])]
    assert moved, "training did not change the weights"


def _initial_weights() -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import digits_lightning
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in digits_lightning.DigitsCNN().state_dict().items()}


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_fork_start_method_with_explicit_cores(tmp_path):
    proc = _run(tmp_path, "max_steps=3", "strategy=nano_ddp_fork", NANO_PATCH_CPU_FOR_EACH_PROCESS="1;0")
    assert_clean_exit(proc)
    r0, r1 = _ranks(tmp_path, 2)
    assert (r0["affinity"], r1["affinity"]) == ([1], [0])
    w0, w1 = _weights(r0["weights"]), _weights(r1["weights"])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_spawn_start_method_pins_and_averages(tmp_path):
    """`strategy="nano_ddp_spawn"`: Lightning's spawn launcher; the ranks re-import the script, pinned."""
    proc = _run(tmp_path, "max_steps=3", "strategy=nano_ddp_spawn", NANO_PATCH_NUM_PROCESSES="2")
    assert_clean_exit(proc)
    r0, r1 = _ranks(tmp_path, 2)
    assert r0["strategy"] == r1["strategy"] == "NanoDDPStrategy"
    assert r0["ppid"] == r1["ppid"] != r0["pid"], "both ranks are children of the launching process"
    assert r0["affinity"] and r1["affinity"] and not set(r0["affinity"]) & set(r1["affinity"])
    assert r0["threads"] == len(r0["affinity"]) and r1["threads"] == len(r1["affinity"])
    w0, w1 = _weights(r0["weights"]), _weights(r1["weights"])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_torchrun_launches_and_each_local_rank_is_pinned(tmp_path):
    """torchrun starts the ranks (nothing re-launched): `num_processes="auto"` follows LOCAL_WORLD_SIZE,
    each rank pins by its LOCAL_RANK, gradients are averaged."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "nano_patch", "run", str(SCRIPT), str(tmp_path), "max_steps=3"]
    proc = subprocess.run(cmd, env=_env(NANO_PATCH_NUM_PROCESSES="auto"), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = _ranks(tmp_path, 2)
    assert (r0["local_rank"], r1["local_rank"], r0["world"]) == (0, 1, 2)
    assert r0["strategy"] == "NanoDDPStrategy"
    assert r0["ppid"] == r1["ppid"], "torchrun's agent is the parent of both: Lightning launched nothing"
    assert not list(tmp_path.glob("rank2.json")), "extra ranks were launched"
    assert r0["affinity"] and r1["affinity"] and not set(r0["affinity"]) & set(r1["affinity"])
    for r in (r0, r1):
        assert r["threads"] == len(r["affinity"]) == int(r["omp"])
    w0, w1 = _weights(r0["weights"]), _weights(r1["weights"])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_two_torchrun_nodes_compose_with_num_nodes(tmp_path):
    """Two torchrun agents acting as two nodes of two ranks (static rendezvous on this machine) and an
    unchanged script with Trainer(num_nodes=2): four ranks, each node's ranks pinned apart by
    LOCAL_RANK, gradients averaged over all four."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "nano_patch", "run", str(SCRIPT), str(tmp_path),
         "max_steps=3", "num_nodes=2"],
        env=_env(NANO_PATCH_NUM_PROCESSES="auto"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for node in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-4000:]
    ranks = _ranks(tmp_path, 4)
    assert sorted((r["node_rank"], r["local_rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(r["world"], r["strategy"]) for r in ranks} == {(4, "NanoDDPStrategy")}
    for node in (0, 1):
        a, b = sorted((r for r in ranks if r["node_rank"] == node), key=lambda r: r["local_rank"])
        assert a["affinity"] and b["affinity"] and not set(a["affinity"]) & set(b["affinity"])
        assert a["threads"] == len(a["affinity"]) and b["threads"] == len(b["affinity"])
    w0 = _weights(ranks[0]["weights"])
    for r in ranks[1:]:
        w = _weights(r["weights"])
        assert all(torch.equal(w0[k], w[k]) for k in w0)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_slurm_bound_tasks_keep_their_own_cores(tmp_path):
    """Two tasks started as srun would (SLURM_* set, each already bound to one CPU with --cpu-bind):
    Lightning's SLURM environment takes the ranks from SLURM, and each rank keeps the CPU SLURM gave it."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    procs = []
    for rank in (0, 1):
        env = _env(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NAME="digits", SLURM_JOB_ID="4242",
                   SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_NODELIST="127.0.0.1",
                   SLURM_CPU_BIND_TYPE="mask_cpu:", MASTER_PORT=str(29500 + os.getpid() % 1000),
                   NANO_PATCH_NUM_PROCESSES="auto")
        bound = {cpus[1 - rank]}  # the reverse of what an even split would give
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "nano_patch", "run", str(SCRIPT), str(tmp_path), "max_steps=3"], env=env,
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda b=bound: os.sched_setaffinity(0, b),
        ))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
    r0, r1 = _ranks(tmp_path, 2)
    assert (r0["world"], r0["strategy"]) == (2, "NanoDDPStrategy")
    assert (r0["affinity"], r1["affinity"]) == ([cpus[1]], [cpus[0]])
    w0, w1 = _weights(r0["weights"]), _weights(r1["weights"])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_a_crashing_rank_ends_every_rank(tmp_path):
    """One rank raises: the run fails with that rank's error and no rank outlives it. A rank left waiting
    for the dead one would hang the run into the timeout (how long a run takes is benchmarks/' business)."""
    import psutil

    proc = _run(tmp_path, "max_steps=20", "crash_rank=1", NANO_PATCH_NUM_PROCESSES="2", timeout=240)
    assert proc.returncode != 0
    assert "rank crashed on purpose" in proc.stderr
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"]) if str(tmp_path) in (p.info["cmdline"] or [])]
    assert left == [], f"rank processes still running after the run ended: {left}"


def test_bf16_and_channels_last_reach_fp32_accuracy(tmp_path):
    """Single process, 5 epochs on digits: bf16 and channels-last within 3 points of fp32."""
    acc = {}
    for name, env in {"fp32": {}, "bf16": {"NANO_PATCH_PRECISION": "bf16"},
                      "channels_last": {"NANO_PATCH_CHANNELS_LAST": "1"}}.items():
        out = tmp_path / name
        out.mkdir()
        proc = _run(out, "epochs=5", "batch=32", "lr=0.02", **env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        acc[name] = json.loads((out / "metrics.json").read_text())["val_acc"]
        rank = _ranks(out, 1)[0]
        assert rank["precision"] == ("bf16-mixed" if name == "bf16" else "32-true")
        wanted = name == "channels_last"
        assert rank["channels_last_weight"] is wanted and rank["conv_input_channels_last"] is wanted
    assert acc["fp32"] > 0.75, acc
    assert abs(acc["bf16"] - acc["fp32"]) <= 0.03, acc
    assert abs(acc["channels_last"] - acc["fp32"]) <= 0.03, acc


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"num_processes": 2, "devices": 4}, ["num_processes=2", "devices=4"]),
        ({"num_processes": 2, "accelerator": "gpu"}, ["num_processes=2", "accelerator='gpu'"]),
        ({"num_processes": 2, "strategy": "deepspeed"}, ["num_processes=2", "strategy='deepspeed'"]),
        ({"num_processes": 0}, ["num_processes", "positive int"]),
        ({"cpu_for_each_process": [[0], [0]]}, ["cpu_for_each_process", "twice"]),
        ({"num_processes": 3, "cpu_for_each_process": [[0], [1]]}, ["num_processes=3", "cpu_for_each_process"]),
    ],
)
def test_conflicting_arguments_name_both(kwargs, names):
    import pytorch_lightning as pl

    nano_patch.patch_torch()
    with pytest.raises(ConfigError) as exc:
        pl.Trainer(logger=False, **kwargs)
    for n in names:
        assert n in str(exc.value)


def test_too_many_processes_is_a_clear_error():
    from nano_patch.train import topology

    n = len(topology.physical_cores()) + 1
    with pytest.raises(ValueError, match=f"num_processes={n} is more than the"):
        topology.split_cores(n)


def test_both_namespaces_are_patched():
    import lightning.pytorch as L
    import pytorch_lightning as pl

    nano_patch.patch_torch(precision="bf16")
    for ns in (pl, L):
        t = ns.Trainer(logger=False, enable_checkpointing=False, channels_last=True, auto_lr=True)
        assert t.precision == "bf16-mixed"
        from nano_patch.train import callbacks, class_name

        added = [c for c in t.callbacks if type(c).__module__ == callbacks.__name__]
        assert {type(c).__name__ for c in added} == {class_name("ChannelsLast", ns.__name__),
                                                     class_name("AutoLR", ns.__name__)}
        assert all(isinstance(c, ns.Callback) for c in t.callbacks)
        # Pickle finds each namespace's class by name (spawn, checkpoints).
        assert all(type(pickle.loads(pickle.dumps(c))) is type(c) for c in added)
    nano_patch.unpatch_torch()
    t = pl.Trainer(logger=False, enable_checkpointing=False)
    assert t.precision == "32-true"


def test_auto_lr_scales_and_warms_up_with_a_user_scheduler():
    import pytorch_lightning as pl

    from nano_patch.train.callbacks import auto_lr_callback

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)

    class FakeTrainer:
        world_size = 4
        optimizers = [opt]
        lr_scheduler_configs = [type("C", (), {"scheduler": sched})()]
        num_training_batches = 10
        estimated_stepping_batches = 100
        global_step = 0

    cb = auto_lr_callback(pl)(warmup_epochs=1)  # 10 warmup steps
    trainer = FakeTrainer()
    step_before = vars(opt).get("step")
    cb.on_fit_start(trainer, None)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.4) and sched.base_lrs == [pytest.approx(0.4)]
    used = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "optimizer.step() has been overridden" warning
        for step in range(12):
            trainer.global_step = step
            p.grad = torch.ones(1)
            before = p.item()
            opt.step()
            used.append(before - p.item())  # plain SGD: the step taken is the lr used
            sched.step()
    # Step 0: the original lr (0.1 = 0.4 * 1/4); linear to the full 0.4; StepLR halves at step 5.
    assert used[0] == pytest.approx(0.1, rel=1e-5)
    assert used[4] == pytest.approx(0.4 * (0.25 + 0.75 * 4 / 10), rel=1e-5)
    assert used[6] == pytest.approx(0.2 * (0.25 + 0.75 * 6 / 10), rel=1e-5)
    assert used[11] == pytest.approx(0.4 * 0.5 * 0.5, rel=1e-5)
    assert opt.param_groups[0]["lr"] == pytest.approx(sched.get_last_lr()[0])
    cb.on_fit_end(trainer, None)
    assert vars(opt).get("step") is step_before


def test_checkpoints_load_both_ways(tmp_path):
    import pytorch_lightning as pl

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import digits_lightning as dl
    finally:
        sys.path.pop(0)
    train, val = dl.data()
    loader = torch.utils.data.DataLoader(train, batch_size=64)
    common = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")

    nano_patch.patch_torch(precision="bf16", channels_last=True)
    t = pl.Trainer(max_steps=3, default_root_dir=tmp_path, **common)
    t.fit(dl.DigitsCNN(), loader)
    patched_ckpt = tmp_path / "patched.ckpt"
    t.save_checkpoint(patched_ckpt)
    nano_patch.unpatch_torch()

    # Patched -> stock: torch.load + load_state_dict, and a stock Trainer resume.
    state = torch.load(patched_ckpt, weights_only=False)["state_dict"]
    fresh = dl.DigitsCNN()
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state_dict()[k], state[k].contiguous()) for k in state)
    pl.Trainer(max_steps=5, default_root_dir=tmp_path, **common).fit(dl.DigitsCNN(), loader, ckpt_path=patched_ckpt)

    # Stock -> patched resume.
    t = pl.Trainer(max_steps=3, default_root_dir=tmp_path, **common)
    t.fit(dl.DigitsCNN(), loader)
    stock_ckpt = tmp_path / "stock.ckpt"
    t.save_checkpoint(stock_ckpt)
    nano_patch.patch_torch(precision="bf16", channels_last=True)
    t = pl.Trainer(max_steps=5, default_root_dir=tmp_path, **common)
    t.fit(dl.DigitsCNN(), loader, ckpt_path=stock_ckpt)
    assert t.global_step == 5


CLI_SCRIPT = Path(__file__).parent / "scripts" / "digits_cli.py"


def test_lightning_cli_shows_and_passes_the_nano_arguments(tmp_path):
    """An unchanged LightningCLI script under `nano-patch run`: --help documents the four arguments with
    their types, and given on the command line they reach the Trainer."""
    cmd = [sys.executable, "-m", "nano_patch", "run", str(CLI_SCRIPT)]
    help_ = subprocess.run([*cmd, "--help"], env=_env(), capture_output=True, text=True, timeout=120,
                           cwd=tmp_path)
    assert help_.returncode == 0, help_.stderr[-4000:]
    for arg, parts in (("num_processes", ("int", "str")), ("cpu_for_each_process", ("list[list[int]]",)),
                       ("channels_last", ("bool",)), ("auto_lr", ("bool", "dict[str, int]"))):
        # The option's own block of the help: its line and the indented lines under it.
        block = re.search(rf"^  --trainer\.{arg} .*?(?=^  --|\Z)", help_.stdout, re.M | re.S)
        text = " ".join(block.group().split()) if block else ""
        typ = text.rpartition("(type: ")[2]
        assert "nano-patch:" in text and all(p in typ for p in parts), (arg, text)
    proc = subprocess.run([*cmd, "--trainer.num_processes=2", "--trainer.channels_last=true",
                           '--trainer.auto_lr={"warmup_epochs": 2}', "--trainer.logger=false"],
                          env=_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert made["strategy"] == "NanoDDPStrategy" and made["num_processes"] == 2
    assert any(c.startswith("ChannelsLast") for c in made["callbacks"]) and made["warmup_epochs"] == [2]
    bad = subprocess.run([*cmd, "--trainer.num_processes=2", "--trainer.devices=3"], env=_env(),
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode != 0 and "num_processes=2" in bad.stderr and re.search(r"devices='?3'? conflict", bad.stderr)



def test_channels_last_reaches_every_image_in_a_batch_and_leaves_the_rest():
    from collections import namedtuple

    from nano_patch.train.callbacks import to_channels_last

    Pair = namedtuple("Pair", "image mask")
    images = [torch.randn(2, 3, 8, 8) for _ in range(4)]
    tokens, vector = torch.randn(2, 5, 16), torch.randn(2, 3)
    batch = {"a": images[0], "nested": [images[1], (Pair(images[2], images[3]), tokens)], "v": vector}
    before = [im.clone() for im in images]
    assert to_channels_last(batch) is batch
    for im, ref in zip(images, before):
        assert im.is_contiguous(memory_format=torch.channels_last) and torch.equal(im, ref)
    assert tokens.is_contiguous() and vector.is_contiguous()  # 3-D and 2-D tensors stay as they were


@pytest.mark.parametrize("native", [False, True])
def test_bf16_without_native_support_warns_once(monkeypatch, native):
    import pytorch_lightning as pl

    from nano_patch import sysinfo
    from nano_patch.registry import NanoPatchWarning
    from nano_patch.train import training_plan

    monkeypatch.setattr(sysinfo, "has_native_bf16", lambda: native)
    training_plan.warn_bf16_once.cache_clear()
    nano_patch.patch_torch()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for precision in ("bf16", "bf16-mixed"):
            t = pl.Trainer(precision=precision, accelerator="cpu", logger=False, enable_checkpointing=False)
            assert str(t.precision) == "bf16-mixed"
    ours = [w for w in seen if issubclass(w.category, NanoPatchWarning)]
    if native:
        assert not ours
    else:
        assert len(ours) == 1 and "avx512_bf16" in str(ours[0].message)
    training_plan.warn_bf16_once.cache_clear()
