"""Where a sample's pixels come from (``vision/images/source.py``) and the dataset's index of its files
(``vision/images/file_index.py``): the cache's counts on every path, and an index that never serves a stale entry."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import nano_patch
from nano_patch import report
from nano_patch.vision.images import cache, file_index


@pytest.fixture
def stats(tmp_path):
    (tmp_path / "report").mkdir()
    report.stats = report.Stats(str(tmp_path / "report"))
    try:
        yield report.stats
    finally:
        report.stats = None


def _folder(root, photos, suffix: str):
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i, im in enumerate(photos):
        for j in range(2):
            im.crop((j * 9, j * 5, im.width - j * 4, im.height)).save(root / "ab"[(i + j) % 2] / f"p{i}_{j}.{suffix}")
    return root


def _old_enough(root) -> None:
    """Files' times safely in the past (a racily new file is served but never stored)."""
    past = time.time() - 60
    for p in root.rglob("*.*"):
        os.utime(p, (past, past))
    time.sleep(0.1)  # the change time that utime set is now past the cache's window of fine timestamps


def _one_epoch(root, tmp_path):
    nano_patch.patch_torch(loader_threads=2, cache_decoded="on", cache_dir=str(tmp_path / "cache"))
    ds = ImageFolder(str(root), transform=T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()]))
    for _ in DataLoader(ds, batch_size=len(ds)):
        pass
    return ds


def test_a_miss_through_the_batch_path_counts_its_decode_time(tmp_path, photos, stats):
    # PNGs: the batch path decodes them in its draw step (PIL), where a miss used to count 0 seconds
    root = _folder(tmp_path / "png", photos, "png")
    _old_enough(root)
    ds = _one_epoch(root, tmp_path)
    assert stats.loader["parallel_batches"] == 1, "the batch took the parallel path"
    pixels = sum(Image.open(p).size[0] * Image.open(p).size[1] for p, _ in ds.samples)
    c = stats.cache
    assert c["misses"] == len(ds) and c["stored"] == len(ds) and c["hits"] == 0
    assert c["decode_px"] == pixels
    assert c["decode_s"] > 0, "the misses' decodes were counted as taking no time"


def test_jpeg_misses_and_hits_through_the_batch_path_are_counted(tmp_path, image_folder, stats):
    root = tmp_path / "jpeg"
    import shutil

    shutil.copytree(image_folder, root)
    _old_enough(root)
    ds = _one_epoch(root, tmp_path)
    c = stats.cache
    assert c["misses"] == c["stored"] == len(ds) and c["decode_s"] > 0 and c["hits"] == 0
    for _ in DataLoader(ds, batch_size=len(ds)):
        pass
    assert c["hits"] == len(ds) and c["misses"] == len(ds)
    assert c["hit_px"] == sum(Image.open(p).size[0] * Image.open(p).size[1] for p, _ in ds.samples)


def _store(tmp_path):
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "cache"))
    return cache.store_for(None)


def test_the_index_answers_a_seen_file_from_memory_and_equal_to_the_store(tmp_path, image_folder, monkeypatch):
    store = _store(tmp_path)
    paths = sorted(str(p) for p in image_folder.rglob("*.jpg"))
    _old_enough(image_folder)
    from nano_patch.data.batches import sample_loading as loading

    for p in paths:
        loading.cached(store, p)  # stored
    index = file_index.FileIndex()
    first = [index.look_up(store, p)[1] for p in paths]
    assert len(index) == len(paths)
    asked = []
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda material: asked.append(material) or real_get(material))
    again = [index.look_up(store, p) for p in paths]
    assert asked == [], "the store was asked for files the index holds"
    for (material, a), b, p in zip(again, first, paths):
        assert material is not None and a is b
        assert np.array_equal(a, np.asarray(Image.open(p).convert("RGB")))


def test_the_index_never_serves_a_file_rewritten_since(tmp_path, photos):
    store = _store(tmp_path)
    p = tmp_path / "x.jpg"
    photos[0].save(p, quality=90)
    _old_enough(tmp_path)
    index = file_index.FileIndex()
    from nano_patch.vision.images import source

    assert np.array_equal(source.load(store, p, index=index), np.asarray(Image.open(p).convert("RGB")))
    assert index.look_up(store, p)[1] is not None and len(index) == 1
    photos[1].save(p, quality=90)  # another photo under the same name
    _old_enough(tmp_path)
    got = source.load(store, p, index=index)
    assert np.array_equal(got, np.asarray(Image.open(p).convert("RGB")))


def test_a_racily_new_file_is_not_indexed_and_is_stored_once_its_times_are_old(tmp_path, photos):
    store = _store(tmp_path)
    p = tmp_path / "new.jpg"
    photos[0].save(p, quality=90)  # written just now: racy
    index = file_index.FileIndex()
    from nano_patch.vision.images import source

    source.load(store, p, index=index)
    assert len(index) == 0 and index.look_up(store, p) == (index.look_up(store, p)[0], None)
    _old_enough(tmp_path)
    source.load(store, p, index=index)  # now stored
    material, a = index.look_up(store, p)
    assert a is not None and len(index) == 1


def test_one_index_per_dataset_dropped_with_it(tmp_path, image_folder):
    ds = ImageFolder(str(image_folder))
    assert file_index.for_dataset(ds) is file_index.for_dataset(ds)
    assert file_index.for_dataset(ds) is not file_index.for_dataset(ImageFolder(str(image_folder)))
    import gc
    import weakref

    ref = weakref.ref(file_index.for_dataset(ds))
    del ds
    gc.collect()
    assert ref() is None


