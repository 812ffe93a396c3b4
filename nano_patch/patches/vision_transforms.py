"""Patch torchvision.transforms (v1) in place.

Where the patch goes in:
- ``torchvision.transforms._functional_pil``: the PIL backend every stock ``functional`` function
  (v1, and v2's PIL kernels) dispatches to. A ``FastImage`` (``vision/images/image.py``, a PIL image only
  the patch makes) runs the kernels on its array; the hot ones run for plain RGB and L PIL images
  too. Anything else, a user's ``np.ndarray`` included, is stock's to accept or reject. Argument
  parsing, matrices and random draws stay in the stock code above it. Which kernel each function runs, and
  on which pixels: ``vision/kernels/pil_dispatch.py``; the routing: ``vision/plans/pil_backend.py``.
- ``functional.to_tensor``, ``pil_to_tensor`` and ``gaussian_blur``, which do not dispatch there.
- ``Compose.__call__``: carries images as ``FastImage`` between steps (``vision/plans/compose_call.py``).

Functions are redirected in place (``AttributeRecord.redirect``): each stays the same object, so
``from torchvision.transforms.functional import to_tensor`` done earlier sees the patch and
``Lambda(F.hflip)`` still pickles by reference.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch, stock_copy


class VisionTransformsPatch(Patch):
    name: ClassVar[str] = "vision_transforms"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.transforms"
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.26,<0.30", "opencv-python-headless": ">=4.8,<6"}

    def check_internals(self, module: ModuleType) -> str | None:
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        from ..vision.kernels.pil_dispatch import PIL_BACKEND

        missing = [n for n in PIL_BACKEND if not callable(getattr(F_pil, n, None))]
        missing += [n for n in ("to_tensor", "pil_to_tensor", "gaussian_blur") if not callable(getattr(F, n, None))]
        missing += [n for n in ("_compute_resized_output_size", "_interpolation_modes_from_int", "pil_modes_mapping",
                                "InterpolationMode") if not hasattr(F, n)]
        classes = ("Compose", "ToTensor", "Normalize", "PILToTensor", "ConvertImageDtype", "Resize", "CenterCrop",
                   "RandomCrop", "RandomResizedCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter",
                   "Grayscale", "RandomGrayscale")
        missing += [n for n in classes if not isinstance(getattr(module, n, None), type)]
        return f"torchvision internals changed: missing {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torchvision.transforms import _functional_pil as F_pil
        from torchvision.transforms import functional as F

        from ..data.datasets import lazy_samples
        from ..vision.kernels import pil_dispatch
        from ..vision.plans import compose_call, pil_backend

        compose_call.configure(module)
        for name, (policy, pil_too) in pil_dispatch.PIL_BACKEND.items():
            func = getattr(F_pil, name)
            kernel = pil_dispatch.kernel_of(name)
            self.record.redirect(func, pil_backend.with_kernel(stock_copy(func), kernel, policy, pil_too))
        self.record.redirect(F.to_tensor, pil_backend.to_tensor_with_kernel(stock_copy(F.to_tensor)))
        self.record.redirect(F.pil_to_tensor, pil_backend.pil_to_tensor_with_kernel(stock_copy(F.pil_to_tensor)))
        self.record.redirect(F.gaussian_blur, pil_backend.gaussian_blur_with_kernel(stock_copy(F.gaussian_blur)))
        self.record.wrap(module.Compose, "__call__", lazy_samples.call_by_plan)

    def _revert(self) -> None:
        from ..vision.kernels import opencv
        from ..vision.plans import compose_call

        compose_call.deactivate()
        opencv.release_cv2()
