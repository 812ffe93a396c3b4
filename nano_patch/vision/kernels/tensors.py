"""uint8 arrays to torch tensors, as stock's ``ToTensor`` and ``PILToTensor`` lay them out, and the tensor tail's
table lookups (each channel through its row of a C x 256 table of stock's own arithmetic on every uint8 value).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import native, native_kernels
from .opencv import contiguous, cv2
from .pil_arrays import get_image_num_channels


def to_tensor(a: np.ndarray, dtype: Any = None) -> Any:
    """``ToTensor``: CHW float in [0, 1], bit-identical to torchvision."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    if dtype in (torch.float32, torch.float64):
        return image_through_tables(a, _to_tensor_table(dtype, get_image_num_channels(a)))
    return _float_planes(a, dtype).div_(255)


_TABLES: dict[tuple[Any, ...], np.ndarray] = {}


def _to_tensor_table(dtype: Any, channels: int) -> np.ndarray:
    """A channels x 256 table: ToTensor's own arithmetic (``.to(dtype).div(255)``) on every uint8 value."""
    import torch

    key = (dtype, channels)
    table = _TABLES.get(key)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).to(dtype).div(255).expand(channels, 256).contiguous().numpy()
        _TABLES[key] = table
    return table


def planes(a: np.ndarray) -> list[np.ndarray]:
    """The image's channels as contiguous H x W planes."""
    return list(cv2().split(contiguous(a))) if a.ndim == 3 else [contiguous(a)]


def planes_through_tables(channels: list[np.ndarray], table: np.ndarray) -> Any:
    """A C x H x W tensor: plane ``c`` looked up in row ``c`` of the C x 256 ``table``.

    One plane and several rows broadcast, as a 1-channel image normalised with 3 means does.
    """
    import torch

    h, w = channels[0].shape
    out = np.empty((table.shape[0], h, w), dtype=table.dtype)
    for c in range(table.shape[0]):
        cv2().LUT(channels[c if len(channels) > 1 else 0], table[c], dst=out[c])
    return torch.from_numpy(out)


def image_through_tables(a: np.ndarray, table: np.ndarray) -> Any:
    """A C x H x W tensor from an H x W (x C) image: channel ``c`` through row ``c`` of ``table``.

    One pass in the native kernel (de-interleave and look up together), else OpenCV's split and LUT.
    """
    import torch

    try:
        out = torch.from_numpy(native_kernels.planes_lut(a, table))
    except native.NativeUnavailable:
        out = planes_through_tables(planes(a), table)
    if out.shape[0] == 1:  # stock's strides for one channel: a (H, W, 1) array seen as (1, H, W)
        out = out[0].unsqueeze(2).permute(2, 0, 1)
    return out


def _float_planes(a: np.ndarray, dtype: Any = None) -> Any:
    """The image as a C x H x W float tensor of the same values (0-255)."""
    import torch

    dtype = dtype or torch.get_default_dtype()
    if a.ndim == 3 and dtype == torch.float32:
        # OpenCV de-interleaves, NumPy widens each plane: faster than torch's strided copy.
        out = np.empty((a.shape[2], a.shape[0], a.shape[1]), dtype=np.float32)
        for plane, channel in zip(out, cv2().split(contiguous(a))):
            plane[...] = channel
        return torch.from_numpy(out)
    hwc = a[:, :, None] if a.ndim == 2 else a
    out = torch.empty((hwc.shape[2], hwc.shape[0], hwc.shape[1]), dtype=dtype)
    out.copy_(from_numpy(hwc).permute(2, 0, 1))
    return out


def pil_to_tensor(a: np.ndarray, owned: bool = False) -> Any:
    """``PILToTensor``: a C x H x W uint8 view of an H x W x C copy, stock's layout (channels-last strides).

    ``owned``: ``a`` is private to the caller, so it is not copied again.
    """
    if not (owned and a.flags.writeable and a.flags.c_contiguous):
        a = np.array(a, copy=True, order="C")
    t = from_numpy(a)
    return (t.unsqueeze(2) if a.ndim == 2 else t).permute(2, 0, 1)


def pixels_through_tables(a: np.ndarray, table: np.ndarray) -> Any:
    """``PILToTensor`` + ``ConvertImageDtype`` (+ ``Normalize``) as stock lays it out: a C x H x W view of
    an H x W x C float array, channel ``c`` through row ``c`` of ``table``."""
    try:
        hwc = native_kernels.pixels_lut(a, table)
    except native.NativeUnavailable:
        src = a[:, :, None] if a.ndim == 2 else a
        hwc = np.stack([table[c][src[..., c]] for c in range(src.shape[2])], -1)
    t = from_numpy(hwc)
    return (t.unsqueeze(2) if hwc.ndim == 2 else t).permute(2, 0, 1)


def from_numpy(a: np.ndarray) -> Any:
    """``torch.from_numpy(a)``, of a copy where torch cannot share the array (negative strides, read-only)."""
    import torch

    if any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a)
    if not a.flags.writeable:
        # torch warns about sharing a read-only array; silencing that needs ``catch_warnings``, which is
        # process-wide state and unsafe while loader threads run: a private copy instead (a rare path).
        a = np.array(a, copy=True)
    return torch.from_numpy(a)
