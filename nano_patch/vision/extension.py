"""The compiled kernels' extension module: is it installed, and loading it. Needs no NumPy.

``nano_patch.vision._native`` is compiled when nano-patch is installed (``hatch_build.py``). Where no
C compiler worked then, the install still succeeds without it, pip shows nothing, and every kernel
runs PIL's own code (exact, slower). This module words that once, with the fix, for the first
``patch_torch()`` of a process tree (:func:`nano_patch.exit_notices.warn_if_kernels_missing`) and for
``nano-patch status``; it is kept apart from ``native.py`` so that ``patch_torch()`` can ask without
importing NumPy.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

NO_NATIVE_ENV = "NANO_PATCH_NO_NATIVE"
ISA_ENV = "NANO_PATCH_NATIVE_ISA"
#: How to get the kernels where the install went without them.
FIX = "install a C compiler and reinstall nano-patch, or install a nano-patch wheel built where one worked"


class ExtensionMissing(ImportError):
    """The extension module is not installed (or cannot be loaded); the message says why and what to do."""


def switched_off() -> bool:
    """``NANO_PATCH_NO_NATIVE`` asks for PIL's code on purpose."""
    return os.environ.get(NO_NATIVE_ENV, "").strip() not in ("", "0")


def load() -> ModuleType:
    """Import the extension module; :class:`ExtensionMissing` where it is not installed or does not load."""
    try:
        return importlib.import_module("nano_patch.vision._native")
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
        load()
    except ExtensionMissing as exc:
        return str(exc)
    return None
