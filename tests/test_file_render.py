"""A sample's file read, checks, window decode, ops and tensor tail as one native call (``_native.run_ops_file``
with ``_jpeg.file_api``; ``oprunner.run_file``), against the two calls it replaces (the region decode, then
``run_ops``) bit for bit, and on every file it must leave to the Python path: the exact bytes back where it read
them (another size, truncated, not a JPEG, damaged, a window outside the image), False where it could not read
them (missing, a directory, larger than its limit), so that the Python path meets stock's error itself.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from nano_patch.vision.kernels import native, native_kernels
from nano_patch.vision.plans import oprunner
from nano_patch.vision.plans.pixel_ops import OP_BRIGHTNESS, OP_CROP, OP_HFLIP, OP_RESIZE, OP_SATURATION

pytestmark = pytest.mark.skipif(not native.available("crop_decode"), reason="crop decoding is not usable here")

TABLE = np.linspace(-2.0, 2.0, 3 * 256, dtype=np.float32).reshape(3, 256)


def _jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _settings():
    return oprunner._settings()


def _records(window, h, w):
    return (
        (OP_CROP, *window, 0.0, None),
        (OP_RESIZE, h, w, Image.BILINEAR, 0, 0.0, None),
        (OP_HFLIP, 0, 0, 0, 0, 0.0, None),
        (OP_BRIGHTNESS, 0, 0, 0, 0, 1.2, None),
        (OP_SATURATION, 0, 0, 0, 0, 0.7, None),
    )


def _two_calls(data: bytes, records, shape) -> np.ndarray:
    """What the render did before: the region decode, then the op runner on it."""
    top, left, height, width = records[0][1:5]
    region = native_kernels.decode_jpeg_region(data, top, left, height, width)
    out = np.empty((3, *shape[:2]), np.float32)
    native.kernel("tables").run_ops(region, records[1:], oprunner.PLANES_F32, TABLE, out, shape, _settings())
    return out


def _one_call(path, size, records, shape, max_bytes=1 << 30):
    out = np.empty((3, *shape[:2]), np.float32)
    got = native.kernel("tables").run_ops_file(native.kernel("crop_decode").file_api, path, size,
                                               (True, native_kernels.crop_multiscan()), max_bytes, records,
                                               oprunner.PLANES_F32, TABLE, out, shape, _settings())
    return got, out


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("window", [(0, 0, 375, 500), (10, 20, 200, 300), (101, 333, 77, 167), (374, 499, 1, 1)])
def test_one_call_equals_the_region_decode_and_the_op_runner(tmp_path, photos, window, progressive):
    img = photos[0].resize((500, 375))
    data = _jpeg(img, progressive=progressive)
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    records = _records(window, 64, 48)
    got, out = _one_call(str(path), (375, 500), records, (64, 48, 3))
    if progressive and not native_kernels.crop_multiscan():
        assert got == data  # refused here: the bytes back, for the Python path
        return
    assert got is True
    assert np.array_equal(out, _two_calls(data, records, (64, 48, 3)))
    # a path-like and a bytes path are the same file
    assert _one_call(path, (375, 500), records, (64, 48, 3))[0] is True
    assert _one_call(os.fsencode(path), (375, 500), records, (64, 48, 3))[0] is True


def test_a_grey_jpeg_decodes_to_rgb_as_the_region_decode(tmp_path, photos):
    data = _jpeg(photos[1].convert("L").resize((320, 240)))
    path = tmp_path / "g.jpg"
    path.write_bytes(data)
    records = _records((5, 7, 100, 150), 32, 32)
    got, out = _one_call(str(path), (240, 320), records, (32, 32, 3))
    assert got is True and np.array_equal(out, _two_calls(data, records, (32, 32, 3)))


def test_what_it_leaves_comes_back_as_the_files_bytes(tmp_path, photos):
    img = photos[0].resize((200, 150))
    data = _jpeg(img)
    records = _records((0, 0, 150, 200), 16, 16)
    cases = {
        "another size": (data, (151, 200)),
        "truncated": (data[: len(data) // 2], (150, 200)),
        "no end marker after the scan": (data[:-2], (150, 200)),
        "not a JPEG": (b"\x89PNG\r\n\x1a\n" + data, (150, 200)),
        "empty": (b"", (150, 200)),
        "damaged scan": (data[:600] + bytes(200) + data[800:], (150, 200)),
    }
    for name, (content, size) in cases.items():
        path = tmp_path / f"{len(name)}.jpg"
        path.write_bytes(content)
        got, _ = _one_call(str(path), size, records, (16, 16, 3))
        assert got == content, name
    path = tmp_path / "ok.jpg"
    path.write_bytes(data)
    outside = _records((100, 100, 60, 60), 16, 16)  # a window outside the image: the Python path raises
    assert _one_call(str(path), (150, 200), outside, (16, 16, 3))[0] == data


def test_what_it_cannot_read_is_false(tmp_path, photos):
    data = _jpeg(photos[0].resize((200, 150)))
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    records = _records((0, 0, 150, 200), 16, 16)
    assert _one_call(str(tmp_path / "missing.jpg"), (150, 200), records, (16, 16, 3))[0] is False
    assert _one_call(str(tmp_path), (150, 200), records, (16, 16, 3))[0] is False  # a directory
    assert _one_call(str(path), (150, 200), records, (16, 16, 3), max_bytes=len(data) - 1)[0] is False
    os.mkfifo(tmp_path / "fifo")  # never opened for reading here (that would wait for a writer)
    assert _one_call(str(tmp_path / "fifo"), (150, 200), records, (16, 16, 3))[0] is False


def test_bad_arguments_raise(tmp_path, photos):
    data = _jpeg(photos[0].resize((200, 150)))
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    mod = native.kernel("tables")
    out = np.empty((3, 16, 16), np.float32)
    records = _records((0, 0, 150, 200), 16, 16)
    with pytest.raises(ValueError, match="crop first"):
        mod.run_ops_file(native.kernel("crop_decode").file_api, str(path), (150, 200), (True, True), 1 << 30,
                         records[1:], oprunner.PLANES_F32, TABLE, out, (16, 16, 3), _settings())
    with pytest.raises(ValueError):  # not the capsule
        mod.run_ops_file(object(), str(path), (150, 200), (True, True), 1 << 30, records, oprunner.PLANES_F32,
                         TABLE, out, (16, 16, 3), _settings())
    with pytest.raises(ValueError, match="do not agree"):  # dst of another size
        mod.run_ops_file(native.kernel("crop_decode").file_api, str(path), (150, 200), (True, True), 1 << 30,
                         records, oprunner.PLANES_F32, TABLE, np.empty((3, 8, 8), np.float32), (16, 16, 3),
                         _settings())
    with pytest.raises(ValueError, match="another size"):  # ops ending in another size than the tail's
        mod.run_ops_file(native.kernel("crop_decode").file_api, str(path), (150, 200), (True, True), 1 << 30,
                         records[:1] + records[2:], oprunner.PLANES_F32, TABLE, out, (16, 16, 3), _settings())


def test_run_file_renders_the_whole_image_where_the_ops_start_otherwise(tmp_path, photos):
    """``oprunner.run_file`` of ops that do not start with a crop: the whole file decoded (a crop of all of it)."""
    data = _jpeg(photos[2].resize((120, 90)))
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    records = _records((0, 0, 90, 120), 20, 30)[1:]
    job = oprunner.NativeRun(records, oprunner.PLANES_F32, TABLE, (20, 30, 3))
    got = oprunner.run_file(job, str(path), (90, 120))
    want = np.empty((3, 20, 30), np.float32)
    whole = native_kernels.decode_jpeg_region(data, 0, 0, 90, 120)
    native.kernel("tables").run_ops(whole, records, oprunner.PLANES_F32, TABLE, want, (20, 30, 3), _settings())
    assert np.array_equal(got.numpy(), want)
    assert oprunner.run_file(job, str(tmp_path / "missing.jpg"), (90, 120)) is None


# --- the batch as one native call per loader thread (``oprunner.NativeBatch``) -----------------------------------

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _jpeg_folder(root, photos):
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
    for i, im in enumerate(photos):
        for j in range(3):
            im.crop((j * 7, j * 3, im.width - j * 5, im.height - j)).save(root / "ab"[(i + j) % 2] / f"p{i}_{j}.jpg",
                                                                           quality=88)
    time_past = __import__("time").time() - 60  # (old enough for the decoded-image cache to store them)
    for p in root.rglob("*.jpg"):
        os.utime(p, (time_past, time_past))
    return root


def _pipelines():
    import torchvision.transforms as T

    return {
        "pets": lambda: T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                                   T.ToTensor(), T.Normalize(MEAN, STD)]),
        "c": lambda: T.Compose([T.Resize(56), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)]),
    }


def _loader_epochs(root, make, epochs=3):
    import torch
    from _rng import rng_state, seed_all
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    seed_all(7)
    loader = DataLoader(ImageFolder(str(root), transform=make()), batch_size=4, shuffle=True)
    out = []
    for _ in range(epochs):
        out.append([(x.clone(), y.clone()) for x, y in loader])
        out.append(rng_state())
    assert all(type(x) is torch.Tensor for batch in out[::2] for x, _ in batch)
    return out


def _assert_same(stock, patched):
    import torch
    from _rng import rng_differences

    assert len(stock) == len(patched)
    for want, got in zip(stock, patched):
        if isinstance(want, tuple):
            assert rng_differences(got, want) == []
            continue
        assert len(want) == len(got)
        for (wx, wy), (gx, gy) in zip(want, got):
            assert wx.stride() == gx.stride() and torch.equal(wx, gx) and torch.equal(wy, gy)


@pytest.mark.parametrize("cache", ["off", "on"])
@pytest.mark.parametrize("name", ["pets", "c"])
def test_later_epochs_render_each_batch_in_one_native_call_per_thread_as_stock(tmp_path, photos, monkeypatch,
                                                                              cache, name):
    """Epoch 1 reads every file in the draw; epochs 2 and 3 (the header index's sizes, or the cache's arrays) render
    every sample through ``NativeBatch``: batches and generators equal stock's."""
    import nano_patch

    root = _jpeg_folder(tmp_path / "f", photos)
    make = _pipelines()[name]
    stock = _loader_epochs(root, make)
    rendered, threads = [], []
    real_run, real_run_on = oprunner.NativeBatch.run, oprunner.NativeBatch.run_on

    def run_on(self, n_threads):  # the caller and native helpers: the samples it wrote to their slots
        ran = real_run_on(self, n_threads)
        threads.append((ran, len(self.jobs)))
        rendered.append(sum(self.done()))
        return ran

    monkeypatch.setattr(oprunner.NativeBatch, "run", lambda self: rendered.append(real_run(self)) or rendered[-1])
    monkeypatch.setattr(oprunner.NativeBatch, "run_on", run_on)
    nano_patch.patch_torch(loader_threads=2, cache_decoded=cache, cache_dir=str(tmp_path / "cache"))
    _assert_same(stock, _loader_epochs(root, make))
    n = len(list(root.rglob("*.jpg")))
    assert sum(rendered) == 2 * n  # epochs 2 and 3, every sample
    # each batch of more than one sample on two threads: this one and a native helper
    assert threads and all(ran == min(2, n) for ran, n in threads)


