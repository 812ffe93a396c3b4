"""The three ways to switch nano-patch on, end to end, including children of Lightning's ddp launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    class M(pl.LightningModule):
        def __init__(self):
            super().__init__(); self.l = torch.nn.Linear(4, 1)
        def training_step(self, batch, i):
            # Runs in every rank, whichever way Lightning started it.
            import nano_patch
            init = pl.Trainer.__init__
            with open(os.path.join(sys.argv[1], f"rank{self.global_rank}.json"), "w") as f:
                json.dump({"patched": nano_patch.is_patched(), "argv": sys.argv, "pid": os.getpid(),
                           "trainer_patched": "nano_patch" in init.__code__.co_filename}, f)
            return self.l(batch[0]).pow(2).mean()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if __name__ == "__main__":
        t = pl.Trainer(accelerator="cpu", devices=2, strategy=os.environ.get("TEST_STRATEGY", "ddp"), max_steps=1,
                       logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False)
        t.fit(M(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
    """
)


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "_NANO_PATCH"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _check(out: Path, proc: subprocess.CompletedProcess, argv_tail: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["patched"] is True, r
        assert r["trainer_patched"] is True, r
        assert r["argv"][-1] == argv_tail
    assert ranks[0]["pid"] != ranks[1]["pid"]


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    return p


def test_patch_torch_at_top_of_script(tmp_path, script):
    script.write_text("from nano_patch import patch_torch; patch_torch()\n" + SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=_env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))


def test_nano_patch_run_script(tmp_path, script):
    proc = subprocess.run([sys.executable, "-m", "nano_patch", "run", str(script), str(tmp_path)], env=_env(),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))


def test_python_m_nano_patch_module_form(tmp_path, script):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(SCRIPT)
    env = _env()
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "nano_patch", "run", "-m", "mypkg.train", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))


def test_import_nano_patch_auto(tmp_path, script):
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import nano_patch.auto, runpy, sys\n"
        f"sys.argv = [{str(script)!r}, {str(tmp_path)!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, str(driver)], env=_env(), capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))


def test_pythonstartup_interactive_session(tmp_path, script):
    """An interactive session (PYTHONSTARTUP) must use Lightning's fork launcher; its children are patched."""
    startup = tmp_path / "startup.py"
    startup.write_text("import nano_patch.auto\n")
    env = _env()
    env["PYTHONSTARTUP"] = str(startup)
    env["TEST_STRATEGY"] = "ddp_fork"
    driver = (
        f"import runpy, sys; sys.argv=[{str(script)!r}, {str(tmp_path)!r}]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-i", "-q"], input=driver, env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))


def test_console_script_and_status():
    # The script pip wrote beside this interpreter (a pyenv shim on PATH may not be rehashed yet).
    script = Path(sys.executable).parent / "nano-patch"
    proc = subprocess.run([str(script), "status"], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "vision_transforms" in proc.stdout and "avx512_bf16=" in proc.stdout and "pil=" in proc.stdout
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert f"torch: {torch.__version__} ({build} build" in proc.stdout  # (which torch: the CPU index's or PyPI's)


def test_unasked_process_is_never_patched(tmp_path):
    code = (
        "import sys, torchvision.transforms.functional as F;"
        "print(F.to_tensor.__code__.co_filename, 'nano_patch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    filename, imported = proc.stdout.split()
    assert filename.endswith("torchvision/transforms/functional.py") and imported == "False"


def test_lightning_s_own_ddp_group_is_destroyed_at_a_clean_exit(tmp_path, script):
    """Lightning leaves a gloo group to interpreter shutdown, where its threads can end a finished rank with
    SIGABRT ("terminate called without an active exception"); under the patch every rank destroys it at exit."""
    check = (
        "import atexit, os, sys\n"
        "def _at_exit():  # registered first: runs after every other handler\n"
        "    import torch.distributed as dist\n"
        "    with open(os.path.join(sys.argv[1], f'exit{os.getpid()}.txt'), 'w') as f:\n"
        "        f.write(str(dist.is_initialized()))\n"
        "atexit.register(_at_exit)\n"
        "from nano_patch import patch_torch; patch_torch()\n"
    )
    script.write_text(check + SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=_env(), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    _check(tmp_path, proc, str(tmp_path))
    states = sorted(p.read_text() for p in tmp_path.glob("exit*.txt"))
    assert states == ["False", "False"]  # both ranks: rank 0 here, rank 1 re-running the script
