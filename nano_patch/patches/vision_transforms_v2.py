"""Patch torchvision.transforms.v2 in place: ``Compose`` carries PIL images as ``FastImage``.

v2's PIL kernels call the v1 PIL backend (``_functional_pil``, patched by ``vision_transforms``)
or PIL methods that ``FastImage`` overrides (``resize``), and dispatch on ``type(inpt).__mro__``,
where ``FastImage`` finds the PIL kernel. So the only v2 change needed is where images enter:
``Compose.forward`` (``vision/plans/compose_v2.py``) hands the steps a ``FastImage`` for every plain PIL ``RGB``/``L``
image among its inputs, runs the policies on a lone image from the plan and the tensor tail as one lookup.
``_utils._get_fill`` looks a ``FastImage`` up as the PIL image it stands for, so fills given per type apply as in
stock.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch, stock_copy
from .vision_transforms import VisionTransformsPatch


class VisionTransformsV2Patch(Patch):
    name: ClassVar[str] = "vision_transforms_v2"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.transforms.v2"
    # v2's PIL kernels run through the v1 backend that VisionTransformsPatch patches: the same versions.
    requires: ClassVar[dict[str, str]] = VisionTransformsPatch.requires

    def check_internals(self, module: ModuleType) -> str | None:
        compose = getattr(module, "Compose", None)
        if not isinstance(compose, type) or "forward" not in vars(compose):
            return "torchvision internals changed: transforms.v2.Compose.forward is missing"
        utils = getattr(module, "_utils", None)
        if not callable(getattr(utils, "_get_fill", None)):
            return "torchvision internals changed: transforms.v2._utils._get_fill is missing"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torchvision.transforms.v2 import _utils

        from ..vision.plans import compose_call, compose_v2, policies

        forward = compose_v2.ComposeForward(module)
        policies.configure_v2(module)
        self.record.redirect(_utils._get_fill, compose_v2.fill_for_fast_images(stock_copy(_utils._get_fill)))
        self.record.wrap(module.Compose, "forward", forward)
        compose_call.configure_v2(module.Compose)

    def _revert(self) -> None:
        from ..vision.plans import compose_call

        compose_call.configure_v2(None)
