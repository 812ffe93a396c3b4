"""Lazy JPEG images (``vision/images/lazy_jpeg.py``), object by object, in this process: stock against patched.

``Image.open(x).convert("RGB")`` under the patch must give what stock gives, whatever a user does with it first
(compare, copy, pickle, ``np.asarray``, ``torch.from_numpy``, ``ImageOps.exif_transpose``...), with stock's
errors and warnings at stock's call, stock's opened image, and the pixels of the bytes read at ``convert``.
The files are real photos (scikit-learn's and matplotlib's sample photos) re-encoded by PIL in many ways.
``pending_of`` shows the lazy path was taken for the plain kinds: with the lazy images switched off those
assertions fail, and only those.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from conftest import photo_sources
from PIL import Image, ImageChops, ImageEnhance, ImageFile, ImageFilter, ImageOps

import nano_patch
from nano_patch.vision.images import lazy_jpeg

HERE = os.path.abspath(__file__)
SIZE = (400, 300)  # thumbnail bound: about 400 x 267 for china.jpg


def _photo(i: int) -> Image.Image:
    im = Image.open(photo_sources()[i]).convert("RGB")
    im.thumbnail(SIZE)
    return im


def _encode(image: Image.Image, **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, **kw)
    return out.getvalue()


def _damage(data: bytes) -> bytes:
    """A run of bytes in the middle of the scan overwritten (no 0xFF: no marker appears, the stream stays whole)."""
    sos = data.find(b"\xff\xda")
    start = sos + (len(data) - sos) // 2
    while data[start - 1] == 0xFF:
        start += 1
    run = bytes((i * 37 + 11) % 255 for i in range(48))
    return data[:start] + run + data[start + len(run):]


def _build_kinds() -> tuple[dict[str, bytes], set[str]]:
    """(name -> file bytes, the names whose convert must be lazy)."""
    im = _photo(0)
    kinds = {
        "baseline": _encode(im, format="JPEG", quality=90),
        "progressive": _encode(im, format="JPEG", quality=85, progressive=True),
        "optimized": _encode(im, format="JPEG", quality=85, optimize=True),
        "s444": _encode(im, format="JPEG", quality=95, subsampling=0),
        "s422": _encode(im, format="JPEG", quality=90, subsampling=1),
        "s420": _encode(im, format="JPEG", quality=90, subsampling=2),
        "qtables": _encode(im, format="JPEG", qtables="web_low"),
        "gray": _encode(im.convert("L"), format="JPEG", quality=90),
        "gray_progressive": _encode(im.convert("L"), format="JPEG", quality=90, progressive=True),
    }
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees (stock convert ignores it, exif_transpose applies it)
    kinds["exif6"] = _encode(im, format="JPEG", quality=90, exif=exif.tobytes())
    exif1 = Image.Exif()
    exif1[0x0112] = 1
    exif1[0x010F] = "nano-patch tests"  # Make
    kinds["exif1"] = _encode(im, format="JPEG", quality=90, exif=exif1.tobytes())
    kinds["icc_comment"] = _encode(im, format="JPEG", quality=90, comment=b"a comment", dpi=(72, 72))
    for name, kw in (("restart_blocks", dict(restart_marker_blocks=5)), ("restart_rows", dict(restart_marker_rows=1)),
                     ("progressive_restart", dict(progressive=True, restart_marker_rows=2))):
        try:
            data = _encode(im, format="JPEG", quality=88, **kw)
        except TypeError:  # a PIL without restart markers
            continue
        assert b"\xff\xdd" in data[: data.find(b"\xff\xda")], name  # DRI: there are restart markers
        kinds[name] = data
    lazy = set(kinds)
    kinds["cmyk"] = _encode(im.convert("CMYK"), format="JPEG", quality=90)
    kinds["png"] = _encode(im, format="PNG")
    kinds["png_as_jpg"] = kinds["png"]  # written with a .jpg name below
    # Corrupt entropy-coded data in a whole stream (its markers intact): PIL decodes it, garbage and all; lazy or
    # not, the pixels are stock's (``_EITHER``).
    kinds["damaged"] = _damage(kinds["baseline"])
    assert kinds["progressive"][: 200] != kinds["baseline"][: 200]
    return kinds, lazy


_KINDS, _LAZY = _build_kinds()
_EITHER = {"damaged"}
KIND_NAMES = sorted(_KINDS)
SOURCES = ("path", "bytesio", "fileobj")


@pytest.fixture(scope="session")
def kind_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lazy_kinds")
    out = {}
    for name, data in _KINDS.items():
        p = root / (f"{name}.png" if name == "png" else f"{name}.jpg")
        p.write_bytes(data)
        out[name] = p
    return out


@pytest.fixture(scope="session")
def other_photo() -> bytes:
    """A second real photo, of another size: what a file is overwritten with."""
    im = _photo(1)
    im.thumbnail((300, 300))
    return _encode(im, format="JPEG", quality=90)


@pytest.fixture(autouse=True)
def _pil_flags():
    """PIL's globals and torch's warn-always flag as they were, whatever a test did."""
    saved = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES, torch.is_warn_always_enabled())
    yield
    Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = saved[:2]
    torch.set_warn_always(saved[2])
    nano_patch.unpatch_torch()


@pytest.fixture
def handles():
    """File objects a test opened itself, closed at its end."""
    opened: list = []
    yield opened
    for f in opened:
        f.close()


def _source(kind: str, how: str, files: dict[str, Path], handles: list):
    if how == "path":
        return str(files[kind])
    if how == "bytesio":
        return io.BytesIO(_KINDS[kind])
    f = open(files[kind], "rb")  # noqa: SIM115 - closed by the handles fixture
    handles.append(f)
    return f


def _convert(kind: str, how: str, files, handles) -> Image.Image:
    return Image.open(_source(kind, how, files, handles)).convert("RGB")


def _patch(**options) -> None:
    nano_patch.patch_torch(**options)
    assert nano_patch.is_patched()


def _assert_lazy(img: Image.Image, kind: str, *what) -> None:
    """The lazy path taken for the plain kinds, not for the others (either way for ``_EITHER``)."""
    if kind not in _EITHER:
        assert (lazy_jpeg.pending_of(img) is not None) == (kind in _LAZY), (kind, *what)


def _same_image(got: Image.Image, want: Image.Image, what: str = "") -> None:
    assert type(got) is type(want), what
    assert got.mode == want.mode and got.size == want.size, what
    assert got.info == want.info, what
    assert got.tobytes() == want.tobytes(), what


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - stock's error is the comparison
        return type(exc), str(exc)


def _array_warning(img: Image.Image):
    """``torch.from_numpy(np.asarray(img))`` and the warnings it gives (the user's line is in this file)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = torch.from_numpy(np.asarray(img))
    return t, [(w.category, str(w.message), w.filename) for w in caught]


# ---------------------------------------------------------------------------------------------------- the result


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_metadata_as_stock_without_decoding(kind, how, kind_files, handles):
    stock = _convert(kind, how, kind_files, handles)
    _patch()
    img = _convert(kind, how, kind_files, handles)
    _assert_lazy(img, kind)
    assert type(img) is Image.Image
    assert vars(img).keys() == vars(stock).keys()
    assert not hasattr(img, "filename") and not hasattr(stock, "filename")
    assert img.format is None and stock.format is None
    assert img.readonly == 0 == stock.readonly
    assert (img.mode, img.size, img.width, img.height) == (stock.mode, stock.size, stock.width, stock.height)
    assert img.info == stock.info and img.info is not stock.info
    assert img.getbands() == stock.getbands()
    assert dict(img.getexif()) == dict(stock.getexif())
    # none of that read a pixel
    _assert_lazy(img, kind)
    _same_image(img, stock)
    assert lazy_jpeg.pending_of(img) is None  # read now
    assert vars(img).keys() == vars(stock).keys()
    assert img.readonly == 0


def _first_reads():
    """Ways a user's first read of the pixels can go: (name, f(image, stock image) -> comparable result)."""

    def eq(img, stock):
        return img == stock

    def req(img, stock):
        return stock == img

    def ne(img, stock):
        return img != stock

    def copied(img, stock):
        c = img.copy()
        return c == img, c == stock, type(c), c.readonly

    def tobytes(img, stock):
        return img.tobytes(), img.tobytes("raw", "BGR")

    def asarray(img, stock):
        a = np.asarray(img)
        return a.flags.writeable, type(a.base), a.dtype, a.shape, a.tobytes()

    def array_copy(img, stock):
        a = np.array(img)
        return a.flags.writeable, a.tobytes()

    def from_numpy(img, stock):
        torch.set_warn_always(True)  # torch warns about non-writable arrays once per process otherwise
        t, caught = _array_warning(img)
        return t.shape, t.dtype, t.numpy().tobytes(), caught

    def pickled(img, stock):
        back = pickle.loads(pickle.dumps(img))
        return type(back), back.mode, back.size, back.info, back.tobytes(), back == stock

    def shallow(img, stock):
        c = copy.copy(img)
        return type(c), c.info, c.tobytes(), c == stock

    def deep(img, stock):
        c = copy.deepcopy(img)
        return type(c), c.info, c.tobytes(), c == stock

    def exif_transpose(img, stock):
        t = ImageOps.exif_transpose(img)
        return type(t), t.mode, t.size, t.info, t.tobytes(), dict(t.getexif())

    def exif_transpose_in_place(img, stock):
        ImageOps.exif_transpose(img, in_place=True)
        return img.size, img.info, img.tobytes(), dict(img.getexif())

    def load(img, stock):
        px = img.load()
        return px[0, 0], px[img.width - 1, img.height - 1], img.getpixel((5, 7)), img.tobytes()

    def crop_resize(img, stock):
        return img.crop((10, 20, 210, 170)).resize((64, 48), Image.BILINEAR).tobytes()

    def transpose(img, stock):
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes()

    def split_histogram(img, stock):
        return [b.tobytes() for b in img.split()], img.histogram(), img.getextrema()

    def save_png(img, stock):
        out = io.BytesIO()
        img.save(out, format="PNG")
        return out.getvalue()

    def paste_into(img, stock):
        canvas = Image.new("RGB", (img.width + 10, img.height + 10), (1, 2, 3))
        canvas.paste(img, (5, 5))
        img.paste((0, 0, 0), (0, 0, 10, 10))  # the lazy image itself written to (readonly 0: writable)
        return canvas.tobytes(), img.tobytes()

    def convert_again(img, stock):
        return img.convert("L").tobytes(), img.convert("RGB").tobytes(), img.convert("RGB") is not img

    def closed(img, stock):
        img.close()
        try:
            img.tobytes()
        except Exception as exc:  # noqa: BLE001 - stock's error is the comparison
            return type(exc), str(exc)
        return "no error"

    def with_block(img, stock):
        with img:
            pass
        return _outcome(img.tobytes)

    def two_images(img, stock):
        other = stock.transpose(Image.Transpose.ROTATE_180)
        return (Image.blend(img, other, 0.3).tobytes(), ImageChops.difference(other, img).tobytes(),
                Image.composite(img, other, img.convert("L")).tobytes(),
                Image.merge("RGB", img.split()[::-1]).tobytes())

    def filters(img, stock):
        return (img.filter(ImageFilter.GaussianBlur(2)).tobytes(), ImageOps.autocontrast(img).tobytes(),
                ImageEnhance.Contrast(img).enhance(1.3).tobytes(), img.getbbox(), img.reduce(2).tobytes())

    def in_place(img, stock):
        img.thumbnail((90, 90))
        img.putpixel((1, 1), (9, 8, 7))
        return img.size, img.tobytes()

    def from_bytes(img, stock):
        img.frombytes(stock.transpose(Image.Transpose.FLIP_TOP_BOTTOM).tobytes())
        return img.tobytes()

    def to_tensor(img, stock):
        return TF.pil_to_tensor(img).numpy().tobytes(), TF.to_tensor(img).numpy().tobytes()

    def fromarray(img, stock):
        return Image.fromarray(np.asarray(img)).tobytes()

    return [(f.__name__, f) for f in (eq, req, ne, copied, tobytes, asarray, array_copy, from_numpy, pickled,
                                      shallow, deep, exif_transpose, exif_transpose_in_place, load, crop_resize,
                                      transpose, split_histogram, save_png, paste_into, convert_again, closed,
                                      with_block, two_images, filters, in_place, from_bytes, to_tensor, fromarray)]


FIRST_READS = _first_reads()


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_every_first_read_equals_stock(kind, how, kind_files, handles):
    """Each way of reading the pixels, on a fresh lazy image each (it is the read that decodes)."""
    stocks = [_convert(kind, how, kind_files, handles) for _ in FIRST_READS]
    reference = _convert(kind, how, kind_files, handles)
    want = [f(s, reference) for (_, f), s in zip(FIRST_READS, stocks)]
    _patch()
    for (name, f), w in zip(FIRST_READS, want):
        img = _convert(kind, how, kind_files, handles)
        _assert_lazy(img, kind, name)
        got = f(img, reference)
        assert got == w, (kind, how, name)
        if name != "closed":
            assert lazy_jpeg.pending_of(img) is None, (kind, name)


def test_the_cases_mean_something(kind_files, handles):
    """Stock's own outcomes, so that the comparisons above compare something."""
    stock = _convert("exif6", "path", kind_files, handles)
    assert ImageOps.exif_transpose(stock).size == stock.size[::-1]  # orientation 6 rotates
    assert ImageOps.exif_transpose(_convert("exif1", "path", kind_files, handles)).size == stock.size
    torch.set_warn_always(True)
    _, caught = _array_warning(stock)
    assert [c[0] for c in caught] == [UserWarning] and "not writable" in caught[0][1]
    a = np.asarray(stock)
    assert not a.flags.writeable and type(a.base) is bytes
    assert _convert("damaged", "path", kind_files, handles) != _convert("baseline", "path", kind_files, handles)
    assert _convert("gray", "path", kind_files, handles).mode == "RGB"
    closed = dict(FIRST_READS)["closed"]
    assert closed(_convert("baseline", "path", kind_files, handles), stock) == (ValueError, "Operation on closed image")


@pytest.mark.parametrize("how", SOURCES)
def test_array_and_torch_warning_are_the_users(how, kind_files, handles):
    """``np.asarray`` is read-only over ``bytes``; ``torch.from_numpy`` warns at the user's line, as stock."""
    torch.set_warn_always(True)
    stock = _convert("baseline", how, kind_files, handles)
    t_stock, want = _array_warning(stock)
    _patch()
    img = _convert("baseline", how, kind_files, handles)
    assert lazy_jpeg.pending_of(img) is not None
    a = np.asarray(img)
    assert not a.flags.writeable and type(a.base) is bytes
    assert np.array_equal(a, np.asarray(stock))
    img = _convert("baseline", how, kind_files, handles)
    t, got = _array_warning(img)
    assert got == want
    assert len(got) == 1 and got[0][0] is UserWarning and got[0][2] == HERE
    assert torch.equal(t, t_stock)


def _composes():
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    return {
        "rrc_flip_jitter_norm": lambda: T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                                                   T.ColorJitter(0.2, 0.2, 0.2), T.ToTensor(), T.Normalize(mean, std)]),
        "rrc_pil_to_tensor": lambda: T.Compose([T.RandomResizedCrop(48, scale=(0.5, 1.0)), T.PILToTensor()]),
        "center_crop": lambda: T.Compose([T.CenterCrop(100), T.ToTensor()]),
        "center_crop_past_edges": lambda: T.Compose([T.CenterCrop((320, 500)), T.ToTensor()]),
        "random_crop_padded": lambda: T.Compose([T.RandomCrop(120, padding=8, padding_mode="reflect"),
                                                 T.RandomHorizontalFlip(), T.ToTensor()]),
        "random_crop_pad_if_needed": lambda: T.Compose([T.RandomCrop((300, 450), pad_if_needed=True), T.ToTensor()]),
        "crop_then_pil": lambda: T.Compose([T.RandomResizedCrop(32)]),
        "resize_first": lambda: T.Compose([T.Resize(80), T.CenterCrop(64), T.ToTensor()]),
    }


