"""The augmentation policies run from the plan: every op of every policy at every magnitude bin, v1 and v2,
equals stock's own op; and whole policies draw as stock (torch, Python and NumPy generators) and give
stock's images, bit for bit, with nearest, bilinear and bicubic interpolation and every kind of fill."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from _rng import rng_differences, rng_state, seed_all
from PIL import Image

import nano_patch
from nano_patch.vision.images.image import FastImage
from nano_patch.vision.plans import compose_plan, policies

IM = T.InterpolationMode
INTERPOLATIONS = [IM.NEAREST, IM.BILINEAR, IM.BICUBIC]


def _v2_takes_strings() -> bool:
    """Whether this torchvision's v2 policies take an interpolation given as a string ("bilinear"), as recent
    releases do; older ones reject it on stock too, so the case exists only where stock has it."""
    try:
        v2.RandAugment(interpolation="bilinear")
        v2.functional.rotate(Image.new("L", (4, 4)), 10.0, interpolation="bilinear")
    except (TypeError, ValueError):
        return False
    return True


#: v2's interpolations: the modes, and a string where this torchvision takes one.
V2_INTERPOLATIONS = (*INTERPOLATIONS, *(("bilinear",) if _v2_takes_strings() else ()))


@pytest.fixture(scope="module")
def small(photos) -> list[Image.Image]:
    """A colour photo crop of odd size and its grey version: every op is cheap on them."""
    rgb = photos[0].crop((40, 30, 77, 59))
    return [rgb, rgb.convert("L")]


def _v1_spaces():
    return {"AutoAugment": T.AutoAugment()._augmentation_space(10, (29, 37)),
            "RandAugment": T.RandAugment()._augmentation_space(31, (29, 37)),
            "TrivialAugmentWide": T.TrivialAugmentWide()._augmentation_space(31)}


GEOMETRY = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


def _variants(img: Image.Image, name: str, interpolations: tuple) -> list[tuple]:
    """(interpolation, fill) pairs: every one for the warps; interpolation and fill mean nothing to the others."""
    if name not in GEOMETRY:
        return [(interpolations[0], None)]
    return [(i, f) for i in interpolations for f in (None, 128 if img.mode == "L" else [10, 200, 30])]


def _magnitudes(values: list[float], signed: bool) -> list[float]:
    return [v for m in values for v in ((m, -m) if signed else (m,))]


def _compare(cases: list[tuple], stock, planned) -> None:
    """Stock's op on every case first, unpatched; then the planned op on each, patched."""
    want = [np.asarray(stock(*case)) for case in cases]
    nano_patch.patch_torch()
    try:
        for case, w in zip(cases, want):
            img = case[0]
            got = planned(compose_plan.Pixels.of(FastImage.wrap(np.asarray(img))), *case[1:]).array()
            assert np.array_equal(got, w), case[1:]
    finally:
        nano_patch.unpatch_torch()
    assert len(cases) > 150


@pytest.mark.parametrize("policy", ["AutoAugment", "RandAugment", "TrivialAugmentWide"])
def test_every_v1_op_at_every_magnitude_bin(small, policy):
    from torchvision.transforms import autoaugment

    cases = []
    for img in small:
        for name, (magnitudes, signed) in _v1_spaces()[policy].items():
            values = [float(m) for m in magnitudes.tolist()] if magnitudes.ndim > 0 else [0.0]
            for magnitude in _magnitudes(values, signed):
                cases += [(img, name, magnitude, i, f) for i, f in _variants(img, name, tuple(INTERPOLATIONS))]
    _compare(cases, autoaugment._apply_op, policies.policy_op)


@pytest.mark.parametrize("policy", [v2.AutoAugment, v2.RandAugment, v2.TrivialAugmentWide])
def test_every_v2_op_at_every_magnitude_bin(small, policy):
    bins = 10 if policy is v2.AutoAugment else policy().num_magnitude_bins
    cases = []
    for img in small:
        for name, (fn, signed) in policy._AUGMENTATION_SPACE.items():
            m = fn(bins, img.height, img.width)
            values = [0.0] if m is None else [float(v) for v in m.tolist()]
            for magnitude in _magnitudes(values, signed and m is not None):
                for interpolation, fill in _variants(img, name, V2_INTERPOLATIONS):
                    cases.append((img, policy(interpolation=interpolation, fill=fill), name, magnitude))
    _compare(cases, lambda img, t, name, magnitude: t._apply_image_or_video_transform(
        img, name, magnitude, t.interpolation, t._fill), lambda px, t, name, magnitude: policies.v2_op(t, px, name,
                                                                                                   magnitude))


def _policies(interpolation):
    i = interpolation
    return {
        "v1 AutoAugment imagenet": T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=i),
        "v1 AutoAugment svhn, fill": T.AutoAugment(T.AutoAugmentPolicy.SVHN, interpolation=i, fill=[5, 80, 250]),
        "v1 RandAugment": T.RandAugment(num_ops=3, interpolation=i),
        "v1 TrivialAugmentWide": T.TrivialAugmentWide(interpolation=i, fill=40),
        "v2 AutoAugment cifar10": v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10, interpolation=i),
        "v2 RandAugment, fill per type": v2.RandAugment(num_ops=3, interpolation=i,
                                                        fill={Image.Image: 99, "others": 1}),
        "v2 TrivialAugmentWide, fill": v2.TrivialAugmentWide(interpolation=i, fill=[1, 2, 3]),
    }


@pytest.mark.parametrize("interpolation", INTERPOLATIONS, ids=lambda i: i.value)
@pytest.mark.parametrize("name", list(_policies(IM.NEAREST)))
def test_whole_policies_draw_and_transform_as_stock(photos, name, interpolation):
    """Inside a Compose, after a crop and a flip (the pending geometry of the plan), 40 draws per policy."""
    policy = _policies(interpolation)[name]
    compose = (v2.Compose if name.startswith("v2") else T.Compose)(
        [(v2 if name.startswith("v2") else T).RandomResizedCrop(64), T.RandomHorizontalFlip(), policy])
    images = [photos[1], photos[2].convert("L")] if "fill" not in name or "type" in name else [photos[1]]

    def run():
        out = []
        for k in range(20):
            for j, img in enumerate(images):
                seed_all(1000 * k + j)
                out.append(np.asarray(compose(img)))
        return out, rng_state()

    stock_out, stock_rng = run()
    nano_patch.patch_torch()
    got_out, got_rng = run()
    described = compose_plan.plan_for(compose).describe() if name.startswith("v1") else None
    nano_patch.unpatch_torch()
    for a, b in zip(got_out, stock_out):
        assert a.shape == b.shape and np.array_equal(a, b), name
    assert rng_differences(got_rng, stock_rng) == []
    if described is not None:
        assert described[-1].endswith(": native"), described  # planned, not stock code


def test_a_v2_fill_given_per_type_applies_to_the_patchs_image(photos):
    """v2 picks a fill by the input's type: the patch's image must count as the PIL image it stands for."""
    t = v2.Compose([v2.RandomRotation(40, fill={Image.Image: 200, "others": 0}), v2.PILToTensor()])
    seed_all(3)
    want = t(photos[0])
    nano_patch.patch_torch()
    seed_all(3)
    got = t(photos[0])
    assert torch.equal(got, want) and (got == 200).any()


def test_random_erasing_after_the_tail_is_stock(photos):
    compose = T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.RandomErasing(p=1.0, value="random")])
    seed_all(0)
    want = [compose(photos[0]) for _ in range(10)]
    nano_patch.patch_torch()
    seed_all(0)
    got = [compose(photos[0]) for _ in range(10)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
