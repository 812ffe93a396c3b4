"""Plans: a Compose runs as kernels on the array, with stock's draws in stock's order and stock's pixels.

Each case runs stock first (unpatched) and then patched, with the same seed, on the same images.
Outputs must be equal bit for bit, of the same type, with the same ``info``; the states of torch's,
Python's and NumPy's generators afterwards must be the same; errors must be stock's class and message.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from _rng import rng_differences, rng_state, seed_all
from PIL import Image

import nano_patch
from nano_patch.vision.images.image import FastImage
from nano_patch.vision.plans import compose_plan

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IM = T.InterpolationMode


def _images(photos):
    grey = photos[1].convert("L")
    grey.info["note"] = "kept"
    return [photos[0], photos[2].crop((10, 20, 300, 260)), grey, photos[1].resize((97, 61))]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):  # values, and stock's memory layout
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                and a.stride() == b.stride())
    if isinstance(a, Image.Image):
        return (type(b) is type(a) and a.mode == b.mode and a.size == b.size and a.info == b.info
                and a.tobytes() == b.tobytes())
    return type(a) is type(b) and a == b


def _run(make, images, seed, repeat=3):
    seed_all(seed)  # timm draws from Python's random and NumPy's generator too
    tf = make()
    out = []
    for _ in range(repeat):
        for im in images:
            try:
                out.append(tf(im))
            except Exception as exc:  # noqa: BLE001 - compared with stock's
                out.append((type(exc), str(exc)))
    return out, rng_state()


def _compare(make, images, seed=0, repeat=3):
    want, want_rng = _run(make, images, seed, repeat)
    nano_patch.patch_torch()
    try:
        got, got_rng = _run(make, images, seed, repeat)
    finally:
        nano_patch.unpatch_torch()
    assert not rng_differences(got_rng, want_rng), f"the patched run drew different random numbers: " \
        f"{rng_differences(got_rng, want_rng)}"
    for k, (w, g) in enumerate(zip(want, got)):
        assert _same(w, g), (k, w, g)


PIPELINES = {
    "pets": lambda: T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3),
                               T.ToTensor(), T.Normalize(MEAN, STD)]),
    "reference_preset": lambda: T.Compose([T.RandomResizedCrop(176, antialias=True), T.RandomHorizontalFlip(0.5),
                                           T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]),
    "reference_eval": lambda: T.Compose([T.Resize(232), T.CenterCrop(224), T.PILToTensor(),
                                         T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]),
    "a": lambda: T.Compose([T.Resize(256), T.ColorJitter(.4, .4, .4, .1), T.RandomCrop(224), T.RandomHorizontalFlip(),
                            T.Resize(128), T.ToTensor()]),
    "flip_before_resize": lambda: T.Compose([T.RandomHorizontalFlip(0.7), T.RandomResizedCrop(64), T.ToTensor()]),
    "flip_crop_flip": lambda: T.Compose([T.RandomHorizontalFlip(0.7), T.RandomCrop(50), T.RandomHorizontalFlip(0.6),
                                         T.ColorJitter(0.2, 0.2, 0.2, 0.2), T.Resize(41), T.RandomVerticalFlip(0.5)]),
    "resize_max_size": lambda: T.Compose([T.Resize(40, max_size=60, interpolation=IM.LANCZOS), T.CenterCrop(33),
                                          T.ToTensor(), T.Normalize(0.5, 0.25)]),
    "every_filter": lambda: T.Compose([T.Resize((77, 45), interpolation=IM.BOX), T.Resize(50, interpolation=IM.HAMMING),
                                       T.RandomResizedCrop(31, interpolation=IM.BICUBIC),
                                       T.Resize(29, interpolation=IM.NEAREST)]),
    "grey_paths": lambda: T.Compose([T.RandomGrayscale(0.5), T.Grayscale(1), T.ColorJitter(0.5, 0.5, 0.5, 0.3),
                                     T.Grayscale(3), T.RandomHorizontalFlip(), T.PILToTensor()]),
    "image_out": lambda: T.Compose([T.CenterCrop(90), T.RandomHorizontalFlip(0.8), T.ColorJitter(0.1, 0.2, 0.3)]),
    "stock_between": lambda: T.Compose([T.RandomResizedCrop(70), T.RandomHorizontalFlip(), T.Lambda(lambda x: x),
                                        T.ColorJitter(0.2, 0.2), T.RandAugment(), T.RandomHorizontalFlip(),
                                        T.ToTensor()]),
    "tensor_steps_after_tail": lambda: T.Compose([T.RandomResizedCrop(48), T.ToTensor(), T.RandomErasing(1.0),
                                                  T.Normalize(MEAN, STD)]),
    "float64": lambda: T.Compose([T.Resize(30), T.PILToTensor(), T.ConvertImageDtype(torch.float64),
                                  T.Normalize(MEAN, STD)]),
    "half_not_fused": lambda: T.Compose([T.Resize(30), T.PILToTensor(), T.ConvertImageDtype(torch.float16)]),
}


@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.parametrize("seed", [0, 7])
def test_plans_match_stock(name, seed, photos):
    _compare(PIPELINES[name], _images(photos), seed)


def test_what_the_plan_runs():
    nano_patch.patch_torch()
    described = compose_plan.plan_for(PIPELINES["stock_between"]()).describe()
    assert described == ["RandomResizedCrop: native", "RandomHorizontalFlip: native", "Lambda: stock",
                         "ColorJitter: native", "RandAugment: native", "RandomHorizontalFlip: native", "ToTensor: tail"]
    assert compose_plan.plan_for(PIPELINES["reference_preset"]()).describe()[-3:] == [
        "PILToTensor: tail", "ConvertImageDtype: tail", "Normalize: tail"]


STEPS = [
    lambda r: T.RandomResizedCrop(r.randint(8, 90), scale=(0.05, 1.0)),
    lambda r: T.Resize(r.randint(5, 120), interpolation=r.choice(list(IM)[:3] + [IM.BOX, IM.HAMMING, IM.LANCZOS])),
    lambda r: T.Resize((r.randint(5, 90), r.randint(5, 90))),
    lambda r: T.CenterCrop(r.randint(5, 150)),
    lambda r: T.RandomCrop(r.randint(5, 60), pad_if_needed=r.random() < 0.3),
    lambda r: T.RandomHorizontalFlip(r.random()),
    lambda r: T.RandomVerticalFlip(r.random()),
    lambda r: T.ColorJitter(r.random(), r.random(), r.random(), r.random() / 2),
    lambda r: T.RandomGrayscale(r.random()),
    lambda r: T.Grayscale(r.choice([1, 3])),
    lambda r: T.RandomRotation(15),
    lambda r: T.Pad(r.randint(0, 4)),
]


@pytest.mark.parametrize("seed", range(40))
def test_random_pipelines_match_stock(seed, photos):
    """Pipelines drawn at random from the steps a plan knows (and a few it does not)."""
    r = random.Random(seed)
    steps = [r.choice(STEPS) for _ in range(r.randint(1, 6))]
    tail = r.choice([[], [T.ToTensor()], [T.ToTensor(), T.Normalize(MEAN, STD)], [T.PILToTensor()],
                     [T.PILToTensor(), T.ConvertImageDtype(torch.float32), T.Normalize(0.4, 0.3)]])
    rr = random.Random(seed + 1000)

    def make():
        return T.Compose([s(rr) for s in steps] + tail)

    _compare(lambda: (rr.seed(seed + 1000), make())[1], _images(photos), seed, repeat=2)  # noqa: B023


def test_stock_errors(photos):
    images = _images(photos)
    _compare(lambda: T.Compose([T.RandomCrop(5000)]), images)  # crop larger than the image
    _compare(lambda: T.Compose([T.ToTensor(), T.Normalize(MEAN, [0.2, 0.0, 0.2])]), images)  # std 0
    _compare(lambda: T.Compose([T.Resize(30), T.Grayscale(1), T.ToTensor(), T.Normalize(MEAN, STD)]), images)

    def bad_hue():
        t = T.ColorJitter(hue=0.3)
        t.hue = (0.4, 0.9)  # out of range after construction: adjust_hue raises
        return T.Compose([T.CenterCrop(20), t])

    _compare(bad_hue, images)


def test_parameters_are_read_on_every_call_and_plans_follow_the_list(photos):
    def run(mutate):
        torch.manual_seed(3)
        tf = T.Compose([T.Resize(60), T.RandomHorizontalFlip(), T.ToTensor()])
        out = [tf(photos[0])]
        mutate(tf)
        out.append(tf(photos[0]))
        return out

    def mutate(tf):
        tf.transforms[0].size = 33
        tf.transforms[1].p = 1.0
        tf.transforms.insert(1, T.CenterCrop(20))

    want = run(mutate)
    nano_patch.patch_torch()
    got = run(mutate)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_changed_classes_run_stock_code(photos, monkeypatch):
    class MyCrop(T.RandomResizedCrop):
        @staticmethod
        def get_params(img, scale, ratio):
            return 0, 0, 10, 10

    nano_patch.patch_torch()
    described = compose_plan.plan_for(T.Compose([MyCrop(20), T.RandomHorizontalFlip()])).describe()
    assert described == ["MyCrop: stock", "RandomHorizontalFlip: native"]
    monkeypatch.setattr(T.RandomResizedCrop, "get_params", staticmethod(lambda img, scale, ratio: (1, 2, 30, 40)))
    out = T.Compose([T.RandomResizedCrop(20)])(photos[0])
    assert out.tobytes() == photos[0].crop((2, 1, 42, 31)).resize((20, 20), Image.BILINEAR).tobytes()


def test_image_types_in_and_out(photos):
    """A plain PIL image in gives a plain one out, the patch's FastImage a FastImage: both with stock's pixels."""
    tf = T.Compose([T.CenterCrop(50), T.ColorJitter(saturation=0.5)])
    torch.manual_seed(3)
    want = tf(photos[0])
    nano_patch.patch_torch()
    torch.manual_seed(3)
    plain = tf(photos[0])
    assert type(plain) is Image.Image and plain.tobytes() == want.tobytes()
    torch.manual_seed(3)
    fast = tf(FastImage.wrap(np.asarray(photos[0])))
    assert type(fast) is FastImage and (fast.mode, fast.size) == (want.mode, want.size)
    assert fast.to_plain().tobytes() == want.tobytes()


def test_uint8_output_for_dataloader_workers(photos):
    from nano_patch.vision.plans import compose_call

    nano_patch.patch_torch()
    tf = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    rgb = [im for im in _images(photos) if im.mode == "RGB"]
    torch.manual_seed(1)
    want = [tf(im) for im in rgb]
    compose_call.emit_uint8(tf)
    torch.manual_seed(1)
    got = [tf(im) for im in rgb]
    for w, g in zip(want, got):
        assert g.dtype == torch.uint8
        f = g.to(torch.float32).div(255)
        mean = torch.tensor(MEAN).view(-1, 1, 1)
        std = torch.tensor(STD).view(-1, 1, 1)
        assert torch.equal(f.sub(mean).div(std), w)


def test_timm_pipelines_match_stock(photos):
    import timm.data as timm_data

    def train():
        return timm_data.create_transform(96, is_training=True)

    def train_random_interpolation():
        return timm_data.create_transform(96, is_training=True, interpolation="random", color_jitter=0.3)

    def eval_():
        return timm_data.create_transform(96)

    for make in (train, train_random_interpolation, eval_):
        _compare(make, _images(photos)[:2] + _images(photos)[3:], seed=5)
    nano_patch.patch_torch()
    assert compose_plan.plan_for(train()).describe() == [
        "RandomResizedCropAndInterpolation: native", "RandomHorizontalFlip: native", "ColorJitter: native",
        "MaybeToTensor: tail", "Normalize: tail"]


TIMM_POLICIES = ["rand-m9-mstd0.5", "rand-m9-n3-mstd0.5-inc1", "rand-m7-mstd101-inc1", "rand-m9-mstd0.5-tweights",
                 "rand-m9-mmax15-p0.8-t3a",
                 "original-mstd0.5", "v0r"]


@pytest.mark.parametrize("policy", TIMM_POLICIES)
def test_timm_policies_run_from_the_plan_as_stock(photos, policy):
    """timm's RandAugment and AutoAugment: timm's draws (NumPy's choice, Python's probability, magnitude
    noise, sign and filter) in timm's order, each op a kernel; bilinear and bicubic warps with the fill."""
    from timm.data import create_transform

    def make():
        return create_transform(96, is_training=True, auto_augment=policy, re_prob=0.25)

    _compare(make, _images(photos), seed=3, repeat=4)
    nano_patch.patch_torch()
    try:
        described = compose_plan.plan_for(make()).describe()
    finally:
        nano_patch.unpatch_torch()
    assert not any(d.endswith("stock") for d in described[:-1]), described  # RandomErasing: a tensor step