COMPOSES = _composes()


@pytest.mark.parametrize("name", sorted(COMPOSES))
def test_a_compose_on_a_lazy_image_in_process_equals_stock(name, kind_files):
    """One sample, no DataLoader: the patched Compose on a lazy image (crop-region decode where it starts with a
    crop) gives stock's output and leaves torch's generator where stock's does."""
    kinds = ["baseline", "progressive", "s444", "gray", "exif6", "restart_rows", "cmyk", "damaged"]
    kinds = [k for k in kinds if k in _KINDS]

    def run():
        out = []
        torch.manual_seed(3)
        tf = COMPOSES[name]()
        for kind in kinds:
            for _ in range(2):
                img = Image.open(kind_files[kind]).convert("RGB")
                before = lazy_jpeg.pending_of(img) is not None
                y = tf(img)
                out.append((kind, before, y if isinstance(y, torch.Tensor) else (y.mode, y.size, y.tobytes()),
                            img.size))
        return out, torch.get_rng_state()

    want, want_rng = run()
    _patch()
    got, got_rng = run()
    assert torch.equal(got_rng, want_rng)
    for (kind, lazy, g, size), (_, _, w, wsize) in zip(got, want):
        if kind not in _EITHER:
            assert lazy == (kind in _LAZY), kind
        assert size == wsize
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (name, kind)
        else:
            assert g == w, (name, kind)


