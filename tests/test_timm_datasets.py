"""timm's ImageDataset decodes through the patch: same samples, same draws, same skipping of bad files."""

from __future__ import annotations

import logging
import random
import sys

import numpy as np
import pytest
import torch

import nano_patch
from nano_patch.vision.images import decode

timm_data = pytest.importorskip("timm.data")


def _states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


def _same_states(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])


def _run(root, **tf_kwargs):
    from timm.data import ImageDataset, create_transform

    tf = create_transform(**tf_kwargs) if tf_kwargs else None
    ds = ImageDataset(str(root), transform=tf)
    out = []
    for i in range(len(ds)):
        torch.manual_seed(i)
        random.seed(i)
        np.random.seed(i)
        out.append(ds[i])
    return out, _states()


def _assert_same(got, want):
    (items, states), (stock_items, stock_states) = got, want
    assert len(items) == len(stock_items)
    for (a, ta), (b, tb) in zip(items, stock_items):
        assert ta == tb and type(a) is type(b)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
        else:
            assert a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))
    assert _same_states(states, stock_states)


TRANSFORMS = {
    "train, RandAugment + RandomErasing": dict(input_size=160, is_training=True, auto_augment="rand-m9-mstd0.5",
                                               re_prob=0.25),
    "train": dict(input_size=160, is_training=True),
    "eval": dict(input_size=160),
    "prefetcher (MaybePILToTensor)": dict(input_size=160, is_training=True, use_prefetcher=True),
    "no transform": {},
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_image_dataset_equals_stock_and_decodes_through_the_patch(image_folder, name, monkeypatch):
    from nano_patch.vision.kernels import native_kernels

    stock = _run(image_folder, **TRANSFORMS[name])
    seen = []
    real = decode.decode_rgb_reproducibly
    monkeypatch.setattr(decode, "decode_rgb_reproducibly", lambda p, *a, **k: seen.append(p) or real(p, *a, **k))
    window = native_kernels.decode_jpeg_region
    monkeypatch.setattr(native_kernels, "decode_jpeg_region", lambda *a, **k: seen.append(a[1:]) or window(*a, **k))
    nano_patch.patch_torch()
    got = _run(image_folder, **TRANSFORMS[name])
    _assert_same(got, stock)
    assert len(seen) == len(got[0])  # every file through the patch's decoders: whole, or the crop's window


def test_maybe_pil_to_tensor_is_a_tail_of_the_plan():
    from timm.data import create_transform

    from nano_patch.vision.plans import compose_plan

    nano_patch.patch_torch()
    tf = create_transform(input_size=160, is_training=True, use_prefetcher=True)
    described = compose_plan.plan_for(tf).describe()
    assert described[-1] == "MaybePILToTensor: tail", described
    assert all(not d.endswith("stock") for d in described), described


def _retry_limit_of_one(ds, monkeypatch) -> None:
    """Make the installed timm give up at the first bad file: newer releases keep the limit on the dataset
    (``_max_retries``), older ones in a module constant (``_ERROR_RETRY``)."""
    if hasattr(ds, "_max_retries"):
        ds._max_retries = 1
    else:
        monkeypatch.setattr(sys.modules[type(ds).__module__], "_ERROR_RETRY", 1)


@pytest.mark.parametrize("mode", ["bad file skipped", "too many bad files"])
def test_unreadable_files_are_skipped_as_timm_skips_them(tmp_path, photos, caplog, monkeypatch, mode):
    """timm catches OSError while loading, warns, and takes the next index (up to its retry limit, then it
    raises): under the patch the same warnings, the same samples, the same error where timm gives up, and
    the same generator states, whatever the installed timm does."""
    (tmp_path / "c").mkdir()
    for i, im in enumerate(photos):
        im.save(tmp_path / "c" / f"{i}.jpg", quality=90)
    data = (tmp_path / "c" / "1.jpg").read_bytes()
    (tmp_path / "c" / "1.jpg").write_bytes(data[: len(data) // 2])
    kwargs = dict(input_size=128, is_training=True)

    def run():
        from timm.data import ImageDataset, create_transform

        ds = ImageDataset(str(tmp_path), transform=create_transform(**kwargs))
        if mode == "too many bad files":
            _retry_limit_of_one(ds, monkeypatch)
        out = []
        for i in range(len(ds)):
            torch.manual_seed(i)
            random.seed(i)
            try:
                out.append(ds[i][0])
            except Exception as exc:  # noqa: BLE001 - what timm raises is compared: its class, and its own message
                out.append(f"{type(exc).__name__}: {exc}" if isinstance(exc, RuntimeError) else type(exc).__name__)
            out.append(torch.get_rng_state())
            out.append(random.getstate())
        return out

    with caplog.at_level(logging.WARNING, logger="timm.data.dataset"):
        stock = run()
    stock_warnings = [r.getMessage().split(".")[0] for r in caplog.records]
    caplog.clear()
    nano_patch.patch_torch()
    with caplog.at_level(logging.WARNING, logger="timm.data.dataset"):
        got = run()
    assert [r.getMessage().split(".")[0] for r in caplog.records] == stock_warnings
    assert len(got) == len(stock)
    for a, b in zip(got, stock):
        assert a == b if isinstance(b, (str, tuple)) else torch.equal(a, b)
    errors = [x for x in stock if isinstance(x, str)]
    assert stock_warnings or errors, "the broken file changed nothing in stock: the comparison covered nothing"
    if stock_warnings:  # this timm skips a file it cannot decode (older ones raise), up to its retry limit
        assert all(w.startswith("Skipped sample (index 1") for w in stock_warnings), stock_warnings
        assert len(errors) == (1 if mode == "too many bad files" else 0), errors  # timm gave up at the bad file


def test_other_readers_and_modes_run_timm_code(image_folder, monkeypatch):
    from timm.data import ImageDataset

    calls = []
    real = decode.decode_rgb_reproducibly
    monkeypatch.setattr(decode, "decode_rgb_reproducibly", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    stock = [ImageDataset(str(image_folder), input_img_mode="L")[i][0] for i in range(3)]
    raw = [ImageDataset(str(image_folder), load_bytes=True)[i][0] for i in range(3)]
    nano_patch.patch_torch()
    got = [ImageDataset(str(image_folder), input_img_mode="L")[i][0] for i in range(3)]
    got_raw = [ImageDataset(str(image_folder), load_bytes=True)[i][0] for i in range(3)]
    assert calls == []
    assert all(a.mode == "L" and np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, stock))
    assert got_raw == raw


def test_the_report_counts_timms_samples_through_the_patch_and_those_left_to_timm(image_folder, tmp_path):
    from timm.data import ImageDataset, create_transform

    from nano_patch import report

    nano_patch.patch_torch()
    report.stats = report.Stats(str(tmp_path))
    try:
        ds = ImageDataset(str(image_folder), transform=create_transform(96, is_training=True,
                                                                         auto_augment="rand-m9-mstd0.5"))
        for i in range(len(ds)):
            ds[i]
        grey = ImageDataset(str(image_folder), input_img_mode="L")
        grey[0]
        counts = dict(report.stats.counts)
    finally:
        report.stats = None
    assert counts[("timm_datasets", True, "sample decoded and transformed through the patch")] == len(ds)
    assert counts[("timm_datasets", False, "input_img_mode other than RGB: timm code")] == 1
    assert not any(key[0] == "vision_transforms" and not key[1] for key in counts), counts  # RandAugment planned
