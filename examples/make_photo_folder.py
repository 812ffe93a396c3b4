"""Build a small ImageFolder of real photographs, offline, from photos that ship in scikit-learn,
matplotlib (and scikit-image when installed).

Each source photo is a class; each sample is a random crop of it, rescaled so the longer side is
300-500 px (pet-dataset sizes) and re-encoded as JPEG. The task (which photo did this crop come
from) is easy, but every byte the input pipeline touches is a real JPEG of a real photograph.

    python examples/make_photo_folder.py DATA_DIR [--per-class 64]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any


def sources() -> list[Path]:
    import matplotlib
    import sklearn

    paths = [
        Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg",
        Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg",
        Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg",
    ]
    try:
        import skimage

        data = Path(skimage.__file__).parent / "data"
        paths += [data / n for n in ("chelsea.png", "coffee.png", "astronaut.png") if (data / n).exists()]
    except ImportError:
        pass
    return [p for p in paths if p.exists()]


def build(root: Path, per_class: int = 64, seed: int = 0) -> Path:
    from PIL import Image

    rng = random.Random(seed)
    for split, n in (("train", per_class), ("val", max(8, per_class // 4))):
        for src in sources():
            _crops(Image.open(src).convert("RGB"), root / split / src.stem, n, rng)
    return root


def _crops(im: Any, out: Path, n: int, rng: random.Random) -> None:
    """``n`` random crops of ``im``, longer side 300-500 px, saved as JPEGs in ``out``."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        w, h = im.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        crop = im.crop((x, y, x + cw, y + ch))
        side = rng.randint(300, 500)
        scale = side / max(crop.size)
        crop = crop.resize((max(1, int(crop.width * scale)), max(1, int(crop.height * scale))), Image.BICUBIC)
        crop.save(out / f"{i:04d}.jpg", quality=rng.randint(80, 95))


def build_class(root: Path | str, src: Path | str, per_class: int, seed: int = 0) -> Path:
    """One class of a training folder (``root/train/<photo>``), from the photo ``src``: for building the classes in
    parallel (its crops are seeded per class, so they are not :func:`build`'s)."""
    from PIL import Image

    out = Path(root) / "train" / Path(src).stem
    _crops(Image.open(src).convert("RGB"), out, per_class, random.Random(f"{seed}:{Path(src).stem}"))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--per-class", type=int, default=64)
    a = ap.parse_args()
    print(build(a.root, a.per_class))
