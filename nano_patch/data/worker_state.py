"""The process state a DataLoader worker sees, as stock's fork freezes it.

A stock worker is a fork of the main process made when the iterator starts its workers (for a persistent iterator:
its first epoch). Whatever the script changes afterwards, the worker keeps what it saw then. A virtual worker carries
the same: its stand-in processes (``stand_in.py``) are forks made at that moment, and its fast path, which runs in
this process, loads a batch only while the state that loading reads is still the captured one; where the script has
changed it since (a default dtype set for one step, a PIL flag flipped between epochs, ``os.chdir``), the batch goes
to the stand-in, which has the frozen state.

What loading reads, and what is compared:

- torch's default dtype (``ToTensor`` converts to it);
- PIL's ``ImageFile.LOAD_TRUNCATED_IMAGES`` and ``Image.MAX_IMAGE_PIXELS`` (its guards on every open and crop);
- the working directory (a dataset's relative paths).

The warning filters and the grad and inference modes a worker runs under are frozen by the stand-in's fork alone:
the fast path never warns (it gives back every sample PIL would warn about) and makes no tensor that records grad.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerState:
    default_dtype: Any
    load_truncated_images: Any
    max_image_pixels: Any
    cwd: str | None

    def is_live(self) -> bool:
        """Whether this process's state is still the captured one (the fast path may load a batch now)."""
        return self == capture()


def capture() -> WorkerState:
    """This process's state as a worker forked now would keep it."""
    import torch
    from PIL import Image, ImageFile

    try:
        cwd: str | None = os.getcwd()
    except OSError:  # (a removed working directory: relative paths fail on both sides)
        cwd = None
    return WorkerState(torch.get_default_dtype(), ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS, cwd)
