"""The one compiled kernel, PIL's hue shift (``hue.c``), built with the machine's C compiler on first use.

The install stays pure Python: the C source ships in the package and is compiled the first time a
hue shift needs it, into a per-user cache (``$NANO_PATCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/nano-patch``, else ``~/.cache/nano-patch``), keyed by the source and flags, so
later processes and DataLoader workers load it without compiling. The compiler is ``$CC`` or ``cc``.
Before first use the library's output is compared with the installed PIL's on a probe of colours
and hue shifts; on any difference, or with no compiler, :func:`hue_shift` raises
:class:`NativeUnavailable` and the caller runs PIL's own code (exact, about 5x slower).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("hue.c")
# No -ffast-math and no contraction into fused multiply-adds: either would round unlike PIL.
FLAGS = ("-O2", "-fPIC", "-shared", "-std=c99", "-ffp-contract=off", "-fno-fast-math")


class NativeUnavailable(RuntimeError):
    """The compiled kernel cannot be used here; the message says why."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failure: str | None = None


def cache_dir() -> Path:
    if os.environ.get("NANO_PATCH_CACHE_DIR"):
        return Path(os.environ["NANO_PATCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nano-patch"


def library_path() -> Path:
    key = hashlib.sha256(
        b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), platform.machine().encode(), sys.platform.encode()])
    ).hexdigest()[:16]
    return cache_dir() / f"hue-{key}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"


def build(out: Path) -> None:
    """Compile ``hue.c`` into ``out``, atomically: concurrent builders each write a temporary file."""
    if sys.platform == "win32":
        raise NativeUnavailable("the hue kernel is built with a Unix C compiler; Windows runs PIL's code")
    cc = shlex.split(os.environ.get("CC") or "cc")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".build-", suffix=out.suffix)
    os.close(fd)
    try:
        try:
            proc = subprocess.run([*cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise NativeUnavailable(f"no working C compiler ({' '.join(cc)}): {exc}") from exc
        if proc.returncode != 0:
            raise NativeUnavailable(f"{' '.join(cc)} failed on {SOURCE.name}: {proc.stderr.strip()[-400:]}")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        build(path)  # a damaged cache entry: build it again, once
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise NativeUnavailable(f"cannot load {path}: {exc}") from exc
    lib.nano_hue_init.restype = None
    lib.nano_hue_init.argtypes = []
    lib.nano_hue_shift.restype = None
    lib.nano_hue_shift.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
    lib.nano_hue_init()
    return lib


def pil_hue_shift(a: np.ndarray, shift: int) -> np.ndarray:
    """torchvision's PIL hue round trip on an RGB array, for reference: HSV, add to H, back to RGB."""
    from PIL import Image

    h, s, v = Image.fromarray(np.ascontiguousarray(a), "RGB").convert("HSV").split()
    hue = (np.asarray(h, dtype=np.uint8) + np.uint8(shift & 255)).astype(np.uint8)
    return np.asarray(Image.merge("HSV", (Image.fromarray(hue, "L"), s, v)).convert("RGB"))


def probe_colours() -> np.ndarray:
    """Colours where rounding differences show: extremes, greys, near-greys, ties and random ones."""
    levels = np.array([0, 1, 2, 3, 127, 128, 129, 252, 253, 254, 255], dtype=np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    rng = np.random.default_rng(20261122)
    rand = rng.integers(0, 256, size=(64 * 64 - len(grid), 3), dtype=np.uint8)
    return np.concatenate([grid, rand]).reshape(64, 64, 3)


def _check(lib: ctypes.CDLL) -> None:
    probe = probe_colours()
    for shift in (0, 1, 37, 128, 219, 255):
        got = _run(lib, probe, shift)
        if not np.array_equal(got, pil_hue_shift(probe, shift)):
            import PIL

            raise NativeUnavailable(f"the compiled hue kernel differs from PIL {PIL.__version__}'s; using PIL's code")


def _run(lib: ctypes.CDLL, a: np.ndarray, shift: int) -> np.ndarray:
    src = np.ascontiguousarray(a)
    out = np.empty_like(src)
    lib.nano_hue_shift(src.ctypes.data, out.ctypes.data, src.size // 3, shift & 255)
    return out


def library() -> ctypes.CDLL:
    """The checked library, built and loaded on the first call; :class:`NativeUnavailable` if it cannot be."""
    global _lib, _failure
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _failure is not None:
                raise NativeUnavailable(_failure)
            try:
                lib = _load()
                _check(lib)
            except NativeUnavailable as exc:
                _failure = str(exc)
                raise
            except Exception as exc:  # noqa: BLE001 - an unusable cache or a full disk must not break hue
                _failure = f"the hue kernel could not be built or loaded: {exc!r}"
                raise NativeUnavailable(_failure) from exc
            _lib = lib
    return _lib


def hue_shift(a: np.ndarray, shift: int) -> np.ndarray:
    """PIL's hue shift of an ``HxWx3`` uint8 RGB array by ``shift`` levels of its 8-bit H, bit-exact."""
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"hue_shift takes an HxWx3 uint8 array, got {a.dtype} of shape {a.shape}")
    return _run(library(), a, int(shift))


def state() -> str:
    """``ready``, ``not built yet`` or why it is unavailable; never builds anything."""
    if _lib is not None:
        return "ready"
    if _failure is not None:
        return f"unavailable: {_failure}"
    return "built" if library_path().exists() else "not built yet"
