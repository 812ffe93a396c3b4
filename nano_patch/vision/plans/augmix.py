"""torchvision's ``AugMix`` (v1, PIL input), as stock computes it, with less repeated work.

AugMix differs from the other policies: it turns the image into a uint8 tensor and runs its ops
through torchvision's *tensor* kernels, then mixes the chains in float32. So its arithmetic is
torch's, not PIL's, and the way to make it faster without changing a bit is to keep torch's own
kernels and stop recomputing what does not change:

- an affine op's sampling grid is a pure function of its matrix and the image size, and the
  matrices come from a few magnitude bins: each grid is computed once, by stock's own
  ``_gen_affine_grid``, and reused (the batched matrix product it costs was a quarter of AugMix's
  time); ``grid_sample`` then runs on it as in stock;
- brightness, the blend of contrast (after stock's own mean), autocontrast (after stock's own per
  channel minimum and scale) and equalize (stock's own lookup table) are functions of each pixel's
  value: the 256 values are run through stock's very expression once, and the image goes through
  the resulting table;
- everything else (colour, sharpness, posterize, solarize, invert, the random draws, the Dirichlet
  weights, the mixing) is stock's code, called as stock calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

#: Sampling grids by (matrix, sizes): a few dozen per image size in practice; bounded all the same.
_GRIDS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_GRID_LIMIT = 256


def _grid(theta_values: list[float], w: int, h: int, ow: int, oh: int) -> Any:
    import torch
    from torchvision.transforms import _functional_tensor as F_t

    key = (tuple(theta_values), w, h, ow, oh)
    grid = _GRIDS.get(key)
    if grid is None:
        theta = torch.tensor(theta_values, dtype=torch.float32).reshape(1, 2, 3)
        grid = F_t._gen_affine_grid(theta, w=w, h=h, ow=ow, oh=oh)
        _GRIDS[key] = grid
        if len(_GRIDS) > _GRID_LIMIT:
            _GRIDS.popitem(last=False)
    else:
        _GRIDS.move_to_end(key)
    return grid


def _warp(img: Any, matrix: list[float], interpolation: Any, fill: Any) -> Any:
    """``F_t.affine`` / ``F_t.rotate`` (no expand) of a uint8 image: stock's checks, a cached grid."""
    from torchvision.transforms import _functional_tensor as F_t

    F_t._assert_grid_transform_inputs(img, matrix, interpolation, fill, ["nearest", "bilinear"])
    grid = _grid(list(matrix), img.shape[-1], img.shape[-2], img.shape[-1], img.shape[-2])
    return F_t._apply_grid_transform(img, grid, interpolation, fill=fill)


def _through(img: Any, tables: np.ndarray, like_input: bool = True) -> Any:
    """A (1, C, H, W) uint8 tensor through one 256-entry table per channel (C x 256 uint8), or None.

    ``like_input``: the result keeps the input's memory layout, as stock's elementwise ops do (a
    channels-last view stays channels-last); else it is contiguous, as stock's ``torch.stack`` makes it.
    Layout matters: torch may sum in another order over another layout (``conv2d`` in a later op).
    """
    import cv2
    import torch

    channels_last = like_input and not img.is_contiguous() and img.is_contiguous(memory_format=torch.channels_last)
    out = torch.empty(img.shape, dtype=img.dtype,
                      memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    c = img.shape[1]
    if c == 3 and img[0].permute(1, 2, 0).is_contiguous() and out[0].permute(1, 2, 0).is_contiguous():
        cv2.LUT(img[0].permute(1, 2, 0).numpy(), np.ascontiguousarray(tables.T).reshape(256, 1, 3),
                dst=out[0].permute(1, 2, 0).numpy())
        return out
    src = img.contiguous()
    if not out.is_contiguous():
        return None
    for i in range(c):
        cv2.LUT(src[0, i].numpy(), tables[i], dst=out[0, i].numpy())
    return out


def _values(channels: int = 1) -> Any:
    import torch

    return torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, channels, 1, 256)


def _table(result: Any) -> np.ndarray:
    return np.ascontiguousarray(result.reshape(-1, 256).numpy())


