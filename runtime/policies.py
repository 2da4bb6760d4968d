"""The gang scheduler's policies: one object per policy, answering what the scheduler asks of it.

Kept apart from `scheduler.py` (which imports JAX through the islands) so that `pw-serve` and
`pw.configure` parse a policy before anything starts. A policy name (`policy="sjf"`, `--policy`) is
parsed once, by `parse_policy`, into one of these objects:

- `fifo`: arrival order; every run that fits is admitted at once.
- `share`: start-time fair queueing on device time, by client weight.
- `sjf`: shortest estimated device time first.
- `deadline`: earliest deadline first (a run's deadline is its `timeout=`; runs without one go after
  those with one, in arrival order).

Every policy but `fifo` admits at most `window` runs onto each island's devices at a time (a run takes a
place on every island it uses; the runs queued beyond the windows are the ones the policy orders); each
class's `default_window` gives its default.

The scheduler tells a policy when a run arrives (`arrived`, for a policy that `follows_arrivals`:
`share` moves a client back from a pause up to the others), asks it in which order to look at the
clients' oldest queued runs (`order`), tells it when it admits a run (`admitted`: `share` advances the
client's virtual time by the run's estimate), when a run is over (`retired`: `share` corrects that by
the run's measured device time), and when a client closed (`forget`). All are called under the
scheduler's lock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable

if TYPE_CHECKING:
    from .run import Run
    from .waiting_runs import WaitingRun

DeviceSeconds = Callable[["Run"], float]   # the scheduler's estimate of a run's device time


class Policy:
    """The order in which queued runs are admitted, and the window of admitted runs it orders beyond."""

    name: ClassVar[str]
    # Admitted runs that may be on one island's devices at once (None: no window). Two keeps an island's
    # executor fed (one run executing, the next queued behind it) while a short run waits for at most those.
    default_window: ClassVar[int | None]

    def __init__(self, window: int | None = None):
        self.window = self.default_window if window is None else window

    @property
    def windowed(self) -> bool:
        """Whether at most `window` admitted runs are on each island's devices at a time (all policies but
        fifo)."""
        return self.window is not None

    def order(self, heads: list[WaitingRun], device_seconds: DeviceSeconds) -> None:
        """Sorts the clients' oldest queued runs into the order they are looked at (ties: arrival)."""
        heads.sort(key=lambda item: item.arrival)

    # True for a policy that `arrived` must be told of (the scheduler then works out whether the client was
    # idle, which costs a look at the runs in flight).
    follows_arrivals: ClassVar[bool] = False

    def arrived(self, run: Run, idle: bool, device_seconds: DeviceSeconds) -> None:
        """Records that `run` was submitted; `idle`: its client had no run queued or on the devices."""

    def admitted(self, run: Run, device_seconds: DeviceSeconds, waiting: Iterable[int]) -> None:
        """Records that `run` is admitted; `waiting`: the clients with runs still queued."""

    def retired(self, run: Run, seconds: float) -> None:
        """Records that `run` is over, having taken `seconds` of device time (as its islands measured it, at
        most twice the second longest of its client's latest runs of the plan (`runtime/device_estimates.py`),
        or its estimate if they could not tell)."""

    def forget(self, client_id: int) -> None:
        """Forgets a client that closed (its runs still in flight may retire after this)."""


class Fifo(Policy):
    """Arrival order, no window."""

    name = "fifo"
    default_window = None

    def __init__(self, window: int | None = None):
        super().__init__()      # fifo has no window (`parse_policy` refuses one)


