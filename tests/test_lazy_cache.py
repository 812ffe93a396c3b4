"""A user's own dataset's lazy JPEG images through the decoded-image cache (``data/datasets/lazy_samples.py``).

With the cache on, the images a ``__getitem__`` opens (by path, or from bytes in memory) are stored as they are
loaded and served from the store in later epochs, keyed by their bytes: the batches of every epoch are stock's, a
file rewritten on disk is served its new pixels, a full store serves what it holds, and ``--fast`` says it is on.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


class PathPhotos(Dataset):
    def __init__(self, files: list[Path], transform: Any) -> None:
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        return self.transform(Image.open(self.files[i]).convert("RGB")), i % 3


class BytesPhotos(PathPhotos):
    def __init__(self, files: list[Path], transform: Any) -> None:
        super().__init__(files, transform)
        self.raw = [p.read_bytes() for p in files]

    def __getitem__(self, i: int) -> Any:
        return self.transform(Image.open(io.BytesIO(self.raw[i])).convert("RGB")), i % 3


def _transform() -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3), T.ToTensor(),
                      T.Normalize([0.5] * 3, [0.25] * 3)])


@pytest.fixture()
def files(tmp_path, photos) -> list[Path]:
    out = []
    for n in range(12):
        im = photos[n % len(photos)]
        w, h = im.size
        path = tmp_path / f"p{n}.jpg"
        im.crop((n * 7, n * 3, w - n * 5, h - n * 4)).save(path, quality=85 + n % 10)
        out.append(path)
    return out


def _epochs(ds: Any, epochs: int = 2, between: Any = None, **kw: Any) -> list[list[Any]]:
    torch.manual_seed(7)
    loader = DataLoader(ds, batch_size=4, shuffle=True, **kw)
    out = []
    for e in range(epochs):
        out.append([(x.clone(), y.clone()) for x, y in loader] + [torch.get_rng_state()])
        if between is not None:
            between(e)
    return out


def _assert_same(stock: list[list[Any]], patched: list[list[Any]]) -> None:
    assert len(stock) == len(patched)
    for se, pe in zip(stock, patched):
        assert len(se) == len(pe)
        for (sx, sy), (px, py) in zip(se[:-1], pe[:-1]):
            assert torch.equal(sx, px) and torch.equal(sy, py)
        assert torch.equal(se[-1], pe[-1])


@pytest.fixture()
def counted(monkeypatch) -> dict[str, int]:
    """The cache's hits and misses counted where the lazy path counts them."""
    from nano_patch.vision.images import cache

    counts = {"hits": 0, "misses": 0, "stored": 0}
    hit, miss = cache.count_hit, cache.count_miss

    def count_hit(a: Any) -> None:
        counts["hits"] += 1
        hit(a)

    def count_miss(a: Any, seconds: float, stored: bool) -> None:
        counts["misses"] += 1
        counts["stored"] += bool(stored)
        miss(a, seconds, stored)

    monkeypatch.setattr(cache, "count_hit", count_hit)
    monkeypatch.setattr(cache, "count_miss", count_miss)
    return counts


@pytest.mark.parametrize("kind", [PathPhotos, BytesPhotos])
def test_later_epochs_are_served_from_the_store_with_stocks_batches(files, tmp_path, counted, kind):
    import nano_patch

    stock = _epochs(kind(files, _transform()), epochs=3)
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "store"))
    patched = _epochs(kind(files, _transform()), epochs=3)
    _assert_same(stock, patched)
    assert counted["stored"] == len(files)  # epoch 1: every image decoded in full and stored
    assert counted["hits"] == 2 * len(files)  # epochs 2 and 3: every one a hit
    from nano_patch.vision.images import cache

    assert cache.describe(tmp_path / "store")["entries"] == len(files)


def test_a_file_rewritten_on_disk_is_served_its_new_pixels(files, tmp_path, counted):
    """The key is the bytes read: a file replaced between epochs (same name, same size class, even its old times put
    back) is a miss, never the old entry."""
    import os

    import nano_patch

    originals = [p.read_bytes() for p in files]

    def rewrite(epoch: int) -> None:
        if epoch == 0:
            for k, p in enumerate(files[:6]):
                st = p.stat()
                with Image.open(files[k + 6]) as other:
                    other.convert("RGB").save(p, quality=60)  # (new bytes: a photo no file held)
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    stock = _epochs(PathPhotos(files, _transform()), between=rewrite)
    for p, raw in zip(files, originals):
        p.write_bytes(raw)
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "store"))
    patched = _epochs(PathPhotos(files, _transform()), between=rewrite)
    _assert_same(stock, patched)
    assert counted["hits"] == len(files) - 6  # the six rewritten are served their new bytes' pixels


def test_a_full_store_serves_what_it_holds(files, tmp_path, counted, monkeypatch):
    import nano_patch
    from nano_patch.vision.images.cache import store as store_module

    stock = _epochs(PathPhotos(files, _transform()))
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "store"))
    put = store_module.Store.put
    taken = []

    def put_until_full(self: Any, material: bytes, a: np.ndarray) -> bool:
        if len(taken) >= 5:
            self.full = True
            return False
        taken.append(material)
        return put(self, material, a)

    monkeypatch.setattr(store_module.Store, "put", put_until_full)
    patched = _epochs(PathPhotos(files, _transform()))
    _assert_same(stock, patched)
    assert counted["hits"] == 5


def test_workers_store_and_serve_too(files, tmp_path):
    """``num_workers=2`` (fork): the workers' lazy images go through the same store; its entries are there after."""
    import nano_patch
    from nano_patch.vision.images import cache

    stock = _epochs(PathPhotos(files, _transform()), num_workers=2, persistent_workers=True,
                    multiprocessing_context="fork")
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "store"))
    patched = _epochs(PathPhotos(files, _transform()), num_workers=2, persistent_workers=True,
                      multiprocessing_context="fork")
    _assert_same(stock, patched)
    assert cache.describe(tmp_path / "store")["entries"] == len(files)


def test_fast_says_the_cache_is_on_for_a_users_dataset(files, tmp_path, capsys):
    import nano_patch

    nano_patch.patch_torch(cache_decoded="auto", cache_dir=str(tmp_path / "store"))
    ds = PathPhotos(files, _transform())
    for _ in DataLoader(ds, batch_size=4):
        pass
    err = capsys.readouterr().err
    assert "decoded-image cache on for the JPEGs PathPhotos's __getitem__ opens" in err
    assert str(tmp_path / "store") in err
