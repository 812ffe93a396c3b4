"""transforms.v2 under the patch against stock v2, in the same process, with the same seeds.

PIL input (a plain PIL image, and the patch's own decoded ``FastImage``), ``tv_tensors.Image``
and plain tensors, alone and with boxes, masks and labels riding along. The random draws must be
stock's (torch, Python's ``random`` and NumPy's generators left in the same state), every output
the same type (``tv_tensors`` subclasses included), boxes and masks equal, and images exact (the
warps and the auto-augment policies included), except Gaussian blur (max 1, as in v1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _rng import rng_differences, rng_state, seed_all
from PIL import Image

import nano_patch

v2 = pytest.importorskip("torchvision.transforms.v2")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# name -> (factory, max abs bar on 0-255, mean abs bar on 0-255)
CASES = {
    "pipeline_b": (lambda: v2.Compose([v2.RandomResizedCrop(176), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]), 0, 0),
    "pipeline_b_to_image": (lambda: v2.Compose([v2.RandomResizedCrop(176), v2.RandomHorizontalFlip(), v2.ToImage(),
                                                v2.ToDtype(torch.float32, scale=True)]), 0, 0),
    "colour": (lambda: v2.Compose([v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.RandomGrayscale(0.3), v2.RandomInvert(0.5),
                                   v2.RandomPosterize(4, 0.5), v2.RandomSolarize(128, 0.5),
                                   v2.RandomAdjustSharpness(2.0, 0.5), v2.RandomAutocontrast(0.5),
                                   v2.RandomEqualize(0.5)]), 0, 0),
    "geometry_exact": (lambda: v2.Compose([v2.RandomCrop(120, padding=4), v2.RandomHorizontalFlip(),
                                           v2.RandomVerticalFlip(), v2.Pad(3, fill=7), v2.CenterCrop(100)]), 0, 0),
    "resize": (lambda: v2.Compose([v2.Resize(150), v2.CenterCrop(128)]), 0, 0),
    "warps": (lambda: v2.Compose([v2.RandomRotation(20), v2.RandomAffine(10, (0.1, 0.1)),
                                  v2.RandomPerspective(p=1.0)]), 0, 0),
    "warps_bilinear": (lambda: v2.Compose([v2.RandomRotation(20, v2.InterpolationMode.BILINEAR, expand=True),
                                           v2.RandomAffine(10, (0.1, 0.1), interpolation=v2.InterpolationMode.BICUBIC),
                                           v2.RandomPerspective(p=1.0)]), 0, 0),
    "augment": (lambda: v2.Compose([v2.RandAugment(interpolation=v2.InterpolationMode.BILINEAR),
                                    v2.TrivialAugmentWide()]), 0, 0),
    "lambda_and_blur": (lambda: v2.Compose([v2.Resize(100), v2.Lambda(lambda im: im.rotate(5) if isinstance(
        im, Image.Image) else im), v2.GaussianBlur(5, (0.5, 1.5))]), 1, 0.5),
}


def _images(photos) -> list[Image.Image]:
    small = Image.fromarray(np.asarray(photos[1])[30:67, 40:93].copy())
    return [photos[0], photos[1], small, photos[0].convert("L")]


def _targets(img_size: tuple[int, int]):
    w, h = img_size
    boxes = tv_tensors.BoundingBoxes([[2, 3, w // 2, h // 2], [w // 4, h // 3, w - 1, h - 2]], format="XYXY",
                                     canvas_size=(h, w))
    mask = torch.zeros(h, w, dtype=torch.uint8)
    mask[h // 4: h // 2, w // 3: w // 2] = 1
    return {"boxes": boxes, "masks": tv_tensors.Mask(mask), "labels": torch.tensor([1, 2])}


def _inputs(kind: str, im: Image.Image):
    if kind == "pil":
        return (im,)
    if kind == "fast_image":
        from nano_patch.vision.images.image import FastImage

        return (FastImage.wrap(np.asarray(im).copy()),)
    t = torch.from_numpy(np.atleast_3d(np.asarray(im)).copy()).permute(2, 0, 1).contiguous()
    if kind == "tv_image":
        return (tv_tensors.Image(t),)
    if kind == "tensor":
        return (t,)
    if kind == "pil_with_targets":
        return im, _targets(im.size)
    raise AssertionError(kind)


def _as_float(x) -> np.ndarray:
    if isinstance(x, Image.Image):
        return np.asarray(x).astype(np.float64)
    t = x.as_subclass(torch.Tensor)
    return t.double().numpy() * (255.0 if t.is_floating_point() else 1.0)


def _compare(name: str, got, want, max_bar, mean_bar) -> None:
    assert type(got) is type(want), f"{name}: {type(got)} against stock's {type(want)}"
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _compare(f"{name}[{k}]", got[k], want[k], 0, 0)  # targets: equal, always
        return
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            _compare(f"{name}[{i}]", g, w, max_bar if i == 0 else 0, mean_bar if i == 0 else 0)
        return
    if isinstance(want, Image.Image):
        assert (got.mode, got.size) == (want.mode, want.size), name
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        if want.numel() > 1 and want.dim() >= 3:  # stock's memory layout as well
            assert got.stride() == want.stride(), f"{name}: strides {got.stride()} against stock's {want.stride()}"
        if isinstance(want, tv_tensors.BoundingBoxes):
            assert (got.format, got.canvas_size) == (want.format, want.canvas_size), name
    if not isinstance(want, (Image.Image, torch.Tensor)):
        assert got == want, name
        return
    diff = np.abs(_as_float(got) - _as_float(want))
    if diff.size == 0:
        return
    if max_bar is not None:
        assert diff.max() <= max_bar, f"{name}: max abs diff {diff.max()} > {max_bar}"
    assert diff.mean() <= mean_bar, f"{name}: mean abs diff {diff.mean()}"


@pytest.mark.parametrize("kind", ["pil", "fast_image", "tv_image", "tensor", "pil_with_targets"])
@pytest.mark.parametrize("case", list(CASES))
def test_v2_matches_stock(case, kind, photos):
    make, max_bar, mean_bar = CASES[case]
    images = _images(photos)
    if kind == "fast_image":
        pytest.importorskip("cv2")
    stock, states = [], []
    for im in images:
        for seed in range(3):
            seed_all(seed)
            inputs = _inputs(kind, im) if kind != "fast_image" else (im,)
            try:
                out = make()(*inputs)
            except Exception as exc:  # noqa: BLE001 - stock errors must be matched, not hidden
                out = exc
            stock.append(out)
            states.append(rng_state())
    nano_patch.patch_torch()
    k = 0
    for im in images:
        for seed in range(3):
            seed_all(seed)
            want = stock[k]
            if isinstance(want, Exception):
                with pytest.raises(type(want)):
                    make()(*_inputs(kind, im))
                k += 1
                continue
            got = make()(*_inputs(kind, im))
            assert not rng_differences(rng_state(), states[k]), f"{case}/{kind}: draws differ from stock"
            if kind == "fast_image" and isinstance(want, Image.Image):
                # the patch's own image stays one: it is a PIL image with stock's pixels
                assert isinstance(got, Image.Image)
                got = Image.fromarray(np.asarray(got))
            _compare(f"{case}:{kind}:{im.mode}{im.size}:seed{seed}", got, want, max_bar, mean_bar)
            k += 1


@pytest.mark.parametrize("policy", ["RandAugment", "TrivialAugmentWide", "AutoAugment", "AugMix"])
def test_v2_auto_augment_policies_are_exact_over_many_draws(policy, photos):
    """With their default (nearest) interpolation every op of the v2 policies is exact: over enough
    draws that each op runs, images equal stock's and every generator is left as stock leaves it."""
    make = getattr(v2, policy)
    images = [_images(photos)[1], _images(photos)[3]]
    if policy == "AugMix":  # a third of the size: AugMix's tensor arithmetic is slow on stock's side
        images = [im.reduce(3) for im in images]
    calls = [(im, seed) for im in images for seed in range(40)]

    def run(im, seed):
        seed_all(seed)
        return np.asarray(make()(im)), rng_state()

    stock = [run(*c) for c in calls]
    nano_patch.patch_torch()
    for c, (want, want_rng) in zip(calls, stock):
        got, got_rng = run(*c)
        assert not rng_differences(got_rng, want_rng), (policy, c[1], rng_differences(got_rng, want_rng))
        assert got.shape == want.shape and np.array_equal(got, want), (
            policy, c[1], np.abs(got.astype(int) - want.astype(int)).max())


