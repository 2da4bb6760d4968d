"""Timing real runs of programs on this machine: robust to other work sharing it.

The machine is shared and noisy, and the noise only ever adds time. So
every case is run `repeats` times back to back per round and the round
keeps the fastest (the run least disturbed), cases take turns in a new
(seeded) random order each round so that no case always follows the same
one (a run can leave work behind for the next) and all see the same load,
the rounds repeat, and each case's figure is the median of its rounds. A
run is timed from the call to every result being ready, as a client sees
it; each wait has a timeout.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from pathways_mlir.dialect.plan import ProgramPlan

from .programs import Program, plan_of

WAIT_S = 60.0


@dataclass(frozen=True)
class Case:
    """A program, lowered, with the dispatch mode to run it in."""

    name: str
    plan: ProgramPlan
    inputs: list
    dispatch: str
    predicates: tuple[bool, ...] = ()   # its conds' predicate values in a run (the program's, per run)


def prepare(cases: tuple[tuple[str, Program, str], ...], topology) -> list[Case]:
    """Lowers each case's program once (cases that share a Program share its plan)."""
    built: dict[int, tuple] = {}
    out = []
    for name, program, dispatch in cases:
        if id(program) not in built:
            built[id(program)] = plan_of(program, topology)
        plan, inputs = built[id(program)]
        out.append(Case(name, plan, inputs, dispatch, program.predicates))
    return out


def time_run(client, case: Case) -> float:
    """Returns the seconds of one real run of `case`, call to results ready."""
    start = time.perf_counter()
    for handle in client.run(case.plan, case.inputs, case.dispatch):
        handle.result(timeout=WAIT_S).block_until_ready()
    return time.perf_counter() - start


def measure(client, cases: list[Case], rounds: int, warmup: int = 3, repeats: int = 3) -> dict[str, float]:
    """Returns each case's median over `rounds` shuffled rounds (after `warmup` rounds) of the fastest
    of `repeats` runs in a row."""
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    order = random.Random(0)
    for r in range(warmup + rounds):
        for case in order.sample(cases, len(cases)):
            fastest = min(time_run(client, case) for _ in range(repeats))
            if r >= warmup:
                times[case.name].append(fastest)
    return {name: statistics.median(ts) for name, ts in times.items()}
