"""The phases of lowering, and one table of what each `pw` op needs in each (checked by pw-verify-phase).

In the spirit of IREE's stream `VerifyLowerings`: every op of the dialect has one row here, saying from
which phase on it may appear, and which marks it carries from which phase on. The phases, in order:

    input      device-agnostic programs: slices, computations, conds, explicit data movement
    placed     pw-place: the module has pw.topology, every slice pw.placement
    lowered    pw-insert-transfers: data movement is explicit (the module is marked pw.lowered)
    partitioned pw-mark-static-subgraphs: every program op has pw.subgraph, every program pw.subgraphs
    scheduled  pw-schedule: every program op has pw.order
    planned    pw-emit-plans: the island and host plans (pw.buffer, pw.launch, ...) exist

A phase includes what every earlier one requires. A pass that needs a phase says so
(`Pass.requires_phase`); the pass driver checks it before running the pass (`passes/pipeline.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from . import ops


class Phase(enum.StrEnum):
    """A phase of lowering; its value is its name in `pw-verify-phase{phase=...}`."""

    INPUT = "input"
    PLACED = "placed"
    LOWERED = "lowered"
    PARTITIONED = "partitioned"
    SCHEDULED = "scheduled"
    PLANNED = "planned"

    @property
    def rank(self) -> int:
        """The phase's position in lowering order (input is 0)."""
        return _RANKS[self]


_RANKS = {phase: rank for rank, phase in enumerate(Phase)}


@dataclass(frozen=True)
class OpPhase:
    """One op's row: the first phase it may appear in, and the marks it carries from a phase on."""

    legal_from: Phase
    marks: tuple[tuple[Phase, str], ...] = ()


_PROGRAM_OP = OpPhase(Phase.INPUT, ((Phase.PARTITIONED, ops.SUBGRAPH), (Phase.SCHEDULED, ops.ORDER)))
_PLAN_OP = OpPhase(Phase.PLANNED)

OP_PHASES: dict[str, OpPhase] = {
    "pw.virtual_slice": OpPhase(Phase.INPUT, ((Phase.PLACED, ops.PLACEMENT),)),
    "pw.compute": _PROGRAM_OP,
    "pw.cond": _PROGRAM_OP,
    "pw.transfer": _PROGRAM_OP,
    "pw.scatter": _PROGRAM_OP,
    "pw.gather": _PROGRAM_OP,
    "pw.buffer": _PLAN_OP,
    "pw.launch": _PLAN_OP,
    "pw.send": _PLAN_OP,
    "pw.recv": _PLAN_OP,
    "pw.copy": _PLAN_OP,
    "pw.free": _PLAN_OP,
    "pw.branch": _PLAN_OP,
}
# The marks of the top module and of each program, from a phase on.
MODULE_MARKS: tuple[tuple[Phase, str], ...] = ((Phase.PLACED, ops.TOPOLOGY), (Phase.LOWERED, ops.LOWERED))
PROGRAM_MARKS: tuple[tuple[Phase, str], ...] = ((Phase.PARTITIONED, ops.SUBGRAPHS),)
# The pass that adds each mark, or writes the ops of a phase, for error messages.
MADE_BY: dict[str, str] = {
    ops.TOPOLOGY: "pw-place", ops.PLACEMENT: "pw-place", ops.LOWERED: "pw-insert-transfers",
    ops.SUBGRAPH: "pw-mark-static-subgraphs", ops.SUBGRAPHS: "pw-mark-static-subgraphs",
    ops.ORDER: "pw-schedule", Phase.PLANNED: "pw-emit-plans",
}


def marked(module, phase: Phase) -> bool:
    """Whether the module carries the mark that records `phase` (`MODULE_MARKS`: pw.topology for placed,
    pw.lowered for lowered): what a reader asks to know whether IR was lowered, without checking it."""
    marks = [mark for since, mark in MODULE_MARKS if since is phase]
    if not marks:
        raise ValueError(f"the {phase} phase leaves no mark on the module")
    return all(mark in module.operation.attributes for mark in marks)


def phase_problems(module, phase: Phase):
    """Yields (op, message) for every op of `module` (top level, program bodies, plan modules) that is not
    legal in `phase` or lacks a mark that `phase` requires."""
    yield from _missing(module.operation, "the module", MODULE_MARKS, phase)
    for op in ops.top_level_ops(module):
        if op.name == "builtin.module":             # a plan, an executable (not pw's), or other IR
            if ops.ISLAND_PLAN in op.attributes or ops.HOST_PLAN in op.attributes:
                yield from _plan_ops(op, phase)
        elif ops.is_program(op):
            yield from _missing(op, f"program @{ops.symbol_name(op)}", PROGRAM_MARKS, phase)
            for inner in ops.program_body(op).operations:
                yield from _op(inner.operation, phase)
        else:
            yield from _op(op, phase)


def _plan_ops(plan, phase: Phase):
    for op in ops.top_level_ops(plan):
        yield from _op(op, phase)


def _op(op, phase: Phase):
    row = OP_PHASES.get(op.name)
    if row is None:
        return
    if phase.rank < row.legal_from.rank:
        yield op, (f"'{op.name}' op is not legal in the {phase} phase: it belongs to the {row.legal_from} "
                   f"phase ({MADE_BY[row.legal_from]} writes it)")
        return
    yield from _missing(op, f"'{op.name}' op", row.marks, phase)


def _missing(op, what: str, marks: tuple[tuple[Phase, str], ...], phase: Phase):
    for since, mark in marks:
        if phase.rank >= since.rank and mark not in op.attributes:
            yield op, f"{what} has no {mark}, which the {phase} phase requires ({MADE_BY[mark]} adds it)"
