"""Lazy images a dataset keeps (loaded once into a list, or cached on first use) decode once, as stock's decode once
at ``convert``: the later epochs render from the pixels, the batches and generators stay stock's, and an image
holds its pixels or its bytes, never both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state
from PIL import Image

import nano_patch
from nano_patch.vision.images import lazy_jpeg


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory, photos) -> list[Path]:
    root = tmp_path_factory.mktemp("kept")
    paths = []
    for k in range(24):
        im = photos[k % len(photos)]
        w, h = im.size
        path = root / f"{k}.jpg"
        im.crop((k, k, w - 2 * k, h - k)).save(path, quality=85 + k % 10)
        paths.append(path)
    return paths


class Preloaded(torch.utils.data.Dataset):
    """Every image loaded once, at construction."""

    def __init__(self, paths: list[Path]) -> None:
        self.images = [Image.open(p).convert("RGB") for p in paths]
        self.tf = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Any:
        return self.tf(self.images[i]), i


class Cached(Preloaded):
    """Each image loaded at its first use, then kept."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths, self.cache = paths, {}
        self.tf = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        if i not in self.cache:
            self.cache[i] = Image.open(self.paths[i]).convert("RGB")
        return self.tf(self.cache[i]), i


def _epochs(dataset_cls: type, paths: list[Path], num_workers: int, epochs: int = 3) -> list[Any]:
    torch.manual_seed(4)
    ds = dataset_cls(paths)
    loader = torch.utils.data.DataLoader(ds, batch_size=6, shuffle=True, num_workers=num_workers)
    out: list[Any] = []
    for _ in range(epochs):
        out.extend((x.clone(), y.clone()) for x, y in loader)
        out.append(rng_state())
    return out


def _assert_same(stock: list[Any], patched: list[Any]) -> None:
    assert len(stock) == len(patched)
    for want, got in zip(stock, patched):
        if len(want) == 3:
            assert rng_differences(got, want) == []
        else:
            assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.fixture
def decodes(monkeypatch) -> list[int]:
    """How many times a lazy image's pixels were decoded whole (kept, or by PIL's decoder)."""
    counted: list[int] = []
    real_pixels, real_decode = lazy_jpeg._pixels_of, lazy_jpeg._decode
    monkeypatch.setattr(lazy_jpeg, "_pixels_of", lambda p: (counted.append(id(p)), real_pixels(p))[1])
    monkeypatch.setattr(lazy_jpeg, "_decode", lambda p: (counted.append(id(p)), real_decode(p))[1])
    return counted


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dataset_cls", [Preloaded, Cached])
def test_kept_images_give_stocks_batches_every_epoch(photo_files, dataset_cls, num_workers):
    stock = _epochs(dataset_cls, photo_files, num_workers)
    nano_patch.patch_torch()
    patched = _epochs(dataset_cls, photo_files, num_workers)
    _assert_same(stock, patched)


@pytest.mark.parametrize("dataset_cls", [Preloaded, Cached])
def test_a_kept_image_decodes_once_over_the_epochs(photo_files, dataset_cls, decodes):
    nano_patch.patch_torch()
    _epochs(dataset_cls, photo_files, 0, epochs=4)
    assert len(decodes) == len(set(decodes))  # (no image decoded twice)
    assert len(set(decodes)) <= len(photo_files)


def test_an_image_used_once_is_not_decoded_whole(photo_files, decodes):
    """The common case stays a crop's window: an image made and dropped in ``__getitem__`` is never kept."""

    class Transient(Preloaded):
        def __init__(self, paths: list[Path]) -> None:
            self.paths = paths
            self.tf = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])

        def __len__(self) -> int:
            return len(self.paths)

        def __getitem__(self, i: int) -> Any:
            return self.tf(Image.open(self.paths[i]).convert("RGB")), i

    nano_patch.patch_torch()
    _epochs(Transient, photo_files, 0, epochs=2)
    assert decodes == []


def test_a_kept_image_holds_its_pixels_or_its_bytes_not_both(photo_files):
    nano_patch.patch_torch()
    ds = Preloaded(photo_files[:6])
    assert all(type(vars(img)["_im"]) is lazy_jpeg.PendingDecode for img in ds.images)
    list(torch.utils.data.DataLoader(ds, batch_size=3))
    for img in ds.images:
        pending = vars(img)["_im"]
        assert pending.pixels is not None and pending.data is None
        assert not pending.pixels.flags.writeable
    # PIL reading it takes a copy of the pixels as its core; the image is then an ordinary decoded one
    want = [Image.open(p).convert("RGB").tobytes() for p in photo_files[:6]]
    assert [img.tobytes() for img in ds.images] == want
