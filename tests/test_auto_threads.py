"""``--loader-threads auto`` (``data/loader_pool.py``'s AutoThreads): the count comes from the throughput the process
measures, never a count slower than fewer threads, and it holds at many cores.

The loader is simulated: each batch's time comes from a model of images/s by thread count, times a drift over
the run (the cold first epoch: files read for the first time, the decoded-image cache filling, the allocator
warming up) and, where given, seeded noise per batch.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import nano_patch
from nano_patch.data import loader_pool

Rate = Callable[[int, int], float]  # images/s on n threads at batch b


class _Loader:
    """A simulated loader feeding ``auto``: batch b (numbered through the run) loads on n threads at
    ``rate_of(n, b)`` images/s, times a seeded uniform draw in 1 +- ``noise``."""

    def __init__(self, auto: loader_pool.AutoThreads, rate_of: Rate, noise: float = 0.0, seed: int = 0) -> None:
        self.auto, self.rate_of, self.noise = auto, rate_of, noise
        self.draws, self.batches = random.Random(seed), 0

    def load(self, batches: int, batch: int = 64) -> list[int]:
        """Load ``batches`` batches; the counts used."""
        used = []
        for _ in range(batches):
            n = self.auto.current()
            used.append(n)
            rate = self.rate_of(n, self.batches) * (1 + self.draws.uniform(-self.noise, self.noise))
            self.auto.record(n, batch, batch / rate)
            self.batches += 1
        return used

    def settle(self) -> list[int]:
        """Load until no comparison is under way (at most 1000 batches); the counts used."""
        used = []
        while self.auto.climbing:
            used += self.load(1)
            assert len(used) < 1000, "still comparing after 1000 batches"
        return used


def _drive(auto: loader_pool.AutoThreads, rate_of: Rate, batches: int, noise: float = 0.0,
           seed: int = 0) -> list[int]:
    """``batches`` batches of a fresh simulated loader; the counts used."""
    return _Loader(auto, rate_of, noise, seed).load(batches)


def _steady(rates: dict[int, float]) -> Rate:
    return lambda n, b: rates[n]


def _warming(rates: dict[int, float], over: int) -> Rate:
    """``rates`` times a drift from 50% at the first batch to 100% at batch ``over``, the same for every count."""
    return lambda n, b: rates[n] * (0.5 + 0.5 * min(1.0, b / over))


# images/s by thread count on a 16-core Xeon (issue 32; pets, real photos, cache off): the threads peak at 8
PEAK_AT_8 = {1: 642, 2: 1191, 4: 1828, 8: 2038, 16: 1806}
# and what the climb of issue 32 measured in that run's cold first batches, where it settled on 2 (4 threads no
# faster than 2; 8 and 16, not measured there, taken as 4)
COLD_START = {1: 434.5, 2: 1113.1, 4: 1095.8, 8: 1100.0, 16: 1100.0}
# other load on the machine: 4 threads are best now, 16 the worst
BUSY = {1: 642, 2: 1191, 4: 2038, 8: 1828, 16: 1500}
PEAK_AT_4 = {1: 565, 2: 1293, 4: 1448, 8: 1421, 16: 1036}  # an earlier loader on the same machine

DRIFTS: dict[str, Callable[[dict[int, float]], Rate]] = {
    "warm-up over 150 batches": lambda rates: _warming(rates, 150),
    # fast enough that windows measured one after another mislead (the climb before this rule took 16)
    "warm-up over 40 batches": lambda rates: _warming(rates, 40),
}


@pytest.mark.parametrize("drift", [*DRIFTS, "issue 32's cold start"])
def test_a_drifting_warm_up_still_ends_at_the_best_count(drift):
    def cold_start(n: int, b: int) -> float:  # the rule before this one settled on 2 here, at these very rates
        return COLD_START[n] if b < 30 else PEAK_AT_8[n]

    auto = loader_pool.AutoThreads(16)
    loader = _Loader(auto, DRIFTS[drift](PEAK_AT_8) if drift in DRIFTS else cold_start)
    loader.settle()
    assert auto.current() == 8, "the climb ends at the best count"
    for _ in range(3):
        loader.load(auto.RECHECK_BATCHES)
        loader.settle()
        assert auto.current() == 8, "and the rechecks keep it"


@pytest.mark.parametrize("drift", DRIFTS)
def test_with_noise_it_ends_within_the_margin_of_the_best_count(drift):
    # +-10% per batch, 200 seeded runs. A climb may end on a count more than 5% below the best only rarely (of
    # 1000 runs this rule ended 8 on 4 under either warm-up; the rule before it 61 on 16 under the slower, 840 under
    # the faster), and never on one slower than 1 thread
    best, ends = max(PEAK_AT_8.values()), []
    for seed in range(200):
        auto = loader_pool.AutoThreads(16)
        _Loader(auto, DRIFTS[drift](PEAK_AT_8), noise=0.1, seed=seed).settle()
        ends.append(auto.current())
    assert all(PEAK_AT_8[n] > PEAK_AT_8[1] for n in ends)
    off = [n for n in ends if PEAK_AT_8[n] < best * (1 - loader_pool.AutoThreads.MARGIN)]
    assert len(off) <= 4, off


@pytest.mark.parametrize("drift", DRIFTS)
@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_two_cores_take_two_threads_where_they_pay(drift, noise):
    for seed in range(20):
        auto = loader_pool.AutoThreads(2)
        _Loader(auto, DRIFTS[drift]({1: 1000, 2: 1600}), noise=noise, seed=seed).settle()
        assert auto.current() == 2


@pytest.mark.parametrize("drift", DRIFTS)
@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_where_more_threads_are_always_slower_it_stays_on_one(drift, noise):
    # 2 threads 4% slower than 1: a warm-up between the two windows made them look faster to the rule before this
    slower = {1: 1000, 2: 960, 4: 900, 8: 800, 16: 600}
    for seed in range(20):
        auto = loader_pool.AutoThreads(16)
        used = _Loader(auto, DRIFTS[drift](slower), noise=noise, seed=seed).settle()
        assert auto.current() == 1
        assert set(used) == {1, 2}, "4 threads and more were never needed"


def test_a_recheck_after_the_load_changes_moves_one_step_toward_the_new_best():
    auto = loader_pool.AutoThreads(16)
    loader = _Loader(auto, _steady(PEAK_AT_8))
    loader.settle()
    assert auto.current() == 8
    loader.rate_of = _steady(BUSY)
    loader.load(auto.RECHECK_BATCHES)
    loader.settle()
    assert auto.current() == 4 and auto.rechecks == 1
    for _ in range(3):
        loader.load(auto.RECHECK_BATCHES)
        loader.settle()
    assert auto.current() == 4 and auto.rechecks == 4, "4 threads stay: the counts either side lose to them"


def test_a_recheck_moves_one_step_at_most():
    auto = loader_pool.AutoThreads(16)
    loader = _Loader(auto, lambda n, b: 300 * n)
    loader.settle()
    assert auto.current() == 16
    loader.rate_of = _steady(BUSY)
    used = loader.load(auto.RECHECK_BATCHES) + loader.settle()
    assert auto.current() == 8 and auto.rechecks == 1 and set(used) == {8, 16}
    loader.load(auto.RECHECK_BATCHES)
    loader.settle()
    assert auto.current() == 4 and auto.rechecks == 2


def test_it_keeps_the_fastest_count_where_more_threads_go_backwards():
    auto = loader_pool.AutoThreads(16)
    assert auto.ladder == [1, 2, 4, 8, 16] and auto.current() == 2  # the climb's first window: 2 threads
    used = _drive(auto, _steady(PEAK_AT_4), 150)
    assert auto.current() == 4 and not auto.climbing
    assert set(used) <= {1, 2, 4, 8} and used[-20:] == [4] * 20, "16 threads (the slowest) were never needed"


def test_it_never_settles_on_a_count_slower_than_one_thread():
    auto = loader_pool.AutoThreads(8)
    _drive(auto, _steady({1: 1000, 2: 900, 4: 1200, 8: 1300}), 40)
    assert auto.current() == 1 and not auto.climbing


def test_it_holds_at_every_core_while_more_threads_pay():
    auto = loader_pool.AutoThreads(16)
    _drive(auto, lambda n, b: 300 * n, 300)
    assert auto.current() == 16 and not auto.climbing


def test_a_count_within_the_margin_of_the_one_below_is_not_taken():
    auto = loader_pool.AutoThreads(4)
    _drive(auto, _steady({1: 1000, 2: 1030, 4: 2000}), 40)  # 2 threads: 3% faster, inside the margin
    assert auto.current() == 1 and not auto.climbing  # the climb ends at the first count that does not pay
    assert auto.rates.keys() == {1, 2}


def test_a_recheck_follows_the_rates_when_they_change():
    auto = loader_pool.AutoThreads(16)
    loader = _Loader(auto, lambda n, b: 300 * n)
    loader.settle()
    assert auto.current() == 16
    # the cache is warm now: the serial part dominates, and 16 threads lose to 8
    loader.rate_of = _steady({1: 1000, 2: 1800, 4: 2600, 8: 2700, 16: 1500})
    loader.load(auto.RECHECK_BATCHES)
    loader.settle()
    assert auto.current() == 8 and auto.rechecks == 1


def test_the_first_batch_on_a_count_and_a_batch_from_before_a_change_are_not_counted():
    auto = loader_pool.AutoThreads(4)
    assert auto.current() == 2
    auto.record(2, 64, 100.0)  # the first batch on a count pays one-time costs: not counted
    for _ in range(auto.WINDOW_BATCHES):
        auto.record(2, 64, 0.1)
    assert auto.current() == 1
    auto.record(2, 64, 100.0)  # a late batch of the 2-thread window
    assert auto.rates == {2: pytest.approx(640)} and auto.current() == 1


def test_a_window_lasts_its_batches_and_its_seconds():
    auto = loader_pool.AutoThreads(2)
    auto.record(2, 64, 0.01)  # uncounted
    for _ in range(auto.WINDOW_BATCHES):
        auto.record(2, 64, 0.01)
    assert auto.current() == 2 and not auto.rates, "8 batches, but 0.08 s of loading: the window goes on"
    for _ in range(round((auto.WINDOW_SECONDS - 0.08) / 0.01) + 1):
        auto.record(2, 64, 0.01)
    assert auto.current() == 1 and auto.rates == {2: pytest.approx(6400)}


def test_a_count_whose_first_window_paid_one_time_costs_is_measured_again():
    # the batch path's first batches (files seen there for the first time) are slow; then 2 threads pay
    auto, seen = loader_pool.AutoThreads(2), {"2": 0}

    def rate(n: int, b: int) -> float:
        if n == 2:
            seen["2"] += 1
            return 400 if seen["2"] <= auto.WINDOW_BATCHES + 1 else 2000
        return 1000

    _drive(auto, rate, 40)
    assert auto.current() == 2 and not auto.climbing


def test_threads_recording_at_once_leave_it_consistent():
    auto = loader_pool.AutoThreads(16)

    def load() -> None:
        for _ in range(3000):
            n = auto.current()
            auto.record(n, 64, 64 / PEAK_AT_8[n])
            auto.describe()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _Loader(auto, _steady(PEAK_AT_8)).settle()  # a recheck may be under way
    assert auto.current() == 8 and auto.describe()["threads"] == 8


def test_the_loader_measures_its_batches_and_climbs(image_folder, monkeypatch):
    monkeypatch.setattr(loader_pool, "usable_cores", lambda: 2)
    nano_patch.patch_torch()  # loader_threads="auto"
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()]))
    assert loader_pool.threads() == 2  # the climb's first window
    monkeypatch.setattr(loader_pool.AutoThreads, "WINDOW_SECONDS", 0.0)
    monkeypatch.setattr(loader_pool.AutoThreads, "WINDOW_BATCHES", 2)
    loader = DataLoader(ds, batch_size=2)
    for _ in range(10):  # windows of 1 uncounted batch and 2 counted, on 2 threads, 1, then 2 again
        for _ in loader:
            pass
        if not loader_pool.describe()["auto"]["climbing"]:
            break
    auto = loader_pool.describe()["auto"]
    assert auto["images_per_s"].keys() == {"1", "2"} and not auto["climbing"] and auto["threads"] in (1, 2)


def test_a_cold_phase_longer_than_the_climb_is_climbed_out_of_at_the_next_recheck():
    """The first climb meets only the cold phase (4 threads no faster than 2: it keeps 2); once warm, the first
    recheck finds 4 paying and climbs on as far as more threads pay (8), not one step per recheck."""
    auto = loader_pool.AutoThreads(16)
    loader = _Loader(auto, lambda n, b: COLD_START[n] if b < 400 else PEAK_AT_8[n])
    loader.settle()
    assert auto.current() == 2
    loader.load(400 - loader.batches)  # (a recheck may fall in the cold phase: it keeps 2)
    loader.settle()
    assert auto.current() == 2
    before = auto.rechecks
    loader.load(auto.RECHECK_BATCHES)  # warm now: the next recheck starts
    used = loader.settle()
    assert auto.current() == 8 and auto.rechecks == before + 1, used
