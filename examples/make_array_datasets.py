"""Build torchvision's array datasets (CIFAR-10/100, SVHN, STL-10, the MNIST family) in their own file formats,
offline, from real photographs that ship in scikit-learn and matplotlib (``make_photo_folder.sources``).

Each sample is a random crop of a source photo, scaled down to the dataset's size (32x32 RGB for CIFAR and SVHN,
96x96 RGB for STL-10, 28x28 greyscale for the MNIST family); its label is the photo it came from. Every byte the
input pipeline touches is a real photograph's, in the layout torchvision reads.

The CIFAR, SVHN and STL-10 classes check their files' MD5 sums against the published datasets', which files made
here cannot match: :func:`open_dataset` opens them through a subclass that skips only that check (its
``__getitem__`` is stock's, so it loads as the class itself does).

    python examples/make_array_datasets.py DATA_DIR [--images 10000] [--kind cifar10]
"""

from __future__ import annotations

import argparse
import pickle
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("cifar10", "cifar100", "svhn", "stl10", "mnist", "fashionmnist", "kmnist", "emnist", "qmnist")
_MNIST_FOLDERS = {"mnist": "MNIST", "fashionmnist": "FashionMNIST", "kmnist": "KMNIST", "emnist": "EMNIST",
                  "qmnist": "QMNIST"}


