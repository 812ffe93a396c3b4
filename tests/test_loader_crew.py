"""``render_pool.run_on_threads``'s parked helpers: every call runs on the calling thread and on each helper, the
helpers are the same threads from one batch to the next, a helper's error reaches the caller, a second caller
meanwhile takes a crew of its own, a dropped pool ends the idle helpers, and an interrupted call breaks its crew
without a wait that never ends."""

from __future__ import annotations

import threading
import time

import pytest

from nano_patch.data.threads import render_pool


def _recording() -> tuple[list[str], threading.Lock]:
    return [], threading.Lock()


def test_each_call_runs_on_the_caller_and_every_helper_the_same_threads_each_time():
    seen, lock = _recording()

    def fn():
        with lock:
            seen.append(threading.current_thread().name)

    render_pool.run_on_threads(fn, 3)
    first = sorted(seen)
    assert len(first) == 3 and threading.current_thread().name in first
    assert sum(name.startswith("nano-patch-loader-") for name in first) == 2
    for _ in range(50):
        seen.clear()
        render_pool.run_on_threads(fn, 3)
        assert sorted(seen) == first  # parked between calls, not made again


def test_it_returns_only_once_every_helper_returned():
    finished = []

    def fn():
        if threading.current_thread().name.startswith("nano-patch-loader-"):
            time.sleep(0.05)
        finished.append(1)

    render_pool.run_on_threads(fn, 2)
    assert len(finished) == 2


def test_a_helper_s_error_reaches_the_caller_and_the_helpers_go_on():
    def fn():
        if threading.current_thread().name.startswith("nano-patch-loader-"):
            raise ValueError("from a helper")

    with pytest.raises(ValueError, match="from a helper"):
        render_pool.run_on_threads(fn, 2)
    ran = []
    render_pool.run_on_threads(lambda: ran.append(1), 2)
    assert len(ran) == 2


def test_a_second_caller_meanwhile_takes_a_crew_of_its_own():
    inside = threading.Event()
    release = threading.Event()
    names: list[str] = []

    def slow():
        if threading.current_thread() is first:
            inside.set()
            release.wait(5)

    def other():
        names.append(threading.current_thread().name)

    first = threading.Thread(target=render_pool.run_on_threads, args=(slow, 2))
    first.start()
    assert inside.wait(5)
    render_pool.run_on_threads(other, 2)  # the first crew is busy: another crew's helper and this thread
    release.set()
    first.join(5)
    assert len(names) == 2 and threading.current_thread().name in names
    assert any(n.startswith("nano-patch-loader-") for n in names)


def _helpers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("nano-patch-loader-") and t.is_alive()}


def _ended(threads: set[threading.Thread]) -> bool:
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(t.is_alive() for t in threads)


def test_a_dropped_pool_ends_the_idle_helpers():
    render_pool.drop()
    render_pool.run_on_threads(lambda: None, 3)
    render_pool.run_on_threads(lambda: None, 2)
    old = _helpers()
    assert len(old) >= 3
    render_pool.drop()  # (loader_threads.configure drops them too)
    assert _ended(old)


def test_no_standard_library_pool_runs_a_batch(image_folder):
    """A ``ThreadPoolExecutor``'s threads are joined at exit without a bound: none of the loader's runs there."""
    import concurrent.futures.thread as pools

    import torchvision.transforms as T
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    import nano_patch

    before = set(pools._threads_queues)
    nano_patch.patch_torch(loader_threads=3)
    ds = ImageFolder(str(image_folder), transform=T.Compose([T.RandomResizedCrop(48), T.ToTensor()]))
    assert len(list(DataLoader(ds, batch_size=4))) == 3
    assert set(pools._threads_queues) == before


def test_a_call_interrupted_while_its_helpers_run_breaks_the_crew_and_returns():
    """Ctrl-C in the calling thread while a helper still works: the caller gets its KeyboardInterrupt once the
    helper is done, the crew is never used again, and its helper ends."""
    render_pool.drop()
    started = threading.Event()

    def fn():
        if threading.current_thread().name.startswith("nano-patch-loader-"):
            started.set()
            time.sleep(0.2)
        else:
            assert started.wait(5)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        render_pool.run_on_threads(fn, 2)
    helpers = _helpers()
    ran = []
    render_pool.run_on_threads(lambda: ran.append(threading.current_thread().name), 2)
    assert len(ran) == 2
    render_pool.drop()
    assert _ended(helpers)
