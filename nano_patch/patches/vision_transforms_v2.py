"""Patch torchvision.transforms.v2 in place: ``Compose`` carries PIL images as ``FastImage``.

v2's PIL kernels call the v1 PIL backend (``_functional_pil``, patched by ``vision_transforms``)
or PIL methods that ``FastImage`` overrides (``resize``), and dispatch on ``type(inpt).__mro__``,
where ``FastImage`` finds the PIL kernel. So the only v2 change needed is where images enter: a
plain PIL ``RGB``/``L`` image anywhere in a ``Compose``'s inputs (alone, or beside boxes, masks and
labels) becomes a ``FastImage`` for the steps, and a plain PIL image again at the end. Random
draws, ``tv_tensors`` and everything that is not a PIL image are untouched.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from ..config import Options
from ..registry import Patch


class VisionTransformsV2Patch(Patch):
    name: ClassVar[str] = "vision_transforms_v2"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.transforms.v2"
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.19,<0.30", "opencv-python-headless": ">=4.8,<6"}

    def check_internals(self, module: ModuleType) -> str | None:
        compose = getattr(module, "Compose", None)
        if not isinstance(compose, type) or "forward" not in vars(compose):
            return "torchvision internals changed: transforms.v2.Compose.forward is missing"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        from ..vision import pipeline
        from ..vision.image import FastImage, fast, plain

        def forward(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if kwargs or not args or not pipeline.active():
                return wrapped(*args, **kwargs)  # the v1 backend is not patched: nothing to gain
            flat, spec = tree_flatten(args)
            converted = [fast(x) if pipeline.takes(x) and not isinstance(x, FastImage) else x for x in flat]
            if all(a is b for a, b in zip(converted, flat)):
                return wrapped(*args)
            out = wrapped(*tree_unflatten(converted, spec))
            flat_out, spec_out = tree_flatten(out)
            return tree_unflatten([plain(x) for x in flat_out], spec_out)

        self.record.wrap(module.Compose, "forward", forward)
