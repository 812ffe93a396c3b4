"""What a run asked for, what picked it up, and the few lines printed when it ends.

- A training knob (precision, channels-last, processes, auto_lr) asked for at run level that no
  Trainer, ``@nano`` or ``TorchNano`` picked up is named once at exit: a plain PyTorch loop ignores
  it, and the user should know.
- ``nano-patch run`` without options, on a model that would have gained from bf16 or channels-last,
  ends with one line naming the flag to try.
- ``nano-patch run --report`` prints (and writes) the report; see :mod:`nano_patch.report`.

Only the run's rank-0 process prints.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .config import Options

TRAINING_KNOBS = ("num_processes", "cpu_for_each_process", "precision", "channels_last", "auto_lr")
_DEFAULTS = Options()

#: Set by the startup hook: this process was started by a patched run (a rank, a worker), not by the user.
started_by_run = False
_asked: dict[str, Any] = {}
_picked_up: list[str] = []
_trained: list[dict[str, Any]] = []
_registered = False
_finished = False
_run: dict[str, Any] | None = None
_kernels_checked = False


def note_options(opts: Options) -> None:
    """``patch_torch()`` ran with these options; in the user's own process, say at exit what went unused."""
    global _registered
    _asked.clear()
    _asked.update({k: getattr(opts, k) for k in TRAINING_KNOBS if getattr(opts, k) != getattr(_DEFAULTS, k)})
    if not started_by_run and not _registered:
        _registered = True
        atexit.register(_at_exit)


def first_kernel_check() -> bool:
    """Whether the compiled kernels' absence is this process's to warn about: its first ``patch_torch()``, in a
    process the user started (processes a patched run starts, ranks and workers, stay quiet: their parent said it)."""
    global _kernels_checked
    if started_by_run or _kernels_checked:
        return False
    _kernels_checked = True
    return True


def forget_options() -> None:
    """``unpatch_torch()``: nothing is asked for any more."""
    _asked.clear()


def note_picked_up(api: str) -> None:
    """A Trainer, ``@nano`` or ``TorchNano`` read the training knobs."""
    _picked_up.append(api)


def note_training(api: str, model: Any, precision: str, channels_last: bool) -> None:
    """A model is about to train: enough to tell, at the end, whether bf16 or channels-last would apply."""
    conv = any(p.dim() == 4 for p in model.parameters()) if hasattr(model, "parameters") else False
    _trained.append({"api": api, "precision": "bf16" if str(precision).startswith("bf16") else str(precision),
                     "channels_last": channels_last, "conv4d": conv})


def start_run(flags: dict[str, Any], report_path: str | None,
              report_facts: Callable[[], tuple[list[dict[str, Any]], str]] | None = None) -> None:
    """``nano-patch run`` is about to run the script with these explicit ``flags``. ``report_facts``: what the
    report needs from the layers above this module (every patch's row, the resize kernel's state), asked at the end."""
    global _run
    _run = {"start": time.monotonic(), "flags": dict(flags), "report": report_path,
            "facts": report_facts or (lambda: ([], "not asked"))}


def is_rank_zero() -> bool:
    # Lightning's script launcher gives the ranks it starts LOCAL_RANK and NODE_RANK; RANK comes later, if at all.
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        value = os.environ.get(var, "0")
        if value.isdigit() and int(value) != 0:
            return False
    return True


def unused_knobs() -> list[str]:
    if not _asked or _picked_up:
        return []
    names = ", ".join(f"{k}={v!r}" for k, v in _asked.items())
    return [f"{names} asked for, but no Lightning Trainer, @nano or TorchNano ran, so nothing applied it "
            "(a plain PyTorch loop keeps fp32 and its own memory format): decorate the training function with "
            "@nano, or subclass TorchNano (see the README)"]


def hint() -> str | None:
    """The one line for a run without options whose model would gain from ``--fast``."""
    from . import sysinfo

    if _run is None or _run["flags"] or _asked:
        return None
    bf16 = sysinfo.has_native_bf16() and any(t["precision"] != "bf16" for t in _trained)
    conv = any(t["conv4d"] and not t["channels_last"] for t in _trained)
    if not (bf16 or conv):
        return None
    why = [w for w, on in (("bf16 (native on this CPU)", bf16), ("channels-last (the model has 4-D convolutions)",
                                                                  conv)) if on]
    return f"nano-patch: this run kept stock numerics; try `nano-patch run --fast` for {' and '.join(why)}"


def _at_exit() -> None:
    if not _finished:
        finish(print_notices=True)


def finish(print_notices: bool = True) -> dict[str, Any] | None:
    """Print the end-of-run lines (rank 0 only, once); return the report when one was asked for."""
    global _finished
    if _finished or not is_rank_zero():
        return None
    _finished = True
    out = sys.stderr
    result = None
    if _run is not None and _run["report"] is not None:
        result = _report()
        from .report import render

        print(render(result), file=out)
        if _run["report"] != "-":
            with open(_run["report"], "w") as f:
                json.dump(result, f, indent=2)
        from . import report

        report.discard()
    elif print_notices:
        for line in unused_knobs():
            print(f"nano-patch: {line}", file=out)
    if print_notices:
        line = hint()
        if line:
            print(line, file=out)
    return result


def _report() -> dict[str, Any]:
    from . import report, sysinfo

    assert _run is not None
    rows, resample_state = _run["facts"]()
    return report.compose(time.monotonic() - _run["start"], rows, unused_knobs(), _trained,
                          sysinfo.has_native_bf16(), sysinfo.pillow_is_simd(), resample_state)
