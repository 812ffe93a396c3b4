"""The release wheel's build switches (hatch_build.py), the run-time choice of instruction set, and, when
``scripts/check-wheel`` runs this file against an installed wheel, that wheel: every kernel native, crop
decoding on the libjpeg-turbo linked into it and never the system's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from nano_patch.vision.kernels import native, native_checks

ROOT = Path(__file__).resolve().parents[1]
#: Set by scripts/check-wheel to the installed package's site folder. Read once here: the suite's autouse
#: fixture clears NANO_PATCH_* variables, hence the other prefix.
WHEEL_SITE = os.environ.get("NANO_WHEEL_CHECK_SITE", "")
in_wheel_check = pytest.mark.skipif(not WHEEL_SITE, reason="runs under scripts/check-wheel, against the wheel")
needs_compiler = pytest.mark.skipif(
    bool(WHEEL_SITE) or not (shutil.which(os.environ.get("CC", "cc").split()[0]) or shutil.which("gcc")),
    reason="builds the kernels from the sources: needs the source tree and a C compiler")


def _hatch_build():
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    return hatch_build


def _cpu_isa() -> str | None:
    """The instruction set the kernels should pick on this CPU, from what Linux reports (None elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None  # not x86 (aarch64 says "Features")
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(flags):
        return "avx512"
    return "avx2" if "avx2" in flags else "generic"


def test_the_kernels_choose_the_instruction_set_this_cpu_has():
    """module.c reads CPUID itself (zig's __builtin_cpu_supports is a stub that reports nothing): its choice must
    be the one the kernel's flags give, in a source build and in the wheel alike."""
    if importlib.util.find_spec("nano_patch.vision._native") is None:
        pytest.skip("the native kernels are not built here")
    want = _cpu_isa()
    if want is None:
        pytest.skip("no x86 CPU flags here")

    assert native.load_extension().best_isa() == want


@needs_compiler
def test_a_stable_abi_build_is_abi3_and_exact(tmp_path, monkeypatch):
    """NANO_PATCH_LIMITED_API=1: ``_native.abi3.so``, compiled against Py_LIMITED_API 3.11, passes every check."""
    if sys.version_info < (3, 11):
        pytest.skip("the stable ABI the wheels use is 3.11's (Py_buffer)")
    hb = _hatch_build()
    monkeypatch.setenv(hb.LIMITED_API_ENV, "1")
    built = hb.build_extension(ROOT, inplace=False, build_dir=tmp_path)
    assert built.name == "_native.abi3.so", built
    spec = importlib.util.spec_from_file_location("abi3_build._native", built)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, check in native_checks.CHECKS.items():
        if name not in native.JPEG_KERNELS:
            assert check(mod) is None, name


def test_a_release_build_fails_rather_than_ship_without_a_kernel(tmp_path, monkeypatch):
    """NANO_PATCH_REQUIRE_NATIVE=1: a kernel that does not build stops the build (a source install only warns)."""
    hb = _hatch_build()
    monkeypatch.setenv(hb.REQUIRE_ENV, "1")
    warnings: list[str] = []

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(hb, "build_extension", no_compiler)
    with pytest.raises(hb.MissingKernels, match="native kernels did not build"):
        hb.build_all(ROOT, False, tmp_path, warnings.append)
    monkeypatch.setattr(hb, "build_extension", lambda *args, **kwargs: tmp_path / "_native.so")
    monkeypatch.setattr(hb, "try_build_jpeg", lambda *args: (None, "cannot find -ljpeg"))
    with pytest.raises(hb.MissingKernels, match="crop-region JPEG decoding did not build: cannot find -ljpeg"):
        hb.build_all(ROOT, False, tmp_path, warnings.append)
    monkeypatch.delenv(hb.REQUIRE_ENV)
    assert hb.build_all(ROOT, False, tmp_path, warnings.append) == [tmp_path / "_native.so"]
    assert len(warnings) == 1 and "could not be built" in warnings[0], warnings


@in_wheel_check
def test_the_wheel_is_what_runs_and_every_kernel_is_native():
    import nano_patch

    assert Path(nano_patch.__file__).resolve().is_relative_to(Path(WHEEL_SITE).resolve()), nano_patch.__file__
    native.reset()
    state = native.check_all()
    assert all(v.startswith("native") for v in state.values()), state
    jpeg = native._import_jpeg()
    assert Path(jpeg.__file__).name == "_jpeg.abi3.so" or sys.version_info < (3, 11), jpeg.__file__


@in_wheel_check
def test_the_wheel_decodes_crops_with_its_own_libjpeg_turbo():
    """libjpeg-turbo is linked into ``_jpeg``: the code it runs lies in that file, and after a crop decode no
    system libjpeg is mapped into the process."""
    import numpy as np
    import simplejpeg

    jpeg = native._import_jpeg()
    assert Path(jpeg.library()).resolve() == Path(jpeg.__file__).resolve(), jpeg.library()
    data = simplejpeg.encode_jpeg(np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8), 90)
    assert np.array_equal(_region(jpeg, data, 5, 7, 30, 40), simplejpeg.decode_jpeg(data)[5:35, 7:47])
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    system = [line.split()[-1] for line in maps.splitlines() if "/libjpeg" in line and "/usr/" in line]
    assert not system, system


def _region(jpeg, data: bytes, top: int, left: int, height: int, width: int):
    import numpy as np

    buf, stride, oy, ox = jpeg.decode_region(data, top, left, height, width)
    return np.frombuffer(buf, np.uint8).reshape(-1, stride // 3, 3)[oy:oy + height, ox:ox + width]


def test_the_wheel_build_names_a_missing_nasm_in_one_line(monkeypatch):
    """A bare Debian machine has no nasm, which libjpeg-turbo's x86-64 SIMD code needs: ``scripts/build-wheel``
    stops before anything else, with one line that says how to install it."""
    spec = importlib.util.spec_from_file_location("build_wheel_script", ROOT / "scripts" / "build_wheel.py")
    build_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_wheel)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="nasm is missing.*apt-get install nasm") as stopped:
        build_wheel.main(["--arch", "x86_64", str(ROOT / "no-such-output")])
    assert "\n" not in str(stopped.value)
    build_wheel.require_nasm("aarch64")  # (libjpeg-turbo's Neon code is C: nothing to assemble)
