"""Drop-in probe: each case of ``tests/scripts/dropin_probe.py`` in fresh stock and patched processes, compared.

Five processes run every case (one process per mode; each case seeds every generator itself): stock and
patched with ``num_workers=0`` (loader threads on, and off), and stock and patched with two worker processes
(loader threads on in the main process; one thread in each worker). Each case's record (every batch, the three
global generators after every batch, the exception's class and ``str``, every warning under ``"always"``, the
case's own Python state) must equal stock's, event by event.

``PROBE_CASES`` (comma-separated case names) runs a selection; docs/reference.md
gives the full run's command and result.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

SCRIPT = Path(__file__).parent / "scripts" / "dropin_probe.py"
#: (stock mode, patched mode): num_workers=0 with loader threads on and off, and worker processes
PAIRS = {"threads on": ("stock", "on"), "threads off": ("stock", "off"), "workers": ("stock-workers", "workers")}


def _probe_module():
    spec = importlib.util.spec_from_file_location("dropin_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROBE = _probe_module()
SELECTED = [c for c in os.environ.get("PROBE_CASES", "").split(",") if c] or list(PROBE.CASES)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANO_PATCH_") and k != "_NANO_PATCH_STARTUP"}
    env["PYTHONWARNINGS"] = "default"
    return env


@pytest.fixture(scope="module")
def records(tmp_path_factory, photos):
    """Every mode's records of the selected cases, each mode in a fresh process (two at a time)."""
    root = tmp_path_factory.mktemp("probe")
    small = []
    for i, im in enumerate(photos):
        im = im.copy()
        im.thumbnail((400 - 60 * i, 400 - 60 * i))
        small.append(im)
    PROBE.make_folders(root / "root", small)
    modes = sorted({m for pair in PAIRS.values() for m in pair})

    def run(mode: str) -> dict[str, list[str]]:
        out = root / f"{mode}.json"
        proc = subprocess.run([sys.executable, str(SCRIPT), mode, "root", str(out), *SELECTED], cwd=root,
                              env=_env(), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text())

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(modes, pool.map(run, modes)))


def _first_difference(stock: list[str], patched: list[str]) -> str | None:
    for i, (want, got) in enumerate(zip(stock, patched)):
        if want != got:
            return f"event {i}:\n  stock:   {want[:600]}\n  patched: {got[:600]}"
    if len(stock) != len(patched):
        longer = stock if len(stock) > len(patched) else patched
        extra = longer[min(len(stock), len(patched))][:600]
        return f"stock has {len(stock)} events, patched {len(patched)}; first extra: {extra}"
    return None


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("name", SELECTED)
def test_the_case_runs_as_on_stock(records, name, pair):
    stock_mode, patched_mode = PAIRS[pair]
    stock, patched = records[stock_mode][name], records[patched_mode][name]
    assert len(stock) >= 2  # the case recorded something besides its end
    assert _first_difference(stock, patched) is None, _first_difference(stock, patched)


def test_the_probe_sees_what_it_compares(tmp_path):
    """The recorder is not blind: a label, a generator draw, an image's info and an exception's text all show."""
    import torch

    rec = PROBE.Recorder()
    rec.add(rec.value((torch.zeros(2), 1)))
    rec.add(rec.value((torch.zeros(2), 2)))
    assert rec.events[0] != rec.events[1]
    im = Image.new("RGB", (4, 4))
    plain = rec.value(im)
    im.info["dpi"] = (72, 72)
    assert rec.value(im) != plain
    rec.generators("a")
    torch.rand(1)
    rec.generators("b")
    assert rec.events[-1].split(":", 1)[1] != rec.events[-2].split(":", 1)[1]
    assert PROBE.error(OSError("x")) != PROBE.error(OSError("x (while reading y)"))
