"""``nano-patch``: run a script patched, show status, set up the environment, install pillow-simd."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from . import config

SUBCOMMANDS = ("run", "status", "init", "install-simd", "cache")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nano-patch", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run a Python script or module with nano-patch switched on",
        usage="nano-patch run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run a script or module as `python` would, patched. Options go before the script; "
                    "everything after it is the script's own.")
    run.add_argument("--fast", action="store_true",
                     help="everything that measured faster here: bf16 where the CPU has native bf16, channels-last "
                          "for models with 4-D convolutions, the `nano-patch init` environment; explicit options win")
    run.add_argument("--report", nargs="?", const="-", metavar="PATH.json",
                     help="at the end, print what the patches did and where the time went; also write it as JSON "
                          "to PATH.json")
    run.add_argument("--tune-env", action="store_true", help="apply `nano-patch init` settings to the program")
    run.add_argument("-m", dest="module", help="run a library module as a script, like python -m")
    opts = run.add_argument_group("nano-patch options",
                                  "each is also a NANO_PATCH_* environment variable; a flag wins over it")
    for field in config.FIELDS:
        flag = "--" + field.replace("_", "-")
        text = f"{config.DESCRIPTIONS[field]}; accepted: {config.ACCEPTED[field]} ({config.env_name(field)})"
        if field in config.BOOLEAN_FIELDS:
            opts.add_argument(flag, dest=field, action=argparse.BooleanOptionalAction, default=None,
                              help=text.replace("%", "%%"))
        elif field in ("auto_lr", "cache_decoded"):
            const, metavar = ("true", "JSON") if field == "auto_lr" else ("on", "on|off|auto|SIZE")
            opts.add_argument(flag, dest=field, nargs="?", const=const, default=None, metavar=metavar,
                              help=text.replace("%", "%%"))
        else:
            metavar = {"num_processes": "N|auto", "cpu_for_each_process": "'0,1;2,3'", "precision": "32|bf16",
                       "cache_dir": "PATH", "loader_threads": "N|auto|off"}
            opts.add_argument(flag, dest=field, default=None, metavar=metavar.get(field, "VALUE"),
                              help=text.replace("%", "%%"))
    run.add_argument("args", nargs=argparse.REMAINDER, help="script path and its arguments")
    st = sub.add_parser("status", help="list every patch, the CPU features that matter and the torch build")
    st.add_argument("--json", action="store_true")
    init = sub.add_parser("init", help="print `export` lines for the best-known environment on this machine")
    init.add_argument("--unset", action="store_true", help="print lines that undo it")
    simd = sub.add_parser("install-simd", help="swap Pillow for pillow-simd, built for this CPU")
    simd.add_argument("--undo", action="store_true", help="put plain Pillow back")
    simd.add_argument("--check", action="store_true", help="only run the self-check")
    cache = sub.add_parser("cache", help="list the decoded-image caches (size, entries, cap), or clear them",
                           description="The decoded-image cache keeps full JPEG decodes on disk so that epochs after "
                                       "the first skip decoding (--cache-decoded, and --fast where it fits).")
    cache.add_argument("action", nargs="?", choices=("list", "clear"), default="list")
    cache.add_argument("--cache-dir", dest="cache_dir", metavar="PATH",
                       help="a cache folder to look at besides the default and NANO_PATCH_CACHE_DIR")
    cache.add_argument("--json", action="store_true")
    return p


#: ``run`` flags whose value is optional: the token after one may be the script itself (``--report train.py``).
_OPTIONAL_VALUE_FLAGS = ("--report", "--cache-decoded", "--auto-lr")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, where the script (or ``-m MODULE``) ends nano-patch's options as ``python`` does: whatever
    follows it is its own, options included (``nano-patch run --report train.py --data-path D``,
    ``nano-patch run -m pytest -q``)."""
    parser = _parser()
    if argv and argv[0] == "run":
        for i, token in enumerate(argv):
            if token == "--":
                break
            if token == "-m" and i + 1 < len(argv):
                head = parser.parse_args(argv[:i + 2])
                if not head.args:  # else `-m` came after the script: it is the script's
                    head.args = argv[i + 2:]
                    return head
                break
            if (token in _OPTIONAL_VALUE_FLAGS and i + 1 < len(argv) and _is_script(argv[i + 1])
                    and not (token == "--report" and argv[i + 1].endswith(".json"))):
                # the flag without its value, then the script: argparse must not read the script's own options
                head = parser.parse_args(argv[:i + 1])
                if not head.args:
                    head.args = argv[i + 1:]
                    return head
                break
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]  # `python -m nano_patch train.py ...`
    args = parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args.json)
    if args.command == "cache":
        return _cache(args.action, args.cache_dir, args.json)
    if args.command == "init":
        from . import envtune

        print(envtune.shell_lines(unset=args.unset))
        return 0
    from . import simd

    return simd.main(undo=args.undo, check_only=args.check)


