"""Crop-region JPEG decoding (``_jpeg``, the system's libjpeg-turbo) against the full decode, sliced.

The reference is simplejpeg's full decode (its own libjpeg-turbo), which nano-patch already holds equal
to ``PIL.Image.open(f).convert("RGB")``; for real photos PIL is compared directly too. Every chroma
sampling, grey, progressive files and restart markers; every window edge in each axis of odd-sized
images; hundreds of RandomResizedCrop windows of real photos. Damaged data must fail exactly where the
strict full decode fails. Builds with the fix taken out (no margin, no minimum band) must be refused by
the check at load, and an install without libjpeg must still build ``_native`` and say why crops are
decoded whole.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
import torchvision.transforms as T
from PIL import Image

from nano_patch.vision.kernels import native, native_checks, native_kernels

ROOT = Path(__file__).resolve().parents[1]

try:
    JPEG = native._import_jpeg()
except native.NativeUnavailable as exc:  # built without libjpeg: only the fallback tests can run
    JPEG = None
    WHY_NO_JPEG = str(exc)
needs_jpeg = pytest.mark.skipif(JPEG is None, reason="crop decoding not built here (no libjpeg-turbo headers)")


def _hatch_build():
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    return hatch_build


def _pixels(h: int, w: int, seed: int) -> np.ndarray:
    """Gradients and noise: neighbouring chroma samples differ, so a wrong edge pixel shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    smooth = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * 7 + y * 13) % 256], -1)
    noise = rng.integers(0, 256, (h, w, 3))
    return np.where(rng.random((h, w, 1)) < 0.5, smooth, noise).astype(np.uint8)


def _pil_jpeg(img: Image.Image, **kwargs) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **kwargs)
    return out.getvalue()


def encode(a: np.ndarray, how: str, quality: int = 90) -> bytes:
    """``a`` as a JPEG: simplejpeg for every sampling it writes and grey; PIL for progressive and restarts."""
    if how in ("444", "422", "420", "440", "411"):
        return simplejpeg.encode_jpeg(a, quality, colorsubsampling=how)
    if how == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(a[..., :1]), quality, colorspace="GRAY")
    img = Image.fromarray(a)
    if how == "progressive-420":
        return _pil_jpeg(img, quality=quality, subsampling=2, progressive=True)
    if how == "progressive-444":
        return _pil_jpeg(img, quality=quality, subsampling=0, progressive=True)
    if how == "progressive-gray":
        return _pil_jpeg(img.convert("L"), quality=quality, progressive=True)
    if how == "restart-blocks-420":
        return _pil_jpeg(img, quality=quality, subsampling=2, restart_marker_blocks=1)
    if how == "restart-rows-422":
        return _pil_jpeg(img, quality=quality, subsampling=1, restart_marker_rows=1)
    raise ValueError(how)


ENCODINGS = ["444", "422", "420", "440", "411", "gray", "progressive-420", "progressive-444", "progressive-gray",
             "restart-blocks-420", "restart-rows-422"]


def full(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)


def region(data: bytes, top: int, left: int, height: int, width: int, **kwargs) -> np.ndarray:
    return native_kernels.decode_jpeg_region(data, top, left, height, width, **kwargs)


@pytest.fixture(autouse=True)
def _fresh_checks():
    """Each test sees the kernels as a new process would, and leaves no verdict behind."""
    native.reset()
    yield
    native.reset()


# --- the kernel and its check here -------------------------------------------------------------


@needs_jpeg
def test_crop_decode_passes_its_check_here():
    assert native.check_all()["crop_decode"] == f"native ({JPEG.LIBJPEG_VERSION})", native.state()
    assert JPEG.MARGIN == 1
    assert JPEG.LIBJPEG_VERSION.startswith("libjpeg-turbo ")
    # in the package in use (the source tree or an installed wheel), linked to a libjpeg the process can name
    assert Path(JPEG.__file__).resolve().parent == Path(native.__file__).resolve().parents[1]
    assert JPEG.library() is None or "jpeg" in os.path.basename(JPEG.library())


@needs_jpeg
def test_the_check_is_quick():
    """It runs once per process before the first crop decode: a few tens of milliseconds."""
    import time

    native_checks.check_crop_decode(JPEG)  # warm: the encoders' first calls
    start = time.perf_counter()
    assert native_checks.check_crop_decode(JPEG) is None
    assert time.perf_counter() - start < 0.5  # ~30 ms here; loose for a loaded 2-core CI machine