# ---------------------------------------------------------------------------------------------- the opened image


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", ["baseline", "progressive", "gray", "exif6", "restart_rows", "cmyk", "png"])
def test_the_opened_image_is_left_as_stocks_load_leaves_it(kind, how, kind_files, handles):
    if kind not in _KINDS:
        pytest.skip(f"{kind}: not supported by this PIL")

    def run():
        opened = Image.open(_source(kind, how, kind_files, handles))
        fp = opened.fp
        img = opened.convert("RGB")
        state = {
            "fp": opened.fp, "closed": fp.closed, "pos": None if fp.closed else fp.tell(), "tile": opened.tile,
            "keys": sorted(vars(opened).keys()), "readonly": opened.readonly, "mode": opened.mode,
            "size": opened.size, "info": opened.info, "format": opened.format,
        }
        return opened, img, state

    s_opened, s_img, want = run()
    _patch()
    opened, img, got = run()
    _assert_lazy(img, kind)
    assert got == want
    assert got["fp"] is None
    if how == "path":
        assert got["closed"]
    assert opened.load() is not None
    assert opened.tobytes() == s_opened.tobytes()
    assert opened.getpixel((3, 4)) == s_opened.getpixel((3, 4))
    assert opened.convert("RGB") == s_img  # converted again, now from a loaded image: stock's convert
    _same_image(img, s_img)


