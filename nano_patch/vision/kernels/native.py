"""The compiled kernels: loading them, and each kernel's verdict (one loader, one check, one fallback rule).

The kernels are C (``csrc/``), compiled into the extension module ``nano_patch.vision._native`` when nano-patch is
installed (``hatch_build.py``); nothing is compiled or loaded from a cache at run time. Where no C compiler worked
then, the install still succeeds without it, pip shows nothing, and every kernel runs PIL's own code (exact,
slower): :func:`missing` words that once, with the fix, for the first ``patch_torch()`` of a process tree and for
``nano-patch status``. Crop-region JPEG decoding (``crop_decode``) lives in a second, optional extension,
``_jpeg``, linked to the system's libjpeg-turbo.

Before its first use in a process each kernel is checked against the installed PIL (``native_checks.py``;
the crop decode against simplejpeg's full decode): :func:`kernel` gives the extension once that kernel passed,
else raises :class:`NativeUnavailable` saying why (the extension missing, switched off with
``NANO_PATCH_NO_NATIVE=1``, or differing from the installed PIL), and the caller runs PIL's own code (the full
decode, for the crop decode). The typed wrappers are ``native_kernels.py``. ``NANO_PATCH_NATIVE_ISA``
(``generic``, ``avx2``, ``avx512``) narrows the instruction set the kernels use, for comparisons; by default they
use the widest this CPU has. This module needs no NumPy: ``patch_torch()`` asks :func:`missing` without it.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from types import ModuleType

from ... import forks

#: The compiled extensions sit in ``vision/`` itself, beside ``csrc/`` (their build names them there).
VISION_PACKAGE = __package__.rpartition(".")[0]

#: The kernels, each checked on its own: the name ``nano-patch status`` shows, and what it stands for.
KERNELS = {
    "resample": "resize (bilinear, bicubic, lanczos, box, hamming), crop and flip folded in",
    "warp": "rotate, affine and perspective (Image.transform: nearest, bilinear, bicubic)",
    "grayscale": "RGB to L, and the grey mean of ImageEnhance.Contrast",
    "saturation": "ImageEnhance.Color (saturation)",
    "blend": "ImageEnhance.Brightness and Contrast (blend with a constant grey)",
    "sharpness": "ImageEnhance.Sharpness (PIL's SMOOTH filter, then the blend)",
    "hue": "adjust_hue (PIL's HSV round trip)",
    "tables": "point tables and the uint8-to-tensor tail",
    "crop_decode": "JPEG decoding of a crop window only (libjpeg-turbo), for crops drawn before decoding",
    "torch_draws": "torch's generator reproduced for the draw step (rand, randint, uniform_, randperm)",
    "array_gather": "an array dataset's batch (CIFAR, MNIST...): pads, crops, flips and the tensor tail in one call",
}
#: Kernels of the optional ``_jpeg`` extension (linked to libjpeg-turbo) rather than ``_native``.
JPEG_KERNELS = ("crop_decode",)
#: What runs instead of a kernel that is not used, where that is not PIL's own code.
FALLBACKS = {"crop_decode": "the full decode", "torch_draws": "torch's own draws"}
NO_NATIVE_ENV = "NANO_PATCH_NO_NATIVE"
ISA_ENV = "NANO_PATCH_NATIVE_ISA"
#: How to get the kernels where the install went without them.
FIX = "install a C compiler and reinstall nano-patch, or install a nano-patch wheel built where one worked"


class NativeUnavailable(RuntimeError):
    """A native kernel cannot be used in this process; the message says why."""


class ExtensionMissing(ImportError):
    """The extension module is not installed (or cannot be loaded); the message says why and what to do."""


def switched_off() -> bool:
    """``NANO_PATCH_NO_NATIVE`` asks for PIL's code on purpose."""
    return os.environ.get(NO_NATIVE_ENV, "").strip() not in ("", "0")


def load_extension() -> ModuleType:
    """Import the extension module; :class:`ExtensionMissing` where it is not installed or does not load."""
    try:
        return importlib.import_module("._native", VISION_PACKAGE)
    except ModuleNotFoundError as exc:
        raise ExtensionMissing(
            f"nano-patch was installed without its compiled kernels (no working C compiler at install time?). "
            f"To get them, {FIX}"
        ) from exc
    except ImportError as exc:  # there, but built for another platform, or damaged
        raise ExtensionMissing(f"nano-patch's compiled kernels do not load ({exc}). To get them, {FIX}") from exc


def missing() -> str | None:
    """Why the compiled kernels are not there, or None where they load (or are switched off on purpose)."""
    if switched_off():
        return None
    try:
        load_extension()
    except ExtensionMissing as exc:
        return str(exc)
    return None


_lock = threading.RLock()
_verdicts: dict[str, str] = {}  # kernel -> "" (checked, exact) or why it is not used
_passed: dict[str, ModuleType] = {}  # kernel -> the module that passed its check


