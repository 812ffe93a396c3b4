"""Helpers for tests that run real processes."""

from __future__ import annotations

import subprocess


def assert_clean_exit(proc: subprocess.CompletedProcess) -> None:
    """Exit status 0 (for every rank: the launching rank waits for the others) and no gloo teardown abort."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr, proc.stderr[-4000:]