# --------------------------------------------------------------------------------------------- errors and guards


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("base", ["baseline", "progressive", "gray"])
def test_truncated_raises_stocks_error_at_convert(base, how, tmp_path, handles):
    data = _KINDS[base]
    sos = data.find(b"\xff\xda")
    cut = data[: sos + (len(data) - sos) // 2]
    path = tmp_path / "truncated.jpg"
    path.write_bytes(cut)

    def source():
        if how == "path":
            return str(path)
        if how == "bytesio":
            return io.BytesIO(cut)
        f = open(path, "rb")  # noqa: SIM115
        handles.append(f)
        return f

    def outcome():
        opened = Image.open(source())  # opening does not fail: the header is whole
        try:
            img = opened.convert("RGB")
        except OSError as exc:
            return ("raised", type(exc), str(exc), exc.args)
        return ("returned", img.tobytes())

    want = outcome()
    assert want[0] == "raised" and want[1] is OSError and "truncated" in want[2]
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        want_ok = outcome()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    assert want_ok[0] == "returned"

    _patch()
    assert outcome() == want
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        img = Image.open(source()).convert("RGB")
        assert lazy_jpeg.pending_of(img) is None  # not a whole stream: stock's convert
        got_ok = ("returned", img.tobytes())
        # the same again, with the flag switched off before the pixels are read
        img = Image.open(source()).convert("RGB")
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    assert got_ok == want_ok
    assert img.tobytes() == want_ok[1]


@pytest.mark.parametrize("how", SOURCES)
def test_load_truncated_images_read_at_convert_not_later(how, kind_files, handles):
    """A whole stream converted with the flag on, read with it off (and the reverse): stock's pixels."""
    stock = _convert("baseline", how, kind_files, handles)
    _patch()
    for flag in (True, False):
        ImageFile.LOAD_TRUNCATED_IMAGES = flag
        try:
            img = _convert("baseline", how, kind_files, handles)
            assert lazy_jpeg.pending_of(img) is not None
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = not flag
        assert img == stock
    ImageFile.LOAD_TRUNCATED_IMAGES = False


def _steps(source_fn):
    """Image.open, convert, read: what each step warned or raised."""
    record = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        img = None
        for step in ("open", "convert", "read"):
            n = len(caught)
            try:
                if step == "open":
                    opened = Image.open(source_fn())
                elif step == "convert":
                    img = opened.convert("RGB")
                else:
                    pixels = img.tobytes()
            except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
                # (a message naming a BytesIO names its address: another object in each run)
                record.append((step, "raised", type(exc), re.sub(r"0x[0-9a-fA-F]+", "0x?", str(exc))))
                break
            record.append((step, [(w.category, str(w.message), w.filename) for w in caught[n:]]))
        else:
            record.append(("pixels", pixels))
    return record


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", ["baseline", "progressive", "gray", "cmyk"])
@pytest.mark.parametrize("share", [0.8, 0.4])
def test_decompression_bomb_as_stock_at_open(share, kind, how, kind_files, handles):
    """MAX_IMAGE_PIXELS lowered below the photo: stock's warning (0.8: over the limit) or error (0.4: over twice
    the limit), at Image.open, and nothing at convert or at the read."""
    w, h = Image.open(kind_files[kind]).size
    Image.MAX_IMAGE_PIXELS = int(w * h * share)
    want = _steps(lambda: _source(kind, how, kind_files, handles))
    if share > 0.5:
        assert want[0][1][0][0] is Image.DecompressionBombWarning and want[1] == ("convert", [])
    else:
        assert want[0][:3] == ("open", "raised", Image.DecompressionBombError)
    _patch()
    got = _steps(lambda: _source(kind, how, kind_files, handles))
    assert got == want


def _odd_streams() -> dict[str, bytes]:
    """JPEG streams a camera, a scraper or a disk error can produce: stock's outcome (pixels, warnings or an error
    at its call) is the outcome, whichever path the patch takes."""
    base, prog = _KINDS["baseline"], _KINDS["progressive"]
    sos = base.find(b"\xff\xda")
    mid = sos + (len(base) - sos) // 2
    while base[mid - 1] == 0xFF:
        mid += 1
    sof = base.find(b"\xff\xc0")
    h = int.from_bytes(base[sof + 5: sof + 7], "big")

    def with_sof(data: bytes, at: int, value: bytes) -> bytes:
        return data[:at] + value + data[at + len(value):]

    out = {
        "reserved_marker_in_scan": base[:mid] + b"\xff\xc8" + base[mid:],
        "rst_marker_without_dri": base[:mid] + b"\xff\xd3" + base[mid:],
        "eoi_missing": base[:-2],
        "eoi_only_cut": base[:-1],
        "trailing_garbage": base + b"\x00garbage after the image" * 20,
        "two_images": base + _KINDS["gray"],
        "progressive_last_scan_missing": prog[: prog.rfind(b"\xff\xda")] + b"\xff\xd9",
        "progressive_cut_between_scans": prog[: prog.rfind(b"\xff\xda")],
        "sof_height_smaller": with_sof(base, sof + 5, (h - 40).to_bytes(2, "big")),
        "sof_height_larger": with_sof(base, sof + 5, (h + 40).to_bytes(2, "big")),
        "sof_precision_12": with_sof(base, sof + 4, b"\x0c"),
        "sof_arithmetic": with_sof(base, sof, b"\xff\xc9"),
        "sof_lossless": with_sof(base, sof, b"\xff\xc3"),
        "zeros_in_scan": base[:mid] + b"\x00" * 2000 + base[mid + 2000:],
        "ff_fill_bytes": base[:sos] + b"\xff\xff\xff" + base[sos:],
        "com_after_scan": base[:-2] + b"\xff\xfe\x00\x07hello\xff\xd9",
    }
    return out


_ODD = _odd_streams()


@pytest.mark.parametrize("how", ["path", "bytesio"])
@pytest.mark.parametrize("odd", sorted(_ODD))
def test_odd_streams_as_stock(odd, how, tmp_path):
    data = _ODD[odd]
    path = tmp_path / f"{odd}.jpg"
    path.write_bytes(data)

    def source():
        return str(path) if how == "path" else io.BytesIO(data)

    def outcome():
        return _steps(source)

    want = outcome()
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        want_truncated_ok = outcome()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    _patch()
    got = outcome()
    assert got == want, odd
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        got_truncated_ok = outcome()
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    assert got_truncated_ok == want_truncated_ok, odd


@pytest.mark.parametrize("how", SOURCES)
def test_limit_lowered_after_convert_is_not_applied_at_the_read(how, kind_files, handles):
    stock = _convert("baseline", how, kind_files, handles)
    _patch()
    img = _convert("baseline", how, kind_files, handles)
    assert lazy_jpeg.pending_of(img) is not None
    Image.MAX_IMAGE_PIXELS = 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert img.tobytes() == stock.tobytes()


# ------------------------------------------------------------------------------------------ the bytes of convert


def test_pixels_are_those_of_the_file_at_convert(tmp_path, other_photo):
    first = _KINDS["baseline"]
    path = tmp_path / "photo.jpg"
    path.write_bytes(first)
    stock = Image.open(path).convert("RGB")
    _patch()
    path.write_bytes(first)
    img = Image.open(path).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    path.write_bytes(other_photo)  # another photo, another size, under the same name
    assert Image.open(path).size != stock.size
    _same_image(img, stock)
    path.write_bytes(first)
    img = Image.open(str(path)).convert("RGB")
    path.unlink()  # gone before the read
    assert lazy_jpeg.pending_of(img) is not None
    _same_image(img, stock)
    assert np.array_equal(np.asarray(img), np.asarray(stock))


def test_pixels_are_those_of_the_buffer_at_convert(other_photo):
    first = _KINDS["progressive"]
    stock = Image.open(io.BytesIO(first)).convert("RGB")
    _patch()
    # the buffer's content replaced by another photo
    buf = io.BytesIO(first)
    img = Image.open(buf).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    buf.seek(0)
    buf.truncate()
    buf.write(other_photo)
    _same_image(img, stock)
    # the buffer's memory written over in place
    buf = io.BytesIO(first)
    img = Image.open(buf).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    view = buf.getbuffer()
    view[100: len(first) - 100] = b"\x00" * (len(first) - 200)
    del view
    _same_image(img, stock)
    # a bytearray the buffer was made from, changed (BytesIO copies it, as stock reads it)
    raw = bytearray(first)
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    raw[:] = other_photo
    _same_image(img, stock)
    # the buffer closed before the read
    buf = io.BytesIO(first)
    img = Image.open(buf).convert("RGB")
    buf.close()
    _same_image(img, stock)


@pytest.mark.parametrize("how", ["path", "fileobj"])
def test_with_block_closes_the_opened_image_before_the_read(how, kind_files, handles):
    with Image.open(_source("exif6", how, kind_files, handles)) as opened:
        stock = opened.convert("RGB")
    _patch()
    with Image.open(_source("exif6", how, kind_files, handles)) as opened:
        img = opened.convert("RGB")
        assert lazy_jpeg.pending_of(img) is not None
    assert lazy_jpeg.pending_of(img) is not None
    _same_image(img, stock)


# ---------------------------------------------------------------------------------------- what stays stock's


def test_a_draft_keeps_stocks_convert(kind_files):
    def drafted():
        opened = Image.open(kind_files["baseline"])
        opened.draft("RGB", (opened.width // 2, opened.height // 2))
        return opened.convert("RGB")

    stock = drafted()
    assert stock.size != Image.open(kind_files["baseline"]).size
    _patch()
    img = drafted()
    assert lazy_jpeg.pending_of(img) is None
    _same_image(img, stock)


@pytest.mark.parametrize("call", ["L", "RGBA", "dither", "kw_mode", "loaded", "no_mode"])
def test_other_converts_are_stocks(call, kind_files):
    def run():
        opened = Image.open(kind_files["baseline"])
        if call == "dither":
            return opened.convert("RGB", dither=Image.Dither.NONE)
        if call == "kw_mode":
            return opened.convert(mode="RGB")
        if call == "loaded":
            px = opened.load()  # its pixel access kept: stock's load, decoded now
            assert px is not None
            return opened.convert("RGB")
        if call == "no_mode":
            return opened.convert()
        return opened.convert(call)

    stock = run()
    _patch()
    img = run()
    if call == "kw_mode":
        assert lazy_jpeg.pending_of(img) is not None  # the same call, by keyword
    elif call in ("loaded", "L", "RGBA"):
        assert lazy_jpeg.pending_of(img) is None
    _same_image(img, stock)


@pytest.mark.parametrize("how", SOURCES)
def test_lazy_images_off_gives_stock_convert(how, kind_files, handles, monkeypatch):
    for kind in ("baseline", "progressive", "gray"):
        stock = _convert(kind, how, kind_files, handles)
        for switch in ("argument", "environment"):
            if switch == "argument":
                _patch(lazy_images=False)
            else:
                monkeypatch.setenv("NANO_PATCH_LAZY_IMAGES", "0")
                _patch()
            try:
                img = _convert(kind, how, kind_files, handles)
                assert lazy_jpeg.pending_of(img) is None
                assert type(img._im) is type(stock._im)
                _same_image(img, stock)
            finally:
                nano_patch.unpatch_torch()
                monkeypatch.delenv("NANO_PATCH_LAZY_IMAGES", raising=False)


def test_unpatched_convert_is_stock_again(kind_files):
    _patch()
    assert lazy_jpeg.pending_of(Image.open(kind_files["baseline"]).convert("RGB")) is not None
    nano_patch.unpatch_torch()
    img = Image.open(kind_files["baseline"]).convert("RGB")
    assert lazy_jpeg.pending_of(img) is None and type(img._im).__name__ == "ImagingCore"


def test_a_lazy_image_made_before_unpatch_reads_after_it(kind_files):
    """The patch undone while a user still holds an image made under it: the image is still an image."""
    stock = Image.open(kind_files["baseline"]).convert("RGB")
    _patch()
    img = Image.open(kind_files["baseline"]).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    nano_patch.unpatch_torch()
    assert img.tobytes() == stock.tobytes()
    assert img == stock


# ---------------------------------------------------------------------------------------------------- threads


def test_threads_reading_one_lazy_image_all_see_stocks_pixels(kind_files):
    stock = Image.open(kind_files["progressive"]).convert("RGB").tobytes()
    _patch()
    for _ in range(5):
        img = Image.open(kind_files["progressive"]).convert("RGB")
        assert lazy_jpeg.pending_of(img) is not None
        got = [None] * 4
        barrier = threading.Barrier(4)

        def read(i, img=img, got=got, barrier=barrier):
            barrier.wait()
            got[i] = img.tobytes()

        threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(g == stock for g in got)


# --- an opened JPEG handed to a Compose as it is (no convert) ------------------------------------------------------


def _opened_batches(files: list[Path]) -> tuple[list, list, list, torch.Tensor]:
    """A user's dataset that hands ``Image.open(path)`` to a Compose as it is, one epoch at num_workers=0: its batches,
    what it saw of each opened image afterwards, and torch's generator after the epoch."""
    import torchvision.transforms as T
    from torch.utils.data import DataLoader, Dataset

    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.2, 0.2, 0.2), T.ToTensor(),
                    T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])])
    seen: list = []
    pending: list = []

    class Opened(Dataset):
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int):
            img = Image.open(files[i])
            x = tf(img)
            pending.append(type(vars(img).get("_im")).__name__)
            seen.append((img.fp is None, img.tile, img.size, img.tobytes()))
            return x, i

    torch.manual_seed(0)
    batches = [b for b in DataLoader(Opened(), batch_size=4, shuffle=True)]
    return batches, seen, pending, torch.get_rng_state()


