"""`nano-patch run`: option flags, the --fast preset, the run report, end-of-run notices, run-level settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _procs import assert_clean_exit
from PIL import Image

import nano_patch
from nano_patch import cli, config, report

SCRIPTS = Path(__file__).parent / "scripts"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _nano_run(cwd: Path, *args: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nano_patch", "run", *args], env=_env(**env), capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


# One value per option, as a flag would carry it, and what patch_torch() must make of it.
FLAG_VALUES = {
    "vision": (["--no-vision"], False),
    "dataloader": (["--no-dataloader"], False),
    "trainer": (["--no-trainer"], False),
    "num_processes": (["--num-processes", "auto"], "auto"),
    "cpu_for_each_process": (["--cpu-for-each-process", "0;1"], ((0,), (1,))),
    "precision": (["--precision", "bf16"], "bf16"),
    "channels_last": (["--channels-last"], True),
    "auto_lr": (["--auto-lr", '{"warmup_epochs": 2}'], {"warmup_epochs": 2}),
    "scaled_decode": (["--scaled-decode"], True),
    "uint8_batches": (["--no-uint8-batches"], False),
    "cache_decoded": (["--cache-decoded", "512MB"], 512 * 1000**2),
    "cache_dir": (["--cache-dir", "/tmp/some cache"], "/tmp/some cache"),
    "loader_threads": (["--loader-threads", "3"], 3),
    "virtual_workers": (["--no-virtual-workers"], False),
    "lazy_images": (["--no-lazy-images"], False),
    "batches_ahead": (["--no-batches-ahead"], False),
}


def test_every_option_is_a_run_flag_and_wins_over_the_environment(monkeypatch):
    assert set(FLAG_VALUES) == set(config.FIELDS), "a new option needs a flag (and a line here)"
    help_text = " ".join(cli._parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    for field, (argv, expected) in FLAG_VALUES.items():
        args = cli._parser().parse_args(["run", *argv, "script.py", "--script-flag"])
        assert args.args == ["script.py", "--script-flag"], "flags after the script belong to the script"
        given = cli.run_options(args)
        assert set(given) == {field}
        assert config.resolve(given).__getattribute__(field) == expected
        assert argv[0] in help_text and config.env_name(field) in help_text
    # A flag wins over the environment.
    monkeypatch.setenv("NANO_PATCH_PRECISION", "32")
    monkeypatch.setenv("NANO_PATCH_CHANNELS_LAST", "0")
    nano_patch.patch_torch(**cli.run_options(cli._parser().parse_args(
        ["run", "--precision", "bf16", "--channels-last", "s.py"])))
    assert (nano_patch.options().precision, nano_patch.options().channels_last) == ("bf16", True)
    bad = cli._parser().parse_args(["run", "--precision", "fp8", "s.py"])
    assert cli._run(bad) == 2  # ConfigError, reported before anything runs or is patched
    from nano_patch.train import warm_start

    assert warm_start.deferred is False  # a later patch_torch(num_processes=2) starts its warm interpreter
    nano_patch.unpatch_torch()


@pytest.mark.parametrize("native", [True, False])
def test_fast_preset_chooses_bf16_only_where_the_cpu_has_it(monkeypatch, native):
    from nano_patch import preset, sysinfo

    monkeypatch.setattr(sysinfo, "has_native_bf16", lambda: native)
    chosen, line = preset.fast_options()
    assert chosen.get("precision") == ("bf16" if native else None)
    assert chosen["channels_last"] is True
    assert line.startswith("nano-patch --fast: ") and "OMP_NUM_THREADS=" in line
    assert ("bf16 autocast" in line) is native and ("neither avx512_bf16 nor AMX" in line) is not native
    # An explicit flag wins over the preset.
    args = cli._parser().parse_args(["run", "--fast", "--precision", "32", "--no-channels-last", "s.py"])
    assert cli.run_options(args) == {"precision": "32", "channels_last": False, "cache_decoded": "auto"}
    args = cli._parser().parse_args(["run", "--fast", "--cache-decoded=off", "s.py"])
    assert cli.run_options(args)["cache_decoded"] == "off"


def test_fast_reaches_the_trainer_and_no_hint_then(tmp_path):
    """--fast on an unchanged script: one start-up line, bf16 where native, channels-last on the conv model."""
    from nano_patch import sysinfo

    proc = _nano_run(tmp_path, "--fast", str(SCRIPTS / "digits_lightning.py"), str(tmp_path), "max_steps=2")
    assert_clean_exit(proc)
    assert proc.stderr.count("nano-patch --fast: ") == 1
    rank = json.loads((tmp_path / "rank0.json").read_text())
    assert rank["precision"] == ("bf16-mixed" if sysinfo.has_native_bf16() else "32-true")
    assert rank["channels_last_weight"] is True and rank["conv_input_channels_last"] is True
    assert rank["omp"] == str(min(len(os.sched_getaffinity(0)), os.cpu_count() or 1))
    assert "try `nano-patch run --fast`" not in proc.stderr


def test_a_run_without_options_ends_with_the_flag_to_try(tmp_path):
    proc = _nano_run(tmp_path, str(SCRIPTS / "digits_lightning.py"), str(tmp_path), "max_steps=2")
    assert_clean_exit(proc)
    rank = json.loads((tmp_path / "rank0.json").read_text())
    assert rank["precision"] == "32-true" and rank["channels_last_weight"] is False  # stock numerics
    hints = [line for line in proc.stderr.splitlines() if "try `nano-patch run --fast`" in line]
    assert len(hints) == 1 and "channels-last (the model has 4-D convolutions)" in hints[0]


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_flags_reach_the_patched_trainer_and_a_spawned_child(tmp_path):
    """Flags before the script reach the Trainer in the launching process and in both spawned ranks."""
    proc = _nano_run(tmp_path, "--num-processes", "2", "--precision", "bf16", "--channels-last",
                     str(SCRIPTS / "digits_lightning.py"), str(tmp_path), "max_steps=2", "strategy=nano_ddp_spawn")
    assert_clean_exit(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert (r["world"], r["strategy"], r["precision"]) == (2, "NanoDDPStrategy", "bf16-mixed")
        assert r["channels_last_weight"] is True and r["ppid"] != r["pid"]
    assert ranks[0]["ppid"] == ranks[1]["ppid"], "both ranks are spawned children of the run"


def test_run_level_num_processes_wins_over_a_lightning_cli_devices_default(tmp_path):
    """The script's LightningCLI trainer_defaults say devices=1; the run's setting wins, and says so."""
    script = str(SCRIPTS / "digits_cli_defaults.py")
    proc = _nano_run(tmp_path, "--num-processes", "2", "--precision", "bf16", script)
    assert proc.returncode == 0, proc.stderr[-4000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert made == {"strategy": "NanoDDPStrategy", "devices": 2, "precision": "bf16-mixed"}
    assert "num_processes=2 for this run wins over the script's devices=1" in proc.stderr
    # The same through the environment; and both arguments on the command line of the CLI are one call.
    proc = _nano_run(tmp_path, script, NANO_PATCH_NUM_PROCESSES="2")
    assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["devices"] == 2
    bad = _nano_run(tmp_path, script, "--trainer.num_processes=2", "--trainer.devices=3")
    assert bad.returncode != 0 and re.search(r"num_processes=2 and devices='?3'? conflict", bad.stderr)


def test_run_level_settings_win_in_process_but_one_call_cannot_contradict_itself():
    import pytorch_lightning as pl

    nano_patch.patch_torch(num_processes=2, precision="bf16")
    t = pl.Trainer(devices=1, strategy="ddp", precision="32-true", logger=False, enable_checkpointing=False)
    assert (type(t.strategy).__name__, t.num_devices, t.precision) == ("NanoDDPStrategy", 2, "bf16-mixed")
    with pytest.raises(config.ConfigError, match="num_processes=2 and devices=1 conflict"):
        pl.Trainer(num_processes=2, devices=1, logger=False)
    with pytest.raises(config.ConfigError, match="strategy='deepspeed'"):
        pl.Trainer(strategy="deepspeed", logger=False)  # not a plain data-parallel strategy: no silent swap


def test_unused_training_knobs_are_named_once_at_exit_of_a_plain_loop(tmp_path):
    """A plain PyTorch loop keeps fp32 and contiguous tensors; the run says which knobs nothing applied."""
    proc = _nano_run(tmp_path, "--precision", "bf16", "--channels-last", str(SCRIPTS / "digits_plain.py"),
                     str(tmp_path))
    assert_clean_exit(proc)
    seen = json.loads((tmp_path / "plain.json").read_text())
    assert seen == {"input_channels_last": False, "output_dtype": "torch.float32"}
    notices = [line for line in proc.stderr.splitlines() if "no Lightning Trainer, @nano or TorchNano ran" in line]
    assert len(notices) == 1
    assert "precision='bf16'" in notices[0] and "channels_last=True" in notices[0] and "@nano" in notices[0]
    # In the report too, and the same from the environment.
    out = tmp_path / "report.json"
    proc = _nano_run(tmp_path, "--report", str(out), str(SCRIPTS / "digits_plain.py"), str(tmp_path),
                     NANO_PATCH_PRECISION="bf16")
    assert_clean_exit(proc)
    unused = json.loads(out.read_text())["unused_knobs"]
    assert len(unused) == 1 and "precision='bf16'" in unused[0]
    # `--report` right before the script takes no path: the script is not mistaken for one.
    proc = _nano_run(tmp_path, "--report", str(SCRIPTS / "digits_plain.py"), str(tmp_path))
    assert_clean_exit(proc)
    assert "nano-patch report" in proc.stderr


def _report_folder(src: Path, dst: Path) -> tuple[int, int]:
    shutil.copytree(src, dst)
    jpegs = len(list(dst.rglob("*.jpg")))
    Image.open(next(dst.rglob("*.jpg"))).save(dst / "a" / "extra.png")
    return jpegs, 1


def test_report_fields_on_a_real_short_run(tmp_path, image_folder):
    """A real Lightning run with one DataLoader worker: the worker's counts reach the report, with reasons."""
    data = tmp_path / "data"
    jpegs, pngs = _report_folder(image_folder, data)
    out = tmp_path / "report.json"
    proc = _nano_run(tmp_path, "--report", str(out), str(SCRIPTS / "photos_lightning.py"), str(data), "1")
    assert_clean_exit(proc)
    assert "nano-patch report" in proc.stderr
    rep = json.loads(out.read_text())
    assert rep["wall_time_s"] > 0
    t = rep["training"]
    assert "Lightning" in t["source"] and t["samples"] == jpegs + pngs and t["num_workers"] == 1
    assert t["data_wait_s"] > 0 and t["step_s"] > 0 and t["images_per_s"] > 0
    assert 0 <= t["data_wait_share"] <= 1
    by_name = {p["name"]: p for p in rep["patches"]}
    decode = by_name["vision_datasets"]
    assert decode["accelerated"] == jpegs and decode["fallback"] == pngs  # one epoch, decoded in the worker
    assert decode["top_fallbacks"] == [{"reason": "PNG files: decoded by PIL", "count": pngs}]
    steps = by_name["vision_transforms"]["top_fallbacks"]
    assert steps[0]["reason"] == "`Lambda` at position 2 of the Compose: stock code (not in the plan)"
    assert steps[0]["count"] == jpegs + pngs
    loader = {f["reason"] for f in by_name["dataloader"]["top_fallbacks"]}
    # no device here: the worker finishes the tail; the Lambda keeps worker processes, and the report says why
    assert "no device finishes the tail: the workers finish it (float batches)" in loader
    assert "num_workers=1 in worker processes: `Lambda` at position 2 of the Compose (stock code)" in loader
    assert by_name["trainer[pytorch_lightning]"]["top_accelerated"][0]["what"].startswith("Trainer(precision=32")
    for step in ("image_loading", "resize"):  # timed (which is slower is for benchmarks/ to say)
        assert rep["seconds"][step] > 0, rep["seconds"]
    # What the report knows of this run: fp32 trained (bf16 advice where the CPU computes bf16 natively),
    # one worker (no num_workers advice), no unused knobs.
    from nano_patch import sysinfo

    assert [a for a in rep["advice"] if "bf16" in a] == ([_BF16_ADVICE] if sysinfo.has_native_bf16() else [])
    assert not [a for a in rep["advice"] if "num_workers" in a or "knob" in a], rep["advice"]


