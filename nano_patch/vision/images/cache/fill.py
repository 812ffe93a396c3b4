"""How fast ``--fast``'s cache fills: never at more than a tenth of the loading time the cache off would take.

A miss that the store takes costs more than the same sample without a cache: the whole file is decoded (a crop's
window would do otherwise) and the decode is written to the store. Storing every miss of the first epoch makes that
epoch much slower than the cache off (docs/benchmarks.md). Under ``--fast`` (``cache_decoded="auto"``) each process
keeps a :class:`FillBudget` per store instead: a miss is stored only while the loading time so far, fills included,
stays within ``1 + SHARE`` of what the same samples would have cost with the cache off (``SHARE`` is 6%; the bar is
10%). Hits cost less than that (no decode), and what they save is spent on more fills, so the cache fills faster
each epoch: in part during the first, in full some epochs on, and no epoch is more than ``SHARE`` slower than the
cache off.

The costs are the samples' own render times (the seconds a loader thread spent on each, the store's write added
for a fill), kept as running means per kind; what the cache costs every sample (its look-up in the draw) counts
against the budget too, so fills get what it leaves. An explicit ``cache_decoded="on"`` (or a size) stores every
miss. Shared by the loader's threads: every figure is read and written under the budget's lock.
"""

from __future__ import annotations

import threading

#: Misses are stored while loading stays within 1 + SHARE of the cache-off estimate (the bar is a tenth: the rest
#: is margin for what the estimate leaves out, such as the pages the store's writes take from the page cache).
SHARE = 0.06
#: Samples of each kind measured before the budget trusts its means.
WARM_UP = 4
#: What a fill is taken to add, in uncached samples' costs, until fills have been measured (a full decode and its
#: write against a crop's window: about twice, measured on pets-sized photos).
PRIOR_EXTRA = 2.0

#: Sample kinds: served as with the cache off, stored (a miss decoded in full, then written), or a hit.
UNCACHED, FILLED, HIT = "uncached", "filled", "hit"


class FillBudget:
    """Whether this process stores its next miss (:meth:`fill`), from the costs it measured (:meth:`seen`)."""

    def __init__(self, share: float = SHARE) -> None:
        self.share = share
        self._lock = threading.Lock()
        self._n = {UNCACHED: 0, FILLED: 0, HIT: 0}
        self._sum = {UNCACHED: 0.0, FILLED: 0.0, HIT: 0.0}
        #: seconds the samples seen took, and how many
        self._spent = 0.0
        self._samples = 0

    def fill(self) -> bool:
        """Whether the next miss is stored (True) or served as with the cache off (False)."""
        with self._lock:
            if self._n[UNCACHED] < WARM_UP:
                return False  # what the cache off costs here, first
            uncached = self._sum[UNCACHED] / self._n[UNCACHED]
            if self._n[FILLED] < WARM_UP:  # (the first fills measure what one costs, within the budget too)
                extra = PRIOR_EXTRA * uncached
            else:
                extra = self._sum[FILLED] / self._n[FILLED] - uncached
            if extra <= 0:
                return True  # (a pipeline that decodes the whole file anyway: storing is all a fill adds)
            return self._spent + extra <= (1 + self.share) * uncached * (self._samples + 1)

    def seen(self, kind: str, seconds: float, overhead: float = 0.0) -> None:
        """A sample of ``kind`` took ``seconds`` (a fill: its render and its write), and ``overhead`` more that the
        cache costs every sample whatever it decides (its look-up): spent, but not part of what a fill adds."""
        with self._lock:
            self._n[kind] += 1
            self._sum[kind] += seconds
            self._spent += seconds + overhead
            self._samples += 1

    def describe(self) -> dict[str, float]:
        with self._lock:
            return {**{f"{k}_samples": float(n) for k, n in self._n.items()},
                    **{f"{k}_mean_s": self._sum[k] / n for k, n in self._n.items() if n}}