def test_a_file_gone_since_its_draw_raises_stocks_error_at_its_sample(tmp_path, photos):
    import nano_patch

    root = _jpeg_folder(tmp_path / "f", photos)
    make = _pipelines()["pets"]
    victim = sorted(root.rglob("*.jpg"))[4]
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(root), transform=make())
    for _ in DataLoader(ds, batch_size=4, shuffle=True):  # epoch 1: the header index filled
        pass
    victim.unlink()
    nano_patch.unpatch_torch()
    ds_stock = ImageFolder.__new__(ImageFolder)  # (the victim's entry kept, as in ds)
    ds_stock.__dict__.update(ds.__dict__)
    with pytest.raises(FileNotFoundError) as want:
        for _ in DataLoader(ds_stock, batch_size=4):
            pass
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    with pytest.raises(FileNotFoundError) as got:
        for _ in DataLoader(ds, batch_size=4):
            pass
    assert str(got.value) == str(want.value)


def test_prepare_batch_refuses_what_does_not_fit(tmp_path, photos):
    data = _jpeg(photos[0].resize((200, 150)))
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    mod = native.kernel("tables")
    api = native.kernel("crop_decode").file_api
    flat = np.empty(2 * 3 * 16 * 16, np.float32)
    records = _records((0, 0, 150, 200), 16, 16)
    args = (oprunner.PLANES_F32, TABLE, flat, (16, 16, 3), _settings(), (True, True), 1 << 30)
    slot = 3 * 16 * 16 * 4
    handle = mod.prepare_batch(api, [((str(path), (150, 200)), records, 0), ((str(path), (150, 200)), records, slot)],
                               *args)
    assert mod.run_batch(handle) == 2 and mod.batch_result(handle, 0) is True and mod.batch_result(handle, 1) is True
    want = _two_calls(data, records, (16, 16, 3))
    assert np.array_equal(flat[: slot // 4].reshape(3, 16, 16), want)
    assert mod.run_batch(handle) == 0  # nothing left to take
    with pytest.raises(ValueError, match="slot outside"):
        mod.prepare_batch(api, [((str(path), (150, 200)), records, 2 * slot - 4)], *args)
    with pytest.raises(ValueError, match="file_api"):
        mod.prepare_batch(None, [((str(path), (150, 200)), records, 0)], *args)
    with pytest.raises(ValueError, match="crop"):
        mod.prepare_batch(api, [((str(path), (150, 200)), records[1:], 0)], *args)
    with pytest.raises(IndexError):
        mod.batch_result(handle, 2)


def test_a_batch_the_native_call_refuses_renders_sample_by_sample(tmp_path, photos, monkeypatch):
    """``prepare_batch`` raising (a record it refuses) is never the user's error: the batch renders each sample on
    its own, as before the batch call, and equals stock."""
    import nano_patch

    root = _jpeg_folder(tmp_path / "f", photos)
    make = _pipelines()["pets"]
    stock = _loader_epochs(root, make, epochs=2)

    def refuse(*args):
        raise ValueError("refused")

    monkeypatch.setattr(native.kernel("tables"), "prepare_batch", refuse, raising=False)
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    _assert_same(stock, _loader_epochs(root, make, epochs=2))


def test_a_file_grown_since_its_draw_is_left_before_anything_is_allocated_for_it(tmp_path, photos):
    """A progressive JPEG of another (larger) size where the draw saw a small one: refused from its header, before
    libjpeg sets up its decode (a whole-image coefficient buffer for a progressive file); the bytes come back."""
    data = _jpeg(photos[0].resize((4000, 3000)), progressive=True)
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    got, _ = _one_call(str(path), (150, 200), _records((0, 0, 150, 200), 16, 16), (16, 16, 3))
    assert got == data
    got, _ = _one_call(str(path), (0, 0), _records((0, 0, 150, 200), 16, 16), (16, 16, 3))
    assert got == data  # no size to check against: left too


def test_a_native_batch_call_that_fails_leaves_its_samples_to_the_python_path(tmp_path, photos, monkeypatch):
    """``run_batch`` raising (in any thread) is never the user's error: the samples it did not render take the
    Python path at their place, and the batches equal stock's."""
    import nano_patch

    root = _jpeg_folder(tmp_path / "f", photos)
    make = _pipelines()["pets"]
    stock = _loader_epochs(root, make, epochs=2)

    def fail(self):
        raise RuntimeError("a call that fails")

    monkeypatch.setattr(oprunner.NativeBatch, "run", fail)
    nano_patch.patch_torch(loader_threads=2, cache_decoded="off")
    _assert_same(stock, _loader_epochs(root, make, epochs=2))


def _file_batch(tmp_path, photos, n=12):
    """A prepared batch of ``n`` JPEG files (three photos at three sizes), its flat output, and each sample's
    expected planes (the region decode, then the op runner)."""
    mod = native.kernel("tables")
    api = native.kernel("crop_decode").file_api
    items, want = [], []
    slot = 3 * 16 * 16 * 4
    for k in range(n):
        size = (150 + 10 * (k % 3), 200 + 8 * (k % 4))
        data = _jpeg(photos[k % 3].resize((size[1], size[0])))
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(data)
        records = _records((k % 5, k % 7, 100 + k, 120 + k), 16, 16)
        items.append(((str(path), size), records, k * slot))
        want.append(_two_calls(data, records, (16, 16, 3)))
    flat = np.full(n * slot // 4, np.nan, np.float32)
    handle = mod.prepare_batch(api, items, oprunner.PLANES_F32, TABLE, flat, (16, 16, 3), _settings(), (True, True),
                               1 << 30)
    return handle, flat, want


def _written(mod, handle, flat, want) -> bool:
    n = len(want)
    return all(mod.batch_result(handle, k) is True for k in range(n)) and \
        np.array_equal(flat.reshape(n, 3, 16, 16), np.stack(want))


def test_run_batch_on_renders_every_sample_on_the_threads_asked_for(tmp_path, photos):
    """The caller and native helper threads (``helpers.c``) take the batch's samples: every one written to its slot
    as the region decode and the op runner write it, on as many threads as asked for (at most one per sample)."""
    mod = native.kernel("tables")
    handle, flat, want = _file_batch(tmp_path, photos)
    threads, taken = mod.run_batch_on(handle, 4)
    assert threads == 4 and taken == 12 and mod.helpers_started() >= 3  # (taken: by all of the call's threads)
    assert _written(mod, handle, flat, want)
    assert mod.run_batch_on(handle, 4)[1] == 0  # nothing left to take
    (tmp_path / "two").mkdir()
    handle, flat, want = _file_batch(tmp_path / "two", photos, n=2)
    assert mod.run_batch_on(handle, 8)[0] == 2  # no more threads than samples
    assert _written(mod, handle, flat, want)
    with pytest.raises(ValueError, match="at least 1"):
        mod.run_batch_on(handle, 0)


def test_two_callers_at_once_each_get_their_whole_batch(tmp_path, photos):
    """The helpers serve one batch at a time; a second caller waits for them (the GIL released), and each batch is
    whole."""
    import threading

    mod = native.kernel("tables")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    batches = [_file_batch(tmp_path / "a", photos), _file_batch(tmp_path / "b", photos)]
    ok = []
    callers = [threading.Thread(target=lambda b=b: ok.append(mod.run_batch_on(b[0], 3) and _written(mod, *b)))
               for b in batches]
    for t in callers:
        t.start()
    for t in callers:
        t.join(60)
    assert ok == [True, True]


def test_a_forked_child_starts_its_own_helpers(tmp_path, photos):
    """A child forked after the helpers started has none of them (only the forking thread is copied): its first
    batch starts its own and renders whole, with no wait on the parent's."""
    import os
    import time

    mod = native.kernel("tables")
    handle, flat, want = _file_batch(tmp_path, photos)
    assert mod.run_batch_on(handle, 3)[0] == 3 and _written(mod, handle, flat, want)
    (tmp_path / "child").mkdir()
    child_batch = _file_batch(tmp_path / "child", photos)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only where its batch rendered whole on its own helpers
        try:
            before = mod.helpers_started()
            threads = mod.run_batch_on(child_batch[0], 3)[0]
            os._exit(0 if before == 0 and threads == 3 and mod.helpers_started() == 2 and _written(mod, *child_batch)
                     else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's batch never finished (its helpers are the parent's)")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
