"""FastImage behaves as the PIL image stock code would have had, whichever form holds its pixels."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from PIL import Image

from nano_patch.vision.images.image import FastImage, fast, plain


def _pixels() -> np.ndarray:
    y, x = np.mgrid[0:7, 0:9]
    return np.stack([x * 28, y * 36, (x + y) * 15], -1).astype(np.uint8)


@pytest.mark.parametrize("form", ["array", "core"])
def test_a_fast_image_is_the_pil_image_it_stands_for(form):
    a = _pixels()
    ref = Image.fromarray(a)
    img = FastImage.wrap(a.copy()) if form == "array" else FastImage.adopt(Image.fromarray(a))
    assert isinstance(img, Image.Image) and (img.mode, img.size) == ("RGB", (9, 7))
    assert img == ref and ref != img.convert("L")
    view = np.asarray(img)
    assert np.array_equal(view, a) and not view.flags.writeable
    assert img.tobytes() == ref.tobytes()
    assert img.getpixel((3, 2)) == ref.getpixel((3, 2))
    for restored in (pickle.loads(pickle.dumps(img)), copy.deepcopy(img)):
        assert type(restored) is Image.Image and restored == ref  # no nano_patch needed to load it
    assert type(plain(img)) is Image.Image and plain(img) == ref


def test_pil_writes_never_reach_arrays_handed_out_or_shared():
    a = _pixels()
    img = FastImage.wrap(a)
    before = np.asarray(img)
    sibling = FastImage.wrap(a)
    img.paste((0, 0, 0), (0, 0, 4, 4))  # PIL takes the pixels over, then writes its own copy
    assert img.array is None and np.asarray(img)[0, 0].tolist() == [0, 0, 0]
    assert np.array_equal(before, _pixels()) and np.array_equal(a, _pixels())
    assert np.array_equal(np.asarray(sibling), _pixels())


def test_fast_takes_only_pil_rgb_and_l():
    rgb = Image.fromarray(_pixels())
    assert isinstance(fast(rgb), FastImage) and isinstance(fast(rgb.convert("L")), FastImage)
    for other in (rgb.convert("RGBA"), rgb.convert("P"), _pixels(), None, "x"):
        assert fast(other) is other
