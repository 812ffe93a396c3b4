"""Patched transforms against stock torchvision, called in the same process, at torchvision's own bars.

Stock outputs are computed first, unpatched, with a seed; the same pipeline then runs patched with
the same seed. The states of torch's, Python's and NumPy's generators afterwards must be identical
(same draws), and the images within: crops/flips/pads, ToTensor (+ Normalize), every colour and
point op, resize, and every rotation, affine and perspective (nearest, bilinear, bicubic) exact;
Gaussian blur max 1, mean 0.5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state, seed_all
from PIL import Image

import nano_patch

F = T.functional
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IM = T.InterpolationMode

# name -> (transform factory, max abs bar, mean abs bar, also on grayscale)
CASES = {
    "resize_bilinear": (lambda: T.Resize(224), 0, 0, True),
    "resize_bicubic": (lambda: T.Resize((200, 150), interpolation=IM.BICUBIC), 0, 0, True),
    "resize_up": (lambda: T.Resize(640), 0, 0, True),
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
    "to_tensor_normalize": (lambda: T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]), 0, 0, True),
    "brightness": (lambda: T.ColorJitter(brightness=0.6), 0, 0, True),
    "contrast": (lambda: T.ColorJitter(contrast=0.6), 0, 0, True),
    "saturation": (lambda: T.ColorJitter(saturation=0.6), 0, 0, True),
    "hue": (lambda: T.ColorJitter(hue=0.4), 0, 0, True),
    "color_jitter": (lambda: T.ColorJitter(0.4, 0.4, 0.4, 0.1), 0, 0, True),
    "sharpness": (lambda: T.RandomAdjustSharpness(2.5, p=1), 0, 0, True),
    "grayscale": (lambda: T.Grayscale(3), 0, 0, True),
    "random_grayscale": (lambda: T.RandomGrayscale(0.5), 0, 0, True),
    "gaussian_blur": (lambda: T.GaussianBlur(5, (0.5, 2.0)), 1, 0.5, True),
    "rotation": (lambda: T.RandomRotation(30), 0, 0, True),
    "rotation_bilinear_expand": (lambda: T.RandomRotation(30, IM.BILINEAR, expand=True), 0, 0, True),
    "rotation_bicubic_fill": (lambda: T.RandomRotation(30, IM.BICUBIC, fill=(10, 200, 30)), 0, 0, False),
    "affine": (lambda: T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10), 0, 0, True),
    "affine_bilinear": (lambda: T.RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10, IM.BILINEAR, fill=77), 0, 0, True),
    "perspective": (lambda: T.RandomPerspective(p=1.0), 0, 0, True),
    "perspective_bicubic": (lambda: T.RandomPerspective(0.6, 1.0, IM.BICUBIC), 0, 0, True),
    "gamma": (lambda: T.Lambda(lambda im: F.adjust_gamma(im, 0.7, 1.2)), 0, 0, True),
    "invert": (lambda: T.RandomInvert(1.0), 0, 0, True),
    "posterize": (lambda: T.RandomPosterize(3, 1.0), 0, 0, True),
    "solarize": (lambda: T.RandomSolarize(100, 1.0), 0, 0, True),
    "autocontrast": (lambda: T.RandomAutocontrast(1.0), 0, 0, True),
    "equalize": (lambda: T.RandomEqualize(1.0), 0, 0, True),
    "autoaugment": (lambda: T.AutoAugment(), 0, 0, False),
    "randaugment": (lambda: T.RandAugment(), 0, 0, False),
    "trivialaugment": (lambda: T.TrivialAugmentWide(), 0, 0, False),
    "augmix_stock": (lambda: T.AugMix(), 0, 0, False),
    "elastic_stock": (lambda: T.ElasticTransform(alpha=30.0), 0, 0, False),
    "lambda_stock": (lambda: T.Compose([T.Resize(100), T.Lambda(lambda im: im.rotate(10)), T.CenterCrop(80)]), 0, 0,
                     False),
    "random_apply_choice_order": (
        lambda: T.Compose([T.RandomApply([T.ColorJitter(0.3)], p=0.7), T.RandomChoice([T.RandomHorizontalFlip(1),
                          T.RandomVerticalFlip(1)]), T.RandomOrder([T.CenterCrop(200), T.Pad(3)])]), 0, 0, False),
    "pipeline_a": (lambda: T.Compose([T.Resize(256), T.ColorJitter(0.4, 0.4, 0.4), T.RandomCrop(224),
                                      T.RandomHorizontalFlip(), T.Resize(128), T.ToTensor()]), 0, 0, False),
    "pipeline_b": (lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                      T.Normalize(MEAN, STD)]), 0, 0, False),
    "pipeline_c": (lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
                   0, 0, False),
}


def synthetic_images() -> list[Image.Image]:
    """A gradient with sharp edges, and tiny, odd-sized, flat and extreme images: where rounding shows."""
    y, x = np.mgrid[0:241, 0:317]
    grad = np.stack([(x * 255 // 316), (y * 255 // 240), ((x + y) % 256)], -1).astype(np.uint8)
    grad[100:140, 50:250] = [255, 0, 0]
    small = np.zeros((37, 53, 3), np.uint8)
    small[::2, ::3] = 200
    extremes = np.zeros((5, 7, 3), np.uint8)  # pure primaries, black, white, one channel at 255
    extremes[0] = 255
    extremes[1, :, 0], extremes[2, :, 1], extremes[3, :, 2], extremes[4] = 255, 255, 255, [255, 0, 255]
    tiny = [Image.fromarray(grad[:1, :1]), Image.fromarray(grad[98:100, 49:51]), Image.fromarray(grad[:3, :1]),
            Image.fromarray(grad[90:103, 40:57])]
    flat = [Image.new("RGB", (6, 5), (0, 0, 0)), Image.new("RGB", (6, 5), (255, 255, 255)),
            Image.new("RGB", (3, 3), (255, 0, 0))]
    return [Image.fromarray(grad), Image.fromarray(small), Image.fromarray(extremes), *tiny, *flat]


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
        images += [photos[0].convert("L"), Image.fromarray(np.array([[0, 255], [128, 1]], np.uint8)),
                   Image.new("L", (1, 1), 255), Image.new("L", (5, 3), 0)]
    if name == "center_crop_pad":
        images = [im for im in images if min(im.size) < 700]
    seeds = range(4)
    stock, states = [], []
    for im in images:
        for s in seeds:
            seed_all(s)
            try:
                stock.append(make()(im))
            except Exception as exc:  # noqa: BLE001 - stock errors must be matched, not hidden
                stock.append(exc)
            states.append(rng_state())
    nano_patch.patch_torch()
    k = 0
    for im in images:
        for s in seeds:
            seed_all(s)
            ref = stock[k]
            if isinstance(ref, Exception):
                with pytest.raises(type(ref)):
                    make()(im)
                k += 1
                continue
            out = make()(im)
            assert not rng_differences(rng_state(), states[k]), (name, rng_differences(rng_state(), states[k]))
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


@pytest.mark.parametrize("policy", [
    lambda: T.RandAugment(num_ops=3, magnitude=15),
    lambda: T.AutoAugment(T.AutoAugmentPolicy.SVHN),
    lambda: T.TrivialAugmentWide(fill=[128, 0, 255]),
    lambda: T.AugMix(severity=5),
], ids=["randaugment", "autoaugment_svhn", "trivialaugment_fill", "augmix"])
def test_auto_augment_policies_are_exact(policy, photos):
    """Their geometric ops (the native warp) and their colour ops are exact, so whole policies equal
    stock bit for bit, on plain images and inside a Compose, over many draws."""
    make = [lambda: policy(), lambda: T.Compose([T.RandomResizedCrop(112), T.ColorJitter(0.2, 0.2, 0.2, 0.05),
                                                 policy()])]
    # a third of the photos' size: AugMix's tensor arithmetic is slow on stock's side
    images = [photos[0].reduce(3), photos[1].reduce(3).convert("L").convert("RGB"), synthetic_images()[0]]
    calls = [(m, im, seed) for m in make for im in images for seed in range(12)]

    def run(m, im, seed):
        seed_all(seed)
        return np.asarray(m()(im)), rng_state()

    stock = [run(*c) for c in calls]
    nano_patch.patch_torch()
    for c, (want, want_rng) in zip(calls, stock):
        got, got_rng = run(*c)
        assert not rng_differences(got_rng, want_rng), (c[2], rng_differences(got_rng, want_rng))
        assert got.shape == want.shape and np.array_equal(got, want), (
            c[2], np.abs(got.astype(int) - want.astype(int)).max())


def test_types_in_equal_types_out_and_user_arrays_stay_stocks(photos):
    """PIL in gives a plain PIL image out; a user's ndarray is stock's to reject, as stock rejects it."""
    import torchvision.transforms.functional as F

    arr = np.asarray(photos[0])
    t = F.pil_to_tensor(photos[0])
    stock_tensor = T.Resize(50)(t)
    stock_errors = []
    for call in (lambda: F.rotate(arr, 10), lambda: F.resize(arr, 50), lambda: T.Compose([T.Resize(60)])(arr)):
        with pytest.raises(TypeError) as info:
            call()
        stock_errors.append(str(info.value))
    nano_patch.patch_torch()
    out = F.resize(photos[0], 50)
    assert type(out) is Image.Image and min(out.size) == 50
    assert type(T.Compose([T.Resize(60), T.CenterCrop(50)])(photos[0])) is Image.Image
    for call, message in zip((lambda: F.rotate(arr, 10), lambda: F.resize(arr, 50),
                              lambda: T.Compose([T.Resize(60)])(arr)), stock_errors):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == message
    for got in (F.resize(t, 50, antialias=True), T.Resize(50)(t)):  # tensors take the stock path
        assert got.dtype == stock_tensor.dtype and torch.equal(got, stock_tensor)


def test_geometry_is_exact(photos):
    """Crop boxes and flips: with the same seed, patched output equals stock bit for bit."""
    make = lambda: T.Compose([T.RandomCrop(200), T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.PILToTensor()])  # noqa: E731
    ref = []
    for s in range(10):
        seed_all(s)
        ref.append((make()(photos[1]), rng_state()))
    nano_patch.patch_torch()
    for s in range(10):
        seed_all(s)
        assert torch.equal(make()(photos[1]), ref[s][0])
        assert not rng_differences(rng_state(), ref[s][1])


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


@pytest.mark.parametrize("std", [[0.229, 0.224, 0.225], [0.01, 0.5, 0.5], [0.0, 1.0, 1.0], [0.3]])
def test_fused_to_tensor_normalize(photos, std):
    """The fused ToTensor+Normalize tail equals stock bit for bit, and a zero std raises stock's error."""
    im = photos[1].crop((0, 0, 160, 120))
    gray = im.getchannel(1)
    mean = [0.485, 0.456, 0.406]

    def pipelines():
        return (T.Compose([T.ToTensor(), T.Normalize(mean, std)]),
                T.Compose([T.ToTensor(), T.Normalize([0.5], std[:1])]))

    if 0.0 in std:
        for patched in (False, True):
            if patched:
                nano_patch.patch_torch()
            with pytest.raises(ValueError, match="std evaluated to zero"):
                pipelines()[0](im)
        return
    rgb, grey = pipelines()
    want = rgb(im), grey(gray)
    nano_patch.patch_torch()
    got = rgb(im), grey(gray)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        assert torch.equal(g, w)


