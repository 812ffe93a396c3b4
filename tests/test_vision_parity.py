"""Patched transforms against stock torchvision, called in the same process, at torchvision's own bars.

Stock outputs are computed first, unpatched, with a seed; the same pipeline then runs patched with
the same seed. The torch RNG state afterwards must be identical (same draws), and the images within:
crops/flips/pads/ToTensor exact; Normalize 1e-6; bilinear resize max 1, mean 0.5; bicubic mean 0.5;
brightness/contrast/saturation/sharpness max 2; hue max 16; rotation/affine/perspective mean 8.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

import nano_patch

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IM = T.InterpolationMode

# name -> (transform factory, max abs bar, mean abs bar, also on grayscale)
CASES = {
    "resize_bilinear": (lambda: T.Resize(224), 1, 0.5, True),
    "resize_bicubic": (lambda: T.Resize((200, 150), interpolation=IM.BICUBIC), None, 0.5, True),
    "resize_up": (lambda: T.Resize(640), 1, 0.5, True),
    "resize_nearest": (lambda: T.Resize(123, interpolation=IM.NEAREST), 0, 0, True),
    "center_crop": (lambda: T.CenterCrop(200), 0, 0, True),
    "center_crop_pad": (lambda: T.CenterCrop(700), 0, 0, True),
    "random_crop_pad": (lambda: T.RandomCrop(300, padding=20, pad_if_needed=True), 0, 0, True),
    "flips": (lambda: T.Compose([T.RandomHorizontalFlip(), T.RandomVerticalFlip()]), 0, 0, True),
    "pad_constant": (lambda: T.Pad(7, fill=10), 0, 0, True),
    "pad_reflect": (lambda: T.Pad((3, 5), padding_mode="reflect"), 0, 0, True),
    "pad_symmetric": (lambda: T.Pad((1, 2, 3, 4), padding_mode="symmetric"), 0, 0, True),
    "five_crop": (lambda: T.FiveCrop(100), 0, 0, True),
    "ten_crop": (lambda: T.TenCrop(90, vertical_flip=True), 0, 0, True),
    "to_tensor": (lambda: T.ToTensor(), 0, 0, True),
    "pil_to_tensor": (lambda: T.PILToTensor(), 0, 0, True),
    "to_tensor_normalize": (lambda: T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]), 1e-6, 1e-6, False),
    "brightness": (lambda: T.ColorJitter(brightness=0.6), 2, 2, True),
    "contrast": (lambda: T.ColorJitter(contrast=0.6), 2, 2, True),
    "saturation": (lambda: T.ColorJitter(saturation=0.6), 2, 2, False),
    "hue": (lambda: T.ColorJitter(hue=0.4), 16, 16, False),
    "color_jitter": (lambda: T.ColorJitter(0.4, 0.4, 0.4), 2, 2, False),
    "sharpness": (lambda: T.RandomAdjustSharpness(2.5, p=1), 2, 2, True),
    "grayscale": (lambda: T.Grayscale(3), 1, 1, True),
    "random_grayscale": (lambda: T.RandomGrayscale(0.5), 1, 1, True),
    "gaussian_blur": (lambda: T.GaussianBlur(5, (0.5, 2.0)), 1, 0.5, True),
    "rotation": (lambda: T.RandomRotation(30), None, 8, True),
    "rotation_bilinear_expand": (lambda: T.RandomRotation(30, IM.BILINEAR, expand=True), None, 8, True),
    "affine": (lambda: T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10), None, 8, True),
    "perspective": (lambda: T.RandomPerspective(p=1.0), None, 8, True),
    "invert": (lambda: T.RandomInvert(1.0), 0, 0, True),
    "posterize": (lambda: T.RandomPosterize(3, 1.0), 0, 0, True),
    "solarize": (lambda: T.RandomSolarize(100, 1.0), 0, 0, True),
    "autocontrast": (lambda: T.RandomAutocontrast(1.0), 0, 0, True),
    "equalize": (lambda: T.RandomEqualize(1.0), 0, 0, True),
    "autoaugment": (lambda: T.AutoAugment(), None, 8, False),
    "randaugment": (lambda: T.RandAugment(), None, 8, False),
    "trivialaugment": (lambda: T.TrivialAugmentWide(), None, 8, False),
    "augmix_stock": (lambda: T.AugMix(), 0, 0, False),
    "elastic_stock": (lambda: T.ElasticTransform(alpha=30.0), 0, 0, False),
    "lambda_stock": (lambda: T.Compose([T.Resize(100), T.Lambda(lambda im: im.rotate(10)), T.CenterCrop(80)]), 1, 0.5,
                     False),
    "random_apply_choice_order": (
        lambda: T.Compose([T.RandomApply([T.ColorJitter(0.3)], p=0.7), T.RandomChoice([T.RandomHorizontalFlip(1),
                          T.RandomVerticalFlip(1)]), T.RandomOrder([T.CenterCrop(200), T.Pad(3)])]), 2, 2, False),
    "pipeline_a": (lambda: T.Compose([T.Resize(256), T.ColorJitter(0.4, 0.4, 0.4), T.RandomCrop(224),
                                      T.RandomHorizontalFlip(), T.Resize(128), T.ToTensor()]), 3, 0.5, False),
    "pipeline_b": (lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                      T.Normalize(MEAN, STD)]), 1 / 255 / min(STD) + 1e-5, 0.5 / 255 / min(STD), False),
    "pipeline_c": (lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
                   1 / 255 / min(STD) + 1e-5, 0.5 / 255 / min(STD), False),
}


def synthetic_images() -> list[Image.Image]:
    """A gradient with sharp edges and a small odd-sized image: cases the photos may not cover."""
    y, x = np.mgrid[0:241, 0:317]
    grad = np.stack([(x * 255 // 316), (y * 255 // 240), ((x + y) % 256)], -1).astype(np.uint8)
    grad[100:140, 50:250] = [255, 0, 0]
    small = np.zeros((37, 53, 3), np.uint8)
    small[::2, ::3] = 200
    return [Image.fromarray(grad), Image.fromarray(small)]


def _as_float(x):
    if isinstance(x, (tuple, list)):
        return np.stack([_as_float(i) for i in x])
    if isinstance(x, torch.Tensor):
        return x.double().numpy()
    return np.asarray(x).astype(np.float64)


def _unit(x) -> float:
    """Bars are on the 0-255 scale; float tensors in [0, 1] are compared in that unit."""
    first = x[0] if isinstance(x, (tuple, list)) else x
    return 255.0 if isinstance(first, torch.Tensor) and first.is_floating_point() else 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_patched_matches_stock(name, photos):
    make, max_bar, mean_bar, gray_too = CASES[name]
    images = list(photos) + synthetic_images()
    if gray_too:
        images += [photos[0].convert("L")]
    if name == "center_crop_pad":
        images = [im for im in images if min(im.size) < 700]
    seeds = range(4)
    stock, states = [], []
    for im in images:
        for s in seeds:
            torch.manual_seed(s)
            random.seed(s)
            try:
                stock.append(make()(im))
            except Exception as exc:  # noqa: BLE001 - stock errors must be matched, not hidden
                stock.append(exc)
            states.append((torch.get_rng_state(), random.getstate()))
    nano_patch.patch_torch()
    k = 0
    for im in images:
        for s in seeds:
            torch.manual_seed(s)
            random.seed(s)
            ref = stock[k]
            if isinstance(ref, Exception):
                with pytest.raises(type(ref)):
                    make()(im)
                k += 1
                continue
            out = make()(im)
            assert torch.equal(torch.get_rng_state(), states[k][0]), f"{name}: torch draws differ from stock"
            assert random.getstate() == states[k][1], f"{name}: python random draws differ from stock"
            assert type(out) is type(ref)
            if isinstance(ref, Image.Image):
                assert out.mode == ref.mode and out.size == ref.size
            a, b = _as_float(out), _as_float(ref)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            diff = np.abs(a - b) * (_unit(ref) if "normalize" not in name and "pipeline_b" not in name
                                    and "pipeline_c" not in name else 1.0)
            if max_bar is not None:
                assert diff.max() <= max_bar, f"{name}: max abs diff {diff.max()} > {max_bar}"
            assert diff.mean() <= mean_bar, f"{name}: mean abs diff {diff.mean()} > {mean_bar}"
            k += 1


def test_types_in_equal_types_out(photos):
    import torchvision.transforms.functional as F

    nano_patch.patch_torch()
    arr = np.asarray(photos[0])
    assert isinstance(F.resize(photos[0], 50), Image.Image)
    out = F.resize(arr, 50)
    assert isinstance(out, np.ndarray) and out.shape[0] == 50
    assert isinstance(T.Compose([T.Resize(60), T.CenterCrop(50)])(arr), np.ndarray)
    t = F.pil_to_tensor(photos[0])
    assert torch.equal(F.resize(t, 50, antialias=True), T.Resize(50)(t))  # tensors take the stock path


def test_geometry_is_exact(photos):
    """Crop boxes and flips: with the same seed, patched output equals stock bit for bit."""
    make = lambda: T.Compose([T.RandomCrop(200), T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.PILToTensor()])  # noqa: E731
    ref = []
    for s in range(10):
        torch.manual_seed(s)
        ref.append(make()(photos[1]))
    nano_patch.patch_torch()
    for s in range(10):
        torch.manual_seed(s)
        assert torch.equal(make()(photos[1]), ref[s])


def test_transforms_pickle_and_run_in_spawned_workers(image_folder):
    import pickle

    import torchvision.transforms.functional as F
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    nano_patch.patch_torch()
    pipe = T.Compose([T.RandomResizedCrop(64), T.Lambda(F.hflip), T.ToTensor()])
    assert pickle.loads(pickle.dumps(pipe)).transforms[1].lambd is F.hflip
    ds = ImageFolder(str(image_folder), transform=pipe)
    for ctx in ("fork", "spawn"):
        torch.manual_seed(0)
        batches = list(DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx))
        assert sum(len(b[0]) for b in batches) == len(ds)
        assert batches[0][0].shape[1:] == (3, 64, 64)


@pytest.mark.parametrize("std", [[0.229, 0.224, 0.225], [0.01, 0.5, 0.5], [0.0, 1.0, 1.0]])
def test_fused_to_tensor_normalize(photos, std):
    """The fused ToTensor+Normalize is within 1e-6 of stock; a tiny std (large outputs) takes stock's
    own arithmetic, and a zero std raises stock's error."""
    import torchvision.transforms.functional as F

    from nano_patch.vision import functional as K

    arr = np.ascontiguousarray(np.asarray(photos[1])[:120, :160])
    mean = [0.485, 0.456, 0.406]
    if 0.0 in std:
        with pytest.raises(ValueError, match="std evaluated to zero"):
            F.normalize(F.to_tensor(arr), mean, std)
        with pytest.raises(ValueError, match="std evaluated to zero"):
            K.to_tensor_normalized(arr, mean, std)
        return
    want = F.normalize(F.to_tensor(arr), mean, std)
    got = K.to_tensor_normalized(arr, mean, std)
    assert got.shape == want.shape and got.dtype == want.dtype
    if min(std) < 0.125:
        assert torch.equal(got, want)
    else:
        assert (got - want).abs().max() <= 1e-6
