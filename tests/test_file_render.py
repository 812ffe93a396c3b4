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

from nano_patch.vision import native, oprunner
from nano_patch.vision.pixels import OP_BRIGHTNESS, OP_CROP, OP_HFLIP, OP_RESIZE, OP_SATURATION

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
    region = native.decode_jpeg_region(data, top, left, height, width)
    out = np.empty((3, *shape[:2]), np.float32)
    native.kernel("tables").run_ops(region, records[1:], oprunner.PLANES_F32, TABLE, out, shape, _settings())
    return out


def _one_call(path, size, records, shape, max_bytes=1 << 30):
    out = np.empty((3, *shape[:2]), np.float32)
    got = native.kernel("tables").run_ops_file(native.kernel("crop_decode").file_api, path, size,
                                               (True, native.crop_multiscan()), max_bytes, records,
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
    if progressive and not native.crop_multiscan():
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
    whole = native.decode_jpeg_region(data, 0, 0, 90, 120)
    native.kernel("tables").run_ops(whole, records, oprunner.PLANES_F32, TABLE, want, (20, 30, 3), _settings())
    assert np.array_equal(got.numpy(), want)
    assert oprunner.run_file(job, str(tmp_path / "missing.jpg"), (90, 120)) is None
