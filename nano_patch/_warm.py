"""``python -m nano_patch._warm SOCKET [MODULE ...]``: the warm interpreter child ranks run in.

Started by the process that starts a multi-instance run (``train/warm_start.py``): it imports the modules named, and
those that process names on its stdin as it imports them, then forks one child rank for each rank entry that hands
it one, and runs it as the rank entry would (:func:`nano_patch._rank.run`).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from nano_patch.train import warm_start

    request = warm_start.serve(argv[0], argv[1:])
    if request is None:
        return  # the warm interpreter, done
    from nano_patch import _rank

    _rank.run(request["argv"])  # the rank, forked: as `python -m nano_patch._rank ARGS` would run it


if __name__ == "__main__":
    main(sys.argv[1:])
