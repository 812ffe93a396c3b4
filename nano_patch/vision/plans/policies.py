"""The augmentation policies: AutoAugment, RandAugment, TrivialAugmentWide and AugMix (torchvision v1), their v2
versions on PIL input, and timm's AutoAugment and RandAugment.

Each runner makes stock's draws in stock's order (torch's generator for torchvision, NumPy's and Python's for
timm) and each op as a kernel on :class:`pixels.Pixels` (written down on a :class:`recording.Recording` in a batch's
draw); an op the kernels leave to stock runs the library's own function on the image.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ... import report
from ..kernels import functional as K
from . import stock
from .pixels import JITTER, LeftPlan, Pixels, UseStock
from .recording import NotSplittable, Recording

#: Methods a policy class must still have (stock's) to be planned, besides forward/__call__/get_params.
POLICY_METHODS = ("_augmentation_space", "_pil_to_tensor", "_tensor_to_pil", "_sample_dirichlet")
#: Per policy class and arguments of ``_augmentation_space``: [(op name, magnitudes as floats or None,
#: signed)] in stock's order. ``_augmentation_space`` is a pure function of its arguments (linspaces),
#: so its floats are computed once, with stock's own code, instead of per image.
_spaces: dict[tuple[Any, ...], list[tuple[str, list[float] | None, bool]]] = {}


def _space(t: Any, *args: Any) -> list[tuple[str, list[float] | None, bool]]:
    key = (type(t), *args)
    space = _spaces.get(key)
    if space is None:
        space = [(name, m.tolist() if m.ndim > 0 else None, bool(signed))
                 for name, (m, signed) in t._augmentation_space(*args).items()]
        _spaces[key] = space
    return space


def _warp_filter(interpolation: Any) -> int:
    """PIL's filter number for a policy's ``interpolation``, as ``F.affine``/``F.rotate`` map it."""
    F = stock.functional()
    mode = interpolation
    if isinstance(mode, int) and not isinstance(mode, bool):
        mode = F._interpolation_modes_from_int(mode)
    elif not isinstance(mode, F.InterpolationMode):
        raise UseStock
    return int(F.pil_modes_mapping[mode])


def policy_op(px: Pixels, name: str, magnitude: float, interpolation: Any, fill: Any) -> Pixels:
    """torchvision's ``autoaugment._apply_op`` on PIL input, with the kernels; stock's own ``_apply_op`` on
    the image for anything the kernels leave to stock."""
    try:
        return _policy_kernel(px, name, magnitude, interpolation, fill)
    except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: stock's op decides
        pass
    from torchvision.transforms import autoaugment

    result = autoaugment._apply_op(px.image(), name, magnitude, interpolation=interpolation, fill=fill)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise LeftPlan(result)


def _affine_matrix(px: Pixels, angle: float, translate: list[Any], shear: list[float],
                   center: list[float] | None, v2: bool) -> list[float]:
    """The inverse matrix ``F.affine`` computes for PIL input: v1's function, or v2's (its own copy, with
    the centre made floats as its argument parsing does)."""
    h, w = px.hw
    if center is None:
        center = [w * 0.5, h * 0.5]
    if v2:
        return _v2_geometry()._get_inverse_affine_matrix([float(c) for c in center], angle, translate, 1.0, shear)
    return stock.functional()._get_inverse_affine_matrix(center, angle, translate, 1.0, shear)


def _v2_geometry() -> Any:
    from torchvision.transforms.v2.functional import _geometry

    return _geometry


def _policy_kernel(px: Pixels, name: str, magnitude: float, interpolation: Any, fill: Any,
                   v2: bool = False) -> Pixels:
    """One op of a policy on PIL input, as torchvision's v1 ``_apply_op`` (or v2's
    ``_apply_image_or_video_transform``) computes it, with the kernels; raises before changing ``px``
    for anything it does not reproduce."""
    if name in _GEOMETRY:
        if v2:
            f = int(stock.functional().pil_modes_mapping[_v2_geometry()._check_interpolation(interpolation)])
        else:
            f = _warp_filter(interpolation)
        if name == "Rotate":
            return px.whole(K.rotate, magnitude, f, False, None, fill)
        else:
            if name == "ShearX":
                matrix = _affine_matrix(px, 0.0, [0, 0], [math.degrees(math.atan(magnitude)), 0.0], [0, 0], v2)
            elif name == "ShearY":
                matrix = _affine_matrix(px, 0.0, [0, 0], [0.0, math.degrees(math.atan(magnitude))], [0, 0], v2)
            elif name == "TranslateX":
                matrix = _affine_matrix(px, 0.0, [int(magnitude), 0], [0.0, 0.0], None, v2)
            else:
                matrix = _affine_matrix(px, 0.0, [0, int(magnitude)], [0.0, 0.0], None, v2)
            return px.whole(K.affine, matrix, f, fill)
    if name in _POLICY_COLOUR:
        if 1.0 + magnitude < 0:
            raise UseStock  # stock's own code decides
        return px.colour(_POLICY_COLOUR[name], 1.0 + magnitude)
    if name == "Sharpness":  # not per pixel: a pending flip is applied first
        return px.whole(K.adjust_sharpness, 1.0 + magnitude)
    if name == "Identity":
        return px
    kernel = _POLICY_POINT[name]
    if name == "Posterize":
        return px.point(kernel, int(magnitude))
    if name == "Solarize":
        return px.point(kernel, 255.0 * magnitude if v2 else magnitude)  # v2 scales by the dtype's bound
    return px.point(kernel)


_GEOMETRY = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})
_POLICY_COLOUR = {"Brightness": JITTER[0], "Contrast": JITTER[1], "Color": JITTER[2]}
_POLICY_POINT: dict[str, Callable[..., np.ndarray]] = {
    "Posterize": K.posterize, "Solarize": K.solarize, "AutoContrast": K.autocontrast, "Equalize": K.equalize,
    "Invert": K.invert}


def run_auto_augment(t: Any, px: Pixels) -> Pixels:
    transform_id, probs, signs = t.get_params(len(t.policies))
    space = dict((n, (m, s)) for n, m, s in _space(t, 10, px.hw))
    for i, (name, p, magnitude_id) in enumerate(t.policies[transform_id]):
        if probs[i] <= p:
            magnitudes, signed = space[name]
            magnitude = float(magnitudes[magnitude_id]) if magnitude_id is not None else 0.0
            if signed and signs[i] == 0:
                magnitude *= -1.0
            px = policy_op(px, name, magnitude, t.interpolation, t.fill)
    return px


def run_rand_augment(t: Any, px: Pixels) -> Pixels:
    torch = stock.torch()
    space = _space(t, t.num_magnitude_bins, px.hw)
    for _ in range(t.num_ops):
        name, magnitudes, signed = space[int(torch.randint(len(space), (1,)).item())]
        magnitude = float(magnitudes[t.magnitude]) if magnitudes is not None else 0.0
        if signed and torch.randint(2, (1,)):
            magnitude *= -1.0
        px = policy_op(px, name, magnitude, t.interpolation, t.fill)
    return px


def run_augmix(t: Any, px: Pixels) -> Pixels:
    """AugMix mixes on tensors with torch's arithmetic: ``vision/plans/augmix.py`` runs it as stock does, with its
    sampling grids and per-value ops computed once."""
    from . import augmix

    if isinstance(px, Recording):  # its draws come between tensor operations on the pixels
        raise NotSplittable("AugMix draws while it computes on the pixels", every_time=True)
    h, w = px.hw
    return Pixels.of(augmix.run(t, px.image(), _space(t, t._PARAMETER_MAX, (h, w))))


def run_trivial_augment_wide(t: Any, px: Pixels) -> Pixels:
    torch = stock.torch()
    space = _space(t, t.num_magnitude_bins)
    name, magnitudes, signed = space[int(torch.randint(len(space), (1,)).item())]
    magnitude = (float(magnitudes[torch.randint(len(magnitudes), (1,), dtype=torch.long)])
                 if magnitudes is not None else 0.0)
    if signed and torch.randint(2, (1,)):
        magnitude *= -1.0
    return policy_op(px, name, magnitude, t.interpolation, t.fill)


# --- the v2 policies (transforms.v2, PIL input) ------------------------------------------------------

#: v2 policy class -> (runner, the stock methods and attributes it relies on, resolved through the MRO).
_V2_POLICIES: dict[type, tuple[Callable[[Any, Pixels], Pixels], dict[str, Any]]] = {}
_V2_METHODS = ("forward", "_apply_image_or_video_transform", "_get_random_item",
               "_flatten_and_extract_image_or_video", "_unflatten_and_insert_image_or_video")
_v2_spaces: dict[tuple[Any, ...], list[tuple[str, list[float] | None, bool]]] = {}


def configure_v2(v2: Any) -> None:
    """Record transforms.v2's policy classes and their stock methods (the v2 patch calls this)."""
    _V2_POLICIES.clear()
    for name, runner in (("AutoAugment", _run_v2_auto_augment), ("RandAugment", _run_v2_rand_augment),
                         ("TrivialAugmentWide", _run_v2_trivial_augment_wide)):
        cls = getattr(v2, name, None)
        if isinstance(cls, type):
            _V2_POLICIES[cls] = (runner, {m: getattr(cls, m, None) for m in (*_V2_METHODS, "_AUGMENTATION_SPACE")})


