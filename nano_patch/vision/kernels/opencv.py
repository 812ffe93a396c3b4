"""OpenCV for the kernels on arrays: imported on first use, kept single-threaded, and given arrays it takes.

A forked DataLoader worker deadlocks in OpenCV if the parent had already started OpenCV's thread pool, and
per-image kernels gain little from threads (the parallelism is the workers'): the thread count OpenCV had is
kept and given back when the patch is reverted (:func:`release_cv2`).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

_cv2: ModuleType | None = None
#: OpenCV's thread count before the first kernel call, restored by :func:`release_cv2`.
_cv2_threads_before: int | None = None


def cv2() -> ModuleType:
    """OpenCV, imported on first use and kept single-threaded."""
    global _cv2, _cv2_threads_before
    if _cv2 is None:
        import cv2 as _m

        _cv2_threads_before = _m.getNumThreads()
        _m.setNumThreads(1)
        _cv2 = _m
    return _cv2


def release_cv2() -> None:
    """Give OpenCV back the thread count it had before the kernels used it."""
    global _cv2, _cv2_threads_before
    if _cv2 is not None and _cv2_threads_before is not None:
        _cv2.setNumThreads(_cv2_threads_before)
    _cv2, _cv2_threads_before = None, None


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array (itself where it is one), as OpenCV's functions take it."""
    if a.flags.c_contiguous:
        return a
    if a.ndim == 3 and a.strides[2] != a.itemsize and all(a[:, :, i].flags.c_contiguous for i in range(a.shape[2])):
        # Planes (torch's CHW output seen as HWC): OpenCV interleaves them much faster than NumPy.
        return cv2().merge([a[:, :, i] for i in range(a.shape[2])])
    return np.ascontiguousarray(a)
