"""``--loader-threads auto`` (``data/parallel.py``'s AutoThreads): the count comes from the throughput the process
measures, never a count slower than fewer threads, and it holds at many cores."""

from __future__ import annotations

import pytest
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import nano_patch
from nano_patch.data import parallel


def _drive(auto: parallel.AutoThreads, rate_of, batches: int, batch: int = 64) -> list[int]:
    """Load ``batches`` batches whose rate at n threads is ``rate_of(n)`` images/s; the counts used."""
    used = []
    for _ in range(batches):
        n = auto.current()
        used.append(n)
        auto.record(n, batch, batch / rate_of(n))
    return used


# images/s by thread count, as measured on 16 cores (issue 32): the threads peak at 4 and then go backwards
PEAK_AT_4 = {1: 565, 2: 1293, 4: 1448, 8: 1421, 16: 1036}


def test_it_keeps_the_fastest_count_where_more_threads_go_backwards():
    auto = parallel.AutoThreads(16)
    assert auto.ladder == [1, 2, 4, 8, 16] and auto.current() == 1
    used = _drive(auto, PEAK_AT_4.__getitem__, 60)
    assert auto.current() == 4 and not auto.climbing
    assert set(used) <= {1, 2, 4, 8} and used[-20:] == [4] * 20, "16 threads (the slowest) were never needed"


def test_it_never_settles_on_a_count_slower_than_one_thread():
    auto = parallel.AutoThreads(8)
    _drive(auto, {1: 1000, 2: 900, 4: 1200, 8: 1300}.__getitem__, 40)
    assert auto.current() == 1


def test_it_holds_at_every_core_while_more_threads_pay():
    auto = parallel.AutoThreads(16)
    _drive(auto, lambda n: 300 * n, 60)
    assert auto.current() == 16 and not auto.climbing


def test_a_count_within_the_margin_of_the_one_below_is_not_taken():
    auto = parallel.AutoThreads(4)
    _drive(auto, {1: 1000, 2: 1030, 4: 2000}.__getitem__, 40)  # 2 threads: 3% faster, inside the margin
    assert auto.current() == 2  # the fastest measured, though not by the margin
    assert auto.rates.keys() == {1, 2}


def test_a_recheck_follows_the_rates_when_they_change():
    auto = parallel.AutoThreads(16)
    _drive(auto, lambda n: 300 * n, 40)
    assert auto.current() == 16
    # the cache is warm now: the serial part dominates, and 16 threads lose to 8
    _drive(auto, {1: 1000, 2: 1800, 4: 2600, 8: 2700, 16: 1500}.__getitem__, auto.RECHECK_BATCHES + 20)
    assert auto.current() == 8


def test_the_first_batch_on_a_count_and_a_batch_from_before_a_change_are_not_counted():
    auto = parallel.AutoThreads(4)
    auto.record(1, 64, 100.0)  # the first batch on a count pays one-time costs: not counted
    for _ in range(auto.WINDOW_BATCHES):
        auto.record(1, 64, 0.1)
    assert auto.current() == 2
    auto.record(1, 64, 100.0)  # a late batch of the 1-thread window
    assert auto.rates == {1: pytest.approx(640)} and auto.current() == 2


def test_the_loader_measures_its_batches_and_climbs(image_folder, monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    nano_patch.patch_torch()  # loader_threads="auto"
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()]))
    assert parallel.threads() == 1
    monkeypatch.setattr(parallel.AutoThreads, "WINDOW_SECONDS", 0.0)
    loader = DataLoader(ds, batch_size=2)
    for _ in range(4):  # 1 batch uncounted and a window of 4, on 1 thread then on 2
        for _ in loader:
            pass
    auto = parallel.describe()["auto"]
    assert "1" in auto["images_per_s"] and "2" in auto["images_per_s"]


def test_a_count_whose_first_window_paid_one_time_costs_is_measured_again():
    # the batch path's first batches (files seen there for the first time) are slow; then 2 threads pay
    auto, seen = parallel.AutoThreads(2), {"2": 0}

    def rate(n: int) -> float:
        if n == 2:
            seen["2"] += 1
            return 400 if seen["2"] <= auto.WINDOW_BATCHES + 1 else 2000
        return 1000

    _drive(auto, rate, 30)
    assert auto.current() == 2 and not auto.climbing