_BF16_ADVICE = ("this CPU computes bf16 natively but the model trained in fp32: try `nano-patch run --fast` "
                "(or --precision bf16)")


def _advice(tmp_path: Path, *, load_s: float = 0.0, resize_s: float = 0.0, wait_s: float = 0.0, step_s: float = 0.0,
            workers: int = 0, precision: str = "32", native_bf16: bool = False, simd: bool = False,
            resample: str = "native (AVX2)", knobs: tuple[str, ...] = ()) -> list[str]:
    """The advice of a report on figures given as a run's counters would hold them."""
    tmp_path.mkdir()
    report.stats = report.Stats(str(tmp_path))
    try:
        report.stats.seconds.update({"load": load_s, "resize": resize_s})
        if wait_s or step_s:
            report.stats.loader.update({"samples": 100, "wait_s": wait_s, "step_s": step_s, "max_workers": workers})
        out = report.compose(1.0, [], list(knobs), [{"precision": precision}], native_bf16, simd, resample)
    finally:
        report.stats = None
    return out["advice"]


def test_advice_names_what_the_report_saw(tmp_path):
    """Each piece of advice appears exactly when its condition holds, and says what was measured."""
    quiet = dict(load_s=1.0, resize_s=0.05, wait_s=0.1, step_s=0.9, workers=0)
    assert _advice(tmp_path / "a", **quiet) == []
    # fp32 on a CPU with native bf16: try --fast; on one without, nothing
    assert _advice(tmp_path / "b", **quiet, native_bf16=True) == [_BF16_ADVICE]
    assert _advice(tmp_path / "c", **quiet, native_bf16=True, precision="bf16") == []
    # the loop waited for data half the time with num_workers=0: give it workers; with workers, nothing
    waiting = _advice(tmp_path / "d", load_s=1.0, wait_s=0.5, step_s=0.5, workers=0)
    assert len(waiting) == 1 and "50% of the time with num_workers=0" in waiting[0]
    assert _advice(tmp_path / "e", load_s=1.0, wait_s=0.5, step_s=0.5, workers=2) == []
    # resizes took 40% of loading on PIL's code (no native kernel): reinstall with a compiler, or pillow-simd
    pil = "PIL's code (no C compiler at install)"
    slow = _advice(tmp_path / "f", load_s=1.0, resize_s=0.4, resample=pil)
    assert len(slow) == 1 and slow[0].startswith("resizes took 40% of image loading time on PIL's own code "
                                                 "(no C compiler at install)") and "install-simd" in slow[0]
    assert _advice(tmp_path / "g", load_s=1.0, resize_s=0.4, resample=pil, simd=True) == []
    assert _advice(tmp_path / "h", load_s=1.0, resize_s=0.4) == []  # the native resize runs
    # unused knobs, as the session names them
    assert _advice(tmp_path / "i", knobs=("precision='bf16' was set, but no Trainer ran",)) == [
        "precision='bf16' was set, but no Trainer ran"]


