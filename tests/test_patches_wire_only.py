"""``patches/`` only wires: each patch module is a list of wraps, redirects and replacements over functions that live
in the layer that owns the behaviour, and while batches load nothing below calls back up into ``patches/``.

The rule for the first part: no function (method, closure) defined in a ``patches/`` module runs over 30 lines,
its docstring included. The second is watched with a profiler hook over real batches, on the loader threads
(``num_workers=0``) and on virtual workers (``num_workers=2``), in a fresh interpreter so that every thread that
loads is started under the hook.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "nano_patch" / "patches"
MAX_LINES = 30


def long_functions(folder: Path = PATCHES, limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > limit:
                    out.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_in_a_patch_module_runs_over_30_lines():
    assert long_functions() == []


def test_the_length_rule_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "wiring.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path) == [f"wiring.py:5 long ({MAX_LINES + 1} lines)"]


_WATCH = textwrap.dedent('''
    import json, os, sys, threading
    import multiprocessing
    multiprocessing.set_start_method("fork", force=True)
    root, workers = sys.argv[1], int(sys.argv[2])
    import nano_patch
    nano_patch.patch_torch(loader_threads=2)
    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    package = os.path.dirname(nano_patch.__file__)
    below = tuple(os.path.join(package, d) + os.sep for d in ("data", "vision", "train"))
    patches = os.path.join(package, "patches") + os.sep
    found, calls = set(), [0]

    def hook(frame, event, arg):
        if event == "call" and frame.f_back is not None:
            callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
            if callee.startswith(package):
                calls[0] += 1
            if callee.startswith(patches) and caller.startswith(below):
                found.add(f"{os.path.relpath(caller, package)}:{frame.f_back.f_code.co_name} -> "
                          f"{os.path.relpath(callee, package)}:{frame.f_code.co_name}")

    tf = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    loader = DataLoader(ImageFolder(root, tf), batch_size=4, shuffle=True, num_workers=workers)
    torch.manual_seed(0)
    threading.setprofile(hook)
    sys.setprofile(hook)
    batches = sum(1 for _ in loader)
    sys.setprofile(None)
    threading.setprofile(None)
    plan = getattr(loader, "_nano_plan", None)
    print(json.dumps({"found": sorted(found), "calls": calls[0], "batches": batches,
                      "path": plan.path if plan is not None else None}))
''')


@pytest.mark.parametrize("workers,path", [(0, "loader threads"), (2, "virtual workers")])
def test_loading_batches_never_calls_up_into_patches(image_folder, workers, path):
    """Every call made while the batches load, on every thread, runs down: data, vision and train never call a
    function of ``patches/`` (a wrapper installed by a patch is a function of the layer below)."""
    proc = subprocess.run([sys.executable, "-c", _WATCH, str(image_folder), str(workers)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["batches"] == 3 and got["calls"] > 100, got  # (the hook saw the package's own loading)
    assert got["path"] == path, got
    assert got["found"] == [], got["found"]
