"""Hatch build hook: compile ``nano_patch.vision._native``, the image kernels, into the wheel.

The kernels are C (``nano_patch/vision/csrc``) built at install time with setuptools' compiler
driver, so that nothing is compiled or loaded from a cache at run time. The extension is optional:
where no C compiler works (a slim container image, say) the install still succeeds, a warning says
so, and nano-patch runs PIL's own code for those operations (``nano-patch status`` names why).
Wheels built on a machine with a compiler carry the kernels for machines without one.

Setting ``NANO_PATCH_NO_NATIVE=1`` at install time skips the build on purpose.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported outside a build (the tests use build_extension)
    BuildHookInterface = object  # type: ignore[assignment,misc]

CSRC = Path("nano_patch") / "vision" / "csrc"
SOURCES = ["module.c", "resample.c", "color.c", "hue.c", "tensor.c", "geometry.c"]
EXTENSION = "nano_patch.vision._native"


def compile_args(compiler_type: str) -> list[str]:
    if compiler_type == "msvc":
        return ["/O2", "/fp:precise"]
    # No fast-math, no fused multiply-add contraction: both would round unlike PIL. No -march:
    # the portable code stays baseline, and wider variants are picked at run time (native.h).
    return ["-O3", "-std=c99", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing"]


def build_extension(root: Path, inplace: bool, build_dir: Path) -> Path:
    """Compile the extension; return the path of the built library."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    class BuildExt(build_ext):
        def build_extensions(self) -> None:
            for ext in self.extensions:
                ext.extra_compile_args = compile_args(self.compiler.compiler_type)
            super().build_extensions()

    ext = Extension(EXTENSION, sources=[str(CSRC / s) for s in SOURCES], include_dirs=[str(CSRC)],
                    depends=[str(CSRC / "native.h")])
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
        return root / cmd.get_ext_fullpath(EXTENSION) if inplace else Path(cmd.get_ext_fullpath(EXTENSION))
    finally:
        os.chdir(cwd)


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("NANO_PATCH_NO_NATIVE", "").strip() not in ("", "0"):
            self.app.display_warning("nano-patch: NANO_PATCH_NO_NATIVE is set: building without the native kernels")
            return
        root = Path(self.root)
        self._tmp = tempfile.TemporaryDirectory(prefix="nano-patch-build-")
        editable = version == "editable"
        try:
            built = build_extension(root, inplace=editable, build_dir=Path(self._tmp.name))
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers: install without the kernels
            self.app.display_warning(
                "nano-patch: the native image kernels could not be compiled "
                f"({type(exc).__name__}: {str(exc).strip()[:300]}); installing without them. nano-patch then "
                "runs PIL's own code for resize and colour (exact, slower); `nano-patch status` says so. "
                "Install a C compiler and reinstall, or install a wheel built elsewhere, to get them."
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:
            build_data["force_include"][str(built)] = f"nano_patch/vision/{built.name}"
        print(f"nano-patch: built {built.name} ({sys.platform})", file=sys.stderr)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
