"""Run the parity suites against the oldest supported releases of the libraries nano-patch patches.

``scripts/compat-check [--work DIR]``:

1. makes a fresh venv (no system site-packages) with this Python;
2. installs the oldest supported torch, torchvision, Pillow, timm and Lightning (the defaults below: the
   floors that pyproject.toml declares; each can be given), and
   the rest of the test environment at the versions of ``constraints.txt``; PyPI's torch wheels are CUDA
   builds, so this downloads a few GB once (``--work`` keeps the venv for a second run);
3. runs the parity suites (``PARITY``: each compares the patch with stock called in the same run) from the
   source tree against that venv, with the compiled kernels already built in the tree (same Python), and
   writes ``compat-check.json`` in the work folder: the versions, the counts, the failing tests.

It takes about half an hour on 2 cores and is not part of CI.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The oldest releases to check: pyproject.toml's floors. (Run once at the earlier floors, torch 2.4.0,
#: torchvision 0.19.0, Pillow 9.2.0, timm 1.0.3, Lightning 2.4.0: 149 of 472 failed, on the product's side;
#: docs/reference.md, "Supported versions".)
OLDEST = {"torch": "2.11.0", "torchvision": "0.26.0", "pillow": "12.3.0", "timm": "1.0.29", "lightning": "2.4.0",
          "pytorch-lightning": "2.4.0"}
#: Left to pip to match the oldest releases (constraints.txt pins them for today's); everything else is pinned.
UNPINNED = {"lightning-fabric", "torchmetrics", "albumentations", "ruff", "hatchling", "setuptools"}
#: The suites that compare the patch with stock in the same run.
PARITY = [f"tests/test_{name}.py" for name in (
    "vision_parity", "vision_v2", "vision_api", "policies", "vision_datasets", "timm_datasets", "vision_plan",
    "identity", "contract", "dataloader", "lightning", "warp_kernels", "native_kernels", "crop_decode")]
#: Tests that build the kernels from the C sources (they need hatch_build's toolchain, not the versions).
DESELECT = ("sabotaged", "refused_kernel_means", "refused_warp_means", "without_the_margin", "without_the_minimum_band",
            "no_c_compiler", "without_libjpeg_the_install", "planted_in_a_cache_folder")


def log(msg: str) -> None:
    print(f"compat-check: {msg}", file=sys.stderr, flush=True)


def requirements(versions: dict[str, str]) -> list[str]:
    """The venv's requirements: the oldest of ``versions``, and constraints.txt's pins for the rest."""
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pinned[name.strip().lower()] = version.strip()
    skip = set(versions) | UNPINNED
    return [f"{n}=={v}" for n, v in versions.items()] + [f"{n}=={v}" for n, v in pinned.items() if n not in skip]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/compat-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="folder for the venv and the results (default: a temporary one)")
    for name, version in OLDEST.items():
        parser.add_argument(f"--{name}", default=version, help=f"default {version}")
    parser.add_argument("--reuse", action="store_true", help="keep the venv in --work if it exists")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments (one string)")
    args = parser.parse_args(argv)
    versions = {name: getattr(args, name.replace("-", "_")) for name in OLDEST}
    work = (args.work or Path(tempfile.mkdtemp(prefix="nano-patch-compat-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    venv, started = work / "venv", time.monotonic()
    python = venv / "bin" / "python"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_CONSTRAINT": "", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    if not (args.reuse and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        t0 = time.monotonic()
        reqs = requirements(versions)
        log("installing " + " ".join(reqs))
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *reqs], env={**env, "PYTHONPATH": ""})
        if pip.returncode != 0:
            raise SystemExit("compat-check: the oldest versions do not install together (see pip's message)")
        log(f"installed in {time.monotonic() - t0:.0f} s")
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, env=env).stdout
    installed = {k.lower(): v for k, _, v in (line.partition("==") for line in freeze.splitlines()) if v}
    log("versions: " + ", ".join(f"{n} {installed.get(n, '?')}" for n in (*OLDEST, "numpy", "simplejpeg", "lmdb")))
    report = work / "junit.xml"
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=1200", "--junitxml", str(report),
           "-k", " and ".join(f"not {d}" for d in DESELECT), *PARITY, *args.pytest_args.split()]
    t0 = time.monotonic()
    tests = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(tests.stdout[-20000:])
    summary = (tests.stdout.strip().splitlines() or [""])[-1]
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", tests.stdout, re.M)))
    out = {"python": sys.version.split()[0], "versions": {n: installed.get(n) for n in sorted(installed)},
           "suites": PARITY, "deselected": list(DESELECT), "summary": summary, "failed": failed,
           "seconds": round(time.monotonic() - t0)}
    (work / "compat-check.json").write_text(json.dumps(out, indent=2))
    log(f"{summary} ({out['seconds']} s); results in {work / 'compat-check.json'}")
    log(f"done in {time.monotonic() - started:.0f} s")
    return tests.returncode


if __name__ == "__main__":
    raise SystemExit(main())