def test_an_opened_jpeg_handed_to_a_compose_loads_lazily_as_stock_loads_it(kind_files):
    files = [kind_files[k] for k in ("baseline", "progressive", "optimized", "exif6", "png")
             if k in kind_files] * 2
    stock, stock_seen, _, stock_rng = _opened_batches(files)
    _patch()
    mine, mine_seen, pending, mine_rng = _opened_batches(files)
    assert len(mine) == len(stock)
    for (x, y), (u, v) in zip(mine, stock):
        assert torch.equal(x, u) and torch.equal(y, v)
    assert mine_seen == stock_seen
    assert torch.equal(mine_rng, stock_rng)
    # the RGB JPEGs were loaded lazily (their cores pending when the transform returned), the others by PIL
    assert pending.count("PendingDecode") >= 4, pending


def test_a_jpeg_with_a_thumbnail_inside_an_app_segment_is_lazy_and_stocks():
    """Photoshop's APP13 (and EXIF's APP1) can carry a JPEG thumbnail with markers of its own: the first scan is found
    by walking the segments, not by searching the bytes."""
    thumb = _encode(_photo(0).resize((64, 48)), format="JPEG", quality=80)
    main = _KINDS["baseline"]
    segment = b"Photoshop 3.0\x00" + thumb
    data = main[:2] + b"\xff\xed" + (len(segment) + 2).to_bytes(2, "big") + segment + main[2:]
    stock = Image.open(io.BytesIO(data)).convert("RGB")
    _patch()
    img = Image.open(io.BytesIO(data)).convert("RGB")
    assert lazy_jpeg.pending_of(img) is not None
    assert img == stock and img.tobytes() == stock.tobytes()


