"""What the gang scheduler takes a run's device time to be (what `share` charges and `sjf` orders by).

A run's device time is its plan's estimate (`pw.cost` at the device rates, `dialect/device_time.py`,
scaled by how other plans' measured runs compared with their estimates) until runs of the plan have
finished; from then on the mean of their measured device time (a moving average of the islands'
reports).
"""

from __future__ import annotations

from .run import Run

_MEASURED_WEIGHT = 0.25   # the weight of a run's measured device time in its plan's moving average
# A run measured at more than this many times its plan's average counts as having taken that long, in the
# average and in what it is charged: on a shared machine such a time is mostly the process waiting for a core
# (runs of 0.7 ms measured at 100-600 ms under load). One of them would otherwise multiply the plan's estimate
# for dozens of runs, and be one client's charge of hundreds of runs' device time, after which the others get
# the devices alone until they catch up. A plan whose runs really grow is followed within a few runs.
_OUTLIER = 2.0


class DeviceTimeEstimates:
    """The measured device time of each plan, and the factor that scales the estimates of the others."""

    def __init__(self):
        self._measured: dict[int, float] = {}          # plan key -> moving average of measured device time
        self._calibration: float | None = None         # moving average of measured over estimated device time

    def record(self, plan_key: int, seconds: float, estimate: float | None = None) -> float:
        """Folds one run's measured device time (at most `_OUTLIER` times the average) into its plan's moving
        average, and its ratio to the plan's `estimate` into the factor that scales the estimates of plans not
        measured yet (so that estimated and measured runs are charged on one scale). Returns the seconds it
        folded in: what the run is charged."""
        before = self._measured.get(plan_key)
        if before is not None:
            seconds = min(seconds, _OUTLIER * before)
        self._measured[plan_key] = seconds if before is None else before + _MEASURED_WEIGHT * (seconds - before)
        if estimate:
            ratio = seconds / estimate
            self._calibration = ratio if self._calibration is None else \
                self._calibration + _MEASURED_WEIGHT * (ratio - self._calibration)
        return seconds

    def measured(self, plan_key: int) -> float | None:
        """Returns the moving average of the measured device time of runs of a plan, or None before one."""
        return self._measured.get(plan_key)

    def forget(self, plan_key: int) -> None:
        """Forgets a plan that nothing runs any more."""
        self._measured.pop(plan_key, None)

    def of(self, run: Run) -> float:
        """Returns the device time of a run of its plan: measured if known, else estimated (scaled by how
        measured runs compared with their estimates)."""
        measured = self._measured.get(run.key)
        if measured is not None:
            return measured
        return run.cost * (self._calibration or 1.0)
