"""Stock against patched, as a matrix of what users combine: transform shape x dataset kind x loading x start method.

Run once per side and start method in a fresh process::

    python stock_matrix.py SIDE START_METHOD ROOT CASES_JSON OUT_JSON

SIDE is ``stock`` (nothing patched) or ``patched`` (``patch_torch()``); START_METHOD is set as a script sets it
(``multiprocessing.set_start_method``; forkserver is Python 3.14's default). CASES_JSON lists the cases (dicts made
by ``tests/test_stock_matrix.py``); each runs from the same seeds on both sides, and records as a list of events:
every batch (dtype, shape, strides, bytes), the three global generators after each epoch, the exception it ends
with (class and ``str``) and every warning (under ``"always"``). The test compares the two sides event by event.

Shapes (``SHAPES``), datasets (``DATASETS``) and the folder (``make_folder``) are defined here once; the test picks
the combinations.
"""

from __future__ import annotations

import functools
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from dropin_probe import Recorder, error, run_cases  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: the photo folder's files per class and classes; ``half_a``/``half_b`` split it for ConcatDataset
PER_CLASS = 5


# --- the folder -----------------------------------------------------------------------------------------------

def make_folder(root: Path, photos: list[Image.Image]) -> None:
    """``all``: 10 JPEGs of the photos (two classes, 72-140 px); ``half_a``/``half_b``: 6 of them split in two."""
    files = []
    for cls in ("a", "b"):
        (root / "all" / cls).mkdir(parents=True, exist_ok=True)
    for n in range(2 * PER_CLASS):
        im = photos[n % len(photos)]
        w, h = im.size
        crop = im.crop((n * 9, n * 5, w - n * 4, h - n * 6))
        crop.thumbnail((140 - 7 * n, 140 - 7 * n))
        path = root / "all" / "ab"[n % 2] / f"p{n}.jpg"
        crop.save(path, quality=87)
        files.append(path)
    for half, picked in (("half_a", files[:3] + files[5:6]), ("half_b", files[6:8])):
        for p in picked:
            (root / half / p.parent.name).mkdir(parents=True, exist_ok=True)
            (root / half / p.parent.name / p.name).write_bytes(p.read_bytes())


# --- the transform shapes (module level: they pickle by reference for forkserver's workers) ----------------------

class CallableTransform:
    """A plain class with ``__call__``: crop, then a tensor."""

    def __call__(self, im: Image.Image) -> torch.Tensor:
        import torchvision.transforms.functional as F

        return F.to_tensor(F.center_crop(im, [40, 40]))


def resized_tensor(im: Image.Image, size: int) -> torch.Tensor:
    import torchvision.transforms.functional as F

    return F.pil_to_tensor(F.resize(im, [size, size]))


def grey_levels(im: Image.Image) -> Image.Image:
    """A ``T.Lambda`` step: the image posterised by PIL (user code between two planned steps)."""
    from PIL import ImageOps

    return ImageOps.posterize(im, 4)


class Label:
    """A ``target_transform``: the class times ten, plus the calls so far (it counts as a user's callable)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, y: int) -> int:
        self.calls += 1
        return y * 10


class PresetTrain:
    """torchvision's reference ``ClassificationPresetTrain``'s shape: a class whose ``transforms`` attribute is a
    Compose, and whose ``__call__`` calls it."""

    def __init__(self, size: int) -> None:
        import torchvision.transforms as T

        self.transforms = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(0.5), T.PILToTensor(),
                                     T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)])

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


def keep_list(batch: list[Any]) -> list[Any]:
    """A ``collate_fn`` for PIL samples: the list as it is."""
    return batch


def _pets(size: int = 48) -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def _shape(name: str) -> dict[str, Any]:
    """``{"transform": ..., "target_transform": ..., "transforms": ..., "collate_fn": ...}`` for a shape."""
    import torchvision.transforms as T
    from torchvision.transforms import v2

    if name == "none":
        return {"collate_fn": keep_list}
    if name == "target_alone":
        return {"target_transform": Label(), "collate_fn": keep_list}
    if name == "v1_one":
        return {"transform": T.ToTensor(), "collate_fn": keep_list}  # (the photos' sizes differ)
    if name == "v2_one":
        return {"transform": v2.ToImage(), "collate_fn": keep_list}
    if name == "lambda":
        return {"transform": lambda im: resized_tensor(im, 36)}
    if name == "callable":
        return {"transform": CallableTransform()}
    if name == "partial":
        return {"transform": functools.partial(resized_tensor, size=36)}
    if name == "sequential":
        return {"transform": torch.nn.Sequential(T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                                                 v2.PILToTensor())}
    if name == "preset":
        return {"transform": PresetTrain(48)}
    if name == "v1_compose":
        return {"transform": _pets(), "target_transform": Label()}
    if name == "v2_compose":
        return {"transform": v2.Compose([v2.RandomResizedCrop(48), v2.RandomHorizontalFlip(), v2.ToImage(),
                                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])}
    if name == "nested":
        return {"transform": T.Compose([T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip()]),
                                        T.ToTensor(), T.Normalize(MEAN, STD)])}
    if name == "compose_lambda":
        return {"transform": T.Compose([T.RandomResizedCrop(48), T.Lambda(grey_levels), T.ToTensor()])}
    if name == "apply_choice":
        return {"transform": T.Compose([T.RandomApply([T.ColorJitter(0.3, 0.3)], p=0.5),
                                        T.RandomChoice([T.RandomHorizontalFlip(), T.RandomVerticalFlip()]),
                                        T.RandomResizedCrop(40), T.ToTensor()])}
    if name == "timm_train":
        from timm.data import create_transform

        return {"transform": create_transform(48, is_training=True)}
    if name == "timm_eval":
        from timm.data import create_transform

        return {"transform": create_transform(48)}
    if name == "joint":
        return {"transforms": v2.Compose([v2.RandomResizedCrop(48), v2.RandomHorizontalFlip(), v2.ToImage(),
                                          v2.ToDtype(torch.float32, scale=True)])}
    raise ValueError(f"unknown shape {name!r}")


#: every transform shape; ``joint`` (v2's ``transforms=``) only with a dataset that takes it
SHAPES = ("none", "v1_one", "v2_one", "lambda", "callable", "partial", "sequential", "preset", "v1_compose",
          "v2_compose", "nested", "compose_lambda", "apply_choice", "timm_train", "timm_eval", "target_alone", "joint")


# --- the dataset kinds --------------------------------------------------------------------------------------------

def open_rgb(path: str) -> Image.Image:
    """DatasetFolder's own loader, as a user writes it."""
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


