"""The compiled hue kernel: PIL's exact output on every RGB colour, its build cache, and the fallbacks.

Where no C compiler exists the kernel cannot be built and the exactness test cannot run; every
fallback test still runs there (hue then goes through PIL's own code).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image

import nano_patch
from nano_patch.vision import functional as K
from nano_patch.vision import native

F = T.functional
HAS_CC = shutil.which(os.environ.get("CC") or "cc") is not None
FACTORS = [-0.5, -0.1, 0.0, 0.003, 0.25, 0.5]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The kernel module as in a new process, with an empty cache of its own."""
    monkeypatch.setenv("NANO_PATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_failure", None)
    return tmp_path / "cache"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the kernel cannot be built")
def test_every_colour_equals_stock_pil(fresh):
    """All 2**24 RGB colours, at hue factors that wrap both ways: equal to stock adjust_hue bit for bit."""
    c = np.arange(2**24, dtype=np.uint32)
    every = np.stack([c >> 16, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
    image = Image.fromarray(every)
    for factor in FACTORS:
        want = np.asarray(F.adjust_hue(image, factor))
        got = K.adjust_hue(every, factor)
        bad = np.any(got != want, axis=-1)
        assert not bad.any(), (factor, every[bad][:5], got[bad][:5], want[bad][:5])
    assert native.state() == "ready"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the kernel cannot be built")
def test_built_once_then_loaded_from_the_cache(fresh):
    native.library()
    built = list(fresh.glob("hue-*"))
    assert built == [native.library_path()] and built[0].stat().st_size > 0
    assert not list(fresh.glob(".build-*")), "the temporary build file was left behind"
    # A new process with no working compiler loads the cached library.
    env = {**os.environ, "CC": "/nonexistent/cc"}
    code = ("from nano_patch.vision import native; print(native.state()); native.library(); print(native.state())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["built", "ready"]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the kernel cannot be built")
def test_a_damaged_cache_entry_is_rebuilt(fresh):
    path = native.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared library")
    native.library()
    assert native.state() == "ready" and path.read_bytes()[:4] == b"\x7fELF"


def _hue_calls(photos):
    images = [photos[0], photos[1].crop((3, 5, 104, 66)), Image.new("RGB", (1, 1), (255, 0, 1))]
    return [(im, f) for im in images for f in FACTORS]


def _assert_hue_matches_stock(photos, want):
    nano_patch.patch_torch()
    for (im, f), w in zip(_hue_calls(photos), want):
        got = F.adjust_hue(im, f)
        assert type(got) is Image.Image and got.info == {}
        assert np.array_equal(np.asarray(got), w), (im.size, f)
        composed = T.Compose([T.RandomHorizontalFlip(0.0), T.Lambda(lambda x, f=f: F.adjust_hue(x, f))])(im)
        assert type(composed) is Image.Image and np.array_equal(np.asarray(composed), w), (im.size, f)


def test_no_compiler_means_pil_code_with_the_same_pixels(fresh, monkeypatch, photos):
    monkeypatch.setenv("CC", str(Path("/nonexistent/cc")))
    want = [np.asarray(F.adjust_hue(im, f)) for im, f in _hue_calls(photos)]
    _assert_hue_matches_stock(photos, want)
    assert native.state().startswith("unavailable: no working C compiler"), native.state()
    assert not list(fresh.glob("*.so")) and not list(fresh.glob(".build-*"))
    with pytest.raises(native.NativeUnavailable):
        native.hue_shift(np.zeros((2, 2, 3), np.uint8), 3)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine: the kernel cannot be built")
def test_a_kernel_that_differs_from_pil_is_refused(fresh, monkeypatch, photos):
    """As if the installed PIL's HSV arithmetic changed: the load-time check refuses the library."""
    want = [np.asarray(F.adjust_hue(im, f)) for im, f in _hue_calls(photos)]
    reference = native.pil_hue_shift
    monkeypatch.setattr(native, "pil_hue_shift", lambda a, shift: reference(a, shift) ^ np.uint8(1))
    _assert_hue_matches_stock(photos, want)
    assert "differs from PIL" in native.state(), native.state()


def test_bad_input_is_named(fresh):
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        native.hue_shift(np.zeros((4, 4), np.uint8), 1)
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        native.hue_shift(np.zeros((4, 4, 3), np.float32), 1)