# ------------------------------------------------------------------------------------- load() as a statement


def _load_as_a_statement(img: Image.Image) -> None:
    img.load()


def _opened_state(opened: Image.Image, fp: object) -> dict:
    return {"fp": opened.fp, "closed": getattr(fp, "closed", None),
            "pos": None if getattr(fp, "closed", True) else fp.tell(), "tile": opened.tile,
            "keys": sorted(vars(opened).keys()), "readonly": opened.readonly, "mode": opened.mode,
            "size": opened.size, "info": opened.info, "format": opened.format}


@pytest.mark.parametrize("how", SOURCES)
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_load_as_a_statement_stays_lazy_and_leaves_stocks_image(kind, how, kind_files, handles):
    """``img.load()`` written as a statement (its pixel access dropped unused) reads the file as stock's ``load``
    does and leaves the pixels pending for the plain kinds; the opened image, a ``convert("RGB")`` of it and every
    read of either are stock's, and so are the errors of the other kinds."""

    def run():
        src = _source(kind, how, kind_files, handles)
        opened = Image.open(src)
        fp = opened.fp
        error = _outcome(lambda: _load_as_a_statement(opened))
        state = _opened_state(opened, fp)
        pending = type(vars(opened).get("_im")).__name__ == "PendingDecode"
        converted = _outcome(lambda: opened.convert("RGB"))
        return opened, state, pending, error, converted

    s_opened, want, _, s_error, s_img = run()
    _patch()
    opened, got, pending, error, img = run()
    assert error == s_error and got == want
    if kind not in _EITHER:
        assert pending == (kind in _LAZY), kind
    if isinstance(s_img, Image.Image):
        if kind in _LAZY:
            assert lazy_jpeg.pending_of(img) is not None, kind  # the convert of it stays lazy too
        _same_image(img, s_img, kind)
        assert opened.tobytes() == s_opened.tobytes() and opened.mode == s_opened.mode
    else:
        assert img == s_img


