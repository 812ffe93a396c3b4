"""``render_pool.run_on_threads``'s parked helpers: every call runs on the calling thread and on each helper, the
helpers are the same threads from one batch to the next, a helper's error reaches the caller, a second caller
meanwhile takes the executor, and a count change or a dropped pool ends the old helpers."""

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


def test_a_second_caller_meanwhile_takes_the_executor():
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
    render_pool.run_on_threads(other, 2)  # the crew is busy: the executor's thread and this one
    release.set()
    first.join(5)
    assert len(names) == 2 and threading.current_thread().name in names


def test_a_new_count_or_a_dropped_pool_ends_the_old_helpers():
    render_pool.run_on_threads(lambda: None, 3)
    old = {t for t in threading.enumerate() if t.name.startswith("nano-patch-loader-") and t.is_alive()}
    assert len(old) == 2
    render_pool.run_on_threads(lambda: None, 2)  # one helper now: the two before end
    render_pool.drop()  # (the pool and the helpers; loader_threads.configure drops them too)
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in old) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in old)
