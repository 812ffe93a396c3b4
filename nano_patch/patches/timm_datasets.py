"""Patch timm's ``ImageDataset`` in place: its images decode through the same path as torchvision's. Wiring only:
the adapters, and which datasets they take, are ``data/datasets/timm_adapters.py``'s."""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch


class TimmDatasetsPatch(Patch):
    name: ClassVar[str] = "timm_datasets"  # (the report row data/datasets/timm_adapters.py counts under)
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "timm.data"
    requires: ClassVar[dict[str, str]] = {"timm": ">=1.0.29,<2", "torchvision": ">=0.26,<0.30",
                                          "simplejpeg": ">=1.6,<2"}

    def check_internals(self, module: ModuleType) -> str | None:
        import importlib

        try:
            dataset = importlib.import_module("timm.data.dataset")
            folder = importlib.import_module("timm.data.readers.reader_image_folder")
        except ImportError as exc:
            return f"timm internals changed: {exc}"
        cls = getattr(dataset, "ImageDataset", None)
        if not isinstance(cls, type) or "__getitem__" not in vars(cls):
            return "timm internals changed: no timm.data.dataset.ImageDataset.__getitem__"
        if not isinstance(getattr(folder, "ReaderImageFolder", None), type):
            return "timm internals changed: no ReaderImageFolder"
        return None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from timm.data import dataset
        from timm.data.readers.reader_image_folder import ReaderImageFolder

        from ..data import fetch
        from ..data.datasets import timm_adapters

        reader_methods = vars(ReaderImageFolder)
        getitem = timm_adapters.getitem_of(ReaderImageFolder, reader_methods)
        self.record.wrap(dataset.ImageDataset, "__getitem__", getitem)
        loader = timm_adapters.getitems_of(dataset.ImageDataset, ReaderImageFolder, reader_methods)
        fetch.register(dataset.ImageDataset, loader)
        self._routed = dataset.ImageDataset

    def _revert(self) -> None:
        from ..data import fetch

        routed = getattr(self, "_routed", None)
        if routed is not None:
            fetch.unregister(routed)
        self._routed = None