def test_fallbacks_are_counted_with_reasons(tmp_path, photos):
    from torchvision import transforms as T
    from torchvision.transforms import functional as F

    from nano_patch.vision.images import decode

    rgb = photos[0]
    rgb.save(tmp_path / "a.jpg", quality=90)
    rgb.save(tmp_path / "b.png")
    rgb.convert("CMYK").save(tmp_path / "c.jpg", quality=90)
    nano_patch.patch_torch()
    report.stats = report.Stats(str(tmp_path))
    try:
        for name in ("a.jpg", "b.png", "c.jpg"):
            decode.decode_rgb(tmp_path / name)
        T.Compose([T.Resize(64), T.Lambda(lambda im: im), T.Lambda(lambda im: im.transpose(0)), T.CenterCrop(32)])(rgb)
        F.resize(rgb.convert("RGBA"), [32])
        counts = dict(report.stats.counts)
    finally:
        report.stats = None
    assert counts[("vision_datasets", True, "JPEG decoded by libjpeg-turbo")] == 1
    assert counts[("vision_datasets", False, "PNG files: decoded by PIL")] == 1
    assert counts[("vision_datasets", False, "CMYK JPEG: decoded by PIL")] == 1
    assert counts[("vision_transforms", True, "Resize")] == counts[("vision_transforms", True, "CenterCrop")] == 1
    for position in (1, 2):
        assert counts[("vision_transforms", False,
                       f"`Lambda` at position {position} of the Compose: stock code (not in the plan)")] == 1
    assert counts[("vision_transforms", False, "PIL images of mode 'RGBA': stock PIL code")] == 1


