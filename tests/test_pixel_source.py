"""Where a sample's pixels come from (``vision/source.py``) and the dataset's index of its files
(``vision/file_index.py``): the cache's counts on every path, and an index that never serves a stale entry."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import nano_patch
from nano_patch import report
from nano_patch.vision import cache, file_index


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
    from nano_patch.vision import loading

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
    from nano_patch.vision import source

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
    from nano_patch.vision import source

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
    from nano_patch.vision import source

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