def run_v2_policy(t: Any, img: Image.Image) -> Any:
    """A v2 policy on a lone PIL image (a ``FastImage``) by its plan: stock's draws in stock's order, each
    op a kernel on the array. None when ``t`` is not exactly a stock v2 policy (run it as it is)."""
    entry = _V2_POLICIES.get(type(t))
    if entry is None or "_AUGMENTATION_SPACE" in vars(t):
        return None
    runner, stock = entry
    if any(getattr(type(t), m, None) is not f for m, f in stock.items()):
        return None
    x = runner(t, Pixels.of(img))
    if report.stats is not None:
        report.stats.count("vision_transforms", True, f"v2.{type(t).__name__}")
    return x.image()


def _v2_space(t: Any, bins: int, h: int, w: int) -> list[tuple[str, list[float] | None, bool]]:
    key = (type(t), bins, h, w)
    space = _v2_spaces.get(key)
    if space is None:
        space = []
        for name, (fn, signed) in t._AUGMENTATION_SPACE.items():
            m = fn(bins, h, w)
            space.append((name, None if m is None else [float(v) for v in m.tolist()], bool(signed)))
        _v2_spaces[key] = space
    return space


def v2_op(t: Any, px: Pixels, name: str, magnitude: float) -> Pixels:
    from PIL.Image import Image as PILImage
    from torchvision.transforms.v2._utils import _get_fill

    fill = _get_fill(t._fill, PILImage)  # as for a plain PIL image, which is what stock was given
    try:
        return _policy_kernel(px, name, magnitude, t.interpolation, fill, v2=True)
    except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: stock's op decides
        pass
    result = t._apply_image_or_video_transform(px.image(), name, magnitude, interpolation=t.interpolation,
                                               fill=t._fill)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise LeftPlan(result)