def _op(img: Any, name: str, magnitude: float, interpolation: Any, fill: Any) -> Any:
    """torchvision's ``_apply_op`` on a uint8 image tensor, to the bit."""
    import math

    import torch
    from torchvision.transforms import _functional_tensor as F_t
    from torchvision.transforms import autoaugment
    from torchvision.transforms import functional as F

    mode = interpolation
    if isinstance(mode, int):
        mode = F._interpolation_modes_from_int(mode)
    if not isinstance(mode, F.InterpolationMode) or img.dtype != torch.uint8 or img.ndim != 4 or img.shape[1] not in (
            1, 3):
        return autoaugment._apply_op(img, name, magnitude, interpolation=interpolation, fill=fill)
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
        h, w = img.shape[-2], img.shape[-1]
        if name == "Rotate":
            matrix = F._get_inverse_affine_matrix([0.0, 0.0], -magnitude, [0.0, 0.0], 1.0, [0.0, 0.0])
        else:
            shear, translate, center = [0.0, 0.0], [0, 0], None
            if name == "ShearX":
                shear, center = [math.degrees(math.atan(magnitude)), 0.0], [0, 0]
            elif name == "ShearY":
                shear, center = [0.0, math.degrees(math.atan(magnitude))], [0, 0]
            elif name == "TranslateX":
                translate = [int(magnitude), 0]
            else:
                translate = [0, int(magnitude)]
            center_f = [0.0, 0.0] if center is None else [1.0 * (c - s * 0.5) for c, s in zip(center, [w, h])]
            matrix = F._get_inverse_affine_matrix(center_f, 0.0, [1.0 * t for t in translate], 1.0, shear)
        return _warp(img, matrix, mode.value, fill)
    out = None
    c = img.shape[1]
    if name == "Brightness" and 1.0 + magnitude >= 0:
        zeros = torch.zeros((1, 1, 1, 256), dtype=torch.uint8)
        out = _through(img, np.repeat(_table(F_t._blend(_values(), zeros, 1.0 + magnitude)), c, 0))
    elif name == "Contrast" and 1.0 + magnitude >= 0:
        if c == 3:
            mean = torch.mean(F_t.rgb_to_grayscale(img).to(torch.float32), dim=(-3, -2, -1), keepdim=True)
        else:
            mean = torch.mean(img.to(torch.float32), dim=(-3, -2, -1), keepdim=True)
        out = _through(img, np.repeat(_table(F_t._blend(_values(), mean, 1.0 + magnitude)), c, 0))
    elif name == "AutoContrast":
        minimum = img.amin(dim=(-2, -1), keepdim=True).to(torch.float32)
        maximum = img.amax(dim=(-2, -1), keepdim=True).to(torch.float32)
        scale = 255 / (maximum - minimum)
        eq_idxs = torch.isfinite(scale).logical_not()
        minimum[eq_idxs] = 0
        scale[eq_idxs] = 1
        out = _through(img, _table(((_values(c) - minimum) * scale).clamp(0, 255).to(torch.uint8)))
    elif name == "Equalize":
        out = _through(img, np.stack([_equalize_table(img[0, i]) for i in range(c)]), like_input=False)
    if out is not None:
        return out
    return autoaugment._apply_op(img, name, magnitude, interpolation=interpolation, fill=fill)


def _equalize_table(img_chan: Any) -> np.ndarray:
    """The table stock's ``_scale_channel`` looks the channel up in (the identity where it returns it as is)."""
    import torch

    hist = torch.bincount(img_chan.reshape(-1), minlength=256)
    nonzero_hist = hist[hist != 0]
    step = torch.div(nonzero_hist[:-1].sum(), 255, rounding_mode="floor")
    if step == 0:
        return np.arange(256, dtype=np.uint8)
    lut = torch.div(torch.cumsum(hist, 0) + torch.div(step, 2, rounding_mode="floor"), step, rounding_mode="floor")
    lut = torch.nn.functional.pad(lut, [1, 0])[:-1].clamp(0, 255)
    return lut.to(torch.uint8).numpy()


def run(t: Any, img: Any, space: list[tuple[str, list[float] | None, bool]]) -> Any:
    """``t.forward(img)`` for a stock ``AugMix`` and a PIL image, with ``space`` its augmentation space for the
    image's size (names, magnitudes as floats, signed), in stock's order. Returns stock's PIL image."""
    import torch

    fill = t.fill
    orig_img = img
    img = t._pil_to_tensor(orig_img)
    orig_dims = list(img.shape)
    batch = img.view([1] * max(4 - img.ndim, 0) + orig_dims)
    batch_dims = [batch.size(0)] + [1] * (batch.ndim - 1)
    m = t._sample_dirichlet(torch.tensor([t.alpha, t.alpha], device=batch.device).expand(batch_dims[0], -1))
    combined_weights = t._sample_dirichlet(
        torch.tensor([t.alpha] * t.mixture_width, device=batch.device).expand(batch_dims[0], -1)
    ) * m[:, 1].view([batch_dims[0], -1])
    mix = m[:, 0].view(batch_dims) * batch
    for i in range(t.mixture_width):
        aug = batch
        depth = t.chain_depth if t.chain_depth > 0 else int(torch.randint(low=1, high=4, size=(1,)).item())
        for _ in range(depth):
            name, magnitudes, signed = space[int(torch.randint(len(space), (1,)).item())]
            magnitude = (float(magnitudes[int(torch.randint(t.severity, (1,), dtype=torch.long))])
                         if magnitudes is not None else 0.0)
            if signed and torch.randint(2, (1,)):
                magnitude *= -1.0
            aug = _op(aug, name, magnitude, t.interpolation, fill)
        mix.add_(combined_weights[:, i].view(batch_dims) * aug)
    mix = mix.view(orig_dims).to(dtype=img.dtype)
    return t._tensor_to_pil(mix)
