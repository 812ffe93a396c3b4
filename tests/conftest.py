"""Shared fixtures: real photographs from installed packages, re-encoded as JPEG; clean patch state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image


def photo_sources() -> list[Path]:
    """Real photos that ship inside scikit-learn and matplotlib wheels."""
    import matplotlib
    import sklearn

    sk = Path(sklearn.__file__).parent / "datasets" / "images"
    mpl = Path(matplotlib.get_data_path()) / "sample_data"
    paths = [sk / "china.jpg", sk / "flower.jpg", mpl / "grace_hopper.jpg"]
    return [p for p in paths if p.exists()]


@pytest.fixture(scope="session")
def photos() -> list[Image.Image]:
    """The photos as RGB PIL images at pet-dataset sizes (longer side 300-500 px)."""
    out = []
    for i, p in enumerate(photo_sources()):
        im = Image.open(p).convert("RGB")
        im.thumbnail((500 - 90 * i, 500 - 90 * i))
        out.append(im)
    assert len(out) >= 2, "scikit-learn/matplotlib sample photos are missing"
    return out


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory, photos) -> Path:
    """An ImageFolder tree of JPEGs made from the photos (two classes, several crops each)."""
    root = tmp_path_factory.mktemp("imagefolder")
    for cls in ("a", "b"):
        (root / cls).mkdir()
    for i, im in enumerate(photos):
        for j in range(3):
            w, h = im.size
            crop = im.crop((j * 10, j * 7, w - j * 5, h - j * 3))
            crop.save(root / ("a" if (i + j) % 2 else "b") / f"p{i}_{j}.jpg", quality=88)
    return root


@pytest.fixture(autouse=True)
def _unpatched():
    """Every test starts and ends unpatched, with no NANO_PATCH_* variables leaking in."""
    import nano_patch

    saved = {k: v for k, v in os.environ.items() if k.startswith("NANO_PATCH_") or k == "_NANO_PATCH_STARTUP"}
    for k in saved:
        del os.environ[k]
    nano_patch.unpatch_torch()
    yield
    nano_patch.unpatch_torch()
    os.environ.update(saved)
