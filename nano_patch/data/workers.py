"""What runs in each DataLoader worker: thread caps around the user's ``worker_init_fn``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class WorkerInit:
    """Caps torch, OpenMP and OpenCV at one thread in the worker, then calls the user's ``worker_init_fn``.

    With ``uint8``, the worker's copy of the dataset's transform also stops before ``ToTensor``
    (see ``data/uint8_batches.py``). A class rather than a closure so that it pickles under spawn.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None, uint8: bool = False) -> None:
        self.user_fn = user_fn
        self.uint8 = uint8

    def __call__(self, worker_id: int) -> None:
        cap_threads(1)
        if self.uint8:
            from torch.utils.data import get_worker_info

            from .uint8_batches import mark_worker_dataset

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
