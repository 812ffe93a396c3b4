"""Helpers for tests that run real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def assert_clean_exit(proc: subprocess.CompletedProcess) -> None:
    """Exit status 0 (for every rank: the launching rank waits for the others) and no gloo teardown abort."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-4000:]


def matrix_records(script: Path, data: Path, work: Path, cases: list[dict[str, Any]],
                   env: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """A stock-against-patched matrix's records, ``{side: {case id: events}}``: ``script`` (a ``run_cases`` main,
    ``tests/scripts/dropin_probe.py``) once per side and start method in a fresh process, two at a time, the
    forkserver runs (the longest) first. ``data``: the files the cases read; ``work``: where the runs write."""
    runs = []
    for method in ("fork", "forkserver"):
        chosen = [c for c in cases if c["start"] == method]
        if chosen:
            (work / f"{method}.json").write_text(json.dumps(chosen))
            runs += [(side, method) for side in ("stock", "patched")]

    def run(side_method: tuple[str, str]) -> tuple[str, dict[str, list[str]]]:
        side, method = side_method
        out = work / f"{side}-{method}.out.json"
        proc = subprocess.run([sys.executable, str(script), side, method, str(data), str(work / f"{method}.json"),
                               str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return side, json.loads(out.read_text())

    merged: dict[str, dict[str, list[str]]] = {"stock": {}, "patched": {}}
    with ThreadPoolExecutor(2) as pool:
        for side, got in pool.map(run, sorted(runs, key=lambda r: r[1] != "forkserver")):
            merged[side].update(got)
    return merged


def first_difference(stock: list[str], patched: list[str]) -> str | None:
    """Where two runs' events first differ (or their counts), for an assertion's message; None where they agree."""
    for i, (want, got) in enumerate(zip(stock, patched)):
        if want != got:
            return f"event {i}:\n  stock:   {want[:700]}\n  patched: {got[:700]}"
    if len(stock) != len(patched):
        longer = stock if len(stock) > len(patched) else patched
        return f"stock has {len(stock)} events, patched {len(patched)}; first extra: " \
               f"{longer[min(len(stock), len(patched))][:700]}"
    return None
