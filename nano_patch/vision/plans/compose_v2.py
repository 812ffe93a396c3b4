"""v2's ``Compose.forward`` on the patch's images: where PIL images enter a v2 pipeline.

v2's PIL kernels call the v1 PIL backend (``_functional_pil``, patched by ``vision_transforms``)
or PIL methods that ``FastImage`` overrides (``resize``), and dispatch on ``type(inpt).__mro__``,
where ``FastImage`` finds the PIL kernel. So the only v2 change needed is where images enter: a
plain PIL ``RGB``/``L`` image anywhere in a ``Compose``'s inputs (alone, or beside boxes, masks and
labels) becomes a ``FastImage`` for the steps, and a plain PIL image again at the end. Random
draws, ``tv_tensors`` and everything that is not a PIL image are untouched. On a lone image (or uint8 tensor):
the policies (``AutoAugment``, ``RandAugment``, ``TrivialAugmentWide``) run from the plan (``policies.py``):
stock's draws, then the kernels; the tensor tail is one table lookup (``tensor_tail.V2Tail``); a DataLoader that
finishes the tail itself gets the uint8 image the tail starts from (:func:`uint8_sample`). v2 picks a transform's fill
by the input's type: :func:`fill_for_fast_images` looks a ``FastImage`` up as the PIL image it stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from PIL import Image

from ... import report
from ..images.image import FastImage, fast, plain
from . import compose_call, policies, tensor_tail

#: Where the run report counts v2's steps (the v2 patch's name).
REPORT_KEY = "vision_transforms_v2"


def fill_for_fast_images(original: Callable[..., Any]) -> Callable[..., Any]:
    """v2's ``_utils._get_fill`` (stock's copy ``original``) looking the patch's image up as the plain PIL image it
    stands for, so that a fill given for PIL images applies to it, as in stock."""

    def _get_fill(fill_dict: Any, inpt_type: Any) -> Any:
        return original(fill_dict, Image.Image if inpt_type is FastImage else inpt_type)

    return _get_fill


class ComposeForward:
    """v2's ``Compose.forward`` wrapper (``(wrapped, instance, args, kwargs)``): the patch's images for the steps."""

    def __init__(self, v2: ModuleType) -> None:
        self.v2 = v2
        self.tail = tensor_tail.V2Tail(v2)

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kwargs or not args or not compose_call.active():
            return wrapped(*args, **kwargs)  # the v1 backend is not patched: nothing to gain
        if len(args) == 1 and (compose_call.takes(args[0]) or self.tail.takes_tensor(args[0])):
            if not compose_call.behaves_as(instance, self.v2.Compose):
                return wrapped(*args)
            return self.run_alone(instance, args[0])
        return _with_fast_images(wrapped, args)

    def run_alone(self, compose: Any, inpt: Any) -> Any:
        """``compose`` on a lone PIL ``RGB``/``L`` image or uint8 tensor ``inpt``: its steps on the patch's image,
        the tensor tail as one lookup; a plain PIL image again where one comes out."""
        x = fast(inpt)
        items = list(compose.transforms)
        uint8 = compose_call.uint8_tail(compose)  # a DataLoader that finishes the tail itself
        if uint8 is not None and isinstance(x, FastImage):
            return uint8_sample(compose, uint8, items, x)
        for i, t in enumerate(items):
            fused = self.tail.run(items[i:], x)
            if fused is not None:
                _count_steps(items[i:], "the tensor tail as one table lookup")
                return fused
            x = _run_step(t, x)
        return x if isinstance(inpt, FastImage) else plain(x)


def _run_step(t: Any, x: Any) -> Any:
    """One step on ``x``: a policy by its plan on the patch's image, else the step itself (counted for the report)."""
    on_image = isinstance(x, FastImage)
    planned = policies.run_v2_policy(t, x) if on_image else None
    out = t(x) if planned is None else planned
    if report.stats is not None:
        if planned is not None:
            report.count(REPORT_KEY, True, f"{type(t).__name__}: the policy's plan")
        elif on_image and type(t).__module__.startswith("torchvision.transforms.v2"):
            report.count(REPORT_KEY, True, f"{type(t).__name__}: on the patch's image (its kernels)")
        else:
            report.count(REPORT_KEY, False, f"{type(t).__name__}: stock code on "
                                            f"{'a tensor' if not on_image else 'the image'}")
    return out


def _with_fast_images(wrapped: Any, args: tuple[Any, ...]) -> Any:
    """Stock's ``forward`` on ``args`` with every PIL ``RGB``/``L`` image among them (beside boxes, masks, labels) as
    the patch's image, and the images it returns plain PIL again; as it is where there is none."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten(args)
    converted = [fast(x) if compose_call.takes(x) and not isinstance(x, FastImage) else x for x in flat]
    if all(a is b for a, b in zip(converted, flat)):
        return wrapped(*args)
    out = wrapped(*tree_unflatten(converted, spec))
    flat_out, spec_out = tree_flatten(out)
    return tree_unflatten([plain(x) for x in flat_out], spec_out)


def _count_steps(steps: list[Any], how: str) -> None:
    if report.stats is not None:
        report.count(REPORT_KEY, True, f"{' + '.join(type(t).__name__ for t in steps)}: {how}")


def uint8_sample(compose: Any, spec: tensor_tail.TailSpec, items: list[Any], x: Any) -> Any:
    """The steps before the tail (``spec``), then the uint8 image the tail starts from, with the erasers' draws:
    ``data/tail/finish_tail.py`` finishes the batch."""
    import torch
    from torchvision.transforms import functional as F1

    for t in items[:spec.start]:
        planned = policies.run_v2_policy(t, x) if isinstance(x, FastImage) else None
        x = t(x) if planned is None else planned
    if not isinstance(x, Image.Image):  # not an image at the tail: stock's steps, stock's float sample
        for t in items[spec.start:]:
            x = t(x)
        return x
    # v2's tail starts with stock's ToImage/PILToTensor (its strides), v1's (ToTensor) with the uint8 image
    image = items[spec.start](x).as_subclass(torch.Tensor) if spec.scale == tensor_tail.V2_MUL else F1.pil_to_tensor(x)
    return tensor_tail.uint8_sample(compose, spec, image)
