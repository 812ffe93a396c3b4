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

Release wheels (``scripts/build-wheel``, docs/wheels.md) set three more, none of which a source install needs:

- ``NANO_PATCH_REQUIRE_NATIVE=1``: a failure to build either extension fails the build instead of warning, so
  that a wheel can never ship without a kernel;
- ``NANO_PATCH_JPEG_STATIC=DIR``: link ``_jpeg`` to the static libjpeg-turbo in ``DIR`` (``DIR/include``,
  ``DIR/lib/libjpeg.a``) instead of the system's, its symbols hidden, and ship its licence files in the wheel;
- ``NANO_PATCH_LIMITED_API=1``: build against the stable ABI of Python 3.11 (``Py_LIMITED_API``) and tag the
  wheel ``cp311-abi3``, one wheel for every Python from 3.11. 3.10 cannot share it: the kernels take NumPy
  arrays through the buffer protocol (``Py_buffer``), which entered the limited API only in 3.11.
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
SOURCES = ["module.c", "batch.c", "resample.c", "color.c", "hue.c", "tensor.c", "geometry.c", "oplist.c",
           "torch_draws.c", "helpers.c", "markers.c", "stat.c", "array_gather.c"]
EXTENSION = "nano_patch.vision._native"
JPEG_SOURCES = ["jpeg_region.c"]
JPEG_EXTENSION = "nano_patch.vision._jpeg"
NO_NATIVE_ENV = "NANO_PATCH_NO_NATIVE"
NO_JPEG_ENV = "NANO_PATCH_NO_JPEG"
JPEG_LIB_ENV = "NANO_PATCH_JPEG_LIB"
REQUIRE_ENV = "NANO_PATCH_REQUIRE_NATIVE"
JPEG_STATIC_ENV = "NANO_PATCH_JPEG_STATIC"
LIMITED_API_ENV = "NANO_PATCH_LIMITED_API"
#: The stable ABI the wheels target: 3.11 is the first whose limited API has the buffer protocol.
LIMITED_API_VERSION = (3, 11)
#: libjpeg-turbo's licence files, shipped next to ``_jpeg`` where it is linked statically (its licence asks it).
JPEG_LICENSES = ("LICENSE.md", "README.ijg")
JPEG_FIX = ("install libjpeg-turbo's development files (Debian: apt-get install libjpeg62-turbo-dev; Ubuntu: "
            "libjpeg-turbo8-dev; Fedora: libjpeg-turbo-devel; macOS: brew install jpeg-turbo) and reinstall")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def limited_api() -> bool:
    """Build against the stable ABI: asked for, and this Python is new enough to have the buffer protocol in it."""
    return _flag(LIMITED_API_ENV) and sys.version_info[:2] >= LIMITED_API_VERSION


def _limited_api_macros() -> list[tuple[str, str]]:
    if not limited_api():
        return []
    major, minor = LIMITED_API_VERSION
    return [("Py_LIMITED_API", f"0x{major:02X}{minor:02X}0000")]


def jpeg_static_dir() -> Path | None:
    """``NANO_PATCH_JPEG_STATIC``: the prefix of a static libjpeg-turbo to link into ``_jpeg``, or None."""
    value = os.environ.get(JPEG_STATIC_ENV, "").strip()
    return Path(value).resolve() if value else None


def _static_jpeg_library(prefix: Path) -> Path:
    for name in ("lib/libjpeg.a", "lib64/libjpeg.a", "lib/jpeg-static.lib"):  # Unix, multilib, MSVC
        if (prefix / name).is_file():
            return prefix / name
    raise FileNotFoundError(f"{JPEG_STATIC_ENV}={prefix}: no lib/libjpeg.a (or lib/jpeg-static.lib) in it")


def fp_contract(platform: str | None = None) -> str:
    """How the C compiler may fuse a multiply and an add: as PIL's own builds for ``platform`` do.

    x86-64 has no FMA in its baseline, so PIL's x86-64 builds never fuse, and neither may the kernels ("off").
    On 64-bit Arm FMA is baseline and compilers fuse by default: GCC (Linux wheels, distributions) across
    statements ("fast"), clang (macOS) within one ("on"). Built with "off" there, blend, saturation and warp
    differ from Pillow 13's aarch64 wheel and the check refuses them (measured under qemu; docs/wheels.md).
    ``platform`` is sysconfig's (``_PYTHON_HOST_PLATFORM`` in a cross build), this build's by default.
    """
    import sysconfig

    plat = platform or sysconfig.get_platform()
    if plat.endswith(("aarch64", "arm64")):
        return "on" if plat.startswith("macosx") else "fast"
    return "off"


def compile_args(compiler_type: str) -> list[str]:
    if compiler_type == "msvc":
        return ["/O2", "/fp:precise"]
    # No fast-math: it would round unlike PIL. Contraction as PIL's build has it (fp_contract). No -march:
    # the portable code stays baseline, and wider variants are picked at run time (native.h).
    return ["-O3", "-std=c99", f"-ffp-contract={fp_contract()}", "-fno-fast-math", "-fno-strict-aliasing"]


def _build(root: Path, inplace: bool, build_dir: Path, ext: Any) -> Path:
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    class BuildExt(build_ext):
        def build_extensions(self) -> None:
            for e in self.extensions:
                e.extra_compile_args = compile_args(self.compiler.compiler_type)
                if self.compiler.compiler_type != "msvc":  # the loader's native helper threads (helpers.c)
                    e.extra_link_args = [*e.extra_link_args, "-pthread"]
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
                    depends=[str(CSRC / "native.h"), str(CSRC / "jpeg_file.h")], define_macros=_limited_api_macros(),
                    py_limited_api=limited_api())
    return _build(root, inplace, build_dir, ext)


