"""``python -m nano_patch._rank (SCRIPT | -m MODULE) [ARGS ...]``: how nano-patch starts a child rank.

Lightning's script launcher builds each child's command; under nano-patch that command runs this module
first (``train/ranks.py``, ``patches/launch_command.py``). Where the launching process started a warm interpreter
(``train/warm_start.py``: ``python -m nano_patch._rank --warm-interpreter ...``), the rank runs in a fork of it
and this process watches it; otherwise it patches the process with the launcher's options
(``_NANO_PATCH_STARTUP``), tells the launcher it started, then runs the script or module exactly as
``python SCRIPT`` / ``python -m MODULE`` would. The patch so reaches the rank whatever the interpreter does
with .pth files.
"""

from __future__ import annotations

import os
import runpy
import sys

#: nano-patch's own modules a rank imports when it patches: the warm interpreter imports them ahead.
OWN = ("nano_patch.registry", "nano_patch.patches", "nano_patch.train.ranks")


def main(argv: list[str]) -> None:
    from nano_patch.train import ranks, warm_start

    if argv[:1] == [warm_start.WARM_FLAG]:  # the warm interpreter (train/warm_start.py)
        request = warm_start.serve(argv[1], argv[2:], OWN)
        if request is not None:  # a rank, forked: run as this entry would run it
            run(request["argv"])
        return
    ranks.announce_start()  # first: its thread connects while this one patches
    status = warm_start.run_warm(argv)  # the rank runs in the warm interpreter's fork; this process watches it
    if status is not None:
        warm_start.exit_as(status)
    run(argv)


def run(argv: list[str]) -> None:
    """Patch with the launcher's options and run the script or module (in this process, or in a warm fork)."""
    from nano_patch.config import STARTUP_ENV
    from nano_patch.train import ranks

    if STARTUP_ENV in os.environ:
        by_hook = "nano_patch._startup" in sys.modules  # the .pth hook ran first: it already patched
        import nano_patch._startup  # noqa: F401 - patches with the launcher's options, once

        ranks.patched_by = ".pth hook" if by_hook else "rank entry"
    if not argv:
        sys.exit(f"usage: python -m {ranks.RANK_ENTRY} (SCRIPT | -m MODULE) [ARGS ...]")
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.exit("python -m nano_patch._rank -m: give a module")
        sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file, as `python -m` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        # `python SCRIPT` puts the script's folder first on the path, where `python -m` put the working directory.
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
