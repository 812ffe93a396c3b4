"""Patch torchvision.datasets in place: JPEGs decode through libjpeg-turbo (simplejpeg). Wiring only: the
adapters are ``data/datasets/dataset_adapters.py``'s, the loading ``data/batches/sample_loading.py``'s.

- ``DatasetFolder.__getitem__`` (and so ``ImageFolder`` and subclasses), when the dataset uses the
  stock PIL loader: the file is decoded straight to an array and handed to a patched ``Compose`` as
  one, so no PIL image is built unless a transform needs one. A first ``Resize`` to a much smaller
  size lets libjpeg-turbo scale the JPEG down while decoding.
- ``folder.pil_loader`` / ``folder.default_loader``: the same decoder, returning a PIL image.
- Built-in datasets that open their files with PIL themselves (Flowers102, Food101, OxfordIIITPet,
  StanfordCars, DTD, Country211 via ImageFolder): their ``__getitem__`` reads the same attributes
  and decodes through the same path. Caltech101 keeps each photo's own mode (grayscale stays "L").
- The array datasets (CIFAR10/100, SVHN, STL10, the MNIST family): a batch of the DataLoader's is made in one native
  call where their tutorials' transforms allow (``data/datasets/array_datasets.py``); their ``__getitem__`` stays
  stock's.

Every one of these paths reads and fills the decoded-image cache when it is on
(``vision/images/cache/``): later epochs skip decoding.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ..config import Options
from ..registry import Patch


class VisionDatasetsPatch(Patch):
    name: ClassVar[str] = "vision_datasets"
    group: ClassVar[str] = "vision"
    target: ClassVar[str] = "torchvision.datasets"
    requires: ClassVar[dict[str, str]] = {"torchvision": ">=0.26,<0.30", "simplejpeg": ">=1.6,<2"}

    def check_internals(self, module: ModuleType) -> str | None:
        folder = getattr(module, "folder", None)
        needed = ("DatasetFolder", "pil_loader", "default_loader")
        missing = [n for n in needed if folder is None or not hasattr(folder, n)]
        return f"torchvision internals changed: missing datasets.folder.{', '.join(missing)}" if missing else None

    def _apply(self, module: ModuleType, options: Options) -> None:
        from torchvision.datasets import folder

        from ..data import fetch
        from ..data.batches import sample_loading as loading
        from ..data.datasets import array_datasets, dataset_adapters

        known = (folder.pil_loader, folder.default_loader)
        # Redirected in place: datasets hold these very objects as default arguments and must
        # still pickle by reference under the spawn start method.
        self.record.redirect(folder.pil_loader, loading.load_pil)
        self.record.redirect(folder.default_loader, loading.default_loader)
        # Batches reach the loader's threads through the DataLoader patch's fetch (``data/fetch.py``), only where
        # stock's fetcher would call this very ``__getitem__``: no ``__getitems__`` that a wrapper could forward.
        self._routed = []
        for cls, (getitem, getitems) in dataset_adapters.adapters(module, known).items():
            self.record.wrap(cls, "__getitem__", getitem)
            fetch.register(cls, getitems)  # None: a patched class that loads one by one
            self._routed.append(cls)
        # The array datasets (CIFAR, SVHN, STL-10, the MNIST family): their __getitem__ stays stock's; a batch is
        # made whole by their route
        for cls, getitems in array_datasets.routes(module).items():
            fetch.register(cls, getitems)
            self._routed.append(cls)

    def _revert(self) -> None:
        from ..data import fetch

        for cls in getattr(self, "_routed", ()):
            fetch.unregister(cls)
        self._routed = []

