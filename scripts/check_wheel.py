"""Check a built wheel the way a user without a compiler or libjpeg would meet it; fail if any kernel is missing.

``scripts/check-wheel WHEEL`` (docs/wheels.md):

1. makes a fresh venv that sees the already-installed dependencies (``--system-site-packages``: torch is
   5 GB) and installs the wheel into it with pip, offline (``--no-index``: every dependency must already be
   satisfied), and times that;
2. from then on runs everything with no compiler reachable (``CC`` and ``LDSHARED`` pointing nowhere, ``PATH``
   holding no gcc, cc, clang or zig) and, as root, in a private mount namespace where the system's
   libjpeg (its libraries and jpeglib.h) is hidden under empty files, so nothing can fall back on them;
3. requires ``nano-patch status`` (the venv's console script) to list every kernel as native, crop_decode
   included, with the package imported from the venv and not from the source tree;
4. runs tests from a copy of ``tests/`` against the installed package: ``--tests smoke`` (CI) the kernel and
   crop-decode suites minus their slowest cases, ``kernels`` those suites whole, ``full`` the whole suite.
   Tests that rebuild the kernels from the C sources (sabotaged builds, a build without a compiler or without
   libjpeg) and the one that runs ``scripts/build-wheel`` need the source tree and a compiler, which this
   check takes away on purpose: they are deselected and listed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Program names that would let something compile: kept off PATH.
COMPILERS = re.compile(r"^(cc|c89|c99|gcc|g\+\+|c\+\+|cpp|clang.*|tcc|zig|ld(\..*)?|as|.*-linux-gnu-.*|.*-gcc(-\d+)?"
                       r"|gcc-\d+|x86_64-.*|aarch64-.*)$")
#: Tests that compile the kernels from the C sources in the test itself, or run the wheel build script: deselected
#: here (see the docstring).
NEEDS_SOURCE_AND_COMPILER = ("sabotaged", "refused_kernel_means", "refused_warp_means", "without_the_margin",
                             "without_the_minimum_band", "no_c_compiler", "without_libjpeg_the_install",
                             "planted_in_a_cache_folder", "missing_nasm")
KERNEL_TESTS = ("tests/test_native_kernels.py", "tests/test_crop_decode.py", "tests/test_warp_kernels.py",
                "tests/test_wheel.py")
#: --tests smoke: the kernel suites less their longest cases (each kernel still checked against PIL at load by
#: test_wheel.py and by status; these add its exhaustive colour sweeps and photo crops).
SMOKE_SKIP = ("every_colour", "every_pair", "every_shift", "real_photo", "real_photos", "augment_policies",
              "timm_rand_augment", "torchvision_under_the_patch", "in_threads", "pillow_simd")


def log(msg: str) -> None:
    print(f"check-wheel: {msg}", file=sys.stderr, flush=True)


def no_compiler_path(work: Path) -> str:
    """A PATH of links to every program on the current PATH except compilers, assemblers and linkers."""
    bindir = work / "bin-no-compiler"
    bindir.mkdir(parents=True, exist_ok=True)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not Path(folder).is_dir() or Path(folder).resolve() == bindir.resolve():
            continue
        for entry in Path(folder).iterdir():
            link = bindir / entry.name
            if COMPILERS.match(entry.name) or link.exists() or link.is_symlink():
                continue
            if entry.is_file() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return str(bindir)


def system_libjpeg() -> list[Path]:
    """The system's libjpeg files (libraries the dynamic linker would find, headers a build would use)."""
    found: set[Path] = set()
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        cache = ""
    for line in cache.splitlines():
        if "libjpeg" in line and "=>" in line:
            found.add(Path(line.split("=>", 1)[1].strip()))
    for pattern in ("/usr/lib/*/libjpeg*", "/usr/lib/libjpeg*", "/usr/lib64/libjpeg*", "/usr/local/lib/libjpeg*",
                    "/usr/include/jpeglib.h", "/usr/include/*/jconfig.h", "/usr/include/jconfig.h"):
        found.update(Path("/").glob(pattern.lstrip("/")))
    return sorted(p for p in found if p.exists())


