"""Hatch build hook: compile ``nano_patch.vision._native``, the image kernels, and ``_jpeg``, crop-region
JPEG decoding, into the wheel.

The kernels are C (``nano_patch/vision/csrc``) built at install time with setuptools' compiler
driver, so that nothing is compiled or loaded from a cache at run time. The extension is optional:
where no C compiler works (a slim container image, say) the install still succeeds, a warning says
so, and nano-patch runs PIL's own code for those operations (``nano-patch status`` names why).
Wheels built on a machine with a compiler carry the kernels for machines without one.

``_jpeg`` links the system's libjpeg-turbo (>= 2.0, with its headers) and is built separately, after
``_native``: where the headers or the library are missing, one warning names the reason and the fix, and
the install goes on without it (crops are then cut from the full decode; ``nano-patch status`` says so).

Setting ``NANO_PATCH_NO_NATIVE=1`` at install time skips both on purpose, ``NANO_PATCH_NO_JPEG=1`` only
``_jpeg``. ``NANO_PATCH_JPEG_LIB`` names the library to link instead of ``jpeg`` (``-ljpeg``); the
compiler's usual ``CPPFLAGS``/``LDFLAGS`` point at headers and libraries installed elsewhere.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported outside a build (the tests use build_extension)
    BuildHookInterface = object  # type: ignore[assignment,misc]

CSRC = Path("nano_patch") / "vision" / "csrc"
SOURCES = ["module.c", "resample.c", "color.c", "hue.c", "tensor.c", "geometry.c"]
EXTENSION = "nano_patch.vision._native"
JPEG_SOURCES = ["jpeg_region.c"]
JPEG_EXTENSION = "nano_patch.vision._jpeg"
NO_NATIVE_ENV = "NANO_PATCH_NO_NATIVE"
NO_JPEG_ENV = "NANO_PATCH_NO_JPEG"
JPEG_LIB_ENV = "NANO_PATCH_JPEG_LIB"
JPEG_FIX = ("install libjpeg-turbo's development files (Debian: apt-get install libjpeg62-turbo-dev; Ubuntu: "
            "libjpeg-turbo8-dev; Fedora: libjpeg-turbo-devel; macOS: brew install jpeg-turbo) and reinstall")


def compile_args(compiler_type: str) -> list[str]:
    if compiler_type == "msvc":
        return ["/O2", "/fp:precise"]
    # No fast-math, no fused multiply-add contraction: both would round unlike PIL. No -march:
    # the portable code stays baseline, and wider variants are picked at run time (native.h).
    return ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing"]


def _build(root: Path, inplace: bool, build_dir: Path, ext: Any) -> Path:
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    class BuildExt(build_ext):
        def build_extensions(self) -> None:
            for e in self.extensions:
                e.extra_compile_args = compile_args(self.compiler.compiler_type)
            super().build_extensions()

    cwd = os.getcwd()
    os.chdir(root)
    try:
        dist = Distribution({"name": "nano-patch", "ext_modules": [ext]})
        cmd = BuildExt(dist)
        cmd.inplace = inplace
        cmd.build_lib = str(build_dir / "lib")
        cmd.build_temp = str(build_dir / "temp")
        cmd.ensure_finalized()
        cmd.run()
        return root / cmd.get_ext_fullpath(ext.name) if inplace else Path(cmd.get_ext_fullpath(ext.name))
    finally:
        os.chdir(cwd)


def build_extension(root: Path, inplace: bool, build_dir: Path) -> Path:
    """Compile the image kernels (``_native``); return the path of the built library."""
    from setuptools import Extension

    ext = Extension(EXTENSION, sources=[str(CSRC / s) for s in SOURCES], include_dirs=[str(CSRC)],
                    depends=[str(CSRC / "native.h")])
    return _build(root, inplace, build_dir, ext)


def build_jpeg_extension(root: Path, inplace: bool, build_dir: Path,
                         define_macros: Sequence[tuple[str, str]] = ()) -> Path:
    """Compile crop-region decoding (``_jpeg``) against the system's libjpeg-turbo; return the library's path.

    Raises what the compiler driver raises where the headers or the library are missing. ``define_macros``
    override the source's defaults (the tests build a copy with ``NANO_JPEG_MARGIN=0``).
    """
    from setuptools import Extension

    lib = os.environ.get(JPEG_LIB_ENV, "").strip() or "jpeg"
    ext = Extension(JPEG_EXTENSION, sources=[str(CSRC / s) for s in JPEG_SOURCES], libraries=[lib],
                    define_macros=list(define_macros))
    return _build(root, inplace, build_dir, ext)


def _captured(fn: Callable[[], Path]) -> tuple[Path | None, str]:
    """Run ``fn`` with the process's stdout and stderr (the compiler's too) going to a file: its result and
    that output, or None and the output plus the exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile("w+b") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        result: Path | None = None
        try:
            result = fn()
            failure = ""
        except Exception as exc:  # noqa: BLE001 - any failure means: no _jpeg, and say why
            failure = f"{type(exc).__name__}: {str(exc).strip()}"
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        log.seek(0)
        text = log.read().decode(errors="replace")
    return result, text + ("\n" + failure if failure else "")


