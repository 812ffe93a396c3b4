"""The native warp (PIL's Image.transform: affine and perspective, nearest, bilinear and bicubic)
against the installed PIL, bit for bit, on every instruction-set variant this CPU runs.

Rotations (quarter turns by matrix, tiny and random angles, expanded, off-centre, translated),
shears, scales and translations (torchvision's own matrices), perspectives drawn as
RandomPerspective draws them, fills of every form, sizes from 1 x 1, RGB and L, real photo crops;
torchvision's functions and classes under the patch against stock with the same seeds;
``FastImage.transform`` and ``rotate`` against PIL's; and a sabotaged build refused by the check.
"""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.transforms import _functional_pil as F_pil

import nano_patch
from nano_patch.vision.images.image import FastImage
from nano_patch.vision.kernels import functional as K
from nano_patch.vision.kernels import native, native_checks, native_kernels

F = T.functional
IM = T.InterpolationMode
ROOT = Path(__file__).resolve().parents[1]
MOD = native._import()
ISAS = ["generic", "avx2", "avx512"][: ["generic", "avx2", "avx512"].index(MOD.best_isa()) + 1]
FILTERS = (Image.Resampling.NEAREST, Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
AFFINE, PERSPECTIVE = Image.Transform.AFFINE, Image.Transform.PERSPECTIVE


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test once per instruction-set variant of the kernels."""
    before = MOD.isa()
    MOD.set_isa(request.param)
    yield request.param
    MOD.set_isa(before)


def _native(a: np.ndarray, size: tuple[int, int], data, perspective: bool, f, fillcolor=None) -> np.ndarray:
    img_mode = "L" if a.ndim == 2 else "RGB"
    n = 8 if perspective else 6
    return native_kernels.warp(a, (size[1], size[0]), list(data)[:n], perspective, int(f),
                               K.fill_bytes(img_mode, fillcolor))


def _assert_transform(a: np.ndarray, size, data, perspective: bool, f, fillcolor=None, what="") -> None:
    img = Image.fromarray(np.ascontiguousarray(a))
    want = np.asarray(img.transform(size, PERSPECTIVE if perspective else AFFINE, data, f, fillcolor=fillcolor))
    got = _native(a, size, data, perspective, f, fillcolor)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        pytest.fail(f"{what}: {len(bad)} values differ from PIL, first at {bad[:3].tolist()} "
                    f"(filter {int(f)}, {'perspective' if perspective else 'affine'} {list(data)}, {a.shape})")


def _probe(h: int, w: int, seed: int = 0) -> np.ndarray:
    return native_checks.probe_image(h, w, seed)


def test_the_warp_kernel_passes_its_check_here():
    native.reset()
    assert native.check_all()["warp"].startswith(f"native ({MOD.isa()}"), native.state()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_rotate_data_is_image_rotates(mode, monkeypatch):
    """The matrix and size ``Image.rotate`` gives ``Image.transform``: rebuilt to the last bit,
    translate, centre and expand included (PIL's own rotate is the reference)."""
    rng = np.random.default_rng(1)
    img = Image.fromarray(_probe(23, 31)).convert(mode)
    handed: list[tuple] = []
    real_transform = Image.Image.transform

    def recording(self, size, method, data=None, *args, **kwargs):
        handed.append((tuple(size), list(data)))
        return real_transform(self, size, method, data, *args, **kwargs)

    for k in range(60):
        angle = float(rng.uniform(-400, 400)) if k % 4 else [1e-3, 45.0, 91.0, -30.5][k // 4 % 4]
        expand = bool(k % 2)
        center = None if k % 3 == 0 else (float(rng.uniform(-5, 40)), float(rng.uniform(-5, 30)))
        translate = None if k % 5 else (int(rng.integers(-6, 7)), int(rng.integers(-6, 7)))
        m, size = native_checks.rotate_data(img.width, img.height, angle % 360.0, expand, center, translate)
        monkeypatch.setattr(Image.Image, "transform", recording)
        handed.clear()
        img.rotate(angle, Image.BILINEAR, expand, center, translate)
        monkeypatch.setattr(Image.Image, "transform", real_transform)
        assert handed == [(size, m)], (angle, expand, center, translate)  # the same doubles, bit for bit
        for f in FILTERS:
            want = img.rotate(angle, f, expand, center, translate, fillcolor=None)
            got = img.transform(size, AFFINE, m, f)
            assert got.size == want.size and got.tobytes() == want.tobytes(), (angle, expand, center, translate, f)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_rotations_every_filter(isa, mode, photos):
    """0, quarter turns and half turns by matrix (PIL's shortcuts bypassed), tiny and random angles,
    expanded and not, off-centre; through the kernel, and through ``pil_rotate`` against ``Image.rotate``."""
    rng = np.random.default_rng(2)
    src = photos[0].convert(mode)
    a = np.asarray(src)[40:140, 60:183]  # a crop: a strided view
    img = Image.fromarray(np.ascontiguousarray(a))
    angles = [0.0, 90.0, 180.0, 270.0, 1e-3, -1e-3, 359.999, 45.0, 0.5] + list(rng.uniform(-180, 180, 8))
    for i, angle in enumerate(angles):
        expand = bool(i % 2)
        center = None if i % 3 else (float(rng.uniform(0, 123)), float(rng.uniform(0, 100)))
        m, size = native_checks.rotate_data(img.width, img.height, angle % 360.0, expand, center)
        for f in FILTERS:
            fill = [None, 17, (250, 3, 128)][i % 3] if mode == "RGB" else [None, 200, (9,)][i % 3]
            _assert_transform(a, size, m, False, f, fill, f"rotate {angle}")
            got = K.pil_rotate(a, angle, f, expand, center, None, fill)
            want = np.asarray(img.rotate(angle, f, expand, center, fillcolor=fill))
            assert np.array_equal(got, want), (angle, expand, center, int(f))


def _affine_matrices(w: int, h: int, rng: np.random.Generator) -> list[list[float]]:
    """torchvision's inverse affine matrices: rotations with translation, scale and shear."""
    out = []
    for _ in range(10):
        angle = float(rng.uniform(-60, 60))
        translate = [int(rng.integers(-w // 3, w // 3 + 1)), int(rng.integers(-h // 3, h // 3 + 1))]
        scale = float(rng.uniform(0.5, 1.8))
        shear = [float(rng.uniform(-30, 30)), float(rng.uniform(-20, 20))]
        center = [w * 0.5, h * 0.5]
        out.append(F._get_inverse_affine_matrix(center, angle, translate, scale, shear))
    out += [F._get_inverse_affine_matrix([w * 0.5, h * 0.5], 0.0, [5, -3], 1.0, [0.0, 0.0]),  # translation only
            F._get_inverse_affine_matrix([w * 0.5, h * 0.5], 0.0, [0, 0], 1.0, [25.0, 0.0]),  # shear only
            F._get_inverse_affine_matrix([w * 0.5, h * 0.5], 0.0, [0, 0], 0.7, [0.0, 0.0])]  # scale only
    return out


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_shears_scales_translations(isa, mode, photos):
    rng = np.random.default_rng(3)
    a = np.asarray(photos[1].convert(mode))[10:150, 20:181]
    h, w = a.shape[:2]
    for k, m in enumerate(_affine_matrices(w, h, rng)):
        for f in FILTERS:
            _assert_transform(a, (w, h), m, False, f, [None, 90, (1, 2, 3)][k % 3] if mode == "RGB" else k * 20,
                              f"affine {k}")
    # PIL's nearest special cases: scale-only (mirrors too), fixed point next to the identity, far out
    for m in ([2.0, 0.0, 0.25, 0.0, 1.75, -0.5], [-1.0, 0.0, float(w), 0.0, 1.0, 0.0], [0.5, 0.0, 3.0, 0.0, -1.5, h],
              [1.0, 1e-9, 0.0, -1e-9, 1.0, 0.0], [0.9, 0.1, 40000.5, -0.1, 0.9, 2.0], [1.0, 0.0, 70000.0, 0.0, 1.0, 0],
              [1.0, 0.3, -40000.0, 0.2, 1.0, 3.0], [1.0, 0.0, -w - 5.0, 0.0, 1.0, 0.0]):
        for f in FILTERS:
            _assert_transform(a, (w + 3, h - 7), m, False, f, None, "special")


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_perspectives_as_torchvision_draws_them(isa, mode, photos):
    torch.manual_seed(4)
    rng = np.random.default_rng(4)
    a = np.asarray(photos[2].convert(mode))[5:190, 30:200]
    h, w = a.shape[:2]
    for k in range(16):
        start, end = T.RandomPerspective.get_params(w, h, float(rng.uniform(0.1, 0.9)))
        coeffs = F._get_perspective_coeffs(start, end)
        for f in FILTERS:
            _assert_transform(a, (w, h), coeffs, True, f, [None, (5, 6, 7), 255][k % 3] if mode == "RGB" else 3,
                              f"perspective {k}")
    # strong ones: a denominator crossing zero inside the image, mappings far outside
    for coeffs in ([1.1, -0.2, 1.0, 0.15, 0.9, -2.0, -0.02, 0.01], [0.2, 0.1, 900.0, -0.1, 0.3, -700.0, 1e-4, 2e-4],
                   [3.0, 1.0, -50.0, 0.5, 2.5, -40.0, 0.03, -0.02]):
        for f in FILTERS:
            _assert_transform(a, (w - 11, h + 4), coeffs, True, f, None, "strong perspective")


def test_tiny_and_odd_sizes(isa):
    rng = np.random.default_rng(5)
    for h, w in [(1, 1), (1, 7), (7, 1), (2, 3), (3, 2), (5, 5), (13, 17), (31, 9)]:
        rgb = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        for a in (rgb, np.ascontiguousarray(rgb[..., 2])):
            for angle in (0.0, 1e-3, 30.0, 90.0, 135.0, 200.0):
                for expand in (False, True):
                    m, size = native_checks.rotate_data(w, h, angle, expand)
                    for f in FILTERS:
                        _assert_transform(a, size, m, False, f, None, f"tiny {h}x{w} {angle}")
            coeffs = [1.1, 0.2, -0.3, -0.1, 0.9, 0.4, 0.01, -0.02]
            for f in FILTERS:
                _assert_transform(a, (w + 2, h + 1), coeffs, True, f, None, f"tiny perspective {h}x{w}")
                _assert_transform(a, (3, 1), [0.5, 0.1, 0.2, 0.0, 2.0, 0.0], False, f, None, f"tiny out {h}x{w}")
                # rows in reverse order in memory (a negative stride): the same transform of that image
                _assert_transform(a[::-1], (w + 1, h), [0.9, 0.3, 0.5, -0.2, 1.1, 0.0], False, f, 9, "reversed rows")


def test_real_photo_crops(isa, photos):
    """Random crops of real photos (views, any size), random warps, each filter, RGB and L."""
    rng = np.random.default_rng(6)
    arrays = [np.asarray(p) for p in photos]
    for trial in range(60):
        src = arrays[trial % len(arrays)]
        h, w = int(rng.integers(1, 200)), int(rng.integers(1, 200))
        top, left = int(rng.integers(0, src.shape[0] - h + 1)), int(rng.integers(0, src.shape[1] - w + 1))
        a = src[top:top + h, left:left + w]
        if trial % 4 == 0:
            a = np.asarray(Image.fromarray(np.ascontiguousarray(a)).convert("L"))
        f = FILTERS[trial % 3]
        if trial % 3 == 2:
            start, end = T.RandomPerspective.get_params(w, h, 0.6)
            _assert_transform(a, (w, h), F._get_perspective_coeffs(start, end), True, f, None, f"crop {trial}")
        else:
            m, size = native_checks.rotate_data(w, h, float(rng.uniform(0, 360)), bool(trial % 2))
            _assert_transform(a, size, m, False, f, None, f"crop {trial}")


def test_fills_of_every_form():
    """What torchvision passes (None, a number, a sequence) and what PIL takes (colour names, an int
    packed into RGB, four values, values out of range): PIL's own reading of each."""
    rgb = _probe(17, 19)
    grey = np.ascontiguousarray(rgb[..., 0])
    m, size = native_checks.rotate_data(19, 17, 33.0, True)
    for a, fills in ((rgb, [None, 0, 7, 300, -4, (1, 2, 3), (1, 2, 3, 4), (300, -1, 128), "red", "#0a0b0c",
                            0x010203, (5,)]),
                     (grey, [None, 0, 99, 300, -4, (77,), "white"])):
        img = Image.fromarray(a)
        for fill in fills:
            for f in FILTERS:
                want = np.asarray(img.transform(size, AFFINE, m, f, fillcolor=fill))
                assert np.array_equal(K.warp(a, size, m, False, f, fill), want), (a.ndim, fill, int(f))
    # torchvision's fills: its _parse_fill, then PIL's reading
    for a, fill in ((rgb, None), (rgb, 3), (rgb, 2.7), (rgb, [9]), (rgb, (1, 2, 3)), (rgb, [1.5, 2.5, 300]),
                    (grey, None), (grey, 5), (grey, [250.9]), (grey, (4,))):
        img = Image.fromarray(a)
        matrix = F._get_inverse_affine_matrix([9.5, 8.5], 20.0, [2, 1], 0.9, [5.0, 0.0])
        want = np.asarray(F_pil.affine(img, matrix, Image.BILINEAR, fill))
        assert np.array_equal(K.affine(a, matrix, Image.BILINEAR, fill), want), (a.ndim, fill)
    with pytest.raises(ValueError, match="number of elements in 'fill'"):
        K.affine(rgb, [1, 0, 0, 0, 1, 0], Image.BILINEAR, (1, 2))


def test_undefined_coordinates_are_left_to_pil():
    """A NaN coordinate (0 / 0 in a perspective) or a non-finite coefficient: PIL's C is undefined
    there, so the kernel says so and the caller runs PIL's own code, whose answer it returns."""
    a = _probe(9, 11)
    img = Image.fromarray(a)
    zero_over_zero = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0, 0.0]  # at x + 0.5 = 0.5 both are 0
    for coeffs, persp in ((zero_over_zero, True), ([float("nan"), 0, 0, 0, 1, 0], False),
                          ([1.0, 0, float("inf"), 0, 1, 0], False)):
        for f in FILTERS:
            with pytest.raises(native_kernels.NotReproducible):
                _native(a, (11, 9), coeffs, persp, f)
            want = np.asarray(img.transform((11, 9), PERSPECTIVE if persp else AFFINE, coeffs, f))
            assert np.array_equal(K.warp(a, (11, 9), coeffs, persp, f, None), want)


def test_bad_arguments_are_named():
    a = _probe(5, 6)
    with pytest.raises(ValueError, match="filters"):
        native_kernels.warp(a, (5, 6), [1, 0, 0, 0, 1, 0], False, Image.BOX, b"\0\0\0")
    with pytest.raises(ValueError, match="6 numbers"):
        native_kernels.warp(a, (5, 6), [1, 0, 0, 0, 1], False, Image.BILINEAR, b"\0\0\0")
    with pytest.raises(ValueError, match="fill needs 3"):
        native_kernels.warp(a, (5, 6), [1, 0, 0, 0, 1, 0], False, Image.BILINEAR, b"\0")
    with pytest.raises(ValueError, match="positive"):
        native_kernels.warp(a, (0, 6), [1, 0, 0, 0, 1, 0], False, Image.BILINEAR, b"\0\0\0")


# --- torchvision under the patch, against stock ------------------------------------------------------


def _torchvision_calls(w: int, h: int, mode: str):
    """(name, call on an image): the functions with every filter and fill form, and the classes."""
    start, end = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], [[3, 2], [w - 5, 1], [w - 2, h - 4], [1, h - 3]]
    fills = [None, 7, [200], [10, 20, 30]] if mode == "RGB" else [None, 7, [200]]
    calls = []
    for i in (IM.NEAREST, IM.BILINEAR, IM.BICUBIC):
        for k, fl in enumerate(fills):
            calls += [
                (f"rotate {i} {fl}", lambda im, i=i, fl=fl, k=k: F.rotate(im, 17.5 + 40 * k, i, bool(k % 2),
                                                                          None if k < 2 else [5, 9], fl)),
                (f"affine {i} {fl}", lambda im, i=i, fl=fl, k=k: F.affine(im, 12.0 * k - 20, [3, -k], 0.8 + 0.1 * k,
                                                                          [7.0, -3.0], i, fl)),
                (f"perspective {i} {fl}", lambda im, i=i, fl=fl: F.perspective(im, start, end, i, fl)),
            ]
        calls += [(f"rotate 90 {i}", lambda im, i=i: F.rotate(im, 90, i, True)),
                  (f"rotate 180 {i}", lambda im, i=i: F.rotate(im, -180, i)),
                  (f"rotate 1e-3 {i}", lambda im, i=i: F.rotate(im, 1e-3, i, fill=5)),
                  (f"affine identity {i}", lambda im, i=i: F.affine(im, 0.0, [0, 0], 1.0, [0.0, 0.0], i))]
    classes = [T.RandomRotation(40, IM.BILINEAR), T.RandomRotation((-10, 80), IM.BICUBIC, expand=True, fill=9),
               T.RandomRotation(25, IM.NEAREST, center=(3, 4)),
               T.RandomAffine(30, (0.2, 0.1), (0.7, 1.3), (-10, 10, -5, 5), IM.BILINEAR, fill=3),
               T.RandomAffine(15, None, None, 20, IM.BICUBIC), T.RandomAffine(10), T.RandomPerspective(0.7, 1.0),
               T.RandomPerspective(0.4, 1.0, IM.BICUBIC, fill=100), T.RandomPerspective(0.5, 1.0, IM.NEAREST)]
    calls += [(f"{type(t).__name__} {t.interpolation}", lambda im, t=t: [t(im) for _ in range(6)]) for t in classes]
    return calls


def _run(call, img):
    torch.manual_seed(11)
    random.seed(11)
    out = call(img)
    return (out if isinstance(out, list) else [out]), torch.get_rng_state(), random.getstate()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_torchvision_under_the_patch_equals_stock(mode, photos, monkeypatch):
    """F.rotate/affine/perspective and RandomRotation/Affine/Perspective on plain PIL images, and on the
    patch's own images (array-held: the kernels' path), against stock on the plain image: the same
    pixels, types, info and draws."""
    img = photos[1].convert(mode).resize((97, 83))
    img.info["dpi"] = (72, 72)
    calls = _torchvision_calls(img.width, img.height, mode)
    stock = [_run(call, img) for _, call in calls]
    ran = _count_native_warps(monkeypatch)
    nano_patch.patch_torch()
    for (name, call), (want, want_torch, want_py) in zip(calls, stock):
        for src, kind in ((img, Image.Image), (FastImage.wrap(np.asarray(img).copy(), img.info), FastImage)):
            before = len(ran)
            got, got_torch, got_py = _run(call, src)
            assert torch.equal(got_torch, want_torch) and got_py == want_py, f"{name}: draws differ"
            for g, wnt in zip(got, want):
                assert type(g) is kind and (g.mode, g.size, g.info) == (wnt.mode, wnt.size, wnt.info), name
                assert g.tobytes() == wnt.tobytes(), (name, kind.__name__)
            # the kernel ran, but where PIL's shortcuts (quarter turns) or, on PIL's pixels, its nearest are used
            shortcut = name.startswith(("rotate 90", "rotate 180"))
            if not shortcut and ("NEAREST" not in name or kind is FastImage):
                assert len(ran) > before, (name, kind.__name__)


def _count_native_warps(monkeypatch) -> list[int]:
    """Record each call of the native warp (one entry per call)."""
    ran: list[int] = []
    real = native_kernels.warp

    def counted(*args, **kwargs):
        ran.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(native_kernels, "warp", counted)
    return ran


@pytest.mark.parametrize("interpolation", [IM.NEAREST, IM.BILINEAR, IM.BICUBIC])
def test_augment_policies_equal_stock(interpolation, photos):
    """The auto-augment policies with the interpolation torchvision's reference recipe passes:
    whole policies equal stock bit for bit, alone and inside a Compose, with the same draws."""
    policies = [T.RandAugment(interpolation=interpolation), T.TrivialAugmentWide(interpolation=interpolation),
                T.AutoAugment(interpolation=interpolation)]
    if interpolation != IM.BICUBIC:  # AugMix works on tensors, where stock has no bicubic warp
        policies.append(T.AugMix(interpolation=interpolation))
    makes = [lambda p=p: p for p in policies] + [lambda p=p: T.Compose([T.RandomResizedCrop(96), p]) for p in policies]
    images = [photos[0].resize((120, 90)), photos[2].convert("L").resize((64, 71))]
    calls = [(m, im, seed) for m in makes for im in images for seed in range(6)]

    def run(m, im, seed):
        torch.manual_seed(seed)
        random.seed(seed)
        return np.asarray(m()(im)), torch.get_rng_state()

    stock = [run(*c) for c in calls]
    nano_patch.patch_torch()
    for c, (want, want_state) in zip(calls, stock):
        got, got_state = run(*c)
        assert np.array_equal(got, want) and torch.equal(got_state, want_state), (c[2], type(c[0]()).__name__)


# --- PIL methods called on the patch's images (timm) -------------------------------------------------


@pytest.mark.parametrize("form", ["array", "core"])
def test_fast_image_transform_and_rotate_are_pils(form, photos):
    base = photos[0].resize((64, 48))
    for mode in ("RGB", "L"):
        ref = base.convert(mode)
        ref.info.update({"dpi": (72, 72), "comments": [1, 2]})
        img = FastImage.wrap(np.asarray(ref).copy(), ref.info) if form == "array" else FastImage.adopt(ref)
        w, h = ref.size
        calls = [
            ("transform", ((w, h), AFFINE, (1, 0.3, -5, 0, 1, 0)), {"resample": Image.BILINEAR, "fillcolor": (1, 2, 3)
                                                                    if mode == "RGB" else 9}),
            ("transform", ((w + 5, h - 3), AFFINE, [0.9, -0.1, 3, 0.2, 1.1, -2, 99]), {"resample": Image.BICUBIC}),
            ("transform", ((w, h), PERSPECTIVE, (1.02, 0.05, -3, 0.01, 0.98, 2, 1e-3, 2e-3)), {"resample": 2}),
            ("transform", ((w, h), AFFINE, (1, 0, 7, 0, 1, -4)), {"resample": Image.NEAREST, "fillcolor": "red"}),
            ("transform", ((w, h), 0, (1, 0.1, 0, 0, 1, 0), Image.BILINEAR), {}),
            ("transform", ((w, h), Image.Transform.EXTENT, (2, 3, 40, 30)), {"resample": Image.BILINEAR}),
            ("transform", ((w, h), Image.Transform.QUAD, (0, 0, 0, h, w, h, w, 0)), {"resample": Image.BICUBIC}),
            ("transform", ((w, h), AFFINE, (1, 0, 0, 0, 1, 0)), {"resample": Image.BOX}),  # PIL's error
            ("transform", ((w, h), AFFINE, (1, 0, 0)), {"resample": Image.BILINEAR}),  # PIL's error
            ("transform", ((w, h), AFFINE, None), {}),  # PIL's error
            ("rotate", (23.5,), {"resample": Image.BILINEAR}),
            ("rotate", (-11,), {"resample": Image.BICUBIC, "expand": True, "fillcolor": (128, 0, 7)
                                if mode == "RGB" else 50}),
            ("rotate", (30,), {"resample": Image.BILINEAR, "center": (5, 9), "translate": (3, -2)}),
            ("rotate", (90,), {"resample": Image.BICUBIC}),
            ("rotate", (90,), {"resample": Image.BICUBIC, "expand": True}),
            ("rotate", (180,), {"resample": Image.BILINEAR}),
            ("rotate", (0,), {"resample": Image.BOX}),  # PIL's shortcut takes any filter
            ("rotate", (720.0,), {"resample": Image.BILINEAR}),
            ("rotate", (1e-3,), {"resample": Image.NEAREST}),
            ("rotate", (45,), {"resample": Image.LANCZOS}),  # PIL's error
        ]
        for name, args, kwargs in calls:
            try:
                want = getattr(ref, name)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the same exception is what is compared
                with pytest.raises(type(exc)):
                    getattr(img, name)(*args, **kwargs)
                continue
            got = getattr(img, name)(*args, **kwargs)
            assert isinstance(got, FastImage), (name, args, kwargs)
            kernel = form == "array" and kwargs.get("resample", args[3] if len(args) > 3 else 0) in (2, 3) and (
                name == "rotate" or args[1] in (AFFINE, PERSPECTIVE))
            if kernel and args[0] not in (90, 180):  # the native warp ran: its result holds an array
                assert got.array is not None, (name, args, kwargs)
            assert (got.mode, got.size, got.info) == (want.mode, want.size, want.info), (name, args, kwargs)
            assert got.tobytes() == want.tobytes(), (mode, name, args, kwargs)
            if name == "transform" and got.info:  # lists in info copied or shared, as this Pillow does
                copied = want.info["comments"] is not ref.info["comments"]
                assert (got.info["comments"] is not img.info["comments"]) == copied, (name, args, kwargs)


def test_timm_rand_augment_on_the_patchs_images(photos, monkeypatch):
    """timm's RandAugment calls img.transform and img.rotate with bilinear and bicubic: on the patch's
    images the native warp, and the same pixels and draws as on plain PIL images."""
    auto_augment = pytest.importorskip("timm.data.auto_augment")
    ran = _count_native_warps(monkeypatch)
    for im in (photos[0].resize((112, 96)), photos[1].convert("L").resize((80, 80))):
        hparams = {"translate_const": 40, "img_mean": (124, 116, 104) if im.mode == "RGB" else 110}
        ra = auto_augment.rand_augment_transform("rand-m9-n3-mstd0.5-inc1", hparams)
        for seed in range(12):
            random.seed(seed)
            np.random.seed(seed)  # timm draws its ops from NumPy's generator
            want = ra(im)
            state = random.getstate()
            random.seed(seed)
            np.random.seed(seed)
            got = ra(FastImage.wrap(np.asarray(im).copy(), im.info))
            assert random.getstate() == state and got.tobytes() == want.tobytes(), (im.mode, seed)
    assert len(ran) >= 8  # rotations, shears and translations went through the kernel


# --- a sabotaged build is refused ------------------------------------------------------------------

#: One rounding term changed in each of the warp's arithmetics; each must fail the check at load.
SABOTAGE = [
    ("geometry.c", "floor(v * 65536.0 + 0.5)", "floor(v * 65536.0 + 0.25)"),  # nearest: PIL's FIX rounding
    ("geometry.c", "_mm256_cvttpd_epi32(", "_mm256_cvtpd_epi32("),  # AVX2: round instead of truncate
    ("geometry.c", "return (uint8_t)(int)v;", "return (uint8_t)(int)(v + 0.5);"),  # portable bicubic
    ("geometry.c", "o[c] = (uint8_t)(int)(v1 + (v2 - v1) * dy);",
     "o[c] = (uint8_t)(int)(v1 + (v2 - v1) * dy + 0.5);"),  # portable bilinear
]


@pytest.fixture(scope="module")
def sabotaged(tmp_path_factory):
    """The kernels compiled from sources with :data:`SABOTAGE` applied, imported under another name."""
    import importlib.util

    tmp = tmp_path_factory.mktemp("sabotaged-warp")
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    csrc = tmp / "src" / hatch_build.CSRC
    shutil.copytree(ROOT / hatch_build.CSRC, csrc)
    for name, old, new in SABOTAGE:
        text = (csrc / name).read_text()
        assert old in text, (name, old)
        (csrc / name).write_text(text.replace(old, new))
    built = hatch_build.build_extension(tmp / "src", inplace=True, build_dir=tmp / "build")
    spec = importlib.util.spec_from_file_location("sabotaged_warp._native", built)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("isa_name", ISAS)
def test_a_sabotaged_warp_is_refused_by_the_check(sabotaged, isa_name):
    sabotaged.set_isa(isa_name)
    for f in FILTERS:  # each filter's arithmetic on its own, on this instruction set
        why = native_checks.check_warp(sabotaged, filters=(int(f),))
        assert why and "differs" in why, (isa_name, int(f), why)
    assert "differs" in (native_checks.check_warp(sabotaged) or "")


def test_a_refused_warp_means_pil_code_with_stock_pixels(sabotaged, monkeypatch, photos):
    im = photos[0].resize((90, 70))
    calls = [lambda: F.rotate(im, 20, IM.BILINEAR), lambda: F.perspective(im, [[0, 0], [89, 0], [89, 69], [0, 69]],
                                                                          [[2, 3], [80, 0], [89, 60], [5, 69]]),
             lambda: F.affine(im, 10, [2, 3], 1.1, [5.0, 0.0], IM.BICUBIC)]
    want = [c().tobytes() for c in calls]
    native.reset()
    monkeypatch.setattr(native, "_import", lambda: sabotaged)
    try:
        nano_patch.patch_torch()
        got = [c().tobytes() for c in calls]
        state = native.state()
    finally:
        native.reset()
    assert got == want
    assert state["warp"].startswith("PIL's code: the compiled transform differs"), state


def test_quarter_turns_by_matrix_are_the_transposes(isa):
    """PIL rounds cos and sin to 15 places, so on a square image a quarter turn by matrix moves pixel
    centres onto pixel centres: every filter of the kernel gives PIL's transpose, the shortcut that
    ``Image.rotate`` (and so ``pil_rotate``) takes whatever the filter."""
    a = _probe(12, 12)
    for angle in (90.0, 180.0, 270.0):
        m, size = native_checks.rotate_data(12, 12, angle)
        assert all(v == round(v) for v in m), m
        for f in FILTERS:
            got = _native(a, size, m, False, f)
            want = np.asarray(Image.fromarray(a).rotate(angle, f))
            assert np.array_equal(got, want), (angle, int(f))
            assert np.array_equal(K.pil_rotate(a, angle, f), want), (angle, int(f))
