"""What runs in each DataLoader worker before the user's ``worker_init_fn``.

Stock's worker already runs torch on one thread (``torch.set_num_threads(1)``); nothing else is capped, so that
the user's code in the worker reads the environment and OpenCV's thread count as on stock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WorkerInit:
    """With ``uint8``, the worker's copy of the dataset's transform stops before ``ToTensor``
    (see ``data/uint8_batches.py``); then the user's ``worker_init_fn`` runs. A class rather than a closure so that it
    pickles under spawn.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None, uint8: bool = False) -> None:
        self.user_fn = user_fn
        self.uint8 = uint8

    def __call__(self, worker_id: int) -> None:
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
