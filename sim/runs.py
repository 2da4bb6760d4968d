"""What a simulation takes and gives (submissions, runs' simulated times, spans, errors), and the state of
a run in flight."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_steps import Step
from pathways_mlir.runtime.dispatch_mode import DispatchMode

if TYPE_CHECKING:
    from .plan_view import PreparedPlan


class SimError(ValueError):
    """A plan or workload the simulator cannot run; the message says why."""


@dataclass(frozen=True)
class Submission:
    """One call of a program: its plan, dispatch mode, the earliest time the client makes it, and the
    program inputs already on their devices (results of an earlier run, as a training loop's weights
    are), which cross no PCIe."""

    plan: ProgramPlan
    dispatch: DispatchMode = DispatchMode.PARALLEL     # a mode's name is parsed here
    at: float = 0.0
    resident: frozenset[int] = frozenset()

    def __post_init__(self):
        try:
            object.__setattr__(self, "dispatch", DispatchMode.parse(self.dispatch))
        except ValueError as error:
            raise SimError(str(error)) from None


@dataclass(frozen=True)
class Span:
    """One interval of simulated work, for traces: on an island's devices, host thread or link."""

    name: str
    kind: str          # launch, copy, send, host, controller
    island: str        # "" for the controller
    track: str         # "devices 0-3", "host", "dcn out slice_a", ...
    start: float
    end: float


@dataclass
class RunRecord:
    """Simulated times of one run (seconds from the start of the simulation)."""

    program: str
    dispatch: DispatchMode
    submitted: float
    admitted: float = -1.0
    done: float = -1.0


@dataclass
class SimResult:
    """A simulation's runs and, when asked for, its spans."""

    runs: list[RunRecord]
    spans: list[Span] = field(default_factory=list)

    def latency(self) -> float:
        """Returns the median run latency: from the call to the client seeing the results."""
        times = sorted(r.done - r.submitted for r in self.runs)
        return times[len(times) // 2]

    def throughput(self) -> float:
        """Returns runs per second in steady state (between the first and the last run's end); inf if the runs
        take no simulated time (a profile whose costs are zero)."""
        ends = sorted(r.done for r in self.runs)
        runs, span = (1, ends[0] - self.runs[0].submitted) if len(ends) < 2 else (len(ends) - 1, ends[-1] - ends[0])
        return runs / span if span > 0 else math.inf

    def makespan(self) -> float:
        """Returns the time from the first call to the last run's end."""
        return max(r.done for r in self.runs) - min(r.submitted for r in self.runs)


class RunState:
    """The state of one run in flight."""

    def __init__(self, index: int, ticket: int, prep: "PreparedPlan", sub: Submission, record: RunRecord):
        self.index = index
        self.ticket = ticket
        self.prep = prep
        self.sub = sub
        self.record = record
        self.ready: dict[int, float] = {}                  # buffer -> time its value is computed
        self.exists: dict[int, float] = {}                 # buffer -> time its handle exists (enqueued)
        self.waiters: dict[int, list[Callable[[], None]]] = {}
        self.delivered: dict[str, list[Step]] = {i: [] for i in prep.islands}
        self.cursor: dict[str, int] = {i: 0 for i in prep.islands}
        self.fanout: dict[str, float] = {}                 # island -> fan-out work still to do
        self.arrived: set[int] = set()                     # recv step ids whose data arrived
        self.remaining = sum(len(prep.plan.islands[i]) for i in prep.islands)
        self.last_end = 0.0
        self.open_conds = len(prep.plan.host_steps)       # conds whose branch run is not over
        self.conds_done: frozenset[int] = frozenset()
        self.parent: RunState | None = None                    # the run whose cond started this branch run
        self.on_devices: dict[int, tuple] = {}   # input -> (island, slice, layout) a cond moves it from
        self.after_dispatch: Callable[[], None] = lambda: None   # what the controller does next

    def set_exists(self, buffer: int, time: float) -> None:
        self.exists[buffer] = time
        for wake in self.waiters.pop(buffer, ()):
            wake()
