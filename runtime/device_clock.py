"""An island's device time, attributed to the runs whose device work overlaps.

XLA computes asynchronously: an island's executor dispatches a run and goes
on with the next while the first still computes, and on a CPU both share
the same cores. A run's device time is therefore not the wall time from its
dispatch to its end. The clock shares the island's time between the runs
active at each moment (processor sharing): from when a run's instructions
first execute until its device work is seen to be over, every interval is
split equally among the runs active in it. The `share` policy charges runs
these measured seconds (`runtime/scheduler.py`).
"""

from __future__ import annotations

import threading


class DeviceClock:
    """Seconds credited to each active run of one island; thread-safe (the executor and tracker call it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active: dict[int, float] = {}    # run id -> seconds credited so far
        self._last = 0.0

    def begin(self, run_id: int, now: float) -> None:
        """A run's instructions began to execute at `now` (monotonic seconds); it is active from then on."""
        with self._lock:
            self._tick(now)
            self._active.setdefault(run_id, 0.0)

    def end(self, run_id: int, now: float) -> float:
        """A run's device work was over at `now`; returns the seconds credited to it."""
        with self._lock:
            self._tick(now)
            return self._active.pop(run_id, 0.0)

    def drop(self, run_id: int) -> None:
        """A run failed: it is no longer active and its seconds are not reported."""
        with self._lock:
            self._active.pop(run_id, None)

    def _tick(self, now: float) -> None:
        if self._active and now > self._last:
            share = (now - self._last) / len(self._active)
            for run_id in self._active:
                self._active[run_id] += share
        self._last = max(self._last, now)
