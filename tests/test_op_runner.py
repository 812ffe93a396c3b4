"""The typed-op renderer (``vision/plans/oprunner.py``, ``csrc/oplist.c``): a sample's recorded ops and its tensor tail
as one native call, against stock's per-sample result, bit for bit.

Every op on its own and in the combinations where the deferred geometry matters (a crop inside a pending resize,
a flip waiting through a resize, colour and grey ops, a vertical flip after all that), every tensor tail (v1's,
timm's) on RGB and grey images, and every pipeline the v1, v2 and timm step runners and policies produce: stock
runs on the PIL image; the patched side draws on a ``Recording`` of the same size (stock's draws, compared on
every generator), then renders natively. Samples whose ops the runner leaves to Python must say why, and still
equal stock through ``recording.render``. The batch tensor the tails write into equals ``default_collate`` of stock's
samples in values, dtype, shape and strides, and ``default_collate`` takes it as it is.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from _rng import rng_differences, rng_state, seed_all
from PIL import Image
from torch.utils.data import default_collate

import nano_patch
from nano_patch import report
from nano_patch.vision.images.image import FastImage
from nano_patch.vision.kernels import functional as K
from nano_patch.vision.plans import compose_call, compose_plan, oprunner, policies
from nano_patch.vision.plans.pixels import JITTER

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture
def patched():
    nano_patch.patch_torch()
    yield
    nano_patch.unpatch_torch()


def _images(photos):
    return [photos[0], photos[2].crop((10, 20, 300, 260)), photos[1].convert("L"), photos[1].resize((97, 61))]


def _same(want, got) -> bool:
    return (isinstance(got, torch.Tensor) and want.dtype == got.dtype and want.shape == got.shape
            and want.stride() == got.stride() and torch.equal(want, got))


def _tail(*steps):
    from torchvision import transforms as T

    tail = compose_plan.plan_for(T.Compose(list(steps))).tails.get(0)  # (a plan records timm's classes it meets)
    assert tail is not None and len(tail) == len(steps)
    return tail


def _render_native(recording, a):
    job = oprunner.prepare(recording)
    assert not isinstance(job, str), job
    return oprunner.run(job, np.ascontiguousarray(a))


# --- every op, alone and combined: (the op on a Recording, the same op on stock's PIL image) ----------------

def _crop(top, left, h, w):
    return lambda r: r.crop(top, left, h, w), lambda im: im.crop((left, top, left + w, top + h))


def _resize(h, w, f):
    return lambda r: r.resize_to(h, w, f), lambda im: im.resize((w, h), f)


HFLIP = (lambda r: r.hflip(), lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
VFLIP = (lambda r: r.vflip(), lambda im: im.transpose(Image.Transpose.FLIP_TOP_BOTTOM))


def _colour(i, factor):
    stock = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)[i]
    return lambda r: r.colour(JITTER[i], factor), lambda im: stock(im, factor)


def _grey(n):
    return lambda r: r.grey(n), lambda im: F.to_grayscale(im, n)


def _point(kernel, stock, *args):
    return lambda r: r.point(kernel, *args), lambda im: stock(im, *args)


SHARP = (lambda r: r.whole(K.adjust_sharpness, 1.7), lambda im: F.adjust_sharpness(im, 1.7))

OPS = {
    "crop": [_crop(5, 7, 40, 50)],
    "crop whole": [_crop(0, 0, 61, 97)],
    **{f"resize down {f}": [_resize(23, 31, f)] for f in (1, 2, 3, 4, 5)},
    **{f"resize up {f}": [_resize(83, 130, f)] for f in (1, 2, 3, 4, 5)},
    "hflip": [HFLIP],
    "vflip": [VFLIP],
    "hflip twice": [HFLIP, HFLIP],
    **{f"brightness {f}": [_colour(0, f)] for f in (0.0, 0.6, 1.37)},
    **{f"contrast {f}": [_colour(1, f)] for f in (0.0, 0.7, 1.3)},
    **{f"saturation {f}": [_colour(2, f)] for f in (0.0, 0.5, 1.9)},
    **{f"hue {f}": [_colour(3, f)] for f in (-0.5, -0.1, 0.0, 0.07, 0.5)},
    "grey 1": [_grey(1)],
    "grey 3": [_grey(3)],
    **{f"posterize {b}": [_point(K.posterize, F.posterize, b)] for b in (1, 4, 8)},
    **{f"solarize {t}": [_point(K.solarize, F.solarize, t)] for t in (0, 77.5, 128, 256)},
    "invert": [_point(K.invert, F.invert)],
    "sharpness": [SHARP],
    # the deferred geometry: windows of a pending resize, flips folded into it or waiting through colour
    "resize, crop": [_resize(80, 120, 2), _crop(9, 11, 50, 70)],
    "resize, crop, crop": [_resize(80, 120, 3), _crop(9, 11, 50, 70), _crop(3, 5, 20, 30)],
    "resize, hflip, crop": [_resize(80, 120, 2), HFLIP, _crop(9, 11, 50, 70)],
    "hflip, resize": [HFLIP, _resize(40, 50, 2)],
    "hflip, crop, resize": [HFLIP, _crop(5, 3, 40, 60), _resize(33, 33, 3)],
    "crop, resize, hflip, colour": [_crop(2, 4, 50, 80), _resize(40, 44, 2), HFLIP, _colour(0, 1.2), _colour(1, 0.8),
                                    _colour(2, 1.3), _colour(3, 0.1)],
    "resize, hflip, contrast, crop": [_resize(70, 90, 2), HFLIP, _colour(1, 1.4), _crop(10, 20, 30, 40)],
    "resize, hflip, grey, vflip": [_resize(70, 90, 1), HFLIP, _grey(3), VFLIP],
    "hflip, grey 1, saturation, hue": [HFLIP, _grey(1), _colour(2, 1.5), _colour(3, 0.2)],
    "resize, hflip, sharpness": [_resize(50, 60, 3), HFLIP, SHARP],
    "resize, hflip, posterize, resize": [_resize(50, 60, 2), HFLIP, _point(K.posterize, F.posterize, 3),
                                         _resize(30, 20, 5)],
    "vflip, hflip, resize, vflip": [VFLIP, HFLIP, _resize(31, 47, 4), VFLIP],
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_and_combination_equals_stock(patched, photos, name):
    rgb = photos[1].resize((97, 61))
    for im in (rgb, rgb.convert("L")):
        for steps in [(T.PILToTensor(),), (T.ToTensor(), T.Normalize([0.4], [0.3]))]:
            want = im
            rec = compose_plan.Recording((im.height, im.width), im.mode)
            for record, stock in OPS[name]:
                record(rec)
                want = stock(want)
            for t in steps:
                want = t(want)
            rec.end_in_tensor(_tail(*steps), False)
            got = _render_native(rec, np.asarray(im))
            assert _same(want, got), (name, im.mode, steps)


# --- the tails -----------------------------------------------------------------------------------------

def _timm_tail():
    timm = pytest.importorskip("timm")
    from timm.data.transforms import MaybePILToTensor, MaybeToTensor

    del timm
    return [(MaybeToTensor(), T.Normalize(MEAN, STD)), (MaybeToTensor(),), (MaybePILToTensor(),)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_tail_equals_stock(patched, photos, dtype):
    tails = [(T.ToTensor(),), (T.ToTensor(), T.Normalize(MEAN, STD)), (T.PILToTensor(),),
             (T.PILToTensor(), T.ConvertImageDtype(torch.float)),
             (T.PILToTensor(), T.ConvertImageDtype(torch.float64), T.Normalize(MEAN, STD))]
    try:
        import timm  # noqa: F401
        tails += _timm_tail()
    except ImportError:
        pass
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        for im in _images(photos):
            for steps in tails:
                want = im
                try:
                    for t in steps:
                        want = t(want)
                except RuntimeError:  # stock's Normalize refuses three means on one channel: no table
                    want = None
                rec = compose_plan.Recording((im.height, im.width), im.mode)
                tail = _tail(*steps)
                rec.end_in_tensor(tail, False)
                job = oprunner.prepare(rec)
                if want is None:
                    assert im.mode == "L" and job == "the tensor tail runs stock code"
                    continue
                assert _same(want, oprunner.run(job, np.asarray(im))), (steps, im.mode)
    finally:
        torch.set_default_dtype(default)


# --- whole pipelines: stock's draws on every generator, then the native render --------------------------

def _timm(**kw):
    def make():
        from timm.data import create_transform

        return create_transform(96, is_training=True, **kw)
    return make


PIPELINES = {
    "pets": lambda: T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.1),
                               T.ToTensor(), T.Normalize(MEAN, STD)]),
    "a": lambda: T.Compose([T.Resize(130), T.ColorJitter(.4, .4, .4, .1), T.RandomCrop(112), T.RandomHorizontalFlip(),
                            T.Resize(80), T.ToTensor()]),
    "c": lambda: T.Compose([T.Resize(120), T.CenterCrop(100), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "grey and flips": lambda: T.Compose([T.RandomResizedCrop(64), T.RandomVerticalFlip(), T.RandomGrayscale(0.5),
                                         T.RandomHorizontalFlip(), T.Grayscale(3), T.PILToTensor()]),
    "reference": lambda: T.Compose([T.RandomResizedCrop(80, interpolation=T.InterpolationMode.BICUBIC),
                                    T.RandomHorizontalFlip(), T.PILToTensor(), T.ConvertImageDtype(torch.float),
                                    T.Normalize(MEAN, STD)]),
    "flip_crop_flip": lambda: T.Compose([T.RandomHorizontalFlip(0.7), T.RandomCrop(50), T.RandomHorizontalFlip(0.6),
                                         T.ColorJitter(0.2, 0.2, 0.2, 0.2), T.Resize(41), T.RandomVerticalFlip(0.5),
                                         T.ToTensor()]),
    "RandAugment": lambda: T.Compose([T.RandomResizedCrop(96), T.RandAugment(num_ops=3), T.ToTensor()]),
    "AutoAugment": lambda: T.Compose([T.RandomResizedCrop(96), T.AutoAugment(), T.ToTensor()]),
    "TrivialAugmentWide": lambda: T.Compose([T.Resize(100), T.RandomCrop(90), T.TrivialAugmentWide(),
                                             T.RandomHorizontalFlip(), T.PILToTensor()]),
    "timm train": _timm(),
    "timm RandAugment": _timm(auto_augment="rand-m9-mstd0.5"),
    "timm AutoAugment": _timm(auto_augment="original"),
}


def _draws_and_renders(make, images, seed, repeat):
    """Per image: the draw on a Recording (the batch path's), then the native render, or the Python one (with
    why) where the recording keeps it."""
    seed_all(seed)
    tf = make()
    out, whys = [], []
    for _ in range(repeat):
        for im in images:
            a = np.asarray(im)
            before = rng_state()
            try:
                rec = compose_call.run_compose(tf, compose_plan.Recording(a.shape[:2], im.mode))
            except compose_plan.NotSplittable as exc:  # an op its library runs itself: one by one, as the batch
                torch.set_rng_state(before[0])
                random.setstate(before[1])
                np.random.set_state(before[2])
                whys.append(f"one by one: {exc}")
                out.append(tf(im))
                continue
            job = oprunner.prepare(rec)
            if isinstance(job, str):
                whys.append(job)
                out.append(compose_plan.render(rec, compose_plan.Pixels.of(FastImage.wrap(a))))
            else:
                out.append(oprunner.run(job, a))
    return out, rng_state(), whys


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_pipeline_renders_natively_as_stock(photos, name):
    if name.startswith("timm"):
        pytest.importorskip("timm")
    images = [im for im in _images(photos) if im.mode == "RGB"]  # what the batch path decodes
    repeat = 6 if "Aug" in name else 3
    seed_all(11)
    tf = PIPELINES[name]()
    want = [tf(im) for _ in range(repeat) for im in images]
    want_rng = rng_state()
    nano_patch.patch_torch()
    try:
        got, got_rng, whys = _draws_and_renders(PIPELINES[name], images, 11, repeat)
    finally:
        nano_patch.unpatch_torch()
    assert rng_differences(got_rng, want_rng) == []
    for k, (w, g) in enumerate(zip(want, got)):
        assert _same(w, g), (name, k)
    if "Aug" not in name:  # crops, resizes, flips, colour, grey, tails: all native
        assert whys == [], whys
    else:  # what a policy leaves to Python is said: histogram ops, warps
        assert len(whys) < len(got)
        assert all(w for w in whys), whys


# --- the policies' ops (v1, v2, timm) on their own ----------------------------------------------------------

POLICY_OPS = [("Brightness", 0.4), ("Brightness", -0.3), ("Contrast", 0.5), ("Color", -0.6), ("Sharpness", 0.7),
              ("Sharpness", -0.2), ("Posterize", 4.0), ("Posterize", 8.0), ("Solarize", 0.3), ("Solarize", 200.0),
              ("Invert", 0.0), ("Identity", 0.0), ("AutoContrast", 0.0), ("Equalize", 0.0)]


@pytest.mark.parametrize("v2", [False, True])
def test_every_policy_op_renders_natively_as_stock(patched, photos, v2):
    from torchvision.transforms import autoaugment
    from torchvision.transforms import v2 as tv2

    policy = tv2.RandAugment()
    for im in _images(photos):
        for name, magnitude in POLICY_OPS:
            if v2 and name == "Solarize":
                magnitude = magnitude / 255.0 if magnitude > 1 else magnitude
            if v2:
                want = policy._apply_image_or_video_transform(im, name, magnitude, interpolation=policy.interpolation,
                                                              fill=policy._fill)
            else:
                want = autoaugment._apply_op(im, name, magnitude, interpolation=T.InterpolationMode.NEAREST, fill=None)
            want = F.pil_to_tensor(want)
            rec = compose_plan.Recording((im.height, im.width), im.mode)
            policies._policy_kernel(rec, name, magnitude, T.InterpolationMode.NEAREST, None, v2=v2)
            rec.end_in_tensor(_tail(T.PILToTensor()), False)
            job = oprunner.prepare(rec)
            if name in ("AutoContrast", "Equalize"):
                assert isinstance(job, str) and "histogram" not in job and "depends on the image" in job
                got = compose_plan.render(rec, compose_plan.Pixels.of(FastImage.wrap(np.asarray(im))))
            else:
                assert not isinstance(job, str), (name, job)
                got = oprunner.run(job, np.asarray(im))
            assert _same(want, got), (name, magnitude, im.mode, v2)


def test_timms_policy_ops_render_natively_as_stock(patched, photos):
    pytest.importorskip("timm")
    from timm.data import auto_augment as aa

    kernels = policies._timm_kernels(aa)
    cases = [(aa.solarize_add, (40,)), (aa.solarize_add, (110, 90)), (aa.posterize, (3,)), (aa.posterize, (8,)),
             (aa.solarize, (100,)), (aa.invert, ()), (aa.brightness, (1.3,)), (aa.contrast, (0.6,)),
             (aa.color, (1.8,)), (aa.sharpness, (0.4,))]
    for im in _images(photos)[:2]:
        for fn, args in cases:
            want = F.pil_to_tensor(fn(im, *args))
            rec = compose_plan.Recording((im.height, im.width), im.mode)
            kernels[fn](rec, *args)
            rec.end_in_tensor(_tail(T.PILToTensor()), False)
            assert _same(want, _render_native(rec, np.asarray(im))), (fn.__name__, args)


# --- the batch tensor ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", ["ToTensor", "ToTensor Normalize", "PILToTensor", "PILToTensor ConvertImageDtype",
                                   "grey ToTensor", "grey PILToTensor"])
def test_the_batch_tensor_is_default_collates_stack_of_stocks_samples(patched, photos, steps):
    make = {"ToTensor": (T.ToTensor(),), "ToTensor Normalize": (T.ToTensor(), T.Normalize(MEAN, STD)),
            "PILToTensor": (T.PILToTensor(),), "PILToTensor ConvertImageDtype": (T.PILToTensor(),
                                                                                T.ConvertImageDtype(torch.float)),
            "grey ToTensor": (T.ToTensor(),), "grey PILToTensor": (T.PILToTensor(),)}[steps]
    images = [photos[k % 3].resize((64, 48)) for k in range(5)]
    if steps.startswith("grey"):
        images = [im.convert("L") for im in images]
    samples, jobs = [], []
    for im in images:
        want = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        for t in make:
            want = t(want)
        samples.append(want)
        rec = compose_plan.Recording((im.height, im.width), im.mode)
        rec.hflip()
        rec.end_in_tensor(_tail(*make), False)
        jobs.append(oprunner.prepare(rec))
    base = oprunner.batch_tensor(jobs)
    got_samples = [oprunner.run(job, np.asarray(im)) for job, im in zip(jobs, images)]
    for w, g in zip(samples, got_samples):
        assert _same(w, g)
    want = default_collate(samples)
    got = default_collate(got_samples)
    assert _same(want, got)
    if "PILToTensor" in steps and not steps.startswith("grey"):
        # stock's samples are channels-last and its stack is contiguous: a slot cannot have the sample's strides
        assert base is None
        return
    assert got is base  # collated as it is: no copy
    again = default_collate(got_samples)  # the marks are gone: stacked as stock stacks
    assert again is not base and _same(want, again)


def test_samples_left_to_python_are_counted_with_why(patched, photos, tmp_path):
    rec_native = compose_plan.Recording((61, 97))
    rec_native.hflip()
    rec_native.end_in_tensor(_tail(T.ToTensor()), False)
    rec_python = compose_plan.Recording((61, 97))
    rec_python.point(K.equalize)
    rec_python.end_in_tensor(_tail(T.ToTensor()), False)
    report.stats = report.Stats(str(tmp_path))
    try:
        jobs = oprunner.prepare_batch([rec_native, rec_python, None])
        counts = dict(report.stats.counts)
    finally:
        report.stats = None
    assert jobs[0] is not None and jobs[1] is None and jobs[2] is None
    assert jobs[0].slot_tensor is None and jobs[0].flat is None  # not every sample native: no batch tensor
    assert counts[("vision_transforms", True, "sample rendered by the native op runner (one call)")] == 1
    assert counts[("vision_transforms", False,
                   "sample rendered by the Python path: equalize (its table depends on the image)")] == 1


@pytest.mark.parametrize("region", ["decoded alone", "refused: the whole file"])
def test_a_jpeg_not_decoded_yet_renders_its_first_crop_as_stock(patched, photos, tmp_path, monkeypatch, region):
    """The batch path's JPEG window: the first crop decoded alone (libjpeg-turbo), or, where that is refused, the
    whole file decoded first, as ``pixels.JpegPixels`` does."""
    from nano_patch.vision.images import decode
    from nano_patch.vision.kernels import native, native_kernels

    path = tmp_path / "p.jpg"
    photos[0].save(path, quality=90)
    data = path.read_bytes()
    size = decode.jpeg_size(data)
    if region == "refused: the whole file":
        def refuse(*args, **kwargs):
            raise native_kernels.JpegRegionError("refused")
        monkeypatch.setattr(native_kernels, "decode_jpeg_region", refuse)
    elif not native.available("crop_decode"):
        pytest.skip("crop decoding is not built here")
    tf = PIPELINES["pets"]()
    seed_all(5)
    want = tf(Image.open(path).convert("RGB"))
    seed_all(5)
    rec = compose_call.run_compose(tf, compose_plan.Recording(size))
    job = oprunner.prepare(rec)
    assert not isinstance(job, str), job
    assert _same(want, oprunner.run_jpeg(job, data, size, path))
