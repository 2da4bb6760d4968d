"""The phases of lowering, and one table of what each `pw` op needs in each (checked by pw-verify-phase).

In the spirit of IREE's stream `VerifyLowerings`: every op of the dialect has one row here, saying from
which phase on it may appear, and which marks it carries from which phase on. The phases, in order:

    input      device-agnostic programs: slices, computations, conds, explicit data movement
    placed     pw-place: the module has pw.topology, every slice pw.placement
    lowered    pw-insert-transfers: data movement is explicit, every operand lives where it is used
    partitioned pw-mark-static-subgraphs: every program op has pw.subgraph, every program pw.subgraphs
    scheduled  pw-schedule: every program op has pw.order
    planned    pw-emit-plans: the island and host plans (pw.buffer, pw.launch, ...) exist

Besides ops and marks, the lowered phase has one rule of meaning, checked by the one analysis of where
values live (`homes.misplaced_operands`): no op uses an operand somewhere other than where it lives. A
phase includes what every earlier one requires. A pass that needs a phase says so
(`Pass.requires_phase`); the pass driver checks it before running the pass (`passes/pipeline.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from . import ops
from .homes import misplaced_operands


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
MODULE_MARKS: tuple[tuple[Phase, str], ...] = ((Phase.PLACED, ops.TOPOLOGY),)
PROGRAM_MARKS: tuple[tuple[Phase, str], ...] = ((Phase.PARTITIONED, ops.SUBGRAPHS),)
# The pass that adds each mark, or writes the ops of a phase, for error messages.
MADE_BY: dict[str, str] = {
    ops.TOPOLOGY: "pw-place", ops.PLACEMENT: "pw-place", Phase.LOWERED: "pw-insert-transfers",
    ops.SUBGRAPH: "pw-mark-static-subgraphs", ops.SUBGRAPHS: "pw-mark-static-subgraphs",
    ops.ORDER: "pw-schedule", Phase.PLANNED: "pw-emit-plans",
}


def holds_plans(module) -> bool:
    """Whether the module holds plans (`pw.host_plan` or `pw.island_plan` modules): what a reader asks to
    know whether IR was lowered to plans already, without checking it."""
    return any(ops.is_plan(op) for op in ops.top_level_ops(module))


def phase_problems(module, phase: Phase):
    """Yields (op, message) for every op of `module` (top level, program bodies, plan modules) that is not
    legal in `phase`, lacks a mark that `phase` requires, or (from the lowered phase on) uses an operand
    somewhere other than where it lives. Requires IR that passes pw-verify."""
    yield from _missing(module.operation, "the module", MODULE_MARKS, phase)
    if phase.rank >= Phase.PLANNED.rank and ops.programs(module) and not holds_plans(module):
        yield module.operation, (f"the module has no plans, which the {phase} phase requires "
                                 f"({MADE_BY[Phase.PLANNED]} writes them)")
    for op in ops.top_level_ops(module):
        if op.name == "builtin.module":             # a plan, an executable (not pw's), or other IR
            if ops.is_plan(op):
                yield from _plan_ops(op, phase)
        elif ops.is_program(op):
            yield from _missing(op, f"program @{ops.symbol_name(op)}", PROGRAM_MARKS, phase)
            for inner in ops.program_body(op).operations:
                yield from _op(inner.operation, phase)
            if phase.rank >= Phase.LOWERED.rank:
                yield from _misplaced(op, phase)
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


def _misplaced(program, phase: Phase):
    for op, index, home, use in misplaced_operands(program):
        yield op, (f"'{op.name}' op operand #{index} lives on @{home.slice} with sharding {home.sharding}, but the "
                   f"op uses it on @{use.slice} with sharding {use.sharding}: the {phase} phase requires every "
                   f"operand where it is used ({MADE_BY[Phase.LOWERED]} moves it)")