class Share(Policy):
    """Proportional share of device time by client weight: start-time fair queueing. The run with the
    smallest virtual start time goes first; each client's virtual time advances by its admitted runs'
    estimated device time over their weight, and is corrected by what each run measured once it is over
    (so a client is charged the device time its runs took, not what they were expected to take).

    The policy's virtual time (`now`) is the virtual start of the latest run admitted, but never past the
    virtual time of a client with runs queued: a run admitted out of the policy's order (one holding a
    reservation, or one that fits where earlier ones do not) may start far ahead of the others. A client new
    to the policy starts at `now`. One that was idle (nothing queued or on the devices) starts again no
    earlier than that, less a credit of one window of its run's estimate: it does not get the devices alone
    for as long as it paused, and it keeps the corrections of its last runs that took less than estimated
    (as CFS bounds the credit of a task that wakes up)."""

    name = "share"
    default_window = 4
    follows_arrivals = True

    def __init__(self, window: int | None = None):
        super().__init__(window)
        self.virtual: dict[int, float] = {}      # client -> its virtual time
        self.now = 0.0                           # the virtual start of the latest run admitted (see above)

    def order(self, heads: list[WaitingRun], device_seconds: DeviceSeconds) -> None:
        heads.sort(key=lambda item: (self.virtual.get(item.run.client_id, self.now), item.run.client_id))

    def arrived(self, run: Run, idle: bool, device_seconds: DeviceSeconds) -> None:
        if run.client_id not in self.virtual:
            self.virtual[run.client_id] = self.now
        elif idle:
            floor = self.now - self.window * device_seconds(run) / run.weight
            self.virtual[run.client_id] = max(self.virtual[run.client_id], floor)

    def admitted(self, run: Run, device_seconds: DeviceSeconds, waiting: Iterable[int]) -> None:
        run.charged = device_seconds(run)
        start = self.virtual.get(run.client_id)
        if start is None:
            return          # its client closed (`forget`) with the run queued: nothing is kept for it
        # As in start-time fair queueing, the virtual time is the start of the run the policy's order would
        # admit: the smallest among the clients waiting. A run admitted out of that order (a client of weight
        # 0.001 through a reservation) must not move it to its own far-ahead start, where every newcomer and
        # every client back from a pause would then start, behind the clients waiting all along.
        behind = min((self.virtual[client] for client in waiting if client in self.virtual), default=start)
        self.now = max(self.now, min(start, behind))
        self.virtual[run.client_id] = start + run.charged / run.weight

    def retired(self, run: Run, seconds: float) -> None:
        if run.client_id in self.virtual:
            self.virtual[run.client_id] += (seconds - run.charged) / run.weight
        run.charged = seconds

    def forget(self, client_id: int) -> None:
        self.virtual.pop(client_id, None)


class ShortestJobFirst(Policy):
    """The run of least device time first (ties: arrival order)."""

    name = "sjf"
    default_window = 2

    def order(self, heads: list[WaitingRun], device_seconds: DeviceSeconds) -> None:
        heads.sort(key=lambda item: (device_seconds(item.run), item.arrival))


class EarliestDeadlineFirst(Policy):
    """The run whose `timeout=` ends first; runs without one after those with one, in arrival order."""

    name = "deadline"
    default_window = 2

    def order(self, heads: list[WaitingRun], device_seconds: DeviceSeconds) -> None:
        heads.sort(key=lambda item: (math.inf if item.run.deadline is None else item.run.deadline, item.arrival))


POLICY_CLASSES: dict[str, type[Policy]] = {cls.name: cls for cls in (Fifo, Share, ShortestJobFirst,
                                                                      EarliestDeadlineFirst)}
POLICIES = tuple(POLICY_CLASSES)


def parse_policy(policy: str | Policy, window: int | None = None) -> Policy:
    """Returns the policy named `policy` with `window` (a Policy is returned as it is); raises ValueError in
    one line unless `policy` names a policy and `window` (if given) is a positive integer for a policy that has
    one (fifo has none: it admits every run that fits)."""
    if isinstance(policy, Policy):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r} (choose from {', '.join(POLICIES)})")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window= must be a positive integer (admitted runs on the devices), not {window!r}")
    if window is not None and POLICY_CLASSES[policy].default_window is None:
        raise ValueError(f"policy {policy!r} has no window (it admits every run that fits): window= is for "
                         f"{', '.join(name for name, cls in POLICY_CLASSES.items() if cls.default_window)}")
    return POLICY_CLASSES[policy](window)
