"""``--loader-threads auto``: the count of loader threads, from the throughput the process measures.

:class:`AutoThreads` is the controller alone (fed the batches' times, it says the count for the next batch);
``loader_threads`` owns the setting and asks it. Shared state is read and written under its lock, so that it stays
correct on a free-threaded Python.
"""

from __future__ import annotations

import threading
from typing import Any


class AutoThreads:
    """``--loader-threads auto``: the thread count, chosen from the throughput the process measures.

    The counts are 1, 2, 4, ... up to the usable cores, and the usable cores themselves (the ladder). The first
    batch loads on every usable core: the batch path's serial part is small (its draws, a few microseconds a
    sample), so the threads scale to the cores, and a job whose epochs are shorter than any measurement gets them
    from its first batch.

    Throughput is measured in windows: after each change of count one batch is not counted (it pays one-time
    costs: the pool's threads, the first batch-path setup), then a window lasts at least ``WINDOW_BATCHES``
    batches and ``WINDOW_SECONDS`` of loading, and its rate is its samples over the seconds its batches took to
    load (draws and renders: what the thread count changes). Two counts are compared in three windows interleaved
    in time, one count's either side of the other's, and the mean of the two outer windows is set against the
    middle one: a throughput that drifts steadily meanwhile (the cold first epoch: files read for the first time,
    the decoded-image cache filling) moves both sides alike and cancels out.

    ``RECHECK_BATCHES`` batches on, the kept count is compared with the counts one step down and, below the top, one
    step up, in windows kept / up / kept / down / kept, each set against the kept windows either side (a pipeline
    whose serial part is large, another load on the machine, moves the best count): where the count below measured
    faster, it is kept and compared with the next one down (next / kept / next), as far as fewer threads keep
    measuring faster; else, where the count above pays (more than ``MARGIN`` faster), the same upwards. A check
    that keeps the count doubles the batches to the next one (up to ``MAX_RECHECK_BATCHES``): a count that holds is
    asked less and less often, so its windows on the other counts cost ever less throughput.

    ``record`` runs once per batch, under the lock, in constant time; ``current`` reads one attribute.
    """

    WINDOW_BATCHES = 8  # at +-10% noise per batch, a window's rate varies by about 2% (one sd): inside MARGIN
    WINDOW_SECONDS = 0.3  # and one slow batch (page faults, a GC pause) weighs little against 0.3 s of others
    MARGIN = 0.05
    # a recheck spends a window on each count either side: 1% of the throughput where they are 10% slower, 2.3%
    # where the count below is 1.6x slower (2 cores)
    RECHECK_BATCHES = 200
    #: a recheck that keeps the count doubles the batches to the next one, up to this many (its windows on the other
    #: counts cost throughput: the longer a count holds, the less often it is asked again)
    MAX_RECHECK_BATCHES = 3200

    def __init__(self, cores: int) -> None:
        ladder, n = [], 1
        while n < cores:
            ladder.append(n)
            n *= 2
        self.ladder = [*ladder, cores]
        self.rates: dict[int, float] = {}  # each count's last window, in samples/s
        self.kept = len(self.ladder) - 1  # index into the ladder of the count kept: every usable core at first
        self.climbing = False  # a comparison is under way: the climb, or a recheck
        self.rechecks = 0
        self._in_use = self.ladder[-1]  # the count the next batch loads on (one attribute: read without the lock)
        self._plan: tuple[int, ...] = ()  # the ladder indices of the comparison's windows, in order
        self._window_rates: list[float] = []  # the rates of its windows so far
        self._rechecking = False
        self._samples, self._seconds, self._batches = 0, 0.0, 0
        self._skip = 0  # batches not to count (the first on a new count)
        self._since_check = 0
        self._interval = self.RECHECK_BATCHES
        self._step = 1  # the way the comparison under way moves: +1 up the ladder, -1 down
        self._lock = threading.Lock()

    def current(self) -> int:
        """The count the next batch loads on."""
        return self._in_use

    def record(self, n_threads: int, samples: int, seconds: float) -> None:
        """A batch of ``samples`` loaded on ``n_threads`` threads in ``seconds``."""
        with self._lock:
            if n_threads != self._in_use:
                return  # loaded before the last change of count: not this window's
            if not self.climbing:
                self._since_check += 1
                if self._since_check >= self._interval and len(self.ladder) > 1:
                    self._recheck()
                return
            if self._skip:
                self._skip -= 1
                return
            self._samples += samples
            self._seconds += seconds
            self._batches += 1
            if self._batches < self.WINDOW_BATCHES or self._seconds < self.WINDOW_SECONDS or self._seconds <= 0:
                return
            rate = self._samples / self._seconds
            self._samples, self._seconds, self._batches = 0, 0.0, 0
            self.rates[n_threads] = rate
            self._window_rates.append(rate)
            if len(self._window_rates) < len(self._plan):
                self._use(self._plan[len(self._window_rates)])
            elif self._rechecking:
                self._end_recheck()
            else:
                self._end_climb_step()

    def _use(self, step: int) -> None:
        """Load on the ladder's count at ``step`` from the next batch on, that batch not counted."""
        self._in_use, self._skip = self.ladder[step], 1

    def _compare(self, plan: tuple[int, ...], rechecking: bool = False) -> None:
        """Start a comparison: a window on each of the ladder's counts at ``plan`` (the kept count every other)."""
        self._plan, self._window_rates, self._rechecking, self.climbing = plan, [], rechecking, True
        self._use(plan[0])

    def _keep(self, step: int, held: bool = False) -> None:
        """End the comparison on the ladder's count at ``step``; ``held``: a recheck kept the count it had (the next
        comes twice as many batches on), else the next is ``RECHECK_BATCHES`` on."""
        self.kept, self._plan, self._window_rates, self.climbing, self._since_check = step, (), [], False, 0
        self._interval = min(2 * self._interval, self.MAX_RECHECK_BATCHES) if held else self.RECHECK_BATCHES
        self._use(step)

    def _gain(self, i: int) -> float:
        """Window ``i``'s rate over the mean of the kept count's windows either side of it."""
        w = self._window_rates
        return w[i] / ((w[i - 1] + w[i + 1]) / 2)

    def _move(self, step: int) -> None:
        """Keep the count one step ``step`` (+1 up, -1 down) from the kept one, which measured faster, and compare
        it with the next one that way (next / kept / next), as far as the ladder goes."""
        k = self.kept + step
        if 0 <= k + step < len(self.ladder):
            self.kept, self._step = k, step
            self._compare((k + step, k, k + step))
        else:
            self._keep(k)

    def _end_climb_step(self) -> None:
        w = self._window_rates
        # up pays beyond the margin; down where it measured faster (fewer threads that lose nothing)
        if (w[0] + w[2]) / 2 > w[1] * ((1 + self.MARGIN) if self._step > 0 else 1.0):
            self._move(self._step)
        else:
            self._keep(self.kept)  # the next count that way did not pay: the move ends here

    def _recheck(self) -> None:
        k, top = self.kept, len(self.ladder) - 1
        self.rechecks += 1
        self._compare((k, *((k + 1, k) if k < top else ()), *((k - 1, k) if k > 0 else ())), rechecking=True)

    def _end_recheck(self) -> None:
        k, plan = self.kept, self._plan
        window_of = {plan[i]: i for i in range(1, len(plan), 2)}  # the ladder index of a count -> its window
        up, down = window_of.get(k + 1), window_of.get(k - 1)
        if down is not None and self._gain(down) > 1:
            self._move(-1)  # fewer threads measured faster: down from there, as far as they keep being faster
        elif up is not None and self._gain(up) > 1 + self.MARGIN:
            self._move(+1)  # more threads pay now (another load on the machine ended): up, as far as they pay
        else:
            self._keep(k, held=True)

    def describe(self) -> dict[str, Any]:
        with self._lock:  # rates may be written meanwhile (a free-threaded Python has no GIL to order it)
            rates = sorted(self.rates.items())
            return {"threads": self._in_use, "climbing": self.climbing, "rechecks": self.rechecks,
                    "images_per_s": {str(n): round(r, 1) for n, r in rates}}
