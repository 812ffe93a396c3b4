"""Run from ``nano_patch_startup.pth`` when a launcher set ``_NANO_PATCH_STARTUP``.

The .pth line imports this module only when that variable is set, so a process that did not ask is
never patched and pays nothing beyond one dictionary lookup.
"""

import os
import sys


def _run() -> None:
    from nano_patch import exit_notices, patch_torch
    from nano_patch.config import STARTUP_ENV, from_json
    from nano_patch.train import ranks

    exit_notices.started_by_run = True

    try:
        patch_torch(**from_json(os.environ.get(STARTUP_ENV) or "{}"))
        ranks.patched_by = ".pth hook"
        ranks.announce_start()  # a child rank whose command did not go through the rank entry
    except Exception as exc:  # noqa: BLE001 - never stop the interpreter from starting
        print(f"nano-patch: startup patching failed, running unpatched: {type(exc).__name__}: {exc}", file=sys.stderr)


_run()