def _reason(output: str) -> str:
    """The line of a failed compile or link that says why (a missing header, a missing library)."""
    for pattern in (r"#error[^\n]*", r"[^\n:]*\.h: No such file or directory", r"cannot find -l\S+",
                    r"(?:fatal )?error:[^\n]*"):
        found = re.search(pattern, output)
        if found:
            return found.group(0).strip().replace('#error "', "").strip('":')
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "unknown failure"


def try_build_jpeg(root: Path, inplace: bool, build_dir: Path) -> tuple[Path | None, str]:
    """Build ``_jpeg`` if libjpeg-turbo's headers compile and its library links: (path, "") or (None, why)."""
    built, output = _captured(lambda: build_jpeg_extension(root, inplace, build_dir))
    if output.strip():
        print(output, file=sys.stderr)  # the compiler's own words, in the build log (pip -v shows them)
    return (built, "") if built is not None else (None, _reason(output))


def jpeg_warning(why: str) -> str:
    return (f"nano-patch: crop-region JPEG decoding could not be built ({why}); installing without it. Crops "
            f"are then cut from the full decode (exact, slower); `nano-patch status` says so. To get it, {JPEG_FIX}.")


def build_all(root: Path, inplace: bool, build_dir: Path, warn: Callable[[str], None]) -> list[Path]:
    """Build ``_native``, then ``_jpeg``; each failure is one warning and leaves that extension out."""
    try:
        built = [build_extension(root, inplace=inplace, build_dir=build_dir / "native")]
    except Exception as exc:  # noqa: BLE001 - no compiler, no headers: install without the kernels
        warn(
            "nano-patch: the native image kernels could not be compiled "
            f"({type(exc).__name__}: {str(exc).strip()[:300]}); installing without them (and without crop-region "
            "JPEG decoding). nano-patch then runs PIL's own code for resize and colour (exact, slower); "
            "`nano-patch status` says so. Install a C compiler and reinstall, or install a wheel built elsewhere, "
            "to get them."
        )
        return []
    if os.environ.get(NO_JPEG_ENV, "").strip() not in ("", "0"):
        warn(f"nano-patch: {NO_JPEG_ENV} is set: building without crop-region JPEG decoding")
        return built
    jpeg, why = try_build_jpeg(root, inplace, build_dir / "jpeg")
    if jpeg is None:
        warn(jpeg_warning(why))
    else:
        built.append(jpeg)
    return built


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get(NO_NATIVE_ENV, "").strip() not in ("", "0"):
            self.app.display_warning(f"nano-patch: {NO_NATIVE_ENV} is set: building without the native kernels")
            return
        root = Path(self.root)
        self._tmp = tempfile.TemporaryDirectory(prefix="nano-patch-build-")
        editable = version == "editable"
        built = build_all(root, inplace=editable, build_dir=Path(self._tmp.name), warn=self.app.display_warning)
        if not built:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for path in built:
            if not editable:
                build_data["force_include"][str(path)] = f"nano_patch/vision/{path.name}"
            print(f"nano-patch: built {path.name} ({sys.platform})", file=sys.stderr)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