def _v2_magnitude(magnitudes: list[float] | None, index: Any, signed: bool) -> float:
    torch = stock.torch()
    if magnitudes is None:
        return 0.0
    magnitude = float(magnitudes[index() if callable(index) else index])
    if signed and torch.rand(()) <= 0.5:
        magnitude *= -1
    return magnitude


def _run_v2_auto_augment(t: Any, px: Pixels) -> Pixels:
    torch = stock.torch()
    h, w = px.hw
    policy = t._policies[int(torch.randint(len(t._policies), ()))]
    space = {n: (m, s) for n, m, s in _v2_space(t, 10, h, w)}
    for name, probability, magnitude_idx in policy:
        if not torch.rand(()) <= probability:
            continue
        magnitudes, signed = space[name]
        px = v2_op(t, px, name, _v2_magnitude(magnitudes, magnitude_idx, signed))
    return px


def _run_v2_rand_augment(t: Any, px: Pixels) -> Pixels:
    torch = stock.torch()
    h, w = px.hw
    space = _v2_space(t, t.num_magnitude_bins, h, w)
    for _ in range(t.num_ops):
        name, magnitudes, signed = space[int(torch.randint(len(space), ()))]
        px = v2_op(t, px, name, _v2_magnitude(magnitudes, t.magnitude, signed))
    return px


def _run_v2_trivial_augment_wide(t: Any, px: Pixels) -> Pixels:
    torch = stock.torch()
    h, w = px.hw
    space = _v2_space(t, t.num_magnitude_bins, h, w)
    name, magnitudes, signed = space[int(torch.randint(len(space), ()))]
    index = lambda: int(torch.randint(t.num_magnitude_bins, ()))  # noqa: E731 - drawn only with magnitudes
    return v2_op(t, px, name, _v2_magnitude(magnitudes, index, signed))


# --- timm's AutoAugment and RandAugment: timm's own draws (NumPy's and Python's random), in timm's order ---

#: timm.data.auto_augment, once a plan has met one of its policies; its AugmentOp.__call__ as first seen.
_timm_aa: Any = None
_timm_op_call: Any = None


def _timm_point(kernel: Callable[..., np.ndarray]) -> Callable[..., Pixels]:
    def run(px: Pixels, *args: Any, **_: Any) -> Pixels:
        return px.point(kernel, *args)
    return run


def _timm_colour(op: tuple[Callable[..., np.ndarray], str, bool]) -> Callable[..., Pixels]:
    def run(px: Pixels, factor: Any, **_: Any) -> Pixels:
        if not (isinstance(factor, (int, float)) and factor >= 0):
            raise UseStock  # ImageEnhance takes what torchvision's checks refuse: timm's own function decides
        return px.colour(op, float(factor))
    return run