COLOUR_OPS = {
    "adjust_brightness": [0.0, 0.3, 1.0, 1.7, 2.5],
    "adjust_contrast": [0.0, 0.3, 1.0, 1.7, 2.5],
    "adjust_saturation": [0.0, 0.3, 1.0, 1.7, 2.5],
    "adjust_hue": [-0.5, -0.3, 0.0, 0.1, 0.5],
    "adjust_sharpness": [0.0, 0.3, 1.0, 1.7, 2.5],
    "adjust_gamma": [0.0, 0.5, 1.0, 2.2],
    "to_grayscale": [1, 3],
    "rgb_to_grayscale": [1, 3],
    "invert": [None],
    "posterize": [1, 4, 8],
    "solarize": [0, 1, 128, 255, 256],
    "autocontrast": [None],
    "equalize": [None],
}


def test_colour_and_point_ops_are_bit_exact(photos):
    """Every colour and point op equals stock bit for bit on RGB and L images of any size, called
    on a plain PIL image and inside a Compose (where the image travels as a FastImage)."""
    rgb = [photos[0], photos[1].crop((10, 20, 141, 97)), *synthetic_images()]
    images = rgb + [im.convert("L") for im in rgb]
    calls = [(op, v, im) for op, values in COLOUR_OPS.items() for v in values for im in images]

    def call(op, v, im, composed):
        fn = getattr(F, op)
        step = (lambda x: fn(x)) if v is None else (lambda x: fn(x, v))
        if composed:
            return T.Compose([T.Lambda(lambda x: x), T.RandomHorizontalFlip(0.0), T.Lambda(step)])(im)
        return step(im)

    stock = [np.asarray(call(op, v, im, False)) for op, v, im in calls]
    nano_patch.patch_torch()
    for composed in (False, True):
        for (op, v, im), want in zip(calls, stock):
            got = call(op, v, im, composed)
            assert type(got) is Image.Image, (op, type(got))
            got = np.asarray(got)
            assert got.shape == want.shape and np.array_equal(got, want), (
                f"{op}({v}) on {im.mode} {im.size}, composed={composed}: "
                f"max abs diff {np.abs(got.astype(int) - want.astype(int)).max()}")


