"""What the gang scheduler takes a run's device time to be (what `share` charges and `sjf` orders by).

A run's device time is its plan's estimate (`pw.cost` at the device rates, `dialect/device_time.py`,
scaled by how other plans' measured runs compared with their estimates) until runs of the plan have
finished; from then on the mean of their measured device time (a moving average of the islands'
reports): of its client's runs of the plan once it has any, as clients may run one plan with arguments
that take different times (a loop's trip count). A run is charged the device time it measured, at most
`_OUTLIER` times the second longest of the latest measurements of its client's runs of the plan.
"""

from __future__ import annotations

import heapq
from collections import deque

from .run import Run

_MEASURED_WEIGHT = 0.25   # the weight of a run's measured device time in a moving average
# A run measured at more than this many times the second longest of the latest `_RECENT` measurements of its
# client's runs of its plan counts as having taken that long, in the averages and in what it is charged: on a
# shared machine such a time is mostly the process waiting for a core (runs of 0.7 ms measured at 100-600 ms
# under load). One of them would otherwise multiply the plan's estimate for dozens of runs, and be one client's
# charge of hundreds of runs' device time, after which the others get the devices alone until they catch up.
# The bound is of the measurements as they were, not as they were charged, and of the second longest, so a run
# that really takes long is charged what it took once one more such run is among the latest: a client whose runs
# of one plan take different times (a loop's trip count) and a plan whose runs really grow. (Bounded by twice
# the client's average of its charges, which the short runs pull down and the bounded long ones never raise,
# a client with three short runs to each long one was charged 5% of the device time they took.) The latest are
# the client's own, as other clients may run the plan with arguments that take less time.
_OUTLIER = 2.0
_RECENT = 16


def _folded(average: float | None, seconds: float) -> float:
    """Returns a moving average with one more measurement folded in (the measurement, if there was none)."""
    return seconds if average is None else average + _MEASURED_WEIGHT * (seconds - average)


class DeviceTimeEstimates:
    """The measured device time of each plan and of each client's runs of it, and the factor that scales the
    estimates of the plans not measured yet."""

    def __init__(self):
        self._measured: dict[int, float] = {}          # plan key -> moving average of measured device time
        self._by_client: dict[int, dict[int, float]] = {}  # plan key -> client -> the same, of its runs
        self._calibration: float | None = None         # moving average of measured over estimated device time
        self._latest: dict[int, Latest] = {}           # plan key -> its latest runs' measurements, as measured
        self._latest_by_client: dict[int, dict[int, Latest]] = {}  # plan key -> client -> the same

    def record(self, plan_key: int, seconds: float, estimate: float | None = None,
               client_id: int | None = None) -> float:
        """Folds one run's measured device time into its plan's moving average and its client's (`client_id`
        None: a duration injected for the plan, of no client's run), and its ratio to the plan's `estimate` into
        the factor that scales the estimates of plans not measured yet (so that estimated and measured runs are
        charged on one scale); a time beyond the bound of its client's latest runs (`Latest.bound`; of the plan's
        before the client's first) is folded in as that bound. Returns the seconds it folded in: what the run is
        charged."""
        plan_latest = self._latest.get(plan_key)
        if plan_latest is None:
            plan_latest = self._latest[plan_key] = Latest()
        latest = None
        if client_id is not None:
            by_client = self._latest_by_client.get(plan_key)
            if by_client is None:
                by_client = self._latest_by_client[plan_key] = {}
            latest = by_client.get(client_id)
            if latest is None:
                latest = by_client[client_id] = Latest()
        bound = (latest if latest is not None and latest.times else plan_latest).bound(seconds)
        plan_latest.add(seconds)
        if latest is not None:
            latest.add(seconds)
        if bound is not None:
            seconds = min(seconds, bound)
        self._measured[plan_key] = _folded(self._measured.get(plan_key), seconds)
        if client_id is not None:
            by_client = self._by_client.get(plan_key)
            if by_client is None:
                by_client = self._by_client[plan_key] = {}
            by_client[client_id] = _folded(by_client.get(client_id), seconds)
        if estimate:
            self._calibration = _folded(self._calibration, seconds / estimate)
        return seconds

    def measured(self, plan_key: int) -> float | None:
        """Returns the moving average of the measured device time of runs of a plan, or None before one."""
        return self._measured.get(plan_key)

    def forget(self, plan_key: int) -> None:
        """Forgets a plan that nothing runs any more."""
        self._measured.pop(plan_key, None)
        self._by_client.pop(plan_key, None)
        self._latest.pop(plan_key, None)
        self._latest_by_client.pop(plan_key, None)

    def forget_client(self, client_id: int) -> None:
        """Forgets a client that closed, once none of its runs is queued or on the devices."""
        for by_client in (*self._by_client.values(), *self._latest_by_client.values()):
            by_client.pop(client_id, None)

    def of(self, run: Run) -> float:
        """Returns the device time of a run of its plan: measured if known (of its client's runs of the plan, if
        any), else estimated (scaled by how measured runs compared with their estimates)."""
        measured = self._average(run.key, run.client_id)
        if measured is not None:
            return measured
        return run.cost * (self._calibration or 1.0)

    def _average(self, plan_key: int, client_id: int | None) -> float | None:
        """Returns the moving average of the measured device time of a client's runs of a plan, or of the
        plan's runs before the client's first, or None before the plan's first."""
        by_client = self._by_client.get(plan_key)
        if by_client is not None and client_id in by_client:
            return by_client[client_id]
        return self._measured.get(plan_key)


class Latest:
    """The latest `_RECENT` measurements of runs (of a plan, or of one client's runs of it), as measured, and the
    most a run can be charged from them: `_OUTLIER` times the second longest (the longest while there is one).
    That bound is worked out again when a run measures over it, or once `_RECENT` runs were added since, not for
    each run (a fast lane's runs retire in microseconds each; between two, the bound may still count a
    measurement that has left the latest)."""

    __slots__ = ("times", "_bound", "_added")

    def __init__(self):
        self.times: deque[float] = deque(maxlen=_RECENT)
        self._bound: float | None = None         # as last worked out (None: never)
        self._added = 0                          # measurements added since

    def bound(self, seconds: float) -> float | None:
        """Returns the most a run measured at `seconds` can be charged, or None with no measurement yet."""
        if self.times and (self._bound is None or seconds > self._bound or self._added >= _RECENT):
            self._bound = _OUTLIER * heapq.nlargest(2, self.times)[-1]
            self._added = 0
        return self._bound

    def add(self, seconds: float) -> None:
        """Adds a run's measurement, as measured."""
        self.times.append(seconds)
        self._added += 1
