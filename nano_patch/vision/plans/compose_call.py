"""Where images enter a torchvision ``Compose``: which calls the plan takes, and uint8 output.

The patched ``Compose.__call__`` (:func:`call_by_plan`) and the dataset patch hand a PIL ``RGB``/``L`` image (usually a
``FastImage`` the decoder made) to :func:`run_compose`, which runs the Compose's plan
(``compose_plan.py``). Everything else (tensors, arrays, other modes, subclasses that override
``__call__``) is stock's.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from PIL import Image

from ... import report
from . import compose_plan, tensor_tail
from .thread_setting import ThreadSetting

_compose_cls: type | None = None
#: Compose objects (a DataLoader worker's own copies) that end in a uint8 tensor instead of ToTensor.
_uint8_out: weakref.WeakSet[Any] = weakref.WeakSet()
#: v2's Compose, where the v2 patch is on (its pipelines split their tensor tail too)
_v2_compose_cls: type | None = None
#: The Compose object this thread stops before its tail while a batch loads (``num_workers=0``, tail deferred).
_here: ThreadSetting[Any] = ThreadSetting(None)


def configure(transforms: Any) -> None:
    """Name the stock classes the pipeline treats specially (set by the patch)."""
    global _compose_cls
    _compose_cls = transforms.Compose
    compose_plan.configure(transforms)


def deactivate() -> None:
    """The transforms patch was reverted: nothing routes through :func:`run_compose` any more."""
    global _compose_cls
    _compose_cls = None
    _uint8_out.clear()


def active() -> bool:
    return _compose_cls is not None


def emit_uint8(compose: Any) -> None:
    """Make ``compose`` stop before its ToTensor tail and return uint8 C x H x W tensors."""
    _uint8_out.add(compose)


def configure_v2(compose_cls: type | None) -> None:
    """v2's ``Compose`` class while the v2 patch is on (None: off)."""
    global _v2_compose_cls
    _v2_compose_cls = compose_cls


def splits_tail(compose: Any) -> bool:
    """``compose`` is a stock Compose (v1, or v2 under its patch) whose plan can stop before a tensor tail."""
    if _compose_cls is None:
        return False
    return behaves_as(compose, _compose_cls) or (
        _v2_compose_cls is not None and behaves_as(compose, _v2_compose_cls))


def uint8_here(compose: Any) -> contextlib.AbstractContextManager[None]:
    """While this runs, ``compose`` stops before its tail in this thread (the draw step of a batch)."""
    return _here.set(compose)


def uint8_tail(compose: Any) -> tensor_tail.TailSpec | None:
    """The tail ``compose`` stops before here, or None: it runs whole."""
    if not ((_uint8_out and compose in _uint8_out) or _here.get() is compose):
        return None
    return tensor_tail.find_tail(compose)


def behaves_as(t: Any, base: type) -> bool:
    """``t`` is a ``base``, and no class between its own and ``base`` overrides ``__call__`` or ``forward``."""
    for klass in type(t).__mro__:
        if klass is base:
            return True
        if "__call__" in vars(klass) or "forward" in vars(klass):
            return False
    return False


def plan_of(transform: Any) -> compose_plan.Plan | None:
    """The plan of ``transform`` where it is a torchvision (v1) Compose that keeps Compose's own call; None for
    anything else, left to stock's call: a single transform, a lambda, a callable, ``nn.Sequential``, a class that
    holds a Compose, a subclass with its own ``__call__``."""
    if transform is None:
        return None
    from torchvision.transforms import Compose

    return compose_plan.plan_for(transform) if behaves_as(transform, Compose) else None


def takes(img: Any) -> bool:
    """Images a plan carries: the patch's own, and PIL ``RGB``/``L``."""
    return isinstance(img, Image.Image) and img.mode in ("RGB", "L")


def run_compose(compose: Any, img: Any, *, skip: int = 0) -> Any:
    """Run ``compose`` on ``img`` (a PIL image, or the plan's ``Pixels``) by its plan; ``skip``: leading
    steps already applied."""
    spec = uint8_tail(compose)
    if spec is None:
        return compose_plan.run(compose, img, skip=skip)
    if not spec.erasers:
        return compose_plan.run(compose, img, skip=skip, uint8_tail=True)
    out = compose_plan.run(tensor_tail.prefix_compose(compose, spec), img, skip=skip, uint8_tail=True)
    if isinstance(out, compose_plan.Recording):
        # the draw step of a batch: the erasers draw now, after this sample's other draws as on stock, from the
        # size and channels the recording ends in; the render's uint8 image is then wrapped with them
        shape = (1 if out.mode == "L" else 3, *out.hw)
        with out.draws.lent() if out.draws is not None else contextlib.nullcontext():
            out.erasures = tensor_tail.draw_erasures(compose, spec, shape)
        return out
    return tensor_tail.uint8_sample(compose, spec, out)


def call_by_plan(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """v1's ``Compose.__call__`` wrapper: an image the plan takes (:func:`takes`) runs by the plan, anything else
    stock's call (counted for the run report)."""
    if len(args) == 1 and not kwargs:
        img = args[0]
        if takes(img):
            return run_compose(instance, img)
        if report.stats is not None:
            kind = f"PIL {img.mode!r}" if isinstance(img, Image.Image) else type(img).__name__
            report.count("vision_transforms", False, f"Compose on {kind} input: stock torchvision code")
    return wrapped(*args, **kwargs)