def test_resize_is_exact_on_many_real_crops(photos):
    """Resize is PIL's own: over hundreds of real crops and scales (up and down, one axis or both,
    bilinear and bicubic), a FastImage resized by the patch equals stock pixel for pixel."""
    from nano_patch.vision.images.image import FastImage

    rng = np.random.default_rng(42)
    cases = []
    for i in range(240):
        im = photos[i % len(photos)]
        w, h = im.size
        ch, cw = int(rng.integers(2, h)), int(rng.integers(2, w))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        size = [int(rng.integers(1, 400)), int(rng.integers(1, 400))]
        if i % 7 == 0:
            size[0] = ch  # one axis only
        cases.append((im, top, left, ch, cw, size, IM.BICUBIC if i % 3 == 0 else IM.BILINEAR))
    stock = [np.asarray(F.resized_crop(im, *box, size, interp)) for im, *box, size, interp in cases]
    torch.manual_seed(42)
    rrc_stock = [T.RandomResizedCrop(224)(photos[i % len(photos)]) for i in range(64)]
    nano_patch.patch_torch()
    for (im, *box, size, interp), want in zip(cases, stock):
        got = F.resized_crop(FastImage.wrap(np.asarray(im)), *box, size, interp)
        assert isinstance(got, FastImage)
        assert np.array_equal(np.asarray(got), want), (im.size, box, size, interp)
    torch.manual_seed(42)
    for i, want in enumerate(rrc_stock):
        got = T.Compose([T.RandomResizedCrop(224)])(photos[i % len(photos)])
        assert np.array_equal(np.asarray(got), np.asarray(want))
