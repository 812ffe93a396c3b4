"""What runs in each DataLoader worker before the user's ``worker_init_fn``.

Stock's worker already runs torch on one thread (``torch.set_num_threads(1)``); nothing else is capped, so that
the user's code in the worker reads the environment and OpenCV's thread count as on stock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WorkerInit:
    """With ``uint8``, the worker's copy of the dataset's transform stops before ``ToTensor``
    (see ``data/tail/uint8_batches.py``); then the user's ``worker_init_fn`` runs. A class rather than a closure so
    that it
    pickles under spawn.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None, uint8: bool = False) -> None:
        self.user_fn = user_fn
        self.uint8 = uint8

    def __call__(self, worker_id: int) -> None:
        if self.uint8:
            from torch.utils.data import get_worker_info

            from ..tail.uint8_batches import mark_worker_dataset

            info = get_worker_info()
            if info is not None:
                mark_worker_dataset(info.dataset)
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerInit) and (other.user_fn, other.uint8) == (self.user_fn, self.uint8)

    def __hash__(self) -> int:
        return hash((WorkerInit, self.user_fn, self.uint8))


#: What a worker process imports to load images under the patch. Under forkserver (Python 3.14's default start
#: method on Linux) they are imported once into the server, and each worker forked from it finds them imported:
#: the same modules at their defaults, without paying their import again per worker and per epoch.
FORKSERVER_PRELOAD = ("torch", "torchvision.datasets", "torchvision.transforms", "PIL.Image", "nano_patch",
                      "nano_patch.vision.kernels.native")


def preload_forkserver() -> list[str] | None:
    """Add :data:`FORKSERVER_PRELOAD` to the forkserver's preload list where the server has not started yet (it
    reads the list as it starts); the list as it was (to put back), or None where nothing changed."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    before = getattr(server, "_preload_modules", None)
    if server is None or not isinstance(before, list) or getattr(server, "_forkserver_pid", 1) is not None:
        return None
    server.set_forkserver_preload(before + [m for m in FORKSERVER_PRELOAD if m not in before])
    return list(before)


def restore_forkserver_preload(before: list[str] | None) -> None:
    """Put back the preload list :func:`preload_forkserver` changed, where the server has still not started."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if before is not None and server is not None and getattr(server, "_forkserver_pid", 1) is None:
        server.set_forkserver_preload(before)
