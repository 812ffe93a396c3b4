"""The native image kernels against the installed PIL, on every instruction-set variant this CPU runs.

Table-driven operations are checked on every value they can see (all 2**24 RGB colours, all 256 x
256 pairs of a blend); resize on real photo crops at many scales, up and down, with boxes, flips,
every filter, grey and colour; every kernel on edge images from 1 x 1 up. A sabotaged build of the
kernels must be refused by the check at load, and a build without a C compiler must install and run
PIL's own code with the same pixels.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image, ImageEnhance, ImageStat

import nano_patch
from nano_patch.vision.kernels import native, native_checks, native_kernels

F = T.functional
ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("nano_patch.vision._native") is None:
    pytest.skip("the native kernels are not built here (nano_patch.vision._native is missing: installed without a "
                f"C compiler?); to test them, {native.FIX}", allow_module_level=True)
MOD = native.load_extension()  # built but broken: fail here rather than skip
ISAS = ["generic", "avx2", "avx512"][: ["generic", "avx2", "avx512"].index(MOD.best_isa()) + 1]
FILTERS = {Image.Resampling.BILINEAR: "bilinear", Image.Resampling.BICUBIC: "bicubic",
           Image.Resampling.LANCZOS: "lanczos", Image.Resampling.BOX: "box", Image.Resampling.HAMMING: "hamming"}


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test once per instruction-set variant of the kernels."""
    before = MOD.isa()
    MOD.set_isa(request.param)
    yield request.param
    MOD.set_isa(before)


