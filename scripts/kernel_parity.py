"""Every kernel against the installed PIL (and simplejpeg) with nothing but NumPy, Pillow and simplejpeg: for
platforms where torch cannot run, such as an aarch64 Python under qemu on an x86-64 machine.

The kernel test suites import torch and torchvision, and torch's aarch64 wheels need CUDA's libraries, so
they cannot run under qemu here. This runs what they compare, on the same kinds of input: first the check
each kernel passes at load (``native.check_all``), then exhaustive sweeps (every RGB colour through grey,
saturation and hue; every value/factor pair of a blend), resizes and warps of real photographs with every
filter, and crop decodes of real photographs over many windows, each against PIL's (simplejpeg's) own result.

    qemu-aarch64 -L SYSROOT SYSROOT/usr/bin/python3.11 scripts/kernel_parity.py [--photos DIR]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

from nano_patch.vision.kernels import native, native_checks, native_kernels, pil_filters

FAILURES: list[str] = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        FAILURES.append(what)
        print(f"  DIFFERS: {what}", flush=True)


def every_colour() -> np.ndarray:
    c = np.arange(2**24, dtype=np.uint32)
    return np.stack([c >> 16, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


def sweeps() -> None:
    colours = every_colour()
    img = Image.fromarray(colours)
    expect(np.array_equal(native_kernels.rgb_to_l(colours), np.asarray(img.convert("L"))), "grey, every colour")
    for factor in (0.0, 0.5, 1.7):
        want = np.asarray(ImageEnhance.Color(img).enhance(factor))
        expect(np.array_equal(native_kernels.saturation(colours, factor), want), f"saturation {factor}, every colour")
    for shift in (1, 100, 200):
        got = np.empty_like(colours)
        native.kernel("hue").hue_shift(colours, got, shift)
        expect(np.array_equal(got, native_checks.pil_hue_shift(colours, shift)), f"hue +{shift}, every colour")
    values = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    grey = Image.fromarray(values)
    for in1 in (0, 77, 128, 255):
        for alpha in (0.3, 0.6, 1.4):
            got = np.empty_like(values)
            native.kernel("blend").blend_const(values, got, in1, alpha)
            want = np.asarray(Image.blend(Image.new("L", grey.size, in1), grey, alpha))
            expect(np.array_equal(got, want), f"blend with {in1} at {alpha}, every value")


def photos(folder: Path | None) -> list[np.ndarray]:
    paths = sorted(folder.glob("*.jpg")) if folder else []
    out = [np.asarray(Image.open(p).convert("RGB")) for p in paths[:3]]
    if not out:  # no photos given: smooth gradients with noise, where rounding shows as much
        rng = np.random.default_rng(0)
        y, x = np.mgrid[0:333, 0:451]
        smooth = np.stack([x * 255 // 450, y * 255 // 332, (x * 7 + y * 13) % 256], -1)
        out = [np.where(rng.random((333, 451, 1)) < 0.3, rng.integers(0, 256, (333, 451, 3)), smooth).astype(np.uint8)]
    return out


def resizes_and_warps(arrays: list[np.ndarray]) -> None:
    rng = np.random.default_rng(1)
    for k, a in enumerate(arrays):
        img = Image.fromarray(a)
        h, w = a.shape[:2]
        for f in pil_filters.FILTERS:
            for _ in range(6):
                left, top = int(rng.integers(0, w // 3)), int(rng.integers(0, h // 3))
                right, bottom = int(rng.integers(w // 2, w + 1)), int(rng.integers(h // 2, h + 1))
                size = (int(rng.integers(8, 300)), int(rng.integers(8, 300)))
                want = np.asarray(img.crop((left, top, right, bottom)).resize(size, f))
                got = native_kernels.resample(a[top:bottom, left:right], (size[1], size[0]), f)
                expect(np.array_equal(got, want), f"resize photo {k} filter {f} to {size}")
        for f in pil_filters.WARP_FILTERS:
            for angle in (13.0, -71.5, 190.0):
                m, (ow, oh) = native_checks.rotate_data(w, h, angle % 360.0, True, None, None)
                want = np.asarray(img.rotate(angle, f, True))
                got = native_kernels.warp(a, (oh, ow), m, False, f, bytes(3))
                expect(np.array_equal(got, want), f"rotate photo {k} by {angle} filter {f}")
            coeffs = [1.02, 0.05, -3.0, 0.01, 0.98, 2.0, 1e-4, 2e-4]
            want = np.asarray(img.transform((w, h), Image.Transform.PERSPECTIVE, coeffs, f))
            got = native_kernels.warp(a, (h, w), coeffs, True, f, bytes(3))
            expect(np.array_equal(got, want), f"perspective photo {k} filter {f}")


def crop_decodes(arrays: list[np.ndarray]) -> None:
    import simplejpeg

    jpeg = native.kernel("crop_decode")
    rng = np.random.default_rng(2)
    for k, a in enumerate(arrays):
        for sub in ("420", "422", "444"):
            data = simplejpeg.encode_jpeg(np.ascontiguousarray(a), 88, colorsubsampling=sub)
            full = simplejpeg.decode_jpeg(data)
            h, w = full.shape[:2]
            for _ in range(40):
                top, left = int(rng.integers(0, h - 1)), int(rng.integers(0, w - 1))
                wh, ww = int(rng.integers(1, h - top + 1)), int(rng.integers(1, w - left + 1))
                buf, stride, oy, ox = jpeg.decode_region(data, top, left, wh, ww)
                got = np.frombuffer(buf, np.uint8).reshape(-1, stride // 3, 3)[oy:oy + wh, ox:ox + ww]
                expect(np.array_equal(got, full[top:top + wh, left:left + ww]),
                       f"crop decode photo {k} {sub} window {(top, left, wh, ww)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, help="a folder of JPEG photographs (scikit-learn's datasets/images)")
    ap.add_argument("--isa", help="narrow the instruction set (generic, avx2, avx512)")
    args = ap.parse_args()
    import PIL

    mod = native.load_extension()
    if args.isa:
        mod.set_isa(args.isa)
    print(f"{platform.machine()}, Python {platform.python_version()}, Pillow {PIL.__version__}, "
          f"kernels from {mod.__file__} ({mod.isa()})", flush=True)
    started = time.monotonic()
    state = native.check_all()
    for name, verdict in state.items():
        print(f"  {name:12s} {verdict}")
        expect(verdict.startswith("native"), f"{name} refused at load: {verdict}")
    arrays = photos(args.photos)
    for name, step in (("sweeps of every colour and blend pair", sweeps),
                       ("resizes and warps of photos, every filter", lambda: resizes_and_warps(arrays)),
                       ("crop decodes of photos, 3 samplings x 40 windows", lambda: crop_decodes(arrays))):
        t0 = time.monotonic()
        step()
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)
    print(f"{'FAILED: ' + str(len(FAILURES)) if FAILURES else 'all equal'} in {time.monotonic() - started:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
