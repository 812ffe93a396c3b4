"""The patched torchvision.transforms (v1) accepts and rejects exactly what stock does.

Every public function of ``torchvision.transforms.functional`` and every transform class is called
with good and bad input: plain NumPy arrays, tensors of the wrong dtype or shape, PIL images of
every mode, tiny images, bad sizes and bad parameters. Stock runs first (unpatched, same process,
same seeds), then the patch. Each call must end the same way: the same exception class, or an
output of the same type, mode/dtype and size, equal pixel for pixel (warps and the auto-augment
policies included), with the same random draws.
"""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

import nano_patch

IM = T.InterpolationMode


def _photo(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x * 7 + y * 13) % 256)],
                    -1).astype(np.uint8)


def images() -> dict[str, object]:
    rgb = Image.fromarray(_photo(9, 11))
    rgb.info["dpi"] = (72, 72)  # PIL copies info into some results and not others: so must the patch
    out: dict[str, object] = {
        "pil_rgb": rgb,
        "pil_l": rgb.convert("L"),
        "pil_rgb_1x1": Image.fromarray(_photo(1, 1)),
        "pil_l_2x2": Image.fromarray(_photo(2, 2)).convert("L"),
        "pil_rgb_3x1": Image.fromarray(_photo(1, 3)),
        "pil_flat_255": Image.new("RGB", (5, 4), (255, 255, 255)),
        "ndarray_u8_hwc": _photo(9, 11),
        "ndarray_u8_hw": _photo(9, 11)[:, :, 0].copy(),
        "ndarray_f32_hwc": _photo(9, 11).astype(np.float32) / 255,
        "tensor_u8": torch.from_numpy(_photo(9, 11)).permute(2, 0, 1).contiguous(),
        "tensor_f32": torch.from_numpy(_photo(9, 11)).permute(2, 0, 1).float() / 255,
        "tensor_i32": torch.from_numpy(_photo(9, 11)).permute(2, 0, 1).int(),
        "tensor_bool": torch.ones(1, 9, 11, dtype=torch.bool),
        "tensor_f64_2d": torch.rand(9, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),
        "tensor_u8_4ch": torch.zeros(4, 9, 11, dtype=torch.uint8),
        "none": None,
        "list": [1, 2, 3],
    }
    for mode in ("RGBA", "P", "I;16", "I", "F", "1", "LA", "CMYK", "YCbCr", "HSV"):
        out[f"pil_{mode}"] = rgb.convert(mode)
    return out