def _tiles(n: int, side: int, mode: str, classes: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """``n`` crops of the photos, ``side`` x ``side``, in ``mode`` ("RGB" or "L"), and their labels (the photo's
    index, spread over ``classes``)."""
    from make_photo_folder import sources
    from PIL import Image

    photos = [Image.open(p).convert(mode) for p in sources()]
    rng = random.Random(seed)
    out = np.empty((n, side, side, 3) if mode == "RGB" else (n, side, side), np.uint8)
    labels = []
    for k in range(n):
        which = rng.randrange(len(photos))
        im = photos[which]
        w, h = im.size
        s = rng.randint(min(w, h) // 8, min(w, h) // 2)
        x, y = rng.randrange(w - s), rng.randrange(h - s)
        out[k] = np.asarray(im.crop((x, y, x + s, y + s)).resize((side, side), Image.BILINEAR))
        labels.append((which * 7 + rng.randrange(7)) % classes)
    return out, labels


def make(root: Path, kind: str, images: int = 10000, seed: int = 0) -> Path:
    """Write ``kind``'s training files (and a small test split) under ``root``; returns ``root``."""
    root = Path(root)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind in ("cifar10", "cifar100"):
        _cifar(root, kind, images, seed)
    elif kind == "svhn":
        _svhn(root, images, seed)
    elif kind == "stl10":
        _stl10(root, images, seed)
    else:
        _mnist(root, kind, images, seed)
    return root


def _cifar(root: Path, kind: str, images: int, seed: int) -> None:
    classes = 10 if kind == "cifar10" else 100
    folder = root / ("cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    data, labels = _tiles(images + images // 5, 32, "RGB", classes, seed)
    rows = data.transpose(0, 3, 1, 2).reshape(len(data), -1)  # (the files hold CHW rows)
    key = "labels" if kind == "cifar10" else "fine_labels"
    train, test = slice(0, images), slice(images, len(data))
    if kind == "cifar10":
        parts = np.array_split(np.arange(images), 5)
        for i, part in enumerate(parts, 1):
            with open(folder / f"data_batch_{i}", "wb") as f:
                pickle.dump({"data": rows[part], key: [labels[j] for j in part]}, f)
        with open(folder / "test_batch", "wb") as f:
            pickle.dump({"data": rows[test], key: labels[test]}, f)
        with open(folder / "batches.meta", "wb") as f:
            pickle.dump({"label_names": [f"class{i}" for i in range(classes)]}, f)
    else:
        for name, part in (("train", train), ("test", test)):
            with open(folder / name, "wb") as f:
                pickle.dump({"data": rows[part], key: labels[part]}, f)
        with open(folder / "meta", "wb") as f:
            pickle.dump({"fine_label_names": [f"class{i}" for i in range(classes)]}, f)


def _svhn(root: Path, images: int, seed: int) -> None:
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    data, labels = _tiles(images, 32, "RGB", 10, seed)
    # (the .mat file holds H x W x C x N, labels 1-10 with 10 for the digit 0)
    savemat(root / "train_32x32.mat", {"X": data.transpose(1, 2, 3, 0),
                                       "y": np.array([[(v % 10) or 10] for v in labels], np.uint8)})


def _stl10(root: Path, images: int, seed: int) -> None:
    folder = root / "stl10_binary"
    folder.mkdir(parents=True, exist_ok=True)
    data, labels = _tiles(images, 96, "RGB", 10, seed)
    # (column-major: each image is C x W x H in the file)
    data.transpose(0, 3, 2, 1).tofile(folder / "train_X.bin")
    np.array([v + 1 for v in labels], np.uint8).tofile(folder / "train_y.bin")
    (folder / "class_names.txt").write_text("".join(f"class{i}\n" for i in range(10)))
    (folder / "fold_indices.txt").write_text(" ".join(str(i) for i in range(images)) + "\n")


def _idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _mnist(root: Path, kind: str, images: int, seed: int) -> None:
    raw = root / _MNIST_FOLDERS[kind] / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    data, labels = _tiles(images + images // 5, 28, "L", 10, seed)
    train, test = slice(0, images), slice(images, len(data))
    if kind == "emnist":
        for split, part in (("train", train), ("test", test)):
            _idx(raw / f"emnist-balanced-{split}-images-idx3-ubyte", data[part].transpose(0, 2, 1))
            _idx(raw / f"emnist-balanced-{split}-labels-idx1-ubyte", np.array(labels[part]))
        return
    if kind == "qmnist":
        for split, part in (("train", train), ("test", test)):
            targets = np.zeros((len(data[part]), 8), ">i4")
            targets[:, 0] = labels[part]
            name = f"qmnist-{split}"
            with open(raw / f"{name}-images-idx3-ubyte", "wb") as f:
                f.write(struct.pack(">HBB", 0, 0x08, 3) + b"".join(struct.pack(">I", d) for d in data[part].shape))
                f.write(data[part].tobytes())
            with open(raw / f"{name}-labels-idx2-int", "wb") as f:
                f.write(struct.pack(">HBB", 0, 0x0C, 2) + struct.pack(">II", *targets.shape) + targets.tobytes())
        return
    for split, part in (("train", train), ("t10k", test)):
        _idx(raw / f"{split}-images-idx3-ubyte", data[part])
        _idx(raw / f"{split}-labels-idx1-ubyte", np.array(labels[part]))


def open_dataset(kind: str, root: Path, train: bool = True, **kwargs: Any) -> Any:
    """torchvision's dataset of ``kind`` over the files :func:`make` wrote (``kwargs``: ``transform`` and so on).
    CIFAR, SVHN and STL-10 through a subclass that skips only the published files' MD5 check."""
    from torchvision import datasets

    root = str(root)
    if kind in ("cifar10", "cifar100"):
        cls = _unchecked(datasets.CIFAR10 if kind == "cifar10" else datasets.CIFAR100)
        return cls(root, train=train, **kwargs)
    if kind == "svhn":
        return _unchecked(datasets.SVHN)(root, split="train", **kwargs)
    if kind == "stl10":
        return _unchecked(datasets.STL10)(root, split="train", **kwargs)
    cls = {"mnist": datasets.MNIST, "fashionmnist": datasets.FashionMNIST, "kmnist": datasets.KMNIST}.get(kind)
    if cls is not None:
        return cls(root, train=train, **kwargs)
    if kind == "emnist":
        return datasets.EMNIST(root, split="balanced", train=train, **kwargs)
    return datasets.QMNIST(root, what="train" if train else "test", **kwargs)


_unchecked_classes: dict[type, type] = {}


def _unchecked(cls: type) -> type:
    """``cls`` with its MD5 checks of the published files skipped (nothing else changed)."""
    if cls not in _unchecked_classes:
        def check_integrity(self: Any) -> bool:
            return True

        def load_meta(self: Any) -> None:
            path = Path(self.root) / self.base_folder / self.meta["filename"]
            with open(path, "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

        body: dict[str, Any] = {"_check_integrity": check_integrity, "__module__": __name__}
        if hasattr(cls, "_load_meta"):
            body["_load_meta"] = load_meta
        _unchecked_classes[cls] = type(cls.__name__, (cls,), body)
    return _unchecked_classes[cls]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--kind", choices=KINDS, default="cifar10")
    args = ap.parse_args()
    make(args.root, args.kind, args.images)
    print(f"{args.kind}: {args.images} images under {args.root}")


if __name__ == "__main__":
    main()
