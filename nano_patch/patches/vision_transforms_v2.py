"""Patch torchvision.transforms.v2 in place: ``Compose`` carries PIL images as ``FastImage``.

v2's PIL kernels call the v1 PIL backend (``_functional_pil``, patched by ``vision_transforms``)
or PIL methods that ``FastImage`` overrides (``resize``), and dispatch on ``type(inpt).__mro__``,
where ``FastImage`` finds the PIL kernel. So the only v2 change needed is where images enter: a
plain PIL ``RGB``/``L`` image anywhere in a ``Compose``'s inputs (alone, or beside boxes, masks and
labels) becomes a ``FastImage`` for the steps, and a plain PIL image again at the end. Random
draws, ``tv_tensors`` and everything that is not a PIL image are untouched. The policies
(``AutoAugment``, ``RandAugment``, ``TrivialAugmentWide``) on a lone image run from the plan
(``vision/plans/compose_plan.py``): stock's draws, then the kernels. ``_utils._get_fill`` looks a ``FastImage`` up
as the PIL image it stands for, so fills given per type apply as in stock.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from .. import report
from ..config import Options
from ..registry import Patch


class VisionTransformsV2Patch(Patch):
    name: ClassVar[str] = "vision_transforms_v2"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.transforms.v2"
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.26,<0.30", "opencv-python-headless": ">=4.8,<6"}

    def check_internals(self, module: ModuleType) -> str | None:
        compose = getattr(module, "Compose", None)
        if not isinstance(compose, type) or "forward" not in vars(compose):
            return "torchvision internals changed: transforms.v2.Compose.forward is missing"
        utils = getattr(module, "_utils", None)
        if not callable(getattr(utils, "_get_fill", None)):
            return "torchvision internals changed: transforms.v2._utils._get_fill is missing"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torch.utils._pytree import tree_flatten, tree_unflatten
        from torchvision.transforms.v2 import _utils

        from ..registry import stock_copy
        from ..vision.images.image import FastImage, fast, plain
        from ..vision.plans import compose_call, compose_plan

        tail = _TensorTail(module)
        compose_plan.configure_v2(module)
        # v2 picks a transform's fill by the input's type: the patch's image is looked up as the plain PIL
        # image it stands for, so that a fill given for PIL images applies to it, as in stock.
        self.record.redirect(_utils._get_fill, _fill_for_fast_images(stock_copy(_utils._get_fill)))

        def forward(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if kwargs or not args or not compose_call.active():
                return wrapped(*args, **kwargs)  # the v1 backend is not patched: nothing to gain
            if len(args) == 1 and (compose_call.takes(args[0]) or tail.takes_tensor(args[0])):
                if not compose_call.behaves_as(instance, module.Compose):
                    return wrapped(*args)
                x = fast(args[0])
                items = list(instance.transforms)
                uint8 = compose_call.uint8_tail(instance)  # a DataLoader that finishes the tail itself
                if uint8 is not None and isinstance(x, FastImage):
                    return tail.uint8_sample(instance, uint8, items, x)
                for i, t in enumerate(items):
                    fused = tail.run(items[i:], x)
                    if fused is not None:
                        _count_steps(items[i:], "the tensor tail as one table lookup")
                        return fused
                    on_image = isinstance(x, FastImage)
                    planned = compose_plan.run_v2_policy(t, x) if on_image else None
                    x = t(x) if planned is None else planned
                    if report.stats is not None:
                        if planned is not None:
                            report.count(self.name, True, f"{type(t).__name__}: the policy's plan")
                        elif on_image and type(t).__module__.startswith("torchvision.transforms.v2"):
                            report.count(self.name, True, f"{type(t).__name__}: on the patch's image (its kernels)")
                        else:
                            report.count(self.name, False, f"{type(t).__name__}: stock code on "
                                                           f"{'a tensor' if not on_image else 'the image'}")
                return x if isinstance(args[0], FastImage) else plain(x)
            flat, spec = tree_flatten(args)
            converted = [fast(x) if compose_call.takes(x) and not isinstance(x, FastImage) else x for x in flat]
            if all(a is b for a, b in zip(converted, flat)):
                return wrapped(*args)
            out = wrapped(*tree_unflatten(converted, spec))
            flat_out, spec_out = tree_flatten(out)
            return tree_unflatten([plain(x) for x in flat_out], spec_out)

        self.record.wrap(module.Compose, "forward", forward)
        compose_call.configure_v2(module.Compose)

    def _revert(self) -> None:
        from ..vision.plans import compose_call

        compose_call.configure_v2(None)


def _count_steps(steps: list[Any], how: str) -> None:
    if report.stats is not None:
        report.count(VisionTransformsV2Patch.name, True, f"{' + '.join(type(t).__name__ for t in steps)}: {how}")


def _fill_for_fast_images(original: Any) -> Any:
    from PIL import Image

    from ..vision.images.image import FastImage

    def _get_fill(fill_dict: Any, inpt_type: Any) -> Any:
        return original(fill_dict, Image.Image if inpt_type is FastImage else inpt_type)

    return _get_fill


class _TensorTail:
    """The end of a v2 pipeline that turns a uint8 image into a normalised float tensor, as one lookup.

    ``[PILToTensor | ToImage,] ToDtype(float, scale=True)[, Normalize]`` is elementwise and per
    channel, and a uint8 pixel has 256 values: the stock transforms themselves are run once on a
    C x 1 x 256 probe of every value, and each plane of the image is then one table lookup. The
    output is stock's, bit for bit, with stock's type (``tv_tensors.Image`` or a plain tensor).
    """

    def __init__(self, module: ModuleType) -> None:
        from torchvision import tv_tensors

        self.v2 = module
        self.image_type = tv_tensors.Image
        self.tables: dict[tuple[Any, ...], Any] = {}

    def takes_tensor(self, x: Any) -> bool:
        import torch

        return (
            type(x) in (torch.Tensor, self.image_type) and x.dtype == torch.uint8 and x.ndim == 3
            and x.shape[0] in (1, 3) and x.device.type == "cpu"
        )

    def run(self, steps: list[Any], x: Any) -> Any:
        import torch

        from ..vision.images.image import FastImage
        from ..vision.kernels import functional as K

        v2 = self.v2
        if not steps:
            return None
        if isinstance(x, FastImage):
            if type(steps[0]) not in (v2.PILToTensor, v2.ToImage):
                return None
            probe_type = self.image_type if type(steps[0]) is v2.ToImage else None
            rest, planes = steps[1:], None  # stock keeps the image's channels-last strides here
            channels = 1 if x.mode == "L" else 3
        elif self.takes_tensor(x) and x.is_contiguous():
            probe_type = self.image_type if type(x) is self.image_type else None
            rest, channels = steps, int(x.shape[0])
            planes = lambda: [p.numpy() for p in x.as_subclass(torch.Tensor)]  # noqa: E731
        else:
            return None
        key = self._key(rest, channels, probe_type)
        if key is None:
            return None
        table, out_type = self.tables.get(key) or self._table(rest, channels, probe_type, key)
        if table.shape[0] != channels and channels != 1:
            return None
        if planes is None and table.shape[0] == channels:
            out = K.pixels_through_tables(K.from_pil(x), table)
        elif planes is None:  # a grey image normalised to three channels: stock broadcasts into a new tensor
            out = K.image_through_tables(K.from_pil(x), table)
        else:
            out = K.planes_through_tables(planes(), table)
        return out if out_type is None else out_type(out)

    def uint8_sample(self, compose: Any, spec: Any, items: list[Any], x: Any) -> Any:
        """The steps before the tail (``spec``, a ``tensor_tail.TailSpec``), then the uint8 image the tail
        starts from, with the erasers' draws: ``data/finish_tail.py`` finishes the batch."""
        import torch
        from PIL import Image
        from torchvision.transforms import functional as F1

        from ..vision.images.image import FastImage
        from ..vision.plans import compose_plan, tensor_tail

        for t in items[:spec.start]:
            planned = compose_plan.run_v2_policy(t, x) if isinstance(x, FastImage) else None
            x = t(x) if planned is None else planned
        if not isinstance(x, Image.Image):  # not an image at the tail: stock's steps, stock's float sample
            for t in items[spec.start:]:
                x = t(x)
            return x
        if spec.scale == tensor_tail.V2_MUL:
            image = items[spec.start](x).as_subclass(torch.Tensor)  # stock's ToImage/PILToTensor: its strides
        else:
            image = F1.pil_to_tensor(x)
        return tensor_tail.uint8_sample(compose, spec, image)

    def _key(self, rest: list[Any], channels: int, probe_type: Any) -> tuple[Any, ...] | None:
        import torch

        v2 = self.v2
        if not 1 <= len(rest) <= 2 or type(rest[0]) is not v2.ToDtype:
            return None
        to_dtype = rest[0]
        if to_dtype.dtype not in (torch.float32, torch.float64) or to_dtype.scale is not True:
            return None
        key: tuple[Any, ...] = (to_dtype.dtype, channels, probe_type)
        if len(rest) == 2:
            norm = rest[1]
            if type(norm) is not v2.Normalize:
                return None
            key += (tuple(float(m) for m in norm.mean), tuple(float(s) for s in norm.std))
        return key

    def _table(self, rest: list[Any], channels: int, probe_type: Any, key: tuple[Any, ...]) -> tuple[Any, Any]:
        import torch

        probe = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(channels, 1, 256).contiguous()
        if probe_type is not None:
            probe = probe_type(probe)
        for t in rest:
            probe = t(probe)  # stock code: its arithmetic, its errors
        out_type = type(probe) if type(probe) is not torch.Tensor else None
        table = probe.as_subclass(torch.Tensor)[:, 0, :].contiguous().numpy()
        if len(self.tables) > 64:
            self.tables.clear()
        self.tables[key] = (table, out_type)
        return table, out_type