# function -> list of argument tuples after the image (good ones and bad ones)
FUNCTION_ARGS: dict[str, list[tuple]] = {
    "get_dimensions": [()], "get_image_size": [()], "get_image_num_channels": [()],
    "to_tensor": [()], "pil_to_tensor": [()],
    "resize": [([6],), ([6, 4],), (5,), ([0],), ([-3],), ("6",), ([6], IM.NEAREST), ([6], IM.BICUBIC),
               ([6], IM.BOX), ([6], 99), ([6, 4, 2],), ([6], IM.BILINEAR, 7), ([6, 4], IM.BILINEAR, 7),
               ([6], IM.BILINEAR, 5), ((6, 4),)],
    "pad": [(2,), ([1, 2],), ([1, 2, 3, 4],), ([1, 2, 3],), (-1,), ([-1, 2],), (2, 7), (2, (1, 2, 3)),
            (2, (1, 2)), (2, 0, "reflect"), (2, 0, "edge"), (2, 0, "symmetric"), (2, 0, "wrap"), ("2",),
            (20, 0, "reflect"), (2, "x")],
    "crop": [(1, 2, 4, 5), (-2, -3, 20, 30), (0, 0, 0, 0), (1, 2, -4, 5), (1.5, 2, 4, 5)],
    "center_crop": [(4,), ([4, 6],), (30,), ([0],), ([4, 6, 8],), ("4",)],
    "resized_crop": [(1, 2, 5, 6, [4]), (1, 2, 5, 6, [4, 3], IM.NEAREST), (0, 0, 0, 0, [4]), (1, 2, 5, 6, 3)],
    "hflip": [()], "vflip": [()],
    "five_crop": [(3,), ([3, 4],), (20,)], "ten_crop": [(3,), (3, True), (20,)],
    "adjust_brightness": [(0.0,), (0.5,), (1.7,), (-1.0,), ("2",), (None,)],
    "adjust_contrast": [(0.0,), (0.5,), (1.7,), (-1.0,), ("2",)],
    "adjust_saturation": [(0.0,), (0.5,), (1.7,), (-1.0,), ("2",)],
    "adjust_hue": [(0.0,), (0.2,), (-0.5,), (0.5,), (0.6,), ("0.1",)],
    "adjust_gamma": [(1.0,), (0.5, 1.3), (2.2,), (-1.0,), (1.0, "2")],
    "adjust_sharpness": [(0.0,), (0.5,), (2.5,), (-1.0,), ("2",)],
    "rotate": [(10,), (90,), (180,), (270, IM.NEAREST, True), (33, IM.BILINEAR, True), (10, IM.BILINEAR, False,
               [2, 3]), (10, IM.NEAREST, False, None, [9]), (10, IM.NEAREST, False, None, [1, 2]),
               (10, IM.BICUBIC), ("10",), (10, IM.BOX)],
    "affine": [(10, [1, 2], 1.2, [5.0, 2.0]), (0, [0, 0], 1.0, 0.0), (10, [1, 2], -1.0, [0.0]),
               (10, [1], 1.0, [0.0]), (10, [1, 2], 1.0, [0.0], IM.BILINEAR, [7]), (10, [1, 2], 0.0, [0.0])],
    "perspective": [([[0, 0], [10, 0], [10, 8], [0, 8]], [[1, 1], [9, 0], [10, 8], [0, 7]]),
                    ([[0, 0], [10, 0], [10, 8], [0, 8]], [[1, 1], [9, 0], [10, 8], [0, 7]], IM.NEAREST, [5]),
                    ([[0, 0], [10, 0], [10, 8]], [[1, 1], [9, 0], [10, 8]])],
    "to_grayscale": [(), (1,), (3,), (2,)], "rgb_to_grayscale": [(), (1,), (3,), (2,)],
    "invert": [()], "posterize": [(1,), (4,), (8,), (0,), (9,), (2.5,)],
    "solarize": [(0,), (1,), (128,), (255,), (256,), (-1,), (0.5,)],
    "autocontrast": [()], "equalize": [()],
    "gaussian_blur": [(3,), ([3, 5],), (3, 0.8), (3, [0.5, 1.0]), (4,), (3, 0.0), (3, -1.0), ([3, 5, 7],), ("3",),
                      (21,)],
    "normalize": [([0.5, 0.5, 0.5], [0.2, 0.2, 0.2]), ([0.5], [0.0])],
    "convert_image_dtype": [(), (torch.uint8,)],
    "to_pil_image": [(), ("RGB",), ("L",)],
    "erase": [(1, 1, 3, 3, 0)],
    "elastic_transform": [(torch.zeros(1, 9, 11, 2),)],
}


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the exception class is what we compare
        return exc


