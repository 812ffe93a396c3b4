"""``nano-patch``: run a script patched, show status, set up the environment, install pillow-simd."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("run", "status", "init", "install-simd")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nano-patch", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Python script or module with nano-patch switched on")
    run.add_argument("--tune-env", action="store_true", help="apply `nano-patch init` settings to the program")
    run.add_argument("-m", dest="module", help="run a library module as a script, like python -m")
    run.add_argument("args", nargs=argparse.REMAINDER, help="script path and its arguments")
    st = sub.add_parser("status", help="list every patch and the CPU features that matter")
    st.add_argument("--json", action="store_true")
    init = sub.add_parser("init", help="print `export` lines for the best-known environment on this machine")
    init.add_argument("--unset", action="store_true", help="print lines that undo it")
    simd = sub.add_parser("install-simd", help="swap Pillow for pillow-simd, built for this CPU")
    simd.add_argument("--undo", action="store_true", help="put plain Pillow back")
    simd.add_argument("--check", action="store_true", help="only run the self-check")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]  # `python -m nano_patch train.py ...`
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args.json)
    if args.command == "init":
        from . import envtune

        print(envtune.shell_lines(unset=args.unset))
        return 0
    from . import simd

    return simd.main(undo=args.undo, check_only=args.check)


def _run(args: argparse.Namespace) -> int:
    from . import patch_torch

    rest = list(args.args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.module is None and not rest:
        print("nano-patch run: give a script path or -m module", file=sys.stderr)
        return 2
    if args.tune_env:
        from . import envtune

        envtune.apply_to(os.environ)
    patch_torch()  # also sets the variable that patches the children it starts
    if args.module is not None:
        sys.argv = [args.module, *rest]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        script = rest[0]
        sys.argv = [script, *rest[1:]]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return 0


def _status(as_json: bool) -> int:
    from . import status

    info = status()
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"patched: {info['patched']}")
    for row in info["patches"]:
        versions = ", ".join(
            f"{d} {v or 'missing'} (supported {row['requires'][d]})" for d, v in row["versions"].items()
        )
        reason = f" - {row['reason']}" if row["reason"] else ""
        print(f"  {row['name']:<30} {row['state']:<9}{reason}  [{versions}]")
    sysinfo = info["system"]
    print("system: " + ", ".join(f"{k}={v}" for k, v in sysinfo.items()))
    return 0