def build_jpeg_extension(root: Path, inplace: bool, build_dir: Path,
                         define_macros: Sequence[tuple[str, str]] = ()) -> Path:
    """Compile crop-region decoding (``_jpeg``) against the system's libjpeg-turbo (or the static one of
    ``NANO_PATCH_JPEG_STATIC``); return the library's path.

    Raises what the compiler driver raises where the headers or the library are missing. ``define_macros``
    override the source's defaults (the tests build a copy with ``NANO_JPEG_MARGIN=0``).
    """
    from setuptools import Extension

    macros = _limited_api_macros() + list(define_macros)
    sources = [str(CSRC / s) for s in JPEG_SOURCES]
    static = jpeg_static_dir()
    if static is None:
        lib = os.environ.get(JPEG_LIB_ENV, "").strip() or "jpeg"
        ext = Extension(JPEG_EXTENSION, sources=sources, libraries=[lib], define_macros=macros,
                        depends=[str(CSRC / "jpeg_file.h")], py_limited_api=limited_api())
    else:
        # Linked in whole, so the user needs no libjpeg at all. Only PyInit__jpeg is exported (a version
        # script; zig's linker has no --exclude-libs): PIL, simplejpeg, OpenCV and torchvision each carry a
        # libjpeg of their own in the same process, and none may bind to ours, nor ours to theirs (Linux;
        # elsewhere an extension's symbols are private anyway).
        link = []
        if sys.platform.startswith("linux"):
            build_dir.mkdir(parents=True, exist_ok=True)
            script = build_dir / "jpeg.map"
            script.write_text("{ global: PyInit__jpeg; local: *; };\n")
            link = [f"-Wl,--version-script={script}"]
        ext = Extension(JPEG_EXTENSION, sources=sources, include_dirs=[str(static / "include")],
                        extra_objects=[str(_static_jpeg_library(static))], extra_link_args=link,
                        depends=[str(CSRC / "jpeg_file.h")], define_macros=macros, py_limited_api=limited_api())
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


class MissingKernels(RuntimeError):
    """An extension could not be built where ``NANO_PATCH_REQUIRE_NATIVE`` asks for every kernel (a release)."""


def build_all(root: Path, inplace: bool, build_dir: Path, warn: Callable[[str], None]) -> list[Path]:
    """Build ``_native``, then ``_jpeg``; each failure is one warning and leaves that extension out (with
    ``NANO_PATCH_REQUIRE_NATIVE`` set: :class:`MissingKernels`, and no wheel)."""
    require = _flag(REQUIRE_ENV)
    try:
        built = [build_extension(root, inplace=inplace, build_dir=build_dir / "native")]
    except Exception as exc:  # noqa: BLE001 - no compiler, no headers: install without the kernels
        if require:
            raise MissingKernels(f"{REQUIRE_ENV} is set and the native kernels did not build: {exc}") from exc
        warn(
            "nano-patch: the native image kernels could not be compiled "
            f"({type(exc).__name__}: {str(exc).strip()[:300]}); installing without them (and without crop-region "
            "JPEG decoding). nano-patch then runs PIL's own code for resize and colour (exact, slower); "
            "`nano-patch status` says so. Install a C compiler and reinstall, or install a wheel built elsewhere, "
            "to get them."
        )
        return []
    if _flag(NO_JPEG_ENV) and not require:
        warn(f"nano-patch: {NO_JPEG_ENV} is set: building without crop-region JPEG decoding")
        return built
    jpeg, why = try_build_jpeg(root, inplace, build_dir / "jpeg")
    if jpeg is None and require:
        raise MissingKernels(f"{REQUIRE_ENV} is set and crop-region JPEG decoding did not build: {why}")
    if jpeg is None:
        warn(jpeg_warning(why))
    else:
        built.append(jpeg)
    return built


def _platform_tag() -> str:
    """This build's platform as a wheel tag (``linux_x86_64``; auditwheel turns it into a manylinux one)."""
    import sysconfig

    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if _flag(NO_NATIVE_ENV) and not _flag(REQUIRE_ENV):
            self.app.display_warning(f"nano-patch: {NO_NATIVE_ENV} is set: building without the native kernels")
            return
        root = Path(self.root)
        self._tmp = tempfile.TemporaryDirectory(prefix="nano-patch-build-")
        editable = version == "editable"
        built = build_all(root, inplace=editable, build_dir=Path(self._tmp.name), warn=self.app.display_warning)
        if not built:
            return
        build_data["pure_python"] = False
        if limited_api():
            # one wheel for every CPython from 3.11: hatchling's inferred tag would name this Python only
            build_data["tag"] = f"cp{LIMITED_API_VERSION[0]}{LIMITED_API_VERSION[1]}-abi3-{_platform_tag()}"
        else:
            build_data["infer_tag"] = True
        for path in built:
            if not editable:
                build_data["force_include"][str(path)] = f"nano_patch/vision/{path.name}"
            print(f"nano-patch: built {path.name} ({sys.platform})", file=sys.stderr)
        static = jpeg_static_dir()
        if static is not None and not editable and any(p.name.startswith("_jpeg") for p in built):
            for name in JPEG_LICENSES:
                if (static / name).is_file():
                    build_data["force_include"][str(static / name)] = f"nano_patch/vision/libjpeg-turbo/{name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