def _compare(name: str, got, want) -> None:
    if isinstance(want, BaseException):
        assert isinstance(got, BaseException), f"{name}: stock raised {type(want).__name__}, patched returned {got!r}"
        assert type(got) is type(want), f"{name}: stock raised {type(want).__name__}, patched {type(got).__name__}"
        return
    assert not isinstance(got, BaseException), f"{name}: stock returned, patched raised {got!r}"
    if isinstance(want, (tuple, list)) and want and not isinstance(want[0], (int, float)):
        assert type(got) is type(want) and len(got) == len(want), name
        for g, w in zip(got, want):
            _compare(name, g, w)
        return
    assert type(got) is type(want), f"{name}: {type(got).__name__} against stock's {type(want).__name__}"
    if isinstance(want, Image.Image):
        assert (got.mode, got.size, got.info) == (want.mode, want.size, want.info), name
        a, b = np.asarray(got).astype(np.int64), np.asarray(want).astype(np.int64)
    elif isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        a, b = got.double().numpy(), want.double().numpy()
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        a, b = got.astype(np.float64), want.astype(np.float64)
    else:
        assert got == want, name
        return
    diff = np.abs(a - b)
    if diff.size:
        assert diff.max() == 0, f"{name}: max abs diff {diff.max()}"


def _function_calls():
    calls = []
    imgs = images()
    for fname, arg_sets in FUNCTION_ARGS.items():
        fn = getattr(F, fname)
        for img_name, img in imgs.items():
            for args in arg_sets:
                calls.append((f"{fname}({img_name}, {args!r})", fn, (img, *args)))
    return calls


def test_every_public_function_is_in_the_walk():
    public = {n for n, f in vars(F).items() if inspect.isfunction(f) and not n.startswith("_")
              and f.__module__ == F.__name__}
    helpers = {"get_image_size", "get_image_num_channels"} & public
    assert public - set(FUNCTION_ARGS) - helpers == set()


def test_functions_accept_and_reject_what_stock_does():
    import warnings

    calls = _function_calls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = []
        for _name, fn, args in calls:
            torch.manual_seed(0)
            stock.append((_outcome(fn, *args), torch.get_rng_state()))
        nano_patch.patch_torch()
        failures = []
        for (name, fn, args), (want, want_rng) in zip(calls, stock):
            torch.manual_seed(0)
            try:
                _compare(name, _outcome(fn, *args), want)
                assert torch.equal(torch.get_rng_state(), want_rng), f"{name}: draws differ"
            except AssertionError as exc:
                failures.append(str(exc))
    assert not failures, f"{len(failures)} of {len(calls)} calls differ from stock:\n" + "\n".join(failures[:40])


# class -> constructor arguments (good and bad)
CLASS_ARGS: dict[str, list[tuple]] = {
    "Resize": [(6,), ([6, 4],), (0,), ("6",), (6, IM.BICUBIC), (6, IM.NEAREST, 7)],
    "CenterCrop": [(4,), ([4, 6],), (30,)],
    "RandomCrop": [(4,), (4, 2), (20,), (20, None, True), (4, 1, False, 5, "reflect"), (20, None, True, 0, "reflect")],
    "RandomResizedCrop": [(5,), ((5, 4),), (5, (0.5, 0.5)), (5, (0.08, 1.0), (2.0, 0.5)), (0,)],
    "RandomHorizontalFlip": [(), (1.0,)], "RandomVerticalFlip": [(), (1.0,)],
    "Pad": [(2,), ([1, 2],), (2, 7, "reflect"), (20, 0, "reflect"), ([1, 2, 3],)],
    "FiveCrop": [(3,), (20,)], "TenCrop": [(3,), (3, True)],
    "ColorJitter": [(0.4, 0.4, 0.4, 0.1), (0.0, 0.0, 0.0, 0.5), (-1.0,), (0, 0, 0, 0.6), ((0.5, 1.5),)],
    "Grayscale": [(), (3,), (2,)], "RandomGrayscale": [(1.0,)],
    "RandomRotation": [(30,), (30, IM.BILINEAR, True), (30, IM.NEAREST, False, (2, 3), 7), (-5,)],
    "RandomAffine": [(20, (0.1, 0.1), (0.8, 1.2), 10), (20, None, None, None, IM.BILINEAR, 3), (20, (2.0, 0.1))],
    "RandomPerspective": [(0.5, 1.0), (0.5, 1.0, IM.NEAREST, 9)],
    "GaussianBlur": [(3,), (5, (0.1, 2.0)), (4,), (3, -1.0)],
    "RandomInvert": [(1.0,)], "RandomPosterize": [(3, 1.0), (0, 1.0)], "RandomSolarize": [(100, 1.0)],
    "RandomAdjustSharpness": [(2.0, 1.0)], "RandomAutocontrast": [(1.0,)], "RandomEqualize": [(1.0,)],
    "AutoAugment": [()], "RandAugment": [(), (2, 15)], "TrivialAugmentWide": [()],
    "ToTensor": [()], "PILToTensor": [()], "ToPILImage": [()],
    "Normalize": [([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])], "ConvertImageDtype": [(torch.float32,)],
    "RandomErasing": [(1.0,)], "ElasticTransform": [(5.0,)], "AugMix": [()],
    "Lambda": [(lambda im: im,)],
    "RandomApply": [([T.ColorJitter(0.3)], 1.0)], "RandomChoice": [([T.RandomHorizontalFlip(1.0), T.Resize(5)],)],
    "RandomOrder": [([T.CenterCrop(6), T.Pad(1)],)],
    "Compose": [([T.Resize(7), T.CenterCrop(5)],), ([T.Resize(7), T.ToTensor(), T.Normalize([0.5] * 3, [0.2] * 3)],),
                ([T.ColorJitter(0.3, 0.3, 0.3, 0.2), T.RandomHorizontalFlip(), T.PILToTensor()],)],
    "LinearTransformation": [(torch.eye(297), torch.zeros(297))],
}