def hidden_libjpeg_prefix(hide: bool) -> list[str]:
    """A command prefix that runs its command with the system's libjpeg files covered by empty ones."""
    files = system_libjpeg()
    if not hide or not files:
        return []
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise SystemExit("check-wheel: hiding the system's libjpeg needs root and unshare (util-linux); "
                         "pass --keep-libjpeg to check without hiding it")
    mounts = " && ".join(f"mount --bind /dev/null '{f}'" for f in files)
    # a private namespace: the mounts are seen by this command and its children only, never by the host
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts} && exec \"$@\"", "hide-libjpeg"]


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def kernel_lines(status: str) -> dict[str, str]:
    """``nano-patch status``'s kernel section: {kernel: state}."""
    out: dict[str, str] = {}
    section = False
    for line in status.splitlines():
        if line.startswith("native image kernels:"):
            section = True
        elif section and line.startswith("  "):
            name, _, state = line.strip().partition(" ")
            out[name] = state.strip()
        elif section:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/check-wheel", description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the wheel (with --installed: only named in the log)")
    parser.add_argument("--tests", choices=("none", "smoke", "kernels", "full"), default="smoke")
    parser.add_argument("--work", type=Path, help="folder for the venv and the test copy (default: a temporary one)")
    parser.add_argument("--keep-libjpeg", action="store_true", help="do not hide the system's libjpeg")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments (one string)")
    parser.add_argument("--installed", action="store_true", help="check the nano-patch installed in this Python "
                        "instead of installing WHEEL (cibuildwheel's test step, where the wheel is already in)")
    args = parser.parse_args(argv)
    wheel = args.wheel.resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix="nano-patch-wheel-check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.installed:
        venv = Path(sys.prefix)
        python = Path(sys.executable)
    else:
        venv = work / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        # no pip (nor the old setuptools a 3.11 venv brings, which would shadow the one torch needs): the
        # installed pip runs, and installs into the venv
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                       check=True)
        python = venv / "bin" / "python"
        # Python adds the base site-packages (torch, wrapt...) only after it has run the venv's .pth files, and the
        # wheel's nano_patch_startup.pth (which patches the processes a patched run starts) needs them: a .pth
        # that sorts first puts them on sys.path before it, still behind the venv's own site-packages.
        site_dirs = subprocess.run([sys.executable, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                                   capture_output=True, text=True, check=True).stdout.split()
        venv_site = next(Path(p) for p in subprocess.run(
            [str(python), "-c", "import site; print('\\n'.join(site.getsitepackages()))"], capture_output=True,
            text=True, check=True).stdout.split() if p.startswith(str(venv)))
        (venv_site / "00-base-site-packages.pth").write_text("".join(f"{d}\n" for d in site_dirs))
    scripts = python.parent
    # Windows cannot link programs without privileges; compilers there are not on PATH by default anyway
    path = f"{scripts}{os.pathsep}{no_compiler_path(work)}" if os.name == "posix" else os.environ["PATH"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANO_PATCH_", "PYTHON", "_NANO_PATCH"))}
    env.update(PATH=path, CC="/nonexistent/cc", CXX="/nonexistent/c++", LDSHARED="/nonexistent/cc -shared",
               VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONSTRAINT="", PIP_NO_INDEX="1",
               PIP_FIND_LINKS="")
    for tool in ("gcc", "cc", "clang", "zig"):
        if shutil.which(tool, path=path):
            raise SystemExit(f"check-wheel: {tool} is still on PATH: {shutil.which(tool, path=path)}")
    hide = hidden_libjpeg_prefix(not args.keep_libjpeg)

    if not args.installed:
        t0 = time.monotonic()
        install = run([str(python), "-m", "pip", "install", "--no-index", str(wheel)], env, work, 600)
        install_s = time.monotonic() - t0
        if install.returncode != 0:
            sys.stderr.write(install.stdout + install.stderr)
            raise SystemExit("check-wheel: the wheel does not install offline over the installed dependencies")
        log(f"installed {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB) in {install_s:.1f} s")

    where = run(hide + [str(python), "-c", (
        "import ctypes, nano_patch, nano_patch.vision._native as n, nano_patch.vision._jpeg as j\n"
        "print(nano_patch.__file__); print(n.__file__); print(j.__file__)\n"
        "try:\n    ctypes.CDLL('libjpeg.so.62'); print('system libjpeg: loads')\n"
        "except OSError as exc:\n    print('system libjpeg: hidden (' + str(exc).split(':')[-1].strip() + ')')\n")],
        env, work, 300)
    if where.returncode != 0:
        sys.stderr.write(where.stdout + where.stderr)
        raise SystemExit("check-wheel: the installed extensions do not import")
    print(where.stdout.strip())
    for line in where.stdout.splitlines()[:3]:
        if not line.startswith(str(venv)):
            raise SystemExit(f"check-wheel: {line} is not the installed wheel's (under {venv})")
    if hide and "system libjpeg: hidden" not in where.stdout:
        raise SystemExit("check-wheel: the system's libjpeg is still loadable")

    console = shutil.which("nano-patch", path=str(scripts))  # the console script the wheel installed
    if console is None:
        raise SystemExit(f"check-wheel: no nano-patch console script in {scripts}")
    status = run(hide + [console, "status"], env, work, 600)
    print(status.stdout.strip())
    kernels = kernel_lines(status.stdout)
    missing = {k: v for k, v in kernels.items() if not v.startswith("native")}
    if status.returncode != 0 or "crop_decode" not in kernels or missing or len(kernels) < 9:
        sys.stderr.write(status.stderr)
        raise SystemExit(f"check-wheel: not every kernel is native: {missing or kernels}")
    log(f"status: all {len(kernels)} kernels native")

    if args.tests != "none":
        tree = work / "tree"  # tests' ROOT: the tests, their data, and nano_patch linked to the installed package
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        for name in ("tests", "examples", "benchmarks"):
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        shutil.copy(ROOT / "hatch_build.py", tree / "hatch_build.py")  # its pure functions (build warning text)
        site = Path(where.stdout.splitlines()[0]).parent
        (tree / "nano_patch").symlink_to(site, target_is_directory=True)
        (tree / "pytest.ini").write_text("[pytest]\ntestpaths = tests\ntimeout = 600\naddopts = -ra\n")
        deselect = list(NEEDS_SOURCE_AND_COMPILER) + (list(SMOKE_SKIP) if args.tests == "smoke" else [])
        files = [] if args.tests == "full" else [f for f in KERNEL_TESTS if (tree / f).exists()]
        cmd = hide + [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                      " and ".join(f"not {name}" for name in deselect), *files, *args.pytest_args.split()]
        log(f"running {args.tests} tests from the installed wheel; deselected (they compile from source): "
            f"{', '.join(NEEDS_SOURCE_AND_COMPILER)}")
        test_env = {**env, "NANO_WHEEL_CHECK_SITE": str(site)}
        if not args.installed:  # the wheel itself, for tests that install it their own way (pip --target)
            test_env["NANO_WHEEL_CHECK_WHEEL"] = str(Path(args.wheel).resolve())
        t0 = time.monotonic()
        tests = subprocess.run(cmd, env=test_env, cwd=tree, timeout=3600)
        log(f"tests took {time.monotonic() - t0:.0f} s")
        if tests.returncode != 0:
            raise SystemExit(f"check-wheel: tests failed ({tests.returncode})")
    log(f"passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
