"""Which way each simulated `pw.cond` goes: a branch probability or a recorded trace of predicate values.

A plan with host branch steps needs a predicate's value that only a real
run computes. The simulator takes it as input instead: either the
probability that a predicate is true (each cond drawn from a seeded random
stream, so a simulation repeats exactly), or a trace, the predicate values
in the order the conds are evaluated (a JSON list of true/false, or 1/0),
for example as a real run's program recorded them. A trace shorter than
the simulation needs is an error, never wrapped around.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pathways_mlir.dialect.input_files import read_json

from .runs import SimError


@dataclass(frozen=True)
class BranchOutcomes:
    """The predicate values of simulated conds: `probability` of true (with `seed`), or a `trace`."""

    probability: float | None = None
    trace: tuple[bool, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.probability is None) == (self.trace is None):
            raise SimError("give either a branch probability or a trace of predicate values, not both or neither")
        if self.probability is not None and not 0.0 <= self.probability <= 1.0:
            raise SimError(f"branch probability {self.probability} is not between 0 and 1")

    def stream(self) -> "OutcomeStream":
        """Returns a fresh stream of predicate values (one per simulation)."""
        return OutcomeStream(self)


class OutcomeStream:
    """Predicate values, one per cond evaluated, in simulated-time order."""

    def __init__(self, outcomes: BranchOutcomes):
        self.outcomes = outcomes
        self.random = random.Random(outcomes.seed)
        self.taken = 0

    def next(self, program: str) -> bool:
        """Returns the next predicate value (for a cond of `program`)."""
        trace = self.outcomes.trace
        self.taken += 1
        if trace is None:
            return self.random.random() < self.outcomes.probability
        if self.taken > len(trace):
            raise SimError(f"the trace of predicate values has {len(trace)} values, but the simulation "
                           f"evaluates more conds (cond number {self.taken}, of @{program})")
        return trace[self.taken - 1]


def load_trace(path: str) -> BranchOutcomes:
    """Reads a trace of predicate values: a JSON list of true/false or 1/0; one-line errors name the file."""
    value = read_json(path, SimError, "the trace of predicate values")
    if not isinstance(value, list) or not value or not all(v in (True, False) and not isinstance(v, float)
                                                           for v in value):
        raise SimError(f"{path}: a trace of predicate values is a non-empty JSON list of true/false or 1/0")
    return BranchOutcomes(trace=tuple(bool(v) for v in value))