def run_options(args: argparse.Namespace) -> dict[str, object]:
    """The explicit options of a `nano-patch run` command line (flags over the preset)."""
    explicit = {f: getattr(args, f) for f in config.FIELDS if getattr(args, f) is not None}
    if args.fast:
        from . import preset

        chosen, _ = preset.fast_options()
        explicit = {**chosen, **explicit}
    return explicit


def _run(args: argparse.Namespace) -> int:
    from . import exit_notices, options, patch_torch, report_facts
    from .train import ranks, shutdown, warm_start

    rest = list(args.args)
    if args.report not in (None, "-") and not args.report.endswith(".json"):
        rest.insert(0, args.report)  # `--report train.py`: the script, not a report path
        args.report = "-"
    for field, const in (("cache_decoded", "on"), ("auto_lr", "true")):
        value = getattr(args, field)
        if value is not None and _is_script(value):
            rest.insert(0, value)  # `--cache-decoded train.py`: the flag without a value, then the script
            setattr(args, field, const)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.module is None and not rest:
        print("nano-patch run: give a script path or -m module", file=sys.stderr)
        return 2
    explicit = run_options(args)
    if args.fast or args.tune_env:
        from . import envtune

        if envtune.needs_reexec(os.environ):
            # A preloaded allocator only takes effect in a new process: start this one again with it.
            env = dict(os.environ)
            envtune.apply_to(env)
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        envtune.apply_to(os.environ)
        if args.fast:
            from . import preset

            print(preset.fast_options()[1], file=sys.stderr)
    if args.report is not None:
        import tempfile

        from . import report

        # Every process of the run (ranks, DataLoader workers) writes its figures here.
        os.environ[report.REPORT_DIR_ENV] = tempfile.mkdtemp(prefix="nano-patch-report-")
    warm_start.deferred = True  # started below, for the script this command runs
    try:
        patch_torch(**explicit)  # also sets the variable that patches the children it starts
    except config.ConfigError as exc:
        print(f"nano-patch run: {exc}", file=sys.stderr)
        return 2
    finally:
        # Only this call defers: a patch_torch() the script makes itself may start one as a script's call does.
        warm_start.deferred = False
    ranks.patched_by = "nano-patch run"
    opts = options()
    # Child ranks will run in an interpreter that imports while this one starts (train/warm_start.py).
    warm_start.maybe_start(opts.num_processes, opts.cpu_for_each_process, script=None if args.module else rest[0],
                           module=args.module)
    exit_notices.start_run(explicit, args.report, report_facts)
    code = 0
    try:
        if args.module is not None:
            sys.argv = [args.module, *rest]
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            script = rest[0]
            sys.argv = [script, *rest[1:]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except KeyboardInterrupt:
        shutdown.mark_failed()
        code = 130
    except BaseException:  # noqa: BLE001 - the script's own error: print it as Python would, then end the run
        shutdown.mark_failed()
        traceback.print_exc()
        code = 1
    if code == 0:
        shutdown.destroy_after_clean_finish()
        for pid, status in shutdown.wait_for_child_ranks():
            print(f"nano-patch run: rank process {pid} ended with status {status}", file=sys.stderr)
            code = 1
    else:
        shutdown.mark_failed()
    exit_notices.finish(print_notices=code == 0)
    return code


def _is_script(value: str) -> bool:
    """A flag's optional value that is really the script to run (a .py file, or a file that exists)."""
    return value.endswith(".py") or os.path.isfile(value)


def _exit_status(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


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
    print("native image kernels:")
    for name, state in info["kernels"].items():
        print(f"  {name:<30} {state}")
    c = info["decoded_cache"]
    where = f"{c['store']}: {c.get('entries')} images, {c.get('bytes_on_disk', 0) / 1e6:.0f} MB [{c['state']}]" \
        if c.get("exists") else c.get("state", "")
    print(f"decoded-image cache: {c['setting']}; {where}")
    sysinfo = info["system"]
    print("system: " + ", ".join(f"{k}={v}" for k, v in sysinfo.items()))
    t = info["torch"]
    gpus = f", {t['gpus']} GPU{'s' if t['gpus'] != 1 else ''} visible" if "gpus" in t else ""
    print(f"torch: {t['version']} ({t['build']} build{gpus})")
    return 0


def _cache(action: str, cache_dir: str | None, as_json: bool) -> int:
    from pathlib import Path

    from .vision.images import cache

    folders = cache.known_folders([Path(cache_dir).expanduser()] if cache_dir else None)
    if action == "clear":
        code = 0
        for folder in folders:
            try:
                removed = cache.clear(folder)
            except OSError as exc:
                print(f"nano-patch cache: {exc}", file=sys.stderr)
                code = 1
                continue
            if removed:
                print(f"removed {removed}")
        return code
    rows = [cache.describe(folder) for folder in folders]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        if not row["exists"]:
            print(f"{row['folder']}: no cache")
            continue
        entries = "?" if row["entries"] is None else row["entries"]
        cap = "" if row["cap"] is None else f", cap {cache.human_bytes(row['cap'])}"
        print(f"{row['store']}: {cache.human_bytes(row['bytes_on_disk'])} on disk, {entries} images{cap} "
              f"[{row['state']}]")
    return 0
