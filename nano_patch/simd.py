"""``nano-patch install-simd``: swap Pillow for pillow-simd in this environment, and back.

pillow-simd builds from source; the build uses AVX2 when the CPU has it (its widest SIMD path).
A self-check decodes and resizes a real photograph and compares against torch's antialiased uint8
resize (which matches Pillow within 1), so a broken build is reported, not silently used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PILLOW_SIMD_VERSION = "12.1.1.post0"
STATE_FILE = Path(sys.prefix) / "nano-patch-simd.json"


def _pip(*args: str, env: dict[str, str] | None = None) -> int:
    return subprocess.call([sys.executable, "-m", "pip", *args], env=env)


def build_flags() -> str:
    from . import sysinfo

    return "cc -mavx2" if "avx2" in sysinfo.cpu_flags() else "cc"


def self_check() -> tuple[bool, str]:
    code = (
        "import numpy as np, torch, PIL, io\n"
        "from PIL import Image\n"
        "from importlib.metadata import version\n"
        "import sklearn, os\n"
        "p = os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'images', 'china.jpg')\n"
        "im = Image.open(p).convert('RGB')\n"
        "out = np.asarray(im.resize((224, 224), Image.BILINEAR)).astype(int)\n"
        "x = torch.from_numpy(np.array(im)).permute(2, 0, 1)[None]\n"
        "ref = torch.nn.functional.interpolate(x, size=(224, 224), mode='bilinear', antialias=True)[0]\n"
        "d = np.abs(out - ref.permute(1, 2, 0).numpy().astype(int)).max()\n"
        "print(version('pillow-simd'), PIL.__version__, d)\n"
        "assert d <= 1, d\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def main(undo: bool = False, check_only: bool = False) -> int:
    if check_only:
        ok, msg = self_check()
        print(("ok: " if ok else "FAILED: ") + msg)
        return 0 if ok else 1
    if undo:
        previous = json.loads(STATE_FILE.read_text()).get("pillow", "") if STATE_FILE.exists() else ""
        rc = _pip("uninstall", "-y", "pillow-simd") or _pip("install", f"pillow=={previous}" if previous else "pillow")
        if rc == 0:
            STATE_FILE.unlink(missing_ok=True)
            print("nano-patch: plain Pillow is back")
        return rc
    from importlib.metadata import PackageNotFoundError, version

    try:
        previous = version("pillow")
    except PackageNotFoundError:
        previous = ""
    env = dict(os.environ, CC=build_flags())
    print(f"nano-patch: building pillow-simd {PILLOW_SIMD_VERSION} with CC={env['CC']!r}")
    if _pip("uninstall", "-y", "pillow") != 0:
        return 1
    rc = _pip("install", "--no-binary", "pillow-simd", f"pillow-simd=={PILLOW_SIMD_VERSION}",
              env=env)
    if rc != 0:
        print("nano-patch: pillow-simd failed to build; reinstalling Pillow", file=sys.stderr)
        _pip("install", f"pillow=={previous}" if previous else "pillow")
        return rc
    STATE_FILE.write_text(json.dumps({"pillow": previous}))
    ok, msg = self_check()
    print(("nano-patch: pillow-simd self-check ok: " if ok else "nano-patch: pillow-simd self-check FAILED: ") + msg)
    if not ok:
        main(undo=True)
        return 1
    return 0