def test_v2_plain_arrays_are_stocks(photos):
    """v2 passes plain NumPy arrays through untouched, as stock does; the patch must not take them."""
    arr = np.asarray(photos[0]).copy()
    pipe = v2.Compose([v2.RandomHorizontalFlip(1.0), v2.ColorJitter(0.3)])
    want = pipe(arr)
    nano_patch.patch_torch()
    got = pipe(arr)
    assert type(got) is type(want) and np.array_equal(got, want)


def test_the_report_counts_what_v2_ran_on_the_patch_s_path(photos, tmp_path):
    """`--report` names each v2 step that ran on the patch's image, the fused tail, and what ran stock's code (it
    counted nothing for v2 pipelines before)."""
    from torchvision.transforms import v2

    from nano_patch import report

    (tmp_path / "r").mkdir()
    report.stats = report.Stats(str(tmp_path / "r"))
    try:
        nano_patch.patch_torch()
        tf = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)])
        odd = v2.Compose([v2.PILToTensor(), v2.RandomHorizontalFlip()])  # the flip on a tensor: stock's code
        for im in photos:
            tf(im)
            odd(im)
        counts = {(p, fast, why): n for (p, fast, why), n in report.stats.counts.items()
                  if p == "vision_transforms_v2"}
    finally:
        report.stats = None
    n = len(photos)
    assert counts[("vision_transforms_v2", True, "RandomResizedCrop: on the patch's image (its kernels)")] == n
    assert counts[("vision_transforms_v2", True,
                   "PILToTensor + ToDtype + Normalize: the tensor tail as one table lookup")] == n
    assert counts[("vision_transforms_v2", False, "RandomHorizontalFlip: stock code on a tensor")] == n