def test_report_off_installs_nothing():
    nano_patch.patch_torch()
    assert report.stats is None and report.REPORT_DIR_ENV not in os.environ


@pytest.mark.parametrize("argv, module, rest, fast", [
    (["run", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"], "pytest", ["-q", "-p", "no:cacheprovider", "-x"],
     False),
    (["run", "--fast", "-m", "pkg.train", "--fast", "--epochs", "2"], "pkg.train", ["--fast", "--epochs", "2"], True),
    (["run", "--precision", "bf16", "-m", "pkg.train"], "pkg.train", [], False),
    (["run", "train.py", "-m", "x", "-q"], None, ["train.py", "-m", "x", "-q"], False),
    (["run", "--", "train.py", "-q"], None, ["--", "train.py", "-q"], False),
])
def test_options_after_the_module_are_the_modules_own(argv, module, rest, fast):
    """`nano-patch run -m pytest -q` passes `-q` to pytest, as `python -m pytest -q` does."""
    from nano_patch import cli

    args = cli.parse_args(argv)
    assert (args.module, args.args, args.fast) == (module, rest, fast)


def test_an_unknown_option_before_the_module_is_still_refused(capsys):
    from nano_patch import cli

    with pytest.raises(SystemExit):
        cli.parse_args(["run", "--no-such-flag", "-m", "pytest"])
    assert "--no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "const"), [("--report", "-"), ("--cache-decoded", "on"), ("--auto-lr", "true")])
def test_a_flag_without_its_value_then_a_script_whose_first_argument_is_an_option(flag, const):
    """`nano-patch run --report train.py --data-path D`: the script's options are the script's (torchvision's and
    timm's train.py begin with one); argparse once read them as nano-patch's and stopped the run."""
    from nano_patch import cli

    args = cli.parse_args(["run", "--fast", flag, "train.py", "--data-path", "D", "--help"])
    assert args.args == ["train.py", "--data-path", "D", "--help"] and args.fast
    assert getattr(args, flag[2:].replace("-", "_")) == const
    value = "x.json" if flag == "--report" else "auto"
    with_value = cli.parse_args(["run", flag, value, "train.py", "--data-path"])
    assert with_value.args == ["train.py", "--data-path"] and getattr(with_value, flag[2:].replace("-", "_")) == value
