"""Every rank patched whatever the install method, or a clear error within a minute (train/ranks.py).

The runs here are real `nano-patch run --num-processes 2` jobs. Each is bounded: a run that hangs (as on the
code before ranks.py, where rank 0 waited in init_process_group for torch's 30-minute default) is killed with
its whole session at the test's limit and fails the test.
"""

from __future__ import annotations

import json
import os
import signal
import site
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import nano_patch

RANK_ENTRY = "nano_patch._rank"
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2
needs_two_cores = pytest.mark.skipif(not TWO_CORES, reason="two ranks need two cores")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _run_bounded(cmd: list[str], env: dict[str, str], cwd: Path, limit: float) -> tuple[int | None, str, str, float]:
    """(exit status or None if it ran past ``limit``, stdout, stderr, seconds). A run past the limit is killed with
    every process of its session, so that a hang fails the test and leaves nothing behind."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out, err, time.monotonic() - start


def _processes_with(tag: str) -> list[str]:
    """Command lines of the live processes that carry ``tag`` in their arguments."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline}")
    return found


def _no_orphans(tag: str) -> list[str]:
    deadline = time.monotonic() + 5  # reaped children vanish from /proc at once; give stragglers a moment
    while (left := _processes_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# -- the child's command ----------------------------------------------------------------------------------------


def test_lightnings_child_command_runs_the_rank_entry_while_patched_and_stock_after():
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from pytorch_lightning.strategies.launchers import subprocess_script as pl_launcher

    stock = pl_launcher._basic_subprocess_cmd()
    assert RANK_ENTRY not in stock
    nano_patch.patch_torch()
    try:
        for module in (pl_launcher, fabric_launcher):
            command = module._basic_subprocess_cmd()
            assert command == [stock[0], "-m", RANK_ENTRY, *stock[1:]], command
    finally:
        nano_patch.unpatch_torch()
    assert pl_launcher._basic_subprocess_cmd() == stock


def test_the_rank_entry_runs_a_script_as_python_would(tmp_path):
    """`python -m nano_patch._rank SCRIPT ARGS` gives the script the argv, sys.path[0] and __main__ that
    `python SCRIPT ARGS` gives it."""
    script = tmp_path / "show.py"
    script.write_text("import json, sys\nprint(json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
                      "'name': __name__, 'file': __file__}))\n")
    stock = subprocess.run([sys.executable, str(script), "a", "--b"], capture_output=True, text=True, check=True,
                           env=_env())
    entry = subprocess.run([sys.executable, "-m", RANK_ENTRY, str(script), "a", "--b"], capture_output=True,
                           text=True, check=True, env=_env(), cwd=tmp_path)
    assert json.loads(entry.stdout) == json.loads(stock.stdout)


# -- every rank patched, whatever the install -------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_install(tmp_path_factory) -> tuple[Path, Path]:
    """The project installed with `pip install --target` (kernels not compiled: they are not what this is about),
    and an interpreter whose own site folder lacks nano-patch: a venv. Its processes find torch and Lightning
    through PYTHONPATH, where Python never processes .pth files."""
    base = tmp_path_factory.mktemp("target-install")
    target, venv = base / "target", base / "venv"
    # from the source tree; under scripts/check-wheel (the tests copied beside the installed wheel), the wheel
    source = os.environ.get("NANO_WHEEL_CHECK_WHEEL") or str(ROOT)
    if not (Path(source).is_file() or (Path(source) / "pyproject.toml").is_file()):
        pytest.skip("neither the source tree nor the wheel under check is here to install with --target")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), "--no-deps",
                    "--no-build-isolation", "--no-index", source], check=True, timeout=300,
                   env=_env(NANO_PATCH_NO_NATIVE="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))
    assert (target / "nano_patch_startup.pth").is_file()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return target, venv / "bin" / "python"


@needs_two_cores
@pytest.mark.parametrize("script", ["lightning", "nano_spawn"])
def test_a_target_install_on_pythonpath_patches_every_rank(tmp_path, target_install, script):
    """`pip install --target DIR` + PYTHONPATH=DIR: the ranks Lightning's launcher starts (the script re-run, or
    spawn) skip nano_patch_startup.pth, yet every rank runs patched, with nano-patch from DIR."""
    target, python = target_install
    if script == "lightning":
        args = [str(SCRIPTS / "digits_lightning.py"), str(tmp_path), "epochs=1"]
    else:
        args = [str(SCRIPTS / "digits_fabric.py"), str(tmp_path), "api=nano", "steps=5", "start_method=spawn"]
    env = _env(PYTHONPATH=os.pathsep.join([str(target), *site.getsitepackages()]))
    code, out, err, _ = _run_bounded([str(python), "-m", "nano_patch", "run", "--num-processes", "2", *args], env,
                                     tmp_path, limit=150)
    assert code == 0, err[-4000:]
    for rank in (0, 1):
        made = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert made["patched"] is True, (rank, made)
        assert Path(made["nano_patch_file"]).is_relative_to(target), made["nano_patch_file"]
    if script == "lightning":  # rank 1 was started by Lightning's script launcher, through the rank entry
        assert json.loads((tmp_path / "rank1.json").read_text())["patched_by"] == "rank entry"


# -- a rank that cannot be patched is an error within 60 s -------------------------------------------------------


@needs_two_cores
@pytest.mark.parametrize(("script", "api", "mode", "wait"), [
    ("digits_lightning.py", None, "no-site", None),
    ("digits_lightning.py", None, "no-env", "8"),
    ("digits_fabric.py", "nano", "no-env", "8"),
    ("digits_fabric.py", "torchnano", "no-site", "8"),
])
def test_a_rank_that_starts_unpatched_fails_the_run_within_60_seconds(tmp_path, script, api, mode, wait):
    """Rank 1 starts without nano-patch (tests/scripts/unpatched_rank.py) and, given no processes itself, trains
    alone as a stock single-process job. The run ends non-zero within 60 s with one message naming the rank, the
    cause and the fix, and leaves no process behind (before ranks.py rank 0 waited for it for 30 minutes). The
    first case waits the default time for the rank; the others a shorter one (the same path, found sooner)."""
    tag = f"tag={uuid.uuid4().hex}"
    args = [str(tmp_path), "epochs=1000", tag] + ([f"api={api}", "steps=1000000"] if api else [])
    cmd = [sys.executable, "-m", "nano_patch", "run", "--num-processes", "2", str(SCRIPTS / "unpatched_rank.py"),
           mode, str(SCRIPTS / script), *args]
    env = _env(**({"NANO_PATCH_RANK_START_TIMEOUT": wait} if wait else {}))
    code, out, err, seconds = _run_bounded(cmd, env, tmp_path, limit=90)
    left = _no_orphans(tag)
    assert code not in (None, 0), f"ran {seconds:.0f} s, status {code}\n{err[-3000:]}"
    assert seconds < 60, seconds
    assert err.count("did not start with nano-patch") == 1, err[-4000:]
    assert "nano-patch: rank 1 (pid" in err and "Fix:" in err and "The run is stopped on every rank" in err
    cause = "runs with -S or -I" if mode == "no-site" else "its environment lacks _NANO_PATCH_STARTUP"
    assert cause in err, err[-3000:]
    assert not left, left


@needs_two_cores
def test_a_rank_with_other_options_fails_every_rank_at_rendezvous(tmp_path):
    """Rank 1 is patched, but its environment turns channels-last on: every rank stops at the rendezvous, before
    the first collective, with the same message naming the option."""
    tag = f"tag={uuid.uuid4().hex}"
    cmd = [sys.executable, "-m", "nano_patch", "run", "--num-processes", "2", str(SCRIPTS / "unpatched_rank.py"),
           "other-options", str(SCRIPTS / "digits_lightning.py"), str(tmp_path), "epochs=1", tag]
    code, out, err, seconds = _run_bounded(cmd, _env(), tmp_path, limit=90)
    left = _no_orphans(tag)
    assert code not in (None, 0), f"ran {seconds:.0f} s, status {code}\n{err[-3000:]}"
    assert seconds < 60, seconds
    line = "nano-patch: rank 1 (pid"
    assert "channels_last=False on rank 0 but True" in err, err[-3000:]
    assert err.count("runs with other options than rank 0") == 2, err[-4000:]  # rank 0's and rank 1's, alike
    assert line in err and not (tmp_path / "rank0.json").exists()
    assert not left, left


# -- the records ------------------------------------------------------------------------------------------------


def _record(**changes):
    base = {"pid": 1, "host": "h", "version": "1.0", "patched": True, "options": {"precision": "bf16"},
            "how": "rank entry", "executable": "/usr/bin/python3"}
    return {**base, **changes}


def test_records_that_agree_pass_and_each_difference_is_named():
    from nano_patch.train import ranks

    assert ranks.mismatch_message([_record(), _record(pid=2), _record(pid=3)]) is None
    unpatched = _record(pid=2, patched=False, options=None, how=None, cause="its interpreter runs with -S or -I")
    text = ranks.mismatch_message([_record(), unpatched])
    assert "rank 1 runs without nano-patch's patches while rank 0 runs them (via rank entry)" in text
    assert "Cause: its interpreter runs with -S or -I." in text and "Fix:" in text
    text = ranks.mismatch_message([_record(), _record(), _record(pid=3, version="0.9")])
    assert "rank 2 (pid 3 on h) runs nano-patch 0.9" in text and "rank 1" not in text
    text = ranks.mismatch_message([_record(), _record(options={"precision": "32"})])
    assert "precision='bf16' on rank 0 but '32'" in text


def test_an_unpatched_process_says_why(monkeypatch):
    from nano_patch.train import ranks

    monkeypatch.delenv("_NANO_PATCH_STARTUP", raising=False)
    record = ranks.local_record()
    assert record["patched"] is False and "lacks _NANO_PATCH_STARTUP" in record["cause"]
    monkeypatch.setenv("_NANO_PATCH_STARTUP", "{}")
    assert "nano_patch_startup.pth" in ranks.local_record()["cause"]


def test_a_rank_started_by_lightnings_launcher_is_not_rank_zero(monkeypatch):
    """Lightning's script launcher sets LOCAL_RANK (and NODE_RANK), not RANK, in the ranks it starts: their one-line
    notices (the --fast cache verdict, the end-of-run lines) are rank 0's alone."""
    from nano_patch import exit_notices

    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert exit_notices.is_rank_zero()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert exit_notices.is_rank_zero()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not exit_notices.is_rank_zero()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "1")
    assert not exit_notices.is_rank_zero()


def test_the_start_timeout_variable_is_no_option_and_is_read(monkeypatch):
    from nano_patch import config
    from nano_patch.train import ranks

    monkeypatch.setenv(ranks.START_TIMEOUT_ENV, "12")
    assert config.from_env() == {}  # not an unknown option
    assert ranks.start_timeout() == 12.0
    monkeypatch.setenv(ranks.START_TIMEOUT_ENV, "soon")
    assert ranks.start_timeout() == ranks.DEFAULT_START_TIMEOUT
