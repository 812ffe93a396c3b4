"""Child ranks started warm (``train/warm_start.py``): Lightning's launcher starts the rank entry, which hands the rank
to an interpreter that imported while the launching process started; the rank entry passes signals on and ends as
its rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from _procs import assert_clean_exit

import nano_patch
from nano_patch.train import warm_start

SCRIPTS = Path(__file__).parent / "scripts"
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.fixture
def warm(tmp_path, monkeypatch):
    """A warm interpreter started by this process, for ``script``; stopped after the test."""
    monkeypatch.setenv(warm_start.WARM_ENV, "x")
    monkeypatch.delenv(warm_start.WARM_ENV)  # restored to absent after the test

    def start(script: Path) -> None:
        assert warm_start.maybe_start(2, None, script=str(script))
        deadline = time.monotonic() + 60
        while warm_start.ready_import_seconds() is None:
            assert time.monotonic() < deadline, "the warm interpreter never became ready"
            time.sleep(0.05)

    yield start
    warm_start.stop()


def _rank_entry(script: Path, *args: str, **env: str) -> subprocess.Popen:
    """What Lightning's launcher starts for local rank 1 under nano-patch."""
    full = {**os.environ, "LOCAL_RANK": "1", "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "nano_patch._rank", str(script), *args], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=script.parent)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "rank_script.py"
    path.write_text("import os, sys, time\nimport torch\nimport pytorch_lightning\n" + textwrap.dedent(body))
    return path


def test_the_script_s_top_level_imports_of_known_packages_are_read_not_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch, mylocal
        from torchvision import transforms
        import pytorch_lightning as pl
        raise SystemExit("never run")

        def later():
            import timm
    """))
    assert warm_start.heavy_imports(str(script), None) == ["torch", "torchvision", "pytorch_lightning"]
    assert warm_start.heavy_imports(str(tmp_path / "missing.py"), None) == ["torch"]


def test_only_a_launching_process_that_asks_for_several_ranks_starts_one(monkeypatch, tmp_path):
    script = _script(tmp_path, "")
    monkeypatch.setattr(warm_start, "_server", None)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("started a warm interpreter"))
    assert not warm_start.maybe_start(1, None, script=str(script))
    assert not warm_start.maybe_start(None, None, script=str(script))
    monkeypatch.setenv("LOCAL_RANK", "1")  # a rank already
    assert not warm_start.maybe_start(2, None, script=str(script))


def test_a_rank_runs_in_the_warm_interpreter_as_a_fresh_one_would(tmp_path, warm):
    """Its own environment, arguments, working directory, streams, Lightning's rank flag from that environment, and
    NumPy's generator seeded anew; its parent is the warm interpreter, not the rank entry."""
    script = _script(tmp_path, """
        import numpy as np
        from pytorch_lightning.utilities.rank_zero import rank_zero_only
        print(json_line := __import__("json").dumps({
            "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
            "env": os.environ.get("RANK_TEST"), "rank_zero": rank_zero_only.rank, "numpy": float(np.random.rand()),
            "torch_imported_before": "torch" in sys.modules, "path0": sys.path[0]}))
        print("to stderr", file=sys.stderr)
    """)
    warm(script)
    outs = []
    for value in ("a", "b"):
        proc = _rank_entry(script, "--flag", value, RANK_TEST=value)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
        assert "to stderr" in err
        assert outs[-1]["ppid"] != proc.pid and outs[-1]["pid"] != proc.pid  # forked by the warm interpreter
    for value, o in zip("ab", outs):
        assert o["argv"] == ["--flag", value] and o["env"] == value and o["cwd"] == str(tmp_path)
        assert o["rank_zero"] == 1 and o["path0"] == str(tmp_path)
    assert outs[0]["numpy"] != outs[1]["numpy"]


def test_the_rank_entry_ends_as_its_rank_and_passes_signals_on(tmp_path, warm):
    script = _script(tmp_path, """
        import signal
        if sys.argv[1] == "exit":
            sys.exit(3)
        if sys.argv[1] == "raise":
            raise ValueError("the rank's own error")
        print(os.getpid(), flush=True)
        time.sleep(60)
    """)
    warm(script)
    proc = _rank_entry(script, "exit")
    assert proc.wait(timeout=60) == 3
    proc = _rank_entry(script, "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "ValueError: the rank's own error" in err
    for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL cannot be passed on: the warm interpreter ends the rank
        proc = _rank_entry(script, "sleep")
        rank = int(proc.stdout.readline())
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
        deadline = time.monotonic() + 10
        while _alive(rank):
            assert time.monotonic() < deadline, f"rank {rank} outlived its rank entry ({sig!r})"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_without_a_warm_interpreter_the_rank_entry_runs_the_rank_itself(tmp_path):
    script = _script(tmp_path, "print('ran', os.getppid())")
    proc = _rank_entry(script, **{warm_start.WARM_ENV: str(tmp_path / "no-such-socket")})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["ran", str(os.getpid())]


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 usable cores")
def test_lightnings_second_rank_starts_warm_and_trains_as_before(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH", "OMP_"))}
    cmd = [sys.executable, "-m", "nano_patch", "run", "--num-processes", "2", str(SCRIPTS / "digits_lightning.py"),
           str(tmp_path), "max_steps=4", "batch=16"]
    proc = subprocess.run(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert_clean_exit(proc)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r1["patched"] and r1["patched_by"] == "rank entry"
    assert r1["ppid"] != r0["pid"], "rank 1 is a fork of the warm interpreter, not a new interpreter"
    assert not set(r0["affinity"]) & set(r1["affinity"])
    w0, w1 = (torch.load(r["weights"], weights_only=True) for r in (r0, r1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_stopping_removes_the_private_folder_of_the_socket(tmp_path, warm):
    """The warm interpreter's socket and ready file live in a private folder of their own: once no rank will start
    (``stop``), it is gone, so that runs leave nothing behind in the temporary directory."""
    warm(_script(tmp_path, "print('ran')\n"))
    folder = Path(os.environ[warm_start.WARM_ENV]).parent
    assert (folder / "ready").exists()
    warm_start.stop()
    assert not folder.exists()
    assert warm_start.WARM_ENV not in os.environ


def test_unpatch_stops_the_warm_interpreter_patch_torch_started(monkeypatch, tmp_path):
    """``patch_torch(num_processes=2)`` starts one; ``unpatch_torch()`` stops it, and a later patch may start one
    again (nothing of the first is left in this process or its environment)."""
    started, stopped = [], []

    class FakeServer:
        def __init__(self, *args, **kwargs):
            r, w = os.pipe()
            os.close(r)
            self.stdin = os.fdopen(w, "wb")
            started.append(self)

        def terminate(self):
            stopped.append(self)

    monkeypatch.setattr(subprocess, "Popen", FakeServer)
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(_script(tmp_path, "")), raising=False)
    for _ in range(2):
        nano_patch.patch_torch(num_processes=2)
        assert len(started) == len(stopped) + 1 and warm_start.WARM_ENV in os.environ
        nano_patch.unpatch_torch()
        assert len(stopped) == len(started) and warm_start.WARM_ENV not in os.environ
        assert warm_start._server is None
