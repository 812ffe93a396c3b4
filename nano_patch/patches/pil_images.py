"""Patch PIL's ``Image`` in place for lazy JPEG images (``vision/images/lazy_jpeg.py``).

Where the patch goes in:
- ``Image.Image.convert``: ``convert("RGB")`` of a plain JPEG just opened returns a lazy image;
- ``ImageFile.ImageFile.load``: ``img.load()`` written as a statement on a plain JPEG just opened reads its file as
  stock's does and leaves the pixels pending (its pixel-access object is dropped unused: nothing can tell);
- ``Image.Image.im``: the property every PIL route to the pixels takes decodes a lazy image's bytes first.

All are switched by the ``lazy_images`` option; reverting puts PIL's own back.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch


class PilImagesPatch(Patch):
    name: ClassVar[str] = "pil_images"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "PIL.Image"
    requires: ClassVar[dict[str, str]] = {"pillow": ">=11,<14"}

    def check_internals(self, module: ModuleType) -> str | None:
        from PIL import ImageFile, JpegImagePlugin

        missing = [] if isinstance(vars(module.Image).get("im"), property) else ["Image.im (a property)"]
        missing += [n for n in ("_getdecoder", "DeferredError", "core") if not hasattr(module, n)]
        missing += [n for n in ("_get_oserror", "MAXBLOCK") if not hasattr(ImageFile, n)]
        missing += [] if "load" in vars(ImageFile.ImageFile) else ["ImageFile.ImageFile.load"]
        missing += [] if hasattr(module.Image, "_copy_info") else ["Image._copy_info"]
        missing += [] if hasattr(JpegImagePlugin, "JpegImageFile") else ["JpegImagePlugin.JpegImageFile"]
        return f"PIL internals changed: missing {', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        if not options.lazy_images:
            return
        from ..vision.images import lazy_jpeg

        stock_im = vars(module.Image)["im"]
        self.record.replace(module.Image, "im", property(lazy_jpeg.image_core, stock_im.fset, None, stock_im.__doc__))
        self.record.wrap(module.Image, "convert", lazy_jpeg.lazy_convert)
        from PIL import ImageFile

        self.record.wrap(ImageFile.ImageFile, "load", lazy_jpeg.lazy_load)

    def _revert(self) -> None:
        from ..vision.images import lazy_jpeg

        lazy_jpeg.decode_all()
