"""`nano-patch init`: eval sets exactly what it prints, --unset restores, missing allocators are never preloaded."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from nano_patch import envtune

NANO = Path(sys.executable).parent / "nano-patch"


def _env_dump(path: Path) -> dict[str, str]:
    items = [e for e in path.read_bytes().decode().split("\0") if e]
    env = dict(e.split("=", 1) for e in items)
    env.pop("_", None)  # bash sets it to the last command
    return env


def test_eval_init_sets_exactly_the_printed_variables_and_unset_restores(tmp_path):
    nano = shlex.quote(str(NANO))
    # The shell's own exported variables, read with builtins: an external `env` would run under the
    # LD_PRELOAD just set, and tcmalloc adds variables to the environment of every process it loads into.
    dump = """for v in $(compgen -e); do printf '%s=%s\\0' "$v" "${!v}"; done"""
    script = f"""
set -e
export OMP_NUM_THREADS=7
unset LD_PRELOAD MALLOC_CONF KMP_BLOCKTIME KMP_AFFINITY _NANO_PATCH_INIT_SAVED
{dump} > before
{nano} init > printed
eval "$({nano} init)"
{dump} > after
eval "$({nano} init --unset)"
{dump} > restored
"""
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after, restored = (_env_dump(tmp_path / n) for n in ("before", "after", "restored"))
    printed = {}
    for line in (tmp_path / "printed").read_text().splitlines():
        if line.startswith("export "):
            key, value = line[len("export "):].split("=", 1)
            printed[key] = shlex.split(value)[0]
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    assert changed == printed and not set(before) - set(after)
    assert printed["OMP_NUM_THREADS"] != "7"
    assert restored == before  # OMP_NUM_THREADS=7 is back, everything else init set is gone


def test_allocator_only_when_its_library_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(envtune, "ALLOCATORS", (("jemalloc", (str(tmp_path / "missing.so"),), {"MALLOC_CONF": "x"}),))
    env, notes = envtune.settings()
    assert "LD_PRELOAD" not in env and "MALLOC_CONF" not in env
    assert any("no tcmalloc or jemalloc" in n for n in notes)
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setattr(envtune, "ALLOCATORS", (("jemalloc", (str(lib),), {"MALLOC_CONF": "x"}),))
    env, notes = envtune.settings()
    assert env["LD_PRELOAD"] == str(lib) and env["MALLOC_CONF"] == "x"


def test_run_tune_env_applies_the_settings_to_the_program(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os; print(os.environ.get('OMP_NUM_THREADS'), os.environ.get('LD_PRELOAD', ''))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LD_PRELOAD")}
    proc = subprocess.run([sys.executable, "-m", "nano_patch", "run", "--tune-env", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    wanted, _ = envtune.settings()
    omp, preload = (proc.stdout.split() + [""])[:2]
    assert omp == wanted["OMP_NUM_THREADS"]
    assert preload == wanted.get("LD_PRELOAD", "")