def test_every_transform_class_is_in_the_walk():
    public = {n for n, c in vars(T).items() if isinstance(c, type) and not n.startswith("_")
              and issubclass(c, (torch.nn.Module, object)) and c.__module__.startswith("torchvision.transforms.")
              and c.__module__ != "torchvision.transforms.functional"}
    public -= {"InterpolationMode", "AutoAugmentPolicy"}
    assert public - set(CLASS_ARGS) == set()


def _class_calls():
    calls = []
    imgs = images()
    for cname, arg_sets in CLASS_ARGS.items():
        cls = getattr(T, cname)
        for args in arg_sets:
            for img_name, img in imgs.items():
                calls.append((f"{cname}({args!r})({img_name})", cls, args, img))
    return calls


def test_transform_classes_accept_and_reject_what_stock_does():
    import warnings

    def run(cls, args, img):
        torch.manual_seed(1)
        random.seed(1)
        try:
            t = cls(*args)
        except Exception as exc:  # noqa: BLE001
            return exc, None
        out = _outcome(t, img)
        return out, (torch.get_rng_state(), random.getstate())

    calls = _class_calls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = [run(cls, args, img) for _name, cls, args, img in calls]
        nano_patch.patch_torch()
        failures = []
        for (name, cls, args, img), (want, want_rng) in zip(calls, stock):
            got, got_rng = run(cls, args, img)
            try:
                _compare(name, got, want)
                if want_rng is not None and not isinstance(want, BaseException):
                    assert torch.equal(got_rng[0], want_rng[0]) and got_rng[1] == want_rng[1], f"{name}: draws differ"
            except AssertionError as exc:
                failures.append(str(exc))
    assert not failures, f"{len(failures)} of {len(calls)} calls differ from stock:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_user_arrays_are_never_taken_for_images(mode):
    """A uint8 array that looks like an image still goes to stock code, which rejects it."""
    nano_patch.patch_torch()
    arr = _photo(9, 11) if mode == "RGB" else _photo(9, 11)[:, :, 0].copy()
    for call in (lambda: F.rotate(arr, 10), lambda: F.adjust_hue(arr, 0.1), lambda: F.hflip(arr),
                 lambda: F.pil_to_tensor(arr), lambda: T.Compose([T.RandomResizedCrop(5)])(arr)):
        with pytest.raises(TypeError):
            call()