@pytest.fixture(scope="module")
def every_colour() -> np.ndarray:
    c = np.arange(2**24, dtype=np.uint32)
    return np.stack([c >> 16, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


def test_the_kernels_pass_their_check_here():
    native.reset()
    state = native.check_all()
    assert all(v.startswith(f"native ({MOD.isa()}") for k, v in state.items() if k not in native.JPEG_KERNELS), state
    # The extension is imported from the package in use (the source tree or an installed wheel), never
    # from a cache or another folder.
    assert Path(MOD.__file__).resolve().parent == Path(native.__file__).resolve().parents[1]


def test_grey_on_every_colour(isa, every_colour):
    want = np.asarray(Image.fromarray(every_colour).convert("L"))
    assert np.array_equal(native_kernels.rgb_to_l(every_colour), want)
    stat = ImageStat.Stat(Image.fromarray(want[:1000, :777]))
    assert native_kernels.contrast_mean(every_colour[:1000, :777]) == int(stat.mean[0] + 0.5)


@pytest.mark.parametrize("factor", [0.0, 0.5, 0.7, 1.0, 1.3, 2.0, -0.6])
def test_saturation_on_every_colour(isa, every_colour, factor):
    want = np.asarray(ImageEnhance.Color(Image.fromarray(every_colour)).enhance(factor))
    got = native_kernels.saturation(every_colour, factor)
    bad = np.any(got != want, axis=-1)
    assert not bad.any(), (every_colour[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("factor", [0.0, 0.25, 0.6, 0.999, 1.0, 1.4, 3.0, -0.5])
def test_blend_with_a_constant_on_every_pair(isa, factor):
    """Every (constant, pixel) pair: ImageEnhance.Brightness (constant 0) and Contrast (the grey mean)."""
    values = np.tile(np.arange(256, dtype=np.uint8), (256, 1))  # row c: every pixel value
    image = Image.fromarray(values)
    for c in range(256):
        want = np.asarray(Image.blend(Image.new("L", (256, 1), c), Image.fromarray(values[c:c + 1]), factor))
        assert np.array_equal(native_kernels.blend_const(values[c:c + 1], c, factor), want), c
    rgb = np.repeat(values[:, :, None], 3, axis=2)
    want = np.asarray(ImageEnhance.Brightness(Image.fromarray(rgb)).enhance(factor))
    assert np.array_equal(native_kernels.blend_const(rgb, 0, factor), want)
    mean = int(ImageStat.Stat(image).mean[0] + 0.5)
    want = np.asarray(ImageEnhance.Contrast(Image.fromarray(rgb)).enhance(factor))
    assert np.array_equal(native_kernels.blend_const(rgb, mean, factor), want)


@pytest.mark.parametrize("factor", [-0.5, -0.1, 0.0, 0.003, 0.25, 0.5])
def test_hue_on_every_colour(isa, every_colour, factor):
    want = np.asarray(F.adjust_hue(Image.fromarray(every_colour), factor))
    shift = int(np.int32(factor * 255).astype(np.uint8))
    got = native_kernels.hue_shift(every_colour, shift)
    bad = np.any(got != want, axis=-1)
    assert not bad.any(), (factor, every_colour[bad][:5], got[bad][:5], want[bad][:5])


def test_hue_on_every_shift_of_every_value_and_saturation(isa, every_colour):
    """The way back from HSV on every input it can get: one colour per (V, S) pair that PIL's RGB to
    HSV gives, at every one of the 256 shifts, so that H + shift takes every value with each pair."""
    hsv = np.asarray(Image.fromarray(every_colour).convert("HSV")).reshape(-1, 3)
    _, first = np.unique(hsv[:, 1].astype(np.int32) * 256 + hsv[:, 2], return_index=True)
    reps = every_colour.reshape(-1, 3)[first]
    reps = np.concatenate([reps, reps[: (-len(reps)) % 128]]).reshape(-1, 128, 3)  # a few rows of 128
    for shift in range(256):
        got = native_kernels.hue_shift(reps, shift)
        want = native_checks.pil_hue_shift(reps, shift)
        bad = np.any(got != want, axis=-1)
        assert not bad.any(), (shift, reps[bad][:5], got[bad][:5], want[bad][:5])


def _edge_images():
    rng = np.random.default_rng(5)
    out = [np.zeros((1, 1, 3), np.uint8), np.full((1, 1, 3), 255, np.uint8), np.full((3, 2, 3), 128, np.uint8)]
    for h, w in [(1, 7), (7, 1), (2, 3), (5, 5), (13, 17), (31, 9), (64, 65)]:
        out.append(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
    out.append(np.tile(np.array([[0, 255]], np.uint8), (9, 11))[:, :, None].repeat(3, 2))  # extremes
    return out


def test_every_kernel_on_edge_images(isa):
    for a in _edge_images():
        img = Image.fromarray(a)
        grey = np.asarray(img.convert("L"))
        assert np.array_equal(native_kernels.rgb_to_l(a), grey)
        assert native_kernels.contrast_mean(a) == int(ImageStat.Stat(img.convert("L")).mean[0] + 0.5)
        for f in (0.0, 0.4, 1.0, 1.7):
            assert np.array_equal(native_kernels.saturation(a, f), np.asarray(ImageEnhance.Color(img).enhance(f)))
            assert np.array_equal(native_kernels.blend_const(a, 0, f),
                                  np.asarray(ImageEnhance.Brightness(img).enhance(f)))
            assert np.array_equal(native_kernels.blend_const(grey, 0, f),
                                  np.asarray(ImageEnhance.Brightness(img.convert("L")).enhance(f)))
        for shift in (0, 1, 128, 255):
            assert np.array_equal(native_kernels.hue_shift(a, shift), native_checks.pil_hue_shift(a, shift))
        for size in [(1, 1), (2, 5), (a.shape[0] * 3, a.shape[1] + 1), (max(1, a.shape[0] // 2), a.shape[1])]:
            for f in FILTERS:
                for src, pil in ((a, img), (grey, img.convert("L"))):
                    want = np.asarray(pil.resize((size[1], size[0]), f))
                    assert np.array_equal(native_kernels.resample(src, size, f), want), (a.shape, size, f)
                    assert np.array_equal(native_kernels.resample(src, size, f, flip=True), want[:, ::-1])


def _photos(photos) -> list[np.ndarray]:
    return [np.asarray(p) for p in photos]


def test_resize_of_real_photo_crops(isa, photos):
    """Random crops, scales 0.05x-2.5x and any size, boxes, flips, grey: equal to PIL's crop then resize."""
    rng = np.random.default_rng(11)
    for trial in range(160):
        a = _photos(photos)[trial % len(photos)]
        h_all, w_all = a.shape[:2]
        h, w = int(rng.integers(1, h_all + 1)), int(rng.integers(1, w_all + 1))
        top, left = int(rng.integers(0, h_all - h + 1)), int(rng.integers(0, w_all - w + 1))
        crop = a[top:top + h, left:left + w]
        scale = [0.05, 0.3, 0.7, 1.0, 1.3, 2.5][trial % 6]
        oh = max(1, int(h * scale * rng.uniform(0.8, 1.25)))
        ow = max(1, int(w * scale * rng.uniform(0.8, 1.25)))
        f = list(FILTERS)[trial % 5]
        pil = Image.fromarray(np.ascontiguousarray(crop))
        src = crop
        if trial % 7 == 0:
            pil = pil.convert("L")
            src = np.asarray(pil)
        box = None
        if trial % 5 == 1 and w > 2 and h > 2:
            box = (float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2)),
                   float(rng.uniform(w / 2 + 0.5, w)), float(rng.uniform(h / 2 + 0.5, h)))
        want = np.asarray(pil.resize((ow, oh), f, box=box))
        flip = bool(trial % 3 == 0)
        got = native_kernels.resample(src, (oh, ow), f, box=box, flip=flip)
        assert np.array_equal(got, want[:, ::-1] if flip else want), (trial, (h, w), (oh, ow), f, box, flip)
        # a window of the output (a CenterCrop after a Resize): only that part computed, the same pixels
        wt, wl = int(rng.integers(0, oh)), int(rng.integers(0, ow))
        wh, ww = int(rng.integers(1, oh - wt + 1)), int(rng.integers(1, ow - wl + 1))
        part = want[wt:wt + wh, wl:wl + ww]
        got = native_kernels.resample(src, (oh, ow), f, box=box, flip=flip, window=(wt, wl, wh, ww))
        assert np.array_equal(got, part[:, ::-1] if flip else part), (trial, (wt, wl, wh, ww))


def test_random_resized_crop_draws_at_seed_42(isa, photos):
    """What RandomResizedCrop(224) does to the photos: 64 draws, the crop a view, resized natively."""
    import torch

    t = T.RandomResizedCrop(224)
    torch.manual_seed(42)
    for k in range(64):
        img = photos[k % len(photos)]
        i, j, h, w = t.get_params(img, t.scale, t.ratio)
        want = np.asarray(img.crop((j, i, j + w, i + h)).resize((224, 224), Image.BILINEAR))
        got = native_kernels.resample(np.asarray(img)[i:i + h, j:j + w], (224, 224), Image.BILINEAR)
        assert np.array_equal(got, want), k


@pytest.mark.parametrize("factor", [0.0, 0.1, 0.7, 1.0, 1.5, 1.9, 2.0, -0.5, 3.3])
def test_sharpness_on_real_photos_and_edge_shapes(photos, factor):
    """ImageEnhance.Sharpness: PIL's float SMOOTH filter, its copied borders, the blend, RGB and L."""
    images = [photos[0], photos[1].convert("L"), photos[2].crop((5, 7, 8, 10)), photos[2].crop((0, 0, 2, 40)),
              photos[0].crop((10, 10, 13, 90)).convert("L"), Image.new("RGB", (1, 1), (200, 10, 5))]
    for im in images:
        want = np.asarray(ImageEnhance.Sharpness(im).enhance(factor))
        assert np.array_equal(native_kernels.sharpness(np.asarray(im), factor), want), (im.size, im.mode)


def test_tables_and_tensor_tail(isa):
    a = np.random.default_rng(2).integers(0, 256, size=(37, 41, 3), dtype=np.uint8)
    tables = np.random.default_rng(3).integers(0, 256, size=(3, 256), dtype=np.uint8)
    assert np.array_equal(native_kernels.lut(a, tables), np.stack([tables[c][a[..., c]] for c in range(3)], -1))
    for dtype in (np.float32, np.float64):
        table = np.random.default_rng(4).standard_normal((3, 256)).astype(dtype)
        assert np.array_equal(native_kernels.planes_lut(a, table), np.stack([table[c][a[..., c]] for c in range(3)]))
        grey = a[..., 0]
        assert np.array_equal(native_kernels.planes_lut(grey, table), np.stack([table[c][grey] for c in range(3)]))
        assert np.array_equal(native_kernels.pixels_lut(a[::-1, 3:30], table),
                              np.stack([table[c][a[::-1, 3:30, c]] for c in range(3)], -1))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="H x W or H x W x 3 uint8"):
        native_kernels.saturation(np.zeros((4, 4, 3), np.float32), 1.0)
    with pytest.raises(ValueError, match="H x W x 3"):
        native_kernels.hue_shift(np.zeros((4, 4), np.uint8), 1)
    with pytest.raises(ValueError, match="filters"):
        native_kernels.resample(np.zeros((4, 4, 3), np.uint8), (2, 2), 0)
    with pytest.raises(ValueError, match="empty"):
        native_kernels.rgb_to_l(np.zeros((0, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="bad resample sizes, window or box"):
        native_kernels.resample(np.zeros((4, 4, 3), np.uint8), (2, 2), 2, box=(0.0, 0.0, 5.0, 4.0))
    with pytest.raises(ValueError, match="not available here"):
        MOD.set_isa("sse9")


# --- a sabotaged build, no compiler, and nothing loaded from elsewhere -------------------------

#: One deliberate arithmetic change per kernel group, in its portable and its wide code; each must
#: fail that kernel's check on every instruction set.
SABOTAGE = {
    "resample.c": [("return (int32_t)1 << (c->precision - 1);", "return ((int32_t)1 << (c->precision - 1)) - 1;")],
    "color.c": [("0x8000", "0x7fff")],  # L's rounding term, in the portable and the wide code
    # a rounding threshold a hair off: 822 of the 2**24 colours change, as many as pillow-simd's grey
    "hue.c": [("q += qx - (double)q >= 0.5;", "q += qx - (double)q >= 0.4999;"),
              ("_mm256_add_pd(x, _mm256_set1_pd(0.5))", "_mm256_add_pd(x, _mm256_set1_pd(0.4999))")],
}


def _build_copy(tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> object:
    """Compile the kernels' sources with ``edits`` applied, and import the result under another name."""
    import importlib.util

    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    src = tmp_path / "src"
    csrc = src / hatch_build.CSRC
    shutil.copytree(ROOT / hatch_build.CSRC, csrc)
    for name, changes in edits.items():
        text = (csrc / name).read_text()
        for old, new in changes:
            assert old in text, (name, old)
            text = text.replace(old, new)  # every occurrence
        (csrc / name).write_text(text)
    built = hatch_build.build_extension(src, inplace=True, build_dir=tmp_path / "build")
    spec = importlib.util.spec_from_file_location("sabotaged._native", built)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sabotaged(tmp_path_factory):
    return _build_copy(tmp_path_factory.mktemp("sabotaged"), SABOTAGE)


@pytest.mark.parametrize("isa_name", ISAS)
def test_a_sabotaged_build_is_refused_by_the_check(sabotaged, isa_name):
    sabotaged.set_isa(isa_name)
    for name, check in native_checks.CHECKS.items():
        if name in native.JPEG_KERNELS:
            continue  # another extension (test_crop_decode.py sabotages it)
        why = check(sabotaged)
        if name in ("resample", "grayscale", "saturation", "hue"):
            assert why and "differs" in why, (name, isa_name, why)
        else:
            assert why is None, (name, isa_name, why)  # blend and tables were left intact


#: Builds that break one of the kernels SABOTAGE leaves intact, each in its portable and wide code:
#: only that kernel's check may refuse it.
MORE_SABOTAGE = {
    # blend with a constant as (1 - a) c + a x: the same in exact arithmetic, not in PIL's float order
    "blend": {"color.c": [
        ("out[x] = blend_byte(in1, in[x], alpha);",
         "{ float t_ = (1.0f - alpha) * (float)in1 + alpha * (float)in[x]; "
         "out[x] = t_ <= 0.0f ? 0 : (t_ >= 255.0f ? 255 : (uint8_t)t_); }"),
        ("v[k] = blend_lanes_avx2(c, cf, p, a);",
         "v[k] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(_mm256_mul_ps("
         "_mm256_sub_ps(_mm256_set1_ps(1.0f), a), cf), _mm256_mul_ps(a, _mm256_cvtepi32_ps(p))), "
         "_mm256_setzero_ps()), _mm256_set1_ps(255.0f)));"),
    ]},
    # the tensor tail reads the green plane through the blue channel's table
    "tables": {"tensor.c": [("o1[x] = t1[row[x * 3 + 1]];", "o1[x] = t2[row[x * 3 + 1]];")]},
    # a point table applies the green channel's table to blue
    "point tables": {"color.c": [("out[x * 3 + 2] = t2[row[x * 3 + 2]];", "out[x * 3 + 2] = t1[row[x * 3 + 2]];")]},
    # the sharpness blend as (1 - a) d + a x: the same in exact arithmetic, not in PIL's float order (the
    # SMOOTH filter itself is integer rounding in disguise, which the kernel computes as such)
    "sharpness": {"color.c": [
        ("float t = (float)deg + alpha * (float)(in - deg);",
         "float t = (1.0f - alpha) * (float)deg + alpha * (float)in;"),
    ]},
}


@pytest.mark.parametrize("broken", list(MORE_SABOTAGE))
def test_a_sabotaged_blend_or_table_build_is_refused_by_its_check(tmp_path, broken):
    mod = _build_copy(tmp_path, MORE_SABOTAGE[broken])
    refused = "tables" if broken == "point tables" else broken
    for isa_name in ISAS:
        mod.set_isa(isa_name)
        for name, check in native_checks.CHECKS.items():
            if name in native.JPEG_KERNELS:
                continue  # the crop decode lives in its own extension (tests/test_crop_decode.py)
            why = check(mod)
            if name == refused:
                assert why and ("differs" in why or "wrong" in why), (broken, name, isa_name, why)
            else:
                assert why is None, (broken, name, isa_name, why)


def test_a_refused_kernel_means_pil_code_with_stock_pixels(sabotaged, monkeypatch, photos):
    im = photos[0]
    want = [np.asarray(F.resize(im, [97, 131])), np.asarray(F.adjust_saturation(im, 0.4)),
            np.asarray(F.adjust_hue(im, 0.2)), np.asarray(F.rgb_to_grayscale(im))]
    native.reset()
    monkeypatch.setattr(native, "_import", lambda: sabotaged)
    try:
        nano_patch.patch_torch()
        got = [np.asarray(F.resize(im, [97, 131])), np.asarray(F.adjust_saturation(im, 0.4)),
               np.asarray(F.adjust_hue(im, 0.2)), np.asarray(F.rgb_to_grayscale(im))]
        state = native.state()
    finally:
        native.reset()
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    for name in ("resample", "saturation", "hue", "grayscale"):
        assert state[name].startswith("PIL's code: the compiled"), state


def test_switched_off_kernels_run_pil_code(photos):
    """NANO_PATCH_NO_NATIVE=1: every transform still equals stock, and status says why."""
    code = (
        "import numpy as np, torch, torchvision.transforms as T, nano_patch\n"
        "from PIL import Image\n"
        "from nano_patch.vision.kernels import native\n"
        "rng = np.random.default_rng(0)\n"
        "im = Image.fromarray(rng.integers(0, 256, (120, 90, 3), dtype=np.uint8))\n"
        "tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(.4, .4, .4, .1),"
        " T.ToTensor(), T.Normalize([.5] * 3, [.2] * 3)])\n"
        "torch.manual_seed(0); want = [tf(im) for _ in range(5)]\n"
        "nano_patch.patch_torch()\n"
        "torch.manual_seed(0); got = [tf(im) for _ in range(5)]\n"
        "assert all(torch.equal(a, b) for a, b in zip(want, got))\n"
        "print(sorted(set(native.state().values())))\n"
    )
    env = {**os.environ, "NANO_PATCH_NO_NATIVE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "PIL's code: NANO_PATCH_NO_NATIVE is set" in out.stdout


@pytest.mark.timeout(900)
def test_no_c_compiler_installs_without_the_kernels_and_runs_pil_code(tmp_path):
    """A wheel built where no C compiler works: it installs, warns once at build, and runs PIL's code.
    pip hides the build's warning, so the first patch_torch() says it in one line with the fix (not
    the processes a patched run starts), and ``nano-patch status`` gives the reason once."""
    env = {**os.environ, "CC": "/nonexistent/cc", "LDSHARED": "/nonexistent/cc -shared"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "wheels"), str(ROOT)], env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "could not be compiled" in build.stdout + build.stderr
    wheel = next((tmp_path / "wheels").glob("nano_patch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "nano_patch/vision/kernels/native.py" in names and not [n for n in names if "_native" in n], names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = (
        "import numpy as np, torchvision.transforms.functional as F, nano_patch\n"
        "from PIL import Image\n"
        "from nano_patch.vision.kernels import native\n"
        f"assert nano_patch.__file__.startswith({str(site)!r}), nano_patch.__file__\n"
        "im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))\n"
        "want = np.asarray(F.resize(im, [31, 23]))\n"
        "nano_patch.patch_torch()\n"
        "assert np.array_equal(np.asarray(F.resize(im, [31, 23])), want)\n"
        "nano_patch.unpatch_torch(); nano_patch.patch_torch()\n"
        "print(native.check_all()['resample'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("_NANO_PATCH_STARTUP", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "installed without its compiled kernels" in run.stdout
    said = [line for line in run.stderr.splitlines() if "installed without its compiled kernels" in line]
    assert len(said) == 1, run.stderr
    assert "NanoPatchWarning" in said[0] and "install a C compiler and reinstall nano-patch" in said[0], said
    # a process that a patched run starts (rank, spawned worker: the startup hook) stays quiet
    child = subprocess.run([sys.executable, "-c", "import nano_patch._startup"],
                           env={**env, "_NANO_PATCH_STARTUP": "{}"}, capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    assert "kernels" not in child.stderr, child.stderr
    status = subprocess.run([sys.executable, "-m", "nano_patch", "status"], env=env, capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    kernels = status.stdout.split("native image kernels:\n", 1)[1].split("\ndecoded-image cache:", 1)[0].splitlines()
    # the reason once, not once per kernel (the crop decode, its own extension, says its own state)
    assert [k.split()[0] for k in kernels] == ["all", *native.JPEG_KERNELS], status.stdout
    assert kernels[0].split()[0] == "all", kernels
    assert "installed without its compiled kernels" in kernels[0], kernels
    assert "install a C compiler and reinstall nano-patch" in kernels[0], kernels
    assert status.stdout.count("installed without its compiled kernels") == 1, status.stdout


def test_a_library_planted_in_a_cache_folder_is_never_loaded(tmp_path):
    """The attack on the old first-use build: a world-writable cache with a library under the kernel's
    name. Nothing is built or loaded from any cache now; the planted constructor must never run."""
    marker = tmp_path / "planted-code-ran"
    for folder in (tmp_path / ".cache" / "nano-patch", tmp_path / "xdg" / "nano-patch"):
        folder.mkdir(parents=True)
        folder.chmod(0o777)
        c = folder / "planted.c"
        c.write_text('#include <stdio.h>\n__attribute__((constructor)) static void f(void) '
                     f'{{ FILE *p = fopen("{marker}", "w"); if (p) fclose(p); }}\n')
        for name in ("hue-0123456789abcdef.so", "_native.so", "resample.so"):
            subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(c)], check=True)
    code = (
        "import numpy as np, nano_patch\n"
        "from nano_patch.vision.kernels import native, native_kernels\n"
        "print(native.check_all())\n"
        "native_kernels.hue_shift(np.zeros((4, 4, 3), np.uint8), 3)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not marker.exists()


# --- pillow-simd's arithmetic, against a plain reference (CI has Pillow; pillow-simd matched here) ---


def _weights(in_size: int, out_size: int, support: float, kernel) -> tuple[list, list]:
    """PIL's precompute_coeffs, in Python doubles (the same operations, libm's sin)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    bounds, weights = [], []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [kernel((x + xmin - center + 0.5) * (1.0 / filterscale)) for x in range(xmax)]
        ww = 0.0
        for w in k:
            ww += w
        bounds.append((xmin, xmax))
        weights.append([w / ww for w in k] if ww != 0.0 else k)
    return bounds, weights


def _simd_quantise(weights: list) -> tuple[list, int]:
    """pillow-simd's normalize_coeffs_8bpc: 16-bit weights at the most precision that fits."""
    maxkk = max(max(w) if w else 0.0 for w in weights)
    maxkk = max(maxkk, 0.0)
    p = 0
    while p < 22 and int(0.5 + maxkk * (1 << (p + 1))) < (1 << 15):
        p += 1
    q = [[int(-0.5 + w * (1 << p)) if w < 0 else int(0.5 + w * (1 << p)) for w in ws] for ws in weights]
    return q, p


def _pass(rows: np.ndarray, bounds, q, p, axis: int) -> np.ndarray:
    out = []
    for (xmin, n), k in zip(bounds, q):
        part = np.take(rows, range(xmin, xmin + n), axis=axis).astype(np.int64)
        shape = [1] * rows.ndim
        shape[axis] = n
        ss = (1 << (p - 1)) + (part * np.array(k, np.int64).reshape(shape)).sum(axis=axis)
        out.append(np.clip(ss >> p, 0, 255))
    return np.stack(out, axis=axis).astype(np.uint8)


def test_pillow_simd_resize_arithmetic(isa):
    """Weights rounded to 16 bits at pillow-simd's precision, horizontal pass first: the kernel's second
    arithmetic equals a plain reference of it (and, on the development machine, pillow-simd itself)."""
    bilinear = (lambda x: max(0.0, 1.0 - abs(x)), 1.0)
    bicubic = (lambda x: (1.5 * abs(x) - 2.5) * x * x + 1 if abs(x) < 1 else
               (((abs(x) - 5) * abs(x) + 8) * abs(x) - 4) * -0.5 if abs(x) < 2 else 0.0, 2.0)
    rng = np.random.default_rng(9)
    for (h, w), (oh, ow) in [((23, 17), (9, 13)), ((16, 40), (30, 11)), ((31, 29), (31, 7))]:
        a = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        for f, (kernel, support) in ((Image.BILINEAR, bilinear), (Image.BICUBIC, bicubic)):
            hb, hw = _weights(w, ow, support, kernel)
            vb, vw = _weights(h, oh, support, kernel)
            hq, hp = _simd_quantise(hw)
            vq, vp = _simd_quantise(vw)
            first = vb[0][0]
            last = vb[-1][0] + vb[-1][1]
            mid = _pass(a[first:last], hb, hq, hp, axis=1) if ow != w else a[first:last]
            want = _pass(mid, [(x - first, n) for x, n in vb], vq, vp, axis=0) if oh != h else mid
            got = np.empty((oh, ow, 3), np.uint8)
            MOD.resample(a, got, int(f), (0.0, 0.0, float(w), float(h)), False, (0, 1), (ow, oh), (0, 0))
            assert np.array_equal(got, want), ((h, w), (oh, ow), f)


def test_pillow_simd_grey_arithmetic(isa):
    """pillow-simd's grey: its 15-bit formula on each row's first 4 * (width // 4) pixels, Pillow's after."""
    rng = np.random.default_rng(4)
    for width in (1, 3, 4, 5, 8, 13, 22, 64, 67):
        a = rng.integers(0, 256, size=(5, width, 3), dtype=np.uint8)
        p = a.astype(np.int64)
        simd = (p[..., 0] * 9798 + p[..., 1] * 19235 + p[..., 2] * 3735 + 0x4000) >> 15
        pil = (p[..., 0] * 19595 + p[..., 1] * 38470 + p[..., 2] * 7471 + 0x8000) >> 16
        want = np.where(np.arange(width) < width - width % 4, simd, pil).astype(np.uint8)
        got = np.empty((5, width), np.uint8)
        MOD.rgb_to_l(a, got, 1)
        assert np.array_equal(got, want), width
        assert MOD.gray_sum(a, 1) == int(want.sum())
        out = np.empty_like(a)
        MOD.blend_gray(a, out, 0.3, 1)
        g = want.astype(np.float32)[..., None]
        ref = np.clip(np.trunc(g + np.float32(0.3) * (a.astype(np.float32) - g)), 0, 255).astype(np.uint8)
        assert np.array_equal(out, ref), width