def test_a_hit_from_the_index_still_applies_stocks_size_rule(tmp_path, photos, stats):
    store = _store(tmp_path)
    p = tmp_path / "big.jpg"
    photos[0].save(p, quality=90)
    _old_enough(tmp_path)
    index = file_index.FileIndex()
    from nano_patch.vision.images import source

    source.load(store, p, index=index)
    source.load(store, p, index=index)  # now in the index
    h, w = Image.open(p).size[::-1]
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = (h * w) // 3  # more than twice the limit: stock's open raises
    try:
        with pytest.raises(Image.DecompressionBombError):
            source.load(store, p, index=index)
    finally:
        Image.MAX_IMAGE_PIXELS = old


# -- the header index: where images are not cached, a seen plain JPEG's size without reading it in the draw --

def _epoch(ds, seed: int = 0) -> list:
    import torch

    torch.manual_seed(seed)
    return [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=3, shuffle=True)]


def _headers_tf():
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor()])


def _stock_epochs(root, epochs: int) -> list:
    ds = ImageFolder(str(root), transform=_headers_tf())
    return [_epoch(ds, seed) for seed in range(epochs)]


def _same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_without_the_cache_a_seen_jpeg_is_not_read_in_the_draw(tmp_path, photos, monkeypatch):
    """Epoch 1 reads each file in the draw and indexes it; epoch 2 takes its size from the index (the render reads
    it): the batches are stock's in both."""
    from nano_patch.data.batches import batch_loader, drawn_batches
    from nano_patch.vision.images import decode
    from nano_patch.vision.kernels import native
    from nano_patch.vision.plans import oprunner

    root = _folder(tmp_path / "f", photos, "jpg")
    stock = _stock_epochs(root, 2)
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    ds = ImageFolder(str(root), transform=_headers_tf())
    in_draw, reads, native_reads = [False], [], []
    real_read, real_source, real_run_file = decode.read_bytes, batch_loader.source_of, oprunner.run_file

    def read_bytes(path):
        reads.append(in_draw[0])
        return real_read(path)

    def run_file(job, path, size):  # the render's native read (None: it did not read; Python's read follows)
        got = real_run_file(job, path, size)
        if got is not None:
            reads.append(in_draw[0])
            native_reads.append(not isinstance(got, bytes))
        return got

    real_native_batch = oprunner.native_batch

    def native_batch(jobs, sources):  # the batch's native call reads each file it is given (none changed here)
        batch = real_native_batch(jobs, sources)
        if batch is not None:
            files = [s for s in sources if type(s) is tuple]
            reads.extend([in_draw[0]] * len(files))
            native_reads.extend([True] * len(files))
        return batch

    def source(*args):
        in_draw[0] = True
        try:
            return real_source(*args)
        finally:
            in_draw[0] = False

    monkeypatch.setattr(decode, "read_bytes", read_bytes)
    monkeypatch.setattr(batch_loader, "source_of", source)
    monkeypatch.setattr(drawn_batches, "source_of", source)  # (the batches made ahead draw there)
    monkeypatch.setattr(oprunner, "run_file", run_file)
    monkeypatch.setattr(oprunner, "native_batch", native_batch)
    assert _same(_epoch(ds, 0), stock[0])
    assert len(file_index.headers_for(ds)) == len(ds) and reads == [True] * len(ds)
    reads.clear()
    assert _same(_epoch(ds, 1), stock[1])
    assert reads == [False] * len(ds)  # every file read once, in the render, none in the draw
    # where crop decoding is usable, each of those reads was the one native call (read, decode, ops, tail)
    assert native_reads == ([True] * len(ds) if native.available("crop_decode") else [])


def test_a_file_changed_after_it_was_indexed_is_read_again(tmp_path, photos):
    """A file rewritten with another photo (other size), or truncated, after epoch 1: epoch 2 gives stock's pixels,
    or stock's error at stock's sample."""
    root = _folder(tmp_path / "f", photos, "jpg")
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    ds = ImageFolder(str(root), transform=_headers_tf())
    _epoch(ds, 0)
    victim = ds.samples[1][0]
    photos[0].resize((123, 77)).save(victim)  # another image, another size
    nano_patch.unpatch_torch()
    stock = _stock_epochs(root, 2)[1]
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    assert _same(_epoch(ds, 1), stock)
    data = Path(victim).read_bytes()
    with open(victim, "wb") as f:
        f.write(data[: len(data) // 2])  # truncated: stock's decode raises OSError
    nano_patch.unpatch_torch()
    with pytest.raises(OSError) as want:
        _stock_epochs(root, 3)
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    with pytest.raises(OSError) as got:
        for seed in range(3):
            _epoch(ds, seed)
    assert str(got.value) == str(want.value)


def test_the_header_index_keeps_stocks_size_rule_on_every_open(tmp_path, photos, monkeypatch):
    """A lowered MAX_IMAGE_PIXELS: stock warns at every open of a large image, every epoch; so does the patch
    where the index answered."""
    import warnings

    root = _folder(tmp_path / "f", photos, "jpg")
    biggest = max(im.width * im.height for im in photos)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", biggest - 1)

    def warned(run) -> int:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            run()
        return sum(issubclass(w.category, Image.DecompressionBombWarning) for w in seen)

    stock = warned(lambda: _stock_epochs(root, 2))
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    ds = ImageFolder(str(root), transform=_headers_tf())
    assert stock > 0 and warned(lambda: [_epoch(ds, s) for s in range(2)]) == stock
