"""What runs in each DataLoader worker, and how many workers to start."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


class WorkerInit:
    """Caps torch, OpenMP and OpenCV at one thread in the worker, then calls the user's ``worker_init_fn``.

    With ``uint8``, the worker's copy of the dataset's transform also stops before ``ToTensor``
    (see ``data/batches.py``). A class rather than a closure so that it pickles under spawn.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None, uint8: bool = False) -> None:
        self.user_fn = user_fn
        self.uint8 = uint8

    def __call__(self, worker_id: int) -> None:
        cap_threads(1)
        if self.uint8:
            from torch.utils.data import get_worker_info

            from .batches import mark_worker_dataset

            info = get_worker_info()
            if info is not None:
                mark_worker_dataset(info.dataset)
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerInit) and (other.user_fn, other.uint8) == (self.user_fn, self.uint8)

    def __hash__(self) -> int:
        return hash((WorkerInit, self.user_fn, self.uint8))


def cap_threads(n: int) -> None:
    """Cap torch, OpenMP and OpenCV at ``n`` threads, OpenCV also if it is imported later."""
    import torch
    import wrapt

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    # Runs now if cv2 is already imported (fork), else when the dataset first imports it (spawn).
    wrapt.register_post_import_hook(lambda cv2: cv2.setNumThreads(n), "cv2")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def decodes_per_item(dataset: Any) -> bool:
    """True for datasets that read and transform a file per item, where workers pay for themselves."""
    vision = sys.modules.get("torchvision.datasets")
    data = sys.modules.get("torch.utils.data")
    while data is not None and isinstance(dataset, data.Subset):
        dataset = dataset.dataset
    return vision is not None and isinstance(dataset, vision.VisionDataset)


def auto_num_workers(dataset: Any) -> int:
    """Workers for a map-style dataset when the user did not choose.

    Only datasets that decode files get workers: for in-memory data a worker costs more in
    pickling than it saves. Two cores stay with the training threads and workers get half of the
    rest, at most 4: on this project's 2-core machine one worker next to a 2-thread training
    process measured 20.2 samples/s against 22.8 with none (ResNet-18, benchmarks/train.py).
    """
    if not decodes_per_item(dataset):
        return 0
    return max(0, min(4, (usable_cores() - 2) // 2))