def _load_kept(img: Image.Image):
    px = img.load()
    return px


def _load_returned(img: Image.Image):
    return img.load()


@pytest.mark.parametrize("use", ["kept", "returned", "in_a_list", "a_lambda", "compared", "attribute"])
def test_a_load_whose_pixel_access_is_used_is_stocks(use, kind_files):
    """Wherever the caller can see ``load()``'s result, it is stock's pixel-access object, over decoded pixels."""
    calls = {
        "kept": _load_kept,
        "returned": _load_returned,
        "in_a_list": lambda img: [img.load()][0],
        "a_lambda": lambda img: img.load(),
        "compared": lambda img: img.load() is not None and img.load(),
        "attribute": lambda img: img.load().__class__ and img.load(),
    }

    def run():
        opened = Image.open(kind_files["baseline"])
        px = calls[use](opened)
        return opened, px

    s_opened, s_px = run()
    _patch()
    opened, px = run()
    assert type(px) is type(s_px) and px is not None
    assert type(vars(opened)["_im"]).__name__ != "PendingDecode"
    assert px[3, 4] == s_px[3, 4] and px[opened.width - 1, opened.height - 1] == s_px[s_opened.width - 1,
                                                                                      s_opened.height - 1]


def test_pil_s_own_loads_are_stocks(kind_files):
    """PIL's methods call ``self.load()`` as a statement; those stay PIL's own (decoded at once)."""
    _patch()
    opened = Image.open(kind_files["baseline"])
    opened.copy()
    assert type(vars(opened)["_im"]).__name__ != "PendingDecode"


def test_a_lazily_loaded_image_inside_a_with_block_reads_as_stock_after_the_file_closes(kind_files, other_photo,
                                                                                       tmp_path):
    """The bytes are read inside the block, as stock's ``load`` reads them: the file changed or closed later does
    not change the pixels, and a second ``load()`` decodes them as stock's would."""
    path = tmp_path / "photo.jpg"
    path.write_bytes(kind_files["baseline"].read_bytes())

    def run():
        with open(path, "rb") as f:
            img = Image.open(f)
            img.load()
        return img

    stock = run()
    _patch()
    img = run()
    assert type(vars(img)["_im"]).__name__ == "PendingDecode"
    path.write_bytes(other_photo)
    px = img.load()
    assert px[5, 5] == stock.load()[5, 5]
    assert img.tobytes() == stock.tobytes()


def test_lazy_load_is_off_with_the_lazy_images_and_after_unpatch(kind_files):
    for options in ({"lazy_images": False}, None):
        if options is None:
            _patch()
            nano_patch.unpatch_torch()
        else:
            _patch(**options)
        opened = Image.open(kind_files["baseline"])
        opened.load()
        assert type(vars(opened)["_im"]).__name__ != "PendingDecode", options
        nano_patch.unpatch_torch()
