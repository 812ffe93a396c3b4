"""A DataLoader worker's generator seeds, as stock's worker loop seeds them (and as Lightning's
``pl_worker_init_function`` seeds them after it, for ``seed_everything(workers=True)``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Seeds:
    """What a worker's generators start from: torch's seed, ``random``'s, and NumPy's (its ``np.random.seed``
    argument, or None where NumPy is not seeded)."""

    torch_seed: int
    random_seed: int
    numpy_seed: Any


def stock_seeds(base_seed: int, worker_id: int) -> Seeds:
    """Stock's worker seeding (``torch.utils.data._utils.worker._worker_loop``)."""
    from torch.utils.data._utils import worker

    seed = base_seed + worker_id
    return Seeds(seed, seed, worker._generate_state(base_seed, worker_id))


def lightning_seeds(base_seed: int, worker_id: int, rank: int, generate: Callable[..., list[int]]) -> Seeds:
    """``pl_worker_init_function``'s seeding after stock's (Lightning's ``seed_everything(workers=True)``): its seed
    sequence from the base seed, the worker's id and the rank (``generate``: Lightning's own function)."""
    seq = generate(base_seed, worker_id, rank, count=4)
    numpy_seed = np.random.SeedSequence([base_seed, worker_id, rank]).generate_state(4)
    return Seeds(seq[0], (seq[1] << 32) | seq[2], numpy_seed)


def lightning_init(fn: Any) -> tuple[Callable[..., list[int]], int | None] | None:
    """Lightning's seed-sequence function and the rank (None: its default) where ``fn`` is Lightning's
    ``pl_worker_init_function`` (as ``seed_everything(workers=True)`` injects it: bare, or with ``rank=``); else
    None."""
    import sys

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if type(fn) is functools.partial:
        fn, args, kwargs = fn.func, fn.args, dict(fn.keywords)
    if args or set(kwargs) - {"rank"}:
        return None
    for name in ("lightning_fabric.utilities.seed", "lightning.fabric.utilities.seed"):
        module = sys.modules.get(name)
        if module is not None and fn is getattr(module, "pl_worker_init_function", None):
            generate = getattr(module, "_generate_seed_sequence", None)
            if generate is None:
                return None
            return generate, kwargs.get("rank")
    return None


def default_rank(generate: Any) -> int:
    """``rank_zero_only.rank``, as ``pl_worker_init_function`` reads it without a ``rank``."""
    import sys

    module = sys.modules[generate.__module__]
    return int(getattr(getattr(module, "rank_zero_only", None), "rank", 0) or 0)


def numpy_seeded() -> bool:
    """Whether stock's workers seed NumPy (they do where torch found it importable)."""
    from torch.utils.data._utils import worker

    return bool(getattr(worker, "HAS_NUMPY", True))


def for_workers(base_seed: int, num_workers: int, worker_init_fn: Any) -> list[Any]:
    """Each worker's seeds, as stock's workers would take them (and Lightning's ``pl_worker_init_function`` where it
    is the ``worker_init_fn``); without NumPy seeded where the workers would not seed it."""
    found = lightning_init(worker_init_fn)
    if found is None:
        seeds = [stock_seeds(base_seed, k) for k in range(num_workers)]
    else:
        generate, rank = found
        rank = default_rank(generate) if rank is None else rank
        seeds = [lightning_seeds(base_seed, k, rank, generate) for k in range(num_workers)]
    if not numpy_seeded():
        for s in seeds:
            s.numpy_seed = None
    return seeds
