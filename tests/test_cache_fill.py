"""``--fast``'s decoded-image cache fills within a budget: no epoch more than a tenth slower than the cache off.

The budget (``vision/images/cache/fill.py``) is driven with made-up costs; the batch path is checked to consult it for
every miss and to tell it what each sample cost, with stock's batches whatever it decides.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader

import nano_patch
from nano_patch.vision.images.cache import fill


def _epoch(budget: fill.FillBudget, files: int, stored: set[int], costs: dict[str, float], rng: random.Random,
           cached: bool = True) -> tuple[float, float]:
    """One epoch over ``files`` files: each is a hit where stored, else a miss the budget stores or not. Returns
    the epoch's cost and what it would have cost with the cache off."""
    spent = 0.0
    for f in rng.sample(range(files), files):
        if cached and f in stored:
            kind = fill.HIT
        elif budget.fill():
            kind = fill.FILLED
            stored.add(f)
        else:
            kind = fill.UNCACHED
        seconds = costs[kind] * rng.uniform(0.9, 1.1)
        budget.seen(kind, seconds)
        spent += seconds
    return spent, files * costs[fill.UNCACHED]


@pytest.mark.parametrize(("filled", "hit"), [(2.0, 0.3), (1.5, 0.5), (3.0, 0.2), (1.1, 0.9)])
def test_no_epoch_is_more_than_a_tenth_slower_and_the_cache_fills(filled, hit):
    rng = random.Random(0)
    costs = {fill.UNCACHED: 1.0, fill.FILLED: filled, fill.HIT: hit}
    budget, stored = fill.FillBudget(), set()
    ratios, coverage = [], []
    for _ in range(30):
        spent, off = _epoch(budget, 500, stored, costs, rng)
        ratios.append(spent / off)
        coverage.append(len(stored) / 500)
    assert max(ratios) <= 1 + fill.SHARE + 0.03  # (the warm-up's fills and the costs' noise)
    assert coverage[0] < 1 < 1.01 * coverage[-1] or coverage[-1] == 1.0  # part the first epoch, all later
    assert coverage[-1] == 1.0 and ratios[-1] < 1


def test_where_a_fill_costs_nothing_more_every_miss_is_stored():
    """A pipeline that decodes the whole file anyway (Resize, CenterCrop): storing is all a fill adds."""
    budget, stored = fill.FillBudget(), set()
    _epoch(budget, 200, stored, {fill.UNCACHED: 1.0, fill.FILLED: 0.99, fill.HIT: 0.3}, random.Random(1))
    # the first fills wait until the budget covers what a fill is taken to cost (PRIOR_EXTRA); once a few were
    # measured as costing nothing more, every miss is stored
    first = fill.WARM_UP + fill.WARM_UP * fill.PRIOR_EXTRA / fill.SHARE
    assert len(stored) >= 200 - first


def test_the_budget_is_safe_across_threads():
    import threading

    budget = fill.FillBudget()

    def run() -> None:
        for k in range(2000):
            budget.seen(fill.FILLED if budget.fill() else fill.UNCACHED, 1.0 + (k % 3))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d = budget.describe()
    assert d["uncached_samples"] + d["filled_samples"] == 8000


def test_the_batch_path_asks_the_budget_and_tells_it_each_samples_cost(image_folder, tmp_path, monkeypatch):
    """Under --fast (auto) a miss is stored only where the budget says so; every sample's cost reaches it, by kind;
    the batches are stock's either way. An explicit cache stores every miss of the first epoch."""
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    from nano_patch.vision.images import cache

    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    torch.manual_seed(0)
    stock = [(x.clone(), y.clone()) for x, y in DataLoader(ImageFolder(str(image_folder), transform=tf),
                                                           batch_size=3, shuffle=True)]
    decisions = iter([False] * 4 + [True, False] * 20)
    seen: list[str] = []
    monkeypatch.setattr(fill.FillBudget, "fill", lambda self: next(decisions))
    monkeypatch.setattr(fill.FillBudget, "seen", lambda self, kind, seconds, overhead=0.0: seen.append(kind))
    nano_patch.patch_torch(cache_decoded="auto", cache_dir=str(tmp_path / "auto"), loader_threads=2)
    ds = ImageFolder(str(image_folder), transform=tf)
    torch.manual_seed(0)
    got = [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=3, shuffle=True)]
    for (a, ya), (b, yb) in zip(stock, got, strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)
    store = cache.store_for(ds)
    assert store is not None and store.fill_budget is not None
    assert len(seen) == len(ds) and seen.count(fill.FILLED) == (len(ds) - 4 + 1) // 2
    assert set(seen) == {fill.FILLED, fill.UNCACHED}
    nano_patch.unpatch_torch()
    nano_patch.patch_torch(cache_decoded="on", cache_dir=str(tmp_path / "on"), loader_threads=2)
    ds = ImageFolder(str(image_folder), transform=tf)
    for _ in DataLoader(ds, batch_size=3, shuffle=True):
        pass
    store = cache.store_for(ds)
    assert store.fill_budget is None and store.env().stat()["entries"] >= len(ds)  # (and its own header keys)
