"""Former home of the tensor tail, split in two: recognising it (``vision/tensor_tail.py``) and finishing a batch
(``data/finish_tail.py``). These names stay here only for code not yet moved to those modules."""

from __future__ import annotations

from ..vision.tensor_tail import ErasedImage  # noqa: F401 - vision/batch_loader.py
from .finish_tail import DeferredImages  # noqa: F401 - benchmarks/gpu_feed.py
