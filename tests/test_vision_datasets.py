"""Decoding and datasets: every format equals stock PIL, bad files fail like stock, datasets equal stock."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image, features

import nano_patch
from nano_patch.vision.images import decode

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _stock_rgb(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.fixture(scope="module")
def files(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("formats")
    im = photos[0]
    out = {}

    def save(name, image, **kw):
        p = root / name
        image.save(p, **kw)
        out[name] = p

    save("baseline.jpg", im, format="JPEG", quality=90)
    save("progressive.jpg", im, format="JPEG", quality=85, progressive=True)
    save("gray.jpg", im.convert("L"), format="JPEG")
    save("cmyk.jpg", im.convert("CMYK"), format="JPEG")
    save("subsampling444.jpg", im, format="JPEG", subsampling=0, quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: stock PIL ignores it, so must we
    save("exif.jpg", im, format="JPEG", exif=exif.tobytes())
    save("image.png", im, format="PNG")
    save("rgba.png", im.convert("RGBA"), format="PNG")
    save("palette.gif", im.convert("P"), format="GIF")
    save("image.bmp", im, format="BMP")
    if features.check("webp"):  # a pillow-simd built without libwebp can neither write nor read it
        save("image.webp", im, format="WEBP", quality=80)
    save("png_named.jpg", im, format="PNG")  # OxfordIIITPet ships files like this
    save("gif_named.jpg", im.convert("P"), format="GIF")
    return out


def test_every_format_equals_stock(files):
    for name, path in files.items():
        got = decode.decode_rgb(path)
        assert got.dtype == np.uint8 and got.ndim == 3 and got.shape[2] == 3, name
        np.testing.assert_array_equal(got, _stock_rgb(path), err_msg=name)


def test_real_jpegs_take_libjpeg_turbo(files, monkeypatch):
    calls = []
    monkeypatch.setattr(decode, "pil_open_rgb", lambda p: calls.append(p) or Image.open(p).convert("RGB"))
    for name in ("baseline.jpg", "progressive.jpg", "gray.jpg", "exif.jpg"):
        decode.decode_rgb(files[name])
    assert calls == []
    decode.decode_rgb(files["cmyk.jpg"])
    decode.decode_rgb(files["png_named.jpg"])
    assert calls == [files["cmyk.jpg"], files["png_named.jpg"]]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "bad_header"])
def test_corrupt_files_raise_stock_exception(tmp_path, files, damage):
    data = files["baseline.jpg"].read_bytes()
    bad = {"truncated": data[: len(data) // 2], "garbage": b"\xff\xd8\xff" + bytes(range(256)) * 40, "empty": b"",
           "bad_header": b"not an image at all"}[damage]
    path = tmp_path / f"{damage}.jpg"
    path.write_bytes(bad)
    with pytest.raises(Exception) as stock, open(path, "rb") as f:  # torchvision's pil_loader opens a file object
        Image.open(f).convert("RGB")
    with pytest.raises(type(stock.value)) as ours:
        decode.decode_rgb(path)
    assert str(ours.value) == str(stock.value)  # stock's message, and no note stock does not add
    assert getattr(ours.value, "__notes__", None) == getattr(stock.value, "__notes__", None)


def test_truncated_with_load_truncated_images_matches_stock(tmp_path, files, monkeypatch):
    from PIL import ImageFile

    data = files["baseline.jpg"].read_bytes()
    path = tmp_path / "trunc.jpg"
    path.write_bytes(data[: int(len(data) * 0.7)])
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    np.testing.assert_array_equal(decode.decode_rgb(path), _stock_rgb(path))


def _dataset_items(ds, n):
    out = []
    for i in range(n):
        torch.manual_seed(i)
        out.append(ds[i])
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
        lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor()]),
        lambda: T.Compose([T.Resize(64), T.Lambda(lambda im: im.transpose(Image.FLIP_TOP_BOTTOM)), T.PILToTensor()]),
        lambda: None,
        lambda: T.CenterCrop(100),
    ],
    ids=["pipeline_c", "pipeline_b", "with_lambda", "no_transform", "bare_transform"],
)
def test_image_folder_equals_stock(image_folder, make):
    from torchvision.datasets import ImageFolder

    stock = _dataset_items(ImageFolder(str(image_folder), transform=make()), 6)
    nano_patch.patch_torch()
    ds = ImageFolder(str(image_folder), transform=make())
    patched = _dataset_items(ds, 6)
    for (a, ta), (b, tb) in zip(patched, stock):
        assert ta == tb and type(a) is type(b)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b)
        else:
            assert a.size == b.size and a.mode == b.mode
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plain = ImageFolder(str(image_folder))
    assert pickle.loads(pickle.dumps(plain)).loader is plain.loader  # the loader pickles by reference


def test_scaled_decode_is_opt_in(tmp_path, photos, monkeypatch):
    """Off by default (it misses the bilinear bar on real photos); on request, a 1/2-scale DCT decode."""
    from torchvision.datasets import ImageFolder

    big = photos[0].resize((2400, 1600), Image.BICUBIC)
    (tmp_path / "c").mkdir()
    big.save(tmp_path / "c" / "big.jpg", quality=92)
    make = lambda: T.Compose([T.Resize(160), T.ToTensor()])  # noqa: E731
    stock = ImageFolder(str(tmp_path), transform=make())[0][0]
    import simplejpeg

    seen = []
    real = simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda data, **kw: seen.append(kw) or real(data, **kw))
    nano_patch.patch_torch()
    patched = ImageFolder(str(tmp_path), transform=make())[0][0]
    assert seen and "min_height" not in seen[0]
    assert torch.equal(patched, stock)  # the full-size decode and the resize are exact
    seen.clear()
    nano_patch.patch_torch(scaled_decode=True)
    scaled = ImageFolder(str(tmp_path), transform=make())[0][0]
    assert seen and seen[0]["min_height"] == 800, seen  # half of 1600: the DCT-domain 1/2 scale
    assert scaled.shape == stock.shape


def test_oxford_pet_with_lying_extensions(tmp_path, photos):
    from torchvision.datasets import OxfordIIITPet

    base = tmp_path / "oxford-iiit-pet"
    (base / "images").mkdir(parents=True)
    (base / "annotations" / "trimaps").mkdir(parents=True)
    lines = []
    for i, fmt in enumerate(["JPEG", "PNG", "GIF"]):
        name = f"Abyssinian_{i}" if i % 2 else f"beagle_{i}"
        im = photos[i % len(photos)]
        (im.convert("P") if fmt == "GIF" else im).save(base / "images" / f"{name}.jpg", format=fmt)
        lines.append(f"{name} {1 + i % 2} 1 1")
    (base / "annotations" / "trainval.txt").write_text("\n".join(lines) + "\n")
    make = lambda: T.Compose([T.Resize(80), T.CenterCrop(64), T.PILToTensor()])  # noqa: E731
    stock = [OxfordIIITPet(str(tmp_path), transform=make())[i] for i in range(3)]
    nano_patch.patch_torch()
    ds = OxfordIIITPet(str(tmp_path), transform=make())
    for i in range(3):
        img, target = ds[i]
        assert target == stock[i][1]
        assert img.dtype == stock[i][0].dtype and torch.equal(img, stock[i][0])


def test_caltech101_keeps_grayscale_and_equals_stock(tmp_path, photos, monkeypatch):
    """Caltech101 opens with a bare Image.open: grayscale photos stay "L"; CMYK and PNG-in-.jpg stay stock."""
    from torchvision.datasets import Caltech101

    decoded = []
    native = decode.decode_jpeg_native
    monkeypatch.setattr(decode, "decode_jpeg_native", lambda p: decoded.append(native(p)) or decoded[-1])

    cats = tmp_path / "caltech101" / "101_ObjectCategories"
    for cat in ("BACKGROUND_Google", "accordion", "Faces"):
        (cats / cat).mkdir(parents=True)
    images = {"accordion": [photos[0], photos[1].convert("L"), photos[2].convert("CMYK")],
              "Faces": [photos[1], photos[0].convert("L")]}
    for cat, ims in images.items():
        for i, im in enumerate(ims, 1):
            im.save(cats / cat / f"image_{i:04d}.jpg", format="JPEG", quality=90)
    photos[2].save(cats / "Faces" / "image_0003.jpg", format="PNG")  # a lying extension
    (tmp_path / "caltech101" / "Annotations").mkdir()
    modes = set()
    for make in (lambda: None, lambda: T.Compose([T.Resize(72), T.CenterCrop(64), T.PILToTensor()])):
        stock = Caltech101(str(tmp_path), transform=make())
        stock_items = [stock[i] for i in range(len(stock))]
        nano_patch.patch_torch()
        try:
            ds = Caltech101(str(tmp_path), transform=make())
            for i, (want, want_target) in enumerate(stock_items):
                got, target = ds[i]
                assert target == want_target
                if isinstance(want, Image.Image):
                    modes.add(want.mode)
                    assert got.mode == want.mode and got.size == want.size, i
                    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
                else:
                    assert got.dtype == want.dtype and torch.equal(got, want), i
        finally:
            nano_patch.unpatch_torch()
    assert modes == {"L", "RGB", "CMYK"}
    # libjpeg-turbo took the 2 colour and 2 grayscale JPEGs; the CMYK JPEG and the PNG went to PIL.
    kinds = sorted("pil" if a is None else f"{a.ndim}d" for a in decoded[:6])
    assert kinds == ["2d", "2d", "3d", "3d", "pil", "pil"], kinds