# --- exact pixels ------------------------------------------------------------------------------


@needs_jpeg
@pytest.mark.parametrize("how", ENCODINGS)
def test_every_window_edge_of_every_layout(how):
    """Every (left, right) pair with the rows varying, every (top, bottom) pair with the columns varying,
    on an odd-sized image: each edge lands on every offset in and on the boundary of an iMCU."""
    h, w = 37, 43 if how != "411" else 75
    data = encode(_pixels(h, w, seed=len(how)), how)
    want = full(data)
    k = 0
    for left in range(w):
        for right in range(left + 1, w + 1):
            k += 1
            top = (k * 7) % h
            bottom = min(h, top + 1 + (k * 11) % h)
            got = region(data, top, left, bottom - top, right - left, check_rest=bool(k % 2))
            assert np.array_equal(got, want[top:bottom, left:right]), (how, top, left, bottom, right)
    for top in range(h):
        for bottom in range(top + 1, h + 1):
            k += 1
            left = (k * 5) % w
            right = min(w, left + 1 + (k * 13) % w)
            got = region(data, top, left, bottom - top, right - left)
            assert np.array_equal(got, want[top:bottom, left:right]), (how, top, left, bottom, right)


@needs_jpeg
@pytest.mark.parametrize("size", [(1, 1), (1, 2), (2, 1), (2, 3), (1, 40), (40, 1), (16, 16), (17, 16), (16, 17),
                                  (9, 33), (19, 18)])
def test_tiny_and_odd_images(size):
    h, w = size
    for how in ("420", "422", "440", "411", "444", "gray", "progressive-420"):
        data = encode(_pixels(h, w, seed=h * 100 + w), how)
        want = full(data)
        for top in range(h):
            for left in range(w):
                for hh, ww in ((1, 1), (h - top, w - left), (min(2, h - top), min(3, w - left))):
                    got = region(data, top, left, hh, ww)
                    assert np.array_equal(got, want[top:top + hh, left:left + ww]), (how, size, top, left, hh, ww)


def _photo_jpegs(photos) -> list[tuple[str, bytes]]:
    out = []
    for i, im in enumerate(photos):
        quality = (75, 85, 95)[i % 3]
        out.append((f"photo {i} q{quality} 4:2:0", _pil_jpeg(im, quality=quality)))
        out.append((f"photo {i} q{quality} 4:4:4", _pil_jpeg(im, quality=quality, subsampling=0)))
        out.append((f"photo {i} q{quality} 4:2:2", _pil_jpeg(im, quality=quality + 2, subsampling=1)))
        out.append((f"photo {i} progressive", _pil_jpeg(im, quality=quality - 3, progressive=True)))
        out.append((f"photo {i} 4:4:0", simplejpeg.encode_jpeg(np.asarray(im), quality, colorsubsampling="440")))
        out.append((f"photo {i} grey", _pil_jpeg(im.convert("L"), quality=quality)))
        # an odd size, so the last iMCU row and column are partial
        odd = im.crop((0, 0, im.width - 3 - i, im.height - 5 - i))
        out.append((f"photo {i} odd {odd.size}", _pil_jpeg(odd, quality=quality + 1)))
    return out


