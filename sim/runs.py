"""What a simulation takes and gives: submissions, runs' simulated times, spans, errors."""

from __future__ import annotations

from dataclasses import dataclass, field

from pathways_mlir.dialect.plan import ProgramPlan

MODES = ("parallel", "sequential")


class SimError(ValueError):
    """A plan or workload the simulator cannot run; the message says why."""


@dataclass(frozen=True)
class Submission:
    """One call of a program: its plan, dispatch mode, the earliest time the client makes it, and the
    program inputs already on their devices (results of an earlier run, as a training loop's weights
    are), which cross no PCIe."""

    plan: ProgramPlan
    dispatch: str = "parallel"
    at: float = 0.0
    resident: frozenset[int] = frozenset()


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
    dispatch: str
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
        """Returns runs per second in steady state (between the first and the last run's end)."""
        ends = sorted(r.done for r in self.runs)
        if len(ends) < 2:
            return 1.0 / (ends[0] - self.runs[0].submitted)
        return (len(ends) - 1) / (ends[-1] - ends[0])

    def makespan(self) -> float:
        """Returns the time from the first call to the last run's end."""
        return max(r.done for r in self.runs) - min(r.submitted for r in self.runs)