def _timm_sharpness(px: Pixels, factor: Any, **_: Any) -> Pixels:
    if not (isinstance(factor, (int, float)) and factor >= 0):
        raise UseStock
    return px.whole(K.adjust_sharpness, float(factor))  # not per pixel: flip first


def _timm_solarize_add(px: Pixels, add: Any, thresh: Any = 128, **_: Any) -> Pixels:
    table = np.array([min(255, i + add) if i < thresh else i for i in range(256)])
    if table.dtype.kind not in "iu" or table.min() < 0 or table.max() > 255:
        raise UseStock  # PIL's point decides what it makes of such a table
    return px.point(K.lut, table)


def _timm_posterize(px: Pixels, bits: Any, **_: Any) -> Pixels:
    if isinstance(bits, (int, float)) and bits >= 8:
        return px  # timm returns the image as it is
    return _timm_point(K.posterize)(px, bits)


def _timm_kernels(aa: Any) -> dict[Any, Callable[..., Pixels]]:
    """timm's ImageOps and ImageEnhance ops as kernels on the array; its warps (``img.transform``,
    ``img.rotate``) reach the native warp through the patch's image, so they run timm's own function."""
    return {aa.auto_contrast: _timm_point(K.autocontrast), aa.equalize: _timm_point(K.equalize),
            aa.invert: _timm_point(K.invert), aa.solarize: _timm_point(K.solarize),
            aa.solarize_add: _timm_solarize_add, aa.posterize: _timm_posterize,
            aa.brightness: _timm_colour(JITTER[0]), aa.contrast: _timm_colour(JITTER[1]),
            aa.color: _timm_colour(JITTER[2]), aa.sharpness: _timm_sharpness}


def _timm_check(t: Any, ops: Any) -> dict[Any, Callable[..., Pixels]]:
    """Before any draw: timm's module as the plan knows it, and every op a stock ``AugmentOp``."""
    global _timm_aa, _timm_op_call
    import sys

    aa = sys.modules.get(type(t).__module__)
    if aa is None or not str(getattr(sys.modules.get("timm"), "__version__", "")).startswith("1."):
        raise UseStock  # AugmentOp's draws are reproduced as timm 1.x makes them
    if _timm_aa is not aa:
        _timm_aa, _timm_op_call = aa, vars(aa.AugmentOp).get("__call__")
        _timm_aa_kernels.clear()
        _timm_aa_kernels.update(_timm_kernels(aa))
    for op in ops:
        if type(op) is not aa.AugmentOp or vars(aa.AugmentOp).get("__call__") is not _timm_op_call:
            raise UseStock
    return _timm_aa_kernels


_timm_aa_kernels: dict[Any, Callable[..., Pixels]] = {}


def _timm_op(op: Any, px: Pixels, kernels: dict[Any, Callable[..., Pixels]]) -> Pixels:
    """timm's ``AugmentOp.__call__``: its draws (the probability, the magnitude's noise, the level's sign,
    the filter), then the op as a kernel, or timm's own function on the patch's image."""
    if op.prob < 1.0 and random.random() > op.prob:
        return px
    magnitude = op.magnitude
    if op.magnitude_std > 0:
        if op.magnitude_std == float("inf"):
            magnitude = random.uniform(0, magnitude)
        elif op.magnitude_std > 0:
            magnitude = random.gauss(magnitude, op.magnitude_std)
    upper_bound = op.magnitude_max or _timm_aa._LEVEL_DENOM
    magnitude = max(0., min(magnitude, upper_bound))
    level_args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else tuple()
    kernel = kernels.get(op.aug_fn)
    if kernel is not None:
        try:
            return kernel(px, *level_args, **op.kwargs)
        except Exception:  # noqa: BLE001 - a kernel raises before it changes ``px``: timm's op decides
            pass
    result = op.aug_fn(px.image(), *level_args, **op.kwargs)
    if isinstance(result, Image.Image) and result.mode in ("RGB", "L"):
        return Pixels.of(result)
    raise LeftPlan(result)


def run_timm_rand_augment(t: Any, px: Pixels) -> Pixels:
    kernels = _timm_check(t, t.ops)
    ops = np.random.choice(t.ops, t.num_layers, replace=t.choice_weights is None, p=t.choice_weights)
    for op in ops:
        px = _timm_op(op, px, kernels)
    return px


def run_timm_auto_augment(t: Any, px: Pixels) -> Pixels:
    kernels = _timm_check(t, [op for sub_policy in t.policy for op in sub_policy])
    for op in random.choice(t.policy):
        px = _timm_op(op, px, kernels)
    return px