class OwnDataset(torch.utils.data.Dataset):
    """A user's own Dataset: a file list, ``Image.open(path).convert("RGB")``, its transforms applied as
    torchvision's ``VisionDataset`` applies them (``transforms=`` joint, else transform and target_transform)."""

    def __init__(self, root: str, transform: Any = None, target_transform: Any = None, transforms: Any = None):
        self.files = sorted(Path(root).rglob("*.jpg"))
        self.classes = sorted({p.parent.name for p in self.files})
        self.transform, self.target_transform, self.transforms = transform, target_transform, transforms

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        path = self.files[i]
        img = Image.open(path).convert("RGB")
        label = self.classes.index(path.parent.name)
        if self.transforms is not None:
            return self.transforms(img, label)
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return img, label


#: the dataset kinds, and whether each takes v2's joint ``transforms=``
DATASETS = {"imagefolder": False, "datasetfolder": False, "own": True, "subset": False, "concat": False,
            "timm": False}


def make_dataset(kind: str, root: Path, shape: dict[str, Any]) -> Any:
    from torchvision import datasets

    tf = {k: shape.get(k) for k in ("transform", "target_transform")}
    if kind == "imagefolder":
        return datasets.ImageFolder(str(root / "all"), **tf)
    if kind == "datasetfolder":
        return datasets.DatasetFolder(str(root / "all"), loader=open_rgb, extensions=(".jpg",), **tf)
    if kind == "own":
        return OwnDataset(str(root / "all"), transforms=shape.get("transforms"), **tf)
    if kind == "subset":
        return torch.utils.data.Subset(datasets.ImageFolder(str(root / "all"), **tf), [9, 2, 7, 4, 0, 5, 3, 8])
    if kind == "concat":
        return torch.utils.data.ConcatDataset([datasets.ImageFolder(str(root / half), **tf)
                                               for half in ("half_a", "half_b")])
    if kind == "timm":
        from timm.data import ImageDataset

        return ImageDataset(str(root / "all"), **tf)
    raise ValueError(f"unknown dataset {kind!r}")


# --- one case ---------------------------------------------------------------------------------------------------

def seed(n: int) -> None:
    torch.manual_seed(n)
    random.seed(n)
    np.random.seed(n)


def run_case(case: dict[str, Any], root: Path, patched: bool) -> list[str]:
    """The case's events: each epoch's batches, the generators after each epoch, its error, its warnings."""
    rec = Recorder()
    seed(case["seed"])
    if patched:
        import nano_patch
        from nano_patch import sysinfo

        nano_patch.patch_torch(virtual_workers=case["virtual"])
        sysinfo.usable_cores = lambda: case["cores"]  # (the loader's thread counts as on that many cores)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            shape = _shape(case["shape"])
            dataset = make_dataset(case["dataset"], root, shape)
            kw: dict[str, Any] = {"batch_size": case["batch_size"], "shuffle": True,
                                  "num_workers": case["workers"]}
            if shape.get("collate_fn") is not None:
                kw["collate_fn"] = shape["collate_fn"]
            if case["workers"]:
                kw["persistent_workers"] = case["persistent"]
            loader = torch.utils.data.DataLoader(dataset, **kw)
            for e in range(case["epochs"]):
                for b, batch in enumerate(loader):
                    rec.add(f"epoch {e} batch {b}: {rec.value(batch)}")
                rec.generators(f"epoch {e} end")
            label = shape.get("target_transform")
            if label is not None and not case["workers"]:  # (in workers, the calls are the workers' copies')
                rec.add(f"target_transform calls {label.calls}")
            del loader
        except Exception as exc:  # noqa: BLE001 - recorded: stock's error is part of its behaviour
            rec.add(f"case {error(exc)}")
        rec.generators("case end")
    rec.warnings(caught)
    return rec.events


if __name__ == "__main__":
    # (the stock workers' start is shorter: the patch preloads its own server where it starts one first)
    run_cases(run_case, ["torch", "torchvision", "PIL.Image", "numpy"], preload_stock_only=True)
