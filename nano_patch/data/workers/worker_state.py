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

Under forkserver and spawn a worker is a fresh interpreter instead: it starts from the modules' defaults
(:func:`fresh`), not from this process's state. Virtual workers run there only while the two agree
(:func:`differs_from_fresh`); the stand-ins are then fresh interpreters of that start method themselves.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

#: ``PIL.Image.MAX_IMAGE_PIXELS`` as PIL's module sets it on import (a quarter gigabyte of 3-byte pixels);
#: ``tests/test_virtual_worker_contract.py`` checks it against a fresh interpreter's.
_PIL_DEFAULT_MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)


@dataclass(frozen=True)
class WorkerState:
    default_dtype: Any
    load_truncated_images: Any
    max_image_pixels: Any
    cwd: str | None

    def is_live(self) -> bool:
        """Whether this process's state is still the captured one (the fast path may load a batch now)."""
        return self == capture()


def changed(then: WorkerState) -> str:
    """What of this process's state differs from ``then`` ("" where nothing does), named for the run report."""
    now = capture()
    return ", ".join(f"{f.name} ({getattr(then, f.name)!r} to {getattr(now, f.name)!r})"
                     for f in dataclasses.fields(WorkerState) if getattr(now, f.name) != getattr(then, f.name))


def fresh() -> WorkerState:
    """The state a fresh interpreter's worker (forkserver, spawn) starts with: the modules' defaults, and this
    process's working directory (the start method passes it on)."""
    import torch

    return dataclasses.replace(capture(), default_dtype=torch.float32, load_truncated_images=False,
                               max_image_pixels=_PIL_DEFAULT_MAX_IMAGE_PIXELS)


def differs_from_fresh() -> str:
    """What of this process's state a fresh worker would not see ("" where nothing differs): the main module may
    have set it at its top level (a fresh worker imports it and sets it too) or in its ``__main__`` block (it does
    not), which cannot be told apart from here."""
    now, start = capture(), fresh()
    return ", ".join(f"{f.name} ({getattr(now, f.name)!r})" for f in dataclasses.fields(WorkerState)
                     if getattr(now, f.name) != getattr(start, f.name))


def capture() -> WorkerState:
    """This process's state as a worker forked now would keep it."""
    import torch
    from PIL import Image, ImageFile

    try:
        cwd: str | None = os.getcwd()
    except OSError:  # (a removed working directory: relative paths fail on both sides)
        cwd = None
    return WorkerState(torch.get_default_dtype(), ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS, cwd)