def test_every_timm_op_at_every_magnitude_equals_timms_own(photos):
    """Each timm op (probability 1) on RGB and L at magnitudes 0..10 and past timm's usual bound, with and
    without magnitude noise, through the plan against stock: pixels, info, errors and every generator."""
    import timm.data.auto_augment as aa

    images = [photos[0].resize((67, 53)), photos[1].convert("L").resize((40, 47))]
    cases = []
    for name in sorted(aa.NAME_TO_OP):
        for magnitude in (0, 1, 3, 5, 7, 9, 10, 13):
            for mstd in (0, 0.5):
                for im in images:
                    hparams = {"translate_const": 20, "img_mean": (124, 116, 104) if im.mode == "RGB" else 110,
                               "magnitude_max": 15, "magnitude_std": mstd}
                    op = aa.AugmentOp(name, prob=1.0, magnitude=magnitude, hparams=hparams)
                    cases.append((name, magnitude, T.Compose([aa.RandAugment([op], num_layers=1)]), im))

    def run_all():
        out = []
        for k, (_, _, tf, im) in enumerate(cases):
            seed_all(k)
            try:
                got = tf(im)
            except Exception as exc:  # noqa: BLE001 - compared with stock's
                got = (type(exc), str(exc))
            out.append((got, rng_state()))
        return out

    want = run_all()
    nano_patch.patch_torch()
    try:
        got = run_all()
        described = {tuple(compose_plan.plan_for(tf).describe()) for _, _, tf, _ in cases}
    finally:
        nano_patch.unpatch_torch()
    for (name, magnitude, _, im), (w, w_rng), (g, g_rng) in zip(cases, want, got):
        assert not rng_differences(g_rng, w_rng), (name, magnitude, im.mode)
        assert _same(w, g), (name, magnitude, im.mode, w, g)
    assert described == {("RandAugment: native",)}