class _Extension:
    """One compiled extension, loaded once per process: the module, or why it cannot be used (kept: asked again, the
    same answer without trying again)."""

    def __init__(self, load: Callable[[], ModuleType]) -> None:
        self._load = load
        self.module: ModuleType | None = None
        self.error: str | None = None

    def get(self) -> ModuleType:
        if self.module is not None:
            return self.module
        if self.error is None and switched_off():
            self.error = f"{NO_NATIVE_ENV} is set"
        if self.error is not None:
            raise NativeUnavailable(self.error)
        try:
            self.module = self._load()
        except NativeUnavailable as exc:
            self.error = str(exc)
            raise
        return self.module

    def forget(self) -> None:
        self.module, self.error = None, None


def _load_native() -> ModuleType:
    try:
        mod = load_extension()
    except ExtensionMissing as exc:
        raise NativeUnavailable(str(exc)) from exc
    isa = os.environ.get(ISA_ENV, "").strip()
    if isa:
        try:
            mod.set_isa(isa)
        except ValueError as exc:
            import warnings

            warnings.warn(f"nano-patch: {ISA_ENV}={isa!r} ignored: {exc}", RuntimeWarning, stacklevel=2)
    return mod


def _load_jpeg() -> ModuleType:
    """The ``_jpeg`` extension (crop decoding), or :class:`NativeUnavailable` saying why not."""
    try:
        return importlib.import_module("._jpeg", VISION_PACKAGE)
    except ModuleNotFoundError as exc:
        raise NativeUnavailable(
            "nano-patch was installed without crop-region JPEG decoding (libjpeg-turbo's headers or library were "
            "missing at install time; on Debian/Ubuntu install libjpeg62-turbo-dev or libjpeg-turbo8-dev, then "
            f"reinstall): {exc}") from exc
    except ImportError as exc:  # built, but its libjpeg cannot be loaded here
        raise NativeUnavailable(f"libjpeg-turbo could not be loaded: {exc}") from exc


_native_ext = _Extension(_load_native)
_jpeg_ext = _Extension(_load_jpeg)


def _import() -> ModuleType:
    return _native_ext.get()


def extension() -> ModuleType:
    """The ``_native`` extension, for a helper that checks its own answers before use rather than through a
    kernel's verdict; :class:`NativeUnavailable` where it is missing or switched off."""
    return _import()


def _import_jpeg() -> ModuleType:
    return _jpeg_ext.get()


def kernel(name: str) -> ModuleType:
    """The extension, once kernel ``name`` has passed its check here; else :class:`NativeUnavailable`."""
    verdict = _verdicts.get(name)
    if verdict == "":
        return _passed[name]
    if verdict is not None:
        raise NativeUnavailable(verdict)
    with _lock:
        if name not in _verdicts:
            try:
                mod = _import_jpeg() if name in JPEG_KERNELS else _import()
                from . import native_checks

                why = native_checks.CHECKS[name](mod)
                if not why:
                    _passed[name] = mod
            except NativeUnavailable as exc:
                why = str(exc)
            except Exception as exc:  # noqa: BLE001 - a broken kernel must never break the image
                why = f"the {name} kernel failed its check: {type(exc).__name__}: {exc}"
            _verdicts[name] = why or ""
        return kernel(name)


def available(name: str) -> bool:
    try:
        kernel(name)
    except NativeUnavailable:
        return False
    return True


def state() -> dict[str, str]:
    """Per kernel: ``native (<isa>)`` (crop decoding: ``native (<libjpeg-turbo version>)``), ``not checked
    yet``, or what runs instead and why (``PIL's code: <why>``, ``the full decode: <why>``). Checks nothing."""
    from . import native_checks

    found = native_checks.found
    out = {}
    for name in KERNELS:
        verdict = _verdicts.get(name)
        fallback = FALLBACKS.get(name, "PIL's code")
        module_error = (_jpeg_ext if name in JPEG_KERNELS else _native_ext).error
        if verdict == "" and name in JPEG_KERNELS:
            version = getattr(_passed.get(name), "LIBJPEG_VERSION", "?")
            out[name] = f"native ({version}{'; ' + found.crop_note if found.crop_note else ''})"
        elif verdict == "":
            which = f", {native_checks.VARIANT_NAMES[found.variants[name]]}" if found.variants.get(name) else ""
            mod = _native_ext.module
            out[name] = f"native ({mod.isa() if mod is not None else '?'}{which})"
        elif verdict is not None:
            out[name] = f"{fallback}: {verdict}"
        elif module_error is not None:
            out[name] = f"{fallback}: {module_error}"
        else:
            out[name] = "not checked yet"
    return out


def check_all() -> dict[str, str]:
    """Check every kernel now (``nano-patch status``), then :func:`state`."""
    for name in KERNELS:
        available(name)
    return state()


def summary() -> dict[str, str]:
    """:func:`check_all` as ``nano-patch status`` shows it: where the extension itself cannot be used
    (not installed, switched off), one entry ``all`` with that reason, said once, not once per kernel."""
    states = check_all()
    if _native_ext.error is not None:  # the crop decode is its own extension: it still says its own state
        return {"all": f"PIL's code: {_native_ext.error}", **{k: states[k] for k in JPEG_KERNELS}}
    return states


def reset() -> None:
    """Forget the checks and the loaded module, as in a new process (tests)."""
    from . import native_checks

    with _lock:
        _native_ext.forget()
        _jpeg_ext.forget()
        native_checks.forget()
        _verdicts.clear()
        _passed.clear()


forks.fresh_in_child(globals(), _lock=threading.RLock)
