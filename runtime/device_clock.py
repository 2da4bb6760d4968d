"""An island's device time, attributed to its runs one after another.

XLA computes asynchronously: an island's executor dispatches a run and goes
on with the next while the first still computes, so a run's device time is
not the wall time from its dispatch to its end. A device executes what is
dispatched to it in order, so the island's runs finish in the order their
dispatch ended (the completion tracker sees them in that order), and each
run's device time is the time from when the run before it was over (or from
when its own instructions began, if later) until its own end. The `share`
policy charges runs these measured seconds (`runtime/scheduler.py`).

A run's end is known only within bounds: exactly when XLA ran it inline (it
was computed when its dispatch returned), else between the last look that
found it still computing (or its dispatch's end) and the look that found it
over. The clock takes the middle of those bounds. When one look finds two
runs over that were both still computing at the previous look, the second
one's time is not known (both ends lie in the same interval), and it is not
reported, rather than reported as zero, which charged the first run for the
second. Nor is a run reported whose end's bounds (or, when it started at the
end of the run before it, that end's bounds) are wider than the tracker's
looks are apart (`widest`): the looks were held up (on a loaded machine, the
process waiting for a core), and the middle of hundreds of milliseconds says
nothing of a run of one. Which runs go unreported depends only on when the
looks were, not on the runs' times, so the times reported are not biased
towards long ones.
(Taking every end at the look that saw it, the 0.5 ms program of `pw-bench
multi-tenancy`'s share runs measured a median of 0.05 ms per device, with a
tenth of its runs at 0.01 ms, while the 2 ms one absorbed their time.)

Sharing overlapping time equally among the active runs instead (processor
sharing) charged a short run for the long run queued ahead of it:
`pw-bench multi-tenancy`'s share errors were 0.69 and 1.23 that way.
"""

from __future__ import annotations

import threading


class DeviceClock:
    """When each active run of one island began, and when the last one ended; thread-safe (the executor
    and the completion tracker call it)."""

    def __init__(self, widest: float):
        """`widest`: the widest bounds of an end that still time a run (wider: the looks were held up)."""
        self._widest = widest                  # bounds wider than this leave an end unknown
        self._lock = threading.Lock()
        self._began: dict[int, float] = {}     # run id -> when its instructions began (monotonic seconds)
        self._last_end = 0.0                   # the estimated end of the latest run over
        self._last_latest = 0.0                # the latest bound of that end
        self._last_width = 0.0                 # and the width of its bounds (0: known exactly)

    def begin(self, run_id: int, now: float) -> None:
        """A run's instructions began to execute at `now`."""
        self._began.setdefault(run_id, now)     # one call on a dict: atomic, no lock needed

    def end(self, run_id: int, earliest: float, latest: float) -> float | None:
        """A run's device work was over at some time between `earliest` and `latest` (equal when known
        exactly; runs end in the order their dispatch ended, and a look gives the runs it finds over one
        `latest`); returns its device time, or None when it is not known."""
        with self._lock:
            began = self._began.pop(run_id, latest)
            earliest = min(max(earliest, self._last_end), latest)   # not before the run before it
            end = (earliest + latest) / 2
            start = max(began, self._last_end)
            width = latest - earliest
            seen_together = width > 0 and self._last_width > 0 and latest == self._last_latest
            unknown = seen_together or width > self._widest or (self._last_end > began and
                                                                self._last_width > self._widest)
            self._last_end, self._last_latest, self._last_width = end, latest, width
            return None if unknown else max(0.0, end - start)

    def drop(self, run_id: int) -> None:
        """A run failed: its time is not reported."""
        with self._lock:
            self._began.pop(run_id, None)