@needs_jpeg
def test_real_photos_random_resized_crops(photos):
    """RandomResizedCrop's windows (drawn from the size alone, as the pipeline draws them) and CenterCrop's:
    equal to the full decode sliced, and to PIL's own decode cropped."""
    rrc = T.RandomResizedCrop(224)
    torch.manual_seed(0)
    n = 0
    for label, data in _photo_jpegs(photos):
        want = full(data)
        pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(want, pil), label  # the reference is stock's
        h, w = want.shape[:2]
        windows = [rrc.get_params(torch.empty(1, h, w), rrc.scale, rrc.ratio) for _ in range(40)]
        for ch, cw in ((224, 224), (h // 2 + 1, w // 3 + 1), (1, w), (h, 1)):
            windows.append(((h - ch) // 2, (w - cw) // 2, ch, cw))  # T.CenterCrop's rounding of the offsets
        for k, (top, left, hh, ww) in enumerate(windows):
            got = region(data, top, left, hh, ww, check_rest=bool(k % 2))
            assert np.array_equal(got, want[top:top + hh, left:left + ww]), (label, top, left, hh, ww)
            n += 1
    assert n > 500


@needs_jpeg
def test_grey_comes_out_as_stock_rgb():
    a = _pixels(29, 31, seed=3)
    for how in ("gray", "progressive-gray"):
        data = encode(a, how)
        got = region(data, 3, 5, 20, 17)
        assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 0], got[..., 2])
        pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(got, pil[3:23, 5:22])


@needs_jpeg
def test_the_result_is_a_view_like_a_slice_of_the_full_decode():
    data = encode(_pixels(50, 70, seed=1), "420")
    got = region(data, 7, 21, 30, 40)
    assert got.shape == (30, 40, 3) and got.dtype == np.uint8
    assert got.flags.writeable and not got.flags.c_contiguous
    assert got.strides[1:] == (3, 1) and got.strides[0] >= 3 * 40
    assert np.array_equal(np.ascontiguousarray(got), full(data)[7:37, 21:61])
    got[0, 0] = 0  # its own buffer: writing changes nothing else
    assert np.array_equal(region(data, 7, 21, 30, 40)[1:], got[1:])
    # the whole image, no cropping at all
    assert np.array_equal(region(data, 0, 0, 50, 70), full(data))
    # any bytes-like input
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert np.array_equal(region(buf, 1, 2, 3, 4), full(data)[1:4, 2:6])


@needs_jpeg
def test_decodes_in_threads_at_once():
    """The GIL is released while decoding; concurrent decodes stay exact."""
    data = [encode(_pixels(120, 160, seed=s), how) for s, how in enumerate(("420", "422", "progressive-420"))]
    wants = [full(d) for d in data]
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            i = int(rng.integers(0, 3))
            top, left = int(rng.integers(0, 100)), int(rng.integers(0, 140))
            got = region(data[i], top, left, 20, 20)
            if not np.array_equal(got, wants[i][top:top + 20, left:left + 20]):
                errors.append(f"{seed} {i} {top} {left}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --- damaged, unusual and wrong input ----------------------------------------------------------


def _damaged(data: bytes, rng: np.random.Generator, kind: int) -> bytes:
    b = bytearray(data)
    if kind == 0:
        return bytes(b[: int(rng.integers(0, len(b)))])  # truncated
    if kind == 1:
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))  # bytes changed
        return bytes(b)
    p = int(rng.integers(0, len(b)))
    del b[p:p + int(rng.integers(1, 40))]  # bytes cut out
    return bytes(b)


@needs_jpeg
@pytest.mark.parametrize("how", ["420", "444", "progressive-420", "restart-blocks-420"])
def test_damaged_data_fails_exactly_where_the_strict_full_decode_fails(how):
    """Truncated or corrupt anywhere, above, in or below the window: the region decode raises
    JpegRegionError exactly when simplejpeg's strict full decode raises, and otherwise gives its pixels."""
    a = _pixels(90, 70, seed=7)
    data = encode(a, how)
    rng = np.random.default_rng(len(how))
    raised = 0
    for k in range(240):
        bad = _damaged(data, rng, k % 3)
        try:
            want = full(bad)
        except ValueError:
            want = None
        # the window drawn from the file's own header, as the pipeline draws it
        try:
            h, w = simplejpeg.decode_jpeg_header(bad)[:2]
        except ValueError:
            h, w = a.shape[:2]
        if h < 25 or w < 15:
            continue
        top, left = int(rng.integers(0, h - 24)), int(rng.integers(0, w - 14))
        try:
            got = region(bad, top, left, 25, 15)
        except native_kernels.JpegRegionError as exc:
            assert want is None, (k, str(exc))
            assert str(exc)
            raised += 1
            continue
        assert want is not None, k
        assert np.array_equal(got, want[top:top + 25, left:left + 15]), k
    assert raised > 100


@needs_jpeg
def test_damage_below_the_window_without_check_rest():
    """check_rest=False stops after the window's rows: a file cut short below the window then decodes (same
    pixels as the intact file), one cut short above or inside it still fails; check_rest=True fails both."""
    data = encode(_pixels(200, 64, seed=9), "420")
    want = full(data)
    cut = data[: len(data) * 2 // 3]  # the last third of the rows is missing
    assert np.array_equal(region(cut, 0, 3, 40, 50, check_rest=False), want[0:40, 3:53])
    with pytest.raises(native_kernels.JpegRegionError, match="Premature end|premature end"):
        region(cut, 0, 3, 40, 50)
    with pytest.raises(native_kernels.JpegRegionError):
        region(cut, 150, 3, 40, 50, check_rest=False)
    with pytest.raises(native_kernels.JpegRegionError):
        region(data[:-2], 0, 0, 8, 8)  # only the end-of-image marker missing


@needs_jpeg
def test_what_is_not_region_decoded_says_so():
    a = _pixels(40, 30, seed=2)
    img = Image.fromarray(a)
    cases = {
        "CMYK JPEG": _pil_jpeg(img.convert("CMYK")),
        "RGB JPEG": _pil_jpeg(img, keep_rgb=True),
        "Not a JPEG file": _pil_jpeg(img).replace(b"\xff\xd8", b"\x89P", 1),
        "Empty input": b"",
        "Premature end": _pil_jpeg(img)[:300],
    }
    for message, data in cases.items():
        with pytest.raises(native_kernels.JpegRegionError, match=message):
            region(data, 0, 0, 4, 4)
    png = io.BytesIO()
    img.save(png, "PNG")
    with pytest.raises(native_kernels.JpegRegionError, match="Not a JPEG"):
        region(png.getvalue(), 0, 0, 4, 4)


@needs_jpeg
def test_a_bad_window_is_a_plain_value_error():
    data = encode(_pixels(40, 30, seed=2), "420")
    for window in [(-1, 0, 5, 5), (0, -1, 5, 5), (0, 0, 0, 5), (0, 0, 5, 0), (0, 0, 41, 5), (0, 29, 1, 2),
                   (36, 0, 5, 1), (2**40, 0, 1, 1)]:
        with pytest.raises(ValueError, match="window") as info:
            region(data, *window)
        assert not isinstance(info.value, native_kernels.JpegRegionError), window
    with pytest.raises(TypeError):
        region("not bytes", 0, 0, 1, 1)  # type: ignore[arg-type]


# --- the check refuses a wrong kernel ----------------------------------------------------------


def _load(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def no_margin(tmp_path_factory):
    """``_jpeg`` built with ``-DNANO_JPEG_MARGIN=0``: the crop's left and right edges upsampled as image edges."""
    tmp = tmp_path_factory.mktemp("no-margin")
    built = _hatch_build().build_jpeg_extension(ROOT, inplace=False, build_dir=tmp,
                                                define_macros=[("NANO_JPEG_MARGIN", "0")])
    return _load(built, "no_margin._jpeg")


@pytest.fixture(scope="module")
def no_min_band(tmp_path_factory):
    """``_jpeg`` without the one-iMCU minimum band: 4:2:0 windows one chroma sample wide go wrong."""
    hb = _hatch_build()
    src = tmp_path_factory.mktemp("no-min-band") / "src"
    shutil.copytree(ROOT / hb.CSRC, src / hb.CSRC)
    c = src / hb.CSRC / "jpeg_region.c"
    text = c.read_text()
    assert "if (x_hi - x_lo < min_band) {" in text
    c.write_text(text.replace("if (x_hi - x_lo < min_band) {", "if (0) {"))
    return _load(hb.build_jpeg_extension(src, inplace=False, build_dir=src / "build"), "no_min_band._jpeg")


@needs_jpeg
def test_a_build_without_the_margin_is_refused_by_the_check(no_margin, monkeypatch):
    assert no_margin.MARGIN == 0
    why = native_checks.check_crop_decode(no_margin)
    assert why and "not exact" in why and "differs from the full decode" in why, why
    # ...which is right: it does give wrong pixels at window edges
    data = encode(_pixels(40, 60, seed=4), "420")
    buf, stride, oy, ox = no_margin.decode_region(data, 0, 16, 40, 20)
    got = np.frombuffer(buf, np.uint8).reshape(-1, stride // 3, 3)[oy:oy + 40, ox:ox + 20]
    assert not np.array_equal(got, full(data)[:, 16:36])
    # refused: the caller gets NativeUnavailable (and decodes whole), status says why
    monkeypatch.setattr(native, "_import_jpeg", lambda: no_margin)
    with pytest.raises(native.NativeUnavailable, match="not exact"):
        region(data, 0, 16, 40, 20)
    assert native.state()["crop_decode"].startswith("the full decode: libjpeg-turbo"), native.state()


@needs_jpeg
def test_a_build_without_the_minimum_band_is_refused_by_the_check(no_min_band):
    why = native_checks.check_crop_decode(no_min_band)
    assert why and "not exact" in why, why


@needs_jpeg
def test_progressive_files_that_differ_go_whole_and_the_rest_stays(monkeypatch):
    """If the system libjpeg decoded progressive files unlike simplejpeg's, only those would go whole."""

    class ProgressiveOff:
        Error = JPEG.Error
        LIBJPEG_VERSION = JPEG.LIBJPEG_VERSION

        @staticmethod
        def decode_region(data, top, left, height, width, check_rest=True, allow_multiscan=True):
            buf, stride, oy, ox = JPEG.decode_region(data, top, left, height, width, check_rest, allow_multiscan)
            if b"\xff\xc2" in bytes(data):  # SOF2: progressive
                buf[len(buf) // 2] ^= 1
            return buf, stride, oy, ox

    monkeypatch.setattr(native, "_import_jpeg", lambda: ProgressiveOff)
    baseline, progressive = encode(_pixels(40, 50, seed=5), "420"), encode(_pixels(40, 50, seed=5), "progressive-420")
    assert np.array_equal(region(baseline, 3, 4, 30, 40), full(baseline)[3:33, 4:44])
    with pytest.raises(native_kernels.JpegRegionError, match="progressive JPEG: not region-decoded"):
        region(progressive, 3, 4, 30, 40)
    assert native.state()["crop_decode"].startswith(f"native ({JPEG.LIBJPEG_VERSION}; progressive files decoded "
                                                    "whole: it differs"), native.state()


def test_switched_off_means_the_full_decode(monkeypatch):
    monkeypatch.setenv("NANO_PATCH_NO_NATIVE", "1")
    native.reset()
    with pytest.raises(native.NativeUnavailable, match="NANO_PATCH_NO_NATIVE"):
        region(b"\xff\xd8", 0, 0, 1, 1)
    assert native.state()["crop_decode"] == "the full decode: NANO_PATCH_NO_NATIVE is set"


# --- the build without libjpeg -----------------------------------------------------------------


def test_the_build_warning_names_the_reason():
    hb = _hatch_build()
    outputs = {
        'x.c:26:10: fatal error: jpeglib.h: No such file or directory\n   26 | #include <jpeglib.h>\ncompilation '
        'terminated.\nCompileError: command \'/usr/bin/gcc\' failed with exit code 1': "jpeglib.h: No such file",
        "/usr/bin/ld: cannot find -ljpeg: No such file or directory\ncollect2: error: ld returned 1 exit status\n"
        "LinkError: command failed": "cannot find -ljpeg",
        'x.c:35:2: error: #error "nano-patch\'s crop decode needs the libjpeg-turbo >= 2.0 headers"\n':
            "needs the libjpeg-turbo >= 2.0 headers",
    }
    for output, reason in outputs.items():
        assert reason in hb._reason(output), (output, hb._reason(output))
    warning = hb.jpeg_warning(hb._reason(next(iter(outputs))))
    assert "jpeglib.h" in warning and "libjpeg62-turbo-dev" in warning and "installing without it" in warning


@pytest.mark.timeout(300)
def test_without_libjpeg_the_install_keeps_native_and_says_why(tmp_path):
    """libjpeg cannot be linked (NANO_PATCH_JPEG_LIB names one that does not exist): one warning naming the
    reason and the fix, ``_native`` still built, no ``_jpeg``; and at run time status says crops decode whole."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "nano_patch", tree / "nano_patch",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    shutil.copy(ROOT / "hatch_build.py", tree / "hatch_build.py")
    code = (
        "import pathlib, hatch_build\n"
        "warnings = []\n"
        "built = hatch_build.build_all(pathlib.Path('.'), True, pathlib.Path('build'), warnings.append)\n"
        "print('BUILT', sorted(p.name.split('.')[0] for p in built))\n"
        "print('WARNINGS', warnings)\n"
    )
    env = {**os.environ, "NANO_PATCH_JPEG_LIB": "nano_patch_no_such_jpeg"}
    env.pop("NANO_PATCH_NO_JPEG", None)
    build = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=240)
    assert build.returncode == 0, build.stderr
    assert "BUILT ['_native']" in build.stdout, build.stdout + build.stderr
    warnings = build.stdout.split("WARNINGS", 1)[1]
    assert warnings.count("nano-patch:") == 1, warnings
    assert "cannot find -lnano_patch_no_such_jpeg" in warnings and "libjpeg62-turbo-dev" in warnings, warnings
    assert list((tree / "nano_patch" / "vision").glob("_native*"))
    assert not list((tree / "nano_patch" / "vision").glob("_jpeg*"))

    run = (
        "import nano_patch\n"
        "from nano_patch.vision.kernels import native\n"
        f"assert nano_patch.__file__.startswith({str(tree)!r}), nano_patch.__file__\n"
        "state = native.check_all()\n"
        "print(state['resample']); print(state['crop_decode'])\n"
    )
    out = subprocess.run([sys.executable, "-c", run], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    resample, crop = out.stdout.strip().splitlines()[-2:]
    assert resample.startswith("native ("), out.stdout
    assert crop.startswith("the full decode: nano-patch was installed without crop-region JPEG decoding"), crop

    # and NANO_PATCH_NO_JPEG=1 skips it on purpose, with one line saying so
    env = {**os.environ, "NANO_PATCH_NO_JPEG": "1"}
    skip = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=240)
    assert skip.returncode == 0, skip.stderr
    assert "BUILT ['_native']" in skip.stdout and "NANO_PATCH_NO_JPEG is set" in skip.stdout, skip.stdout


# --- through the dataset: a plan that starts with a crop decodes only its window ---------------------


def _crop_first_pipelines():
    from timm.data.transforms import RandomResizedCropAndInterpolation

    return {
        "RandomResizedCrop": lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor()]),
        "RandomCrop": lambda: T.Compose([T.RandomCrop(120), T.ColorJitter(0.3, 0.3, 0.3), T.PILToTensor()]),
        "CenterCrop": lambda: T.Compose([T.CenterCrop(150), T.Resize(64), T.ToTensor()]),
        "timm": lambda: T.Compose([RandomResizedCropAndInterpolation(80, interpolation="random"), T.ToTensor()]),
    }


def _dataset_run(folder, make):
    import random

    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(folder), transform=make())
    out = []
    for i in range(len(ds)):
        torch.manual_seed(i)
        random.seed(i)
        out.append(ds[i])
    return out, torch.get_rng_state(), random.getstate()


@needs_jpeg
@pytest.mark.parametrize("name", list(_crop_first_pipelines()))
def test_a_plan_that_starts_with_a_crop_decodes_only_the_window(image_folder, name, monkeypatch):
    import nano_patch

    make = _crop_first_pipelines()[name]
    stock, stock_torch, stock_random = _dataset_run(image_folder, make)
    windows = []
    real = native_kernels.decode_jpeg_region
    monkeypatch.setattr(native_kernels, "decode_jpeg_region", lambda *a, **k: windows.append(a[1:]) or real(*a, **k))
    nano_patch.patch_torch()
    got, got_torch, got_random = _dataset_run(image_folder, make)
    assert len(windows) == len(stock)
    for (a, ta), (b, tb) in zip(got, stock):
        assert ta == tb and torch.equal(a, b) and a.stride() == b.stride()
    assert torch.equal(got_torch, stock_torch) and got_random == stock_random


def _make_folder(root, photos, damage):
    (root / "c").mkdir(parents=True)
    for i, im in enumerate(photos):
        im.save(root / "c" / f"{i}.jpg", quality=90)
    bad = root / "c" / "1.jpg"
    data = bad.read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "cmyk":
        photos[1].convert("CMYK").save(bad, format="JPEG")
    elif damage == "png":
        photos[1].save(bad, format="PNG")
    return bad


@needs_jpeg
@pytest.mark.parametrize("damage", ["truncated", "truncated, LOAD_TRUNCATED_IMAGES", "cmyk", "png"])
def test_files_the_window_decode_refuses_are_stock(tmp_path, photos, damage, monkeypatch):
    """What the crop decode cannot take goes to the full decode: stock's pixels, or stock's error with the
    random state as stock leaves it (stock fails before its draws)."""
    from PIL import ImageFile
    from torchvision.datasets import ImageFolder

    import nano_patch

    _make_folder(tmp_path, photos, damage.split(",")[0])
    if "LOAD_TRUNCATED" in damage:
        monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    make = _crop_first_pipelines()["RandomResizedCrop"]

    def run():
        ds = ImageFolder(str(tmp_path), transform=make())
        out = []
        for i in range(len(ds)):
            torch.manual_seed(i)
            try:
                out.append(ds[i][0])
            except Exception as exc:  # noqa: BLE001 - compared with stock's
                out.append(type(exc))
            out.append(torch.get_rng_state())
        return out

    stock = run()
    nano_patch.patch_torch()
    got = run()
    assert len(got) == len(stock)
    for a, b in zip(got, stock):
        assert (a is b) if isinstance(b, type) else torch.equal(a, b)
    if damage == "truncated":
        assert any(isinstance(b, type) for b in stock)  # the case really fails in stock
