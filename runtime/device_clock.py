"""An island's device time, attributed to its runs one after another.

XLA computes asynchronously: an island's executor dispatches a run and goes
on with the next while the first still computes, so a run's device time is
not the wall time from its dispatch to its end. A device executes what is
dispatched to it in order, so the island's runs finish in the order their
dispatch ended (the completion tracker sees them in that order), and each
run's device time is the time from when the run before it was over (or from
when its own instructions began, if later) until its own end. The `share`
policy charges runs these measured seconds (`runtime/scheduler.py`).

Sharing overlapping time equally among the active runs instead (processor
sharing) charged a short run for the long run queued ahead of it:
`pw-bench multi-tenancy`'s share errors were 0.69 and 1.23 that way, and
0.13 and 0.09 attributed in order, in runs a few minutes apart on this
machine.
"""

from __future__ import annotations

import threading


class DeviceClock:
    """When each active run of one island began, and when the last one ended; thread-safe (the executor
    and the completion tracker call it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._began: dict[int, float] = {}     # run id -> when its instructions began (monotonic seconds)
        self._last_end = 0.0

    def begin(self, run_id: int, now: float) -> None:
        """A run's instructions began to execute at `now`."""
        with self._lock:
            self._began.setdefault(run_id, now)

    def end(self, run_id: int, now: float) -> float:
        """A run's device work was over at `now` (runs end in the order their dispatch ended); returns its
        device time."""
        with self._lock:
            began = self._began.pop(run_id, now)
            seconds = max(0.0, now - max(began, self._last_end))
            self._last_end = max(self._last_end, now)
            return seconds

    def drop(self, run_id: int) -> None:
        """A run failed: its time is not reported."""
        with self._lock:
            self._began.pop(run_id, None)
