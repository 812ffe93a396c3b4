"""Stock against patched for torchvision's array datasets: dataset x pipeline x loading x start method.

Run once per side and start method in a fresh process::

    python array_matrix.py SIDE START_METHOD ROOT CASES_JSON OUT_JSON

SIDE is ``stock`` or ``patched`` (``patch_torch()``). Each case (a dict made by ``tests/test_array_datasets.py``)
runs from the same seeds on both sides and records its events: every batch (dtype, shape, strides, bytes, the
targets), the three global generators after each epoch, the error it ends with, its warnings. The files are
``examples/make_array_datasets.py``'s, made from real photographs (:func:`make_files`).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from dropin_probe import Recorder, error, run_cases, seed  # noqa: E402
from make_array_datasets import make, open_dataset  # noqa: E402

KINDS = ("cifar10", "cifar100", "svhn", "stl10", "mnist", "fashionmnist", "kmnist", "emnist", "qmnist")
IMAGES = {"stl10": 40}
RGB = ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])
GREY = ((0.1307,), (0.3081,))
#: pipelines: the tutorials' and the variants around them (the last ones are not the array path's: stock's code)
PIPELINES = ("tutorial", "reflect", "edge_center", "pad_if_needed", "totensor", "target_draws", "fill_tuple",
             "small_pixel_limit", "jitter", "none", "std_zero", "crop_too_big", "three_means", "pil_to_tensor")

#: pipelines stock raises for (at the first batch)
ERRORS = ("none", "std_zero", "crop_too_big", "three_means")


def make_files(root: Path) -> None:
    for kind in KINDS:
        make(root, kind, IMAGES.get(kind, 80), seed=KINDS.index(kind))


def side_of(kind: str) -> int:
    return 96 if kind == "stl10" else 32 if kind in ("cifar10", "cifar100", "svhn") else 28


def grey(kind: str) -> bool:
    return side_of(kind) == 28


def target_draw(y: Any) -> Any:
    """A target_transform that draws from torch's generator between samples."""
    return (y if isinstance(y, int) else int(y[0])) * 10 + int(torch.randint(0, 5, (1,)).item())


def pipeline(name: str, kind: str) -> tuple[Any, Any]:
    """(transform, target_transform) of ``name`` for ``kind``'s images."""
    import torchvision.transforms as T

    side = side_of(kind)
    norm = T.Normalize(*(GREY if grey(kind) else RGB))
    if name == "small_pixel_limit":
        return T.Compose([T.RandomCrop(side, padding=2), T.RandomHorizontalFlip(), T.ToTensor()]), None
    if name in ("tutorial", "target_draws"):
        steps = [T.RandomCrop(side, padding=side // 8), T.RandomHorizontalFlip()] if kind in (
            "cifar10", "cifar100", "stl10") else []
        return T.Compose([*steps, T.ToTensor(), norm]), target_draw if name == "target_draws" else None
    if name == "reflect":
        return T.Compose([T.RandomCrop(side - 2, padding=(2, 3, 1, 4), padding_mode="reflect"),
                          T.RandomVerticalFlip(0.4), T.ToTensor()]), None
    if name == "edge_center":
        return T.Compose([T.Pad(3, padding_mode="edge"), T.CenterCrop(side + 1), T.RandomHorizontalFlip(0.7),
                          T.ToTensor(), T.Normalize([0.5], [0.25])]), None
    if name == "pad_if_needed":
        return T.Compose([T.RandomCrop(side + 6, pad_if_needed=True, fill=9), T.CenterCrop(side + 9),
                          T.ToTensor()]), None
    if name == "totensor":
        return T.Compose([T.ToTensor()]), None
    if name == "fill_tuple":
        fill = (7,) if grey(kind) else (5, 100, 250)
        return T.Compose([T.RandomCrop(side, padding=[3, 1], fill=fill), T.RandomHorizontalFlip(),
                          T.ToTensor(), norm]), None
    if name == "jitter":
        return T.Compose([T.RandomCrop(side, padding=4), T.ColorJitter(0.3, 0.3), T.ToTensor(), norm]), None
    if name == "none":
        return None, None
    if name == "std_zero":
        return T.Compose([T.ToTensor(), T.Normalize([0.5], [0.0])]), None
    if name == "crop_too_big":
        return T.Compose([T.RandomCrop(side + 5), T.ToTensor()]), None
    if name == "three_means":
        return T.Compose([T.ToTensor(), T.Normalize(*RGB)]), None
    return T.Compose([T.RandomHorizontalFlip(), T.PILToTensor()]), None


def run_case(case: dict[str, Any], root: Path, patched: bool) -> list[str]:
    rec = Recorder()
    seed(case["seed"])
    if patched:
        import nano_patch

        nano_patch.patch_torch()
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if case["pipeline"] == "small_pixel_limit":  # a crop's box over PIL's limit: stock's warning per crop
        Image.MAX_IMAGE_PIXELS = side_of(case["kind"]) ** 2 - 100
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            transform, target_transform = pipeline(case["pipeline"], case["kind"])
            ds = open_dataset(case["kind"], root, transform=transform, target_transform=target_transform)
            kw: dict[str, Any] = {"batch_size": case["batch_size"], "shuffle": True, "num_workers": case["workers"]}
            if case["workers"]:
                kw["persistent_workers"] = case["persistent"]
            loader = torch.utils.data.DataLoader(ds, **kw)
            for e in range(2):
                for b, batch in enumerate(loader):
                    rec.add(f"epoch {e} batch {b}: {rec.value(batch)}")
                rec.generators(f"epoch {e} end")
            del loader
        except Exception as exc:  # noqa: BLE001 - recorded: stock's error is part of its behaviour
            rec.add(f"case {error(exc)}")
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        rec.generators("case end")
    rec.warnings(caught)
    return rec.events


if __name__ == "__main__":
    run_cases(run_case, ["torch", "torchvision.datasets", "torchvision.transforms"])
