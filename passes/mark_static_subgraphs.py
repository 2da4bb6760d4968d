"""`pw-mark-static-subgraphs`: groups a program's ops into units of dispatch.

A static subgraph is a set of ops whose resource needs (shapes, dtypes,
placement, buffer sizes) are all known before any of them runs, so the
client can send it to every island scheduler in one message and the islands
can allocate buffers and prepare launches while predecessors still run
(parallel asynchronous dispatch). In a placed, lowered program every shape is
static, so only a data-dependent decision breaks a subgraph: what uses the
results of a `pw.cond` cannot be dispatched before the host has read the
predicate and run a branch.

Each op gets `pw.subgraph = k`, where k is the number of `pw.cond` decisions
on its longest chain of inputs (a `pw.cond` belongs to the subgraph of its
inputs; its results start the next one). Subgraph 0 is the maximal static
subgraph; subgraphs 1, 2, ... follow data-dependent decisions and fall back
to sequential dispatch. The program records them as
`pw.subgraphs = [{id, static}, ...]`. Branch programs are programs too and
are marked on their own.

Requires: IR that passes pw-verify (the driver runs its checks first). It
marks whatever ops the programs hold, so pw-lower runs it after
pw-insert-transfers, whose data movement must be grouped too (not checked
here: pw-verify-phase{phase=partitioned} finds an op left unmarked).

    // before
    %p = "pw.compute"(%x) {...}
    %y = "pw.cond"(%p, %x) {...}
    %z = "pw.compute"(%y) {...}
    // after
    func.func @main(...) attributes {pw.program, pw.subgraphs = [{id = 0, static = true}, {id = 1, static = false}]}
    %p = "pw.compute"(%x) {..., pw.subgraph = 0 : i64}
    %y = "pw.cond"(%p, %x) {..., pw.subgraph = 0 : i64}
    %z = "pw.compute"(%y) {..., pw.subgraph = 1 : i64}
"""

from __future__ import annotations

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine

from .registry import Pass, register


def mark_program(program: ir.Operation) -> None:
    """Marks the ops of one program with their subgraph and the program with the list."""
    decisions: dict[ir.Value, int] = {}
    count = 0
    for op in ops.program_body(program).operations:
        op = op.operation
        if op.name == "func.return":
            continue
        subgraph = max((decisions.get(v, 0) for v in op.operands), default=0)
        ops.set_attr(op, ops.SUBGRAPH, subgraph)
        count = max(count, subgraph + 1)
        for result in op.results:
            decisions[result] = subgraph + 1 if ops.Cond.isa(op) else subgraph
    ops.set_attr(program, ops.SUBGRAPHS, [{"id": k, "static": k == 0} for k in range(count)])


@register
class MarkStaticSubgraphsPass(Pass):
    __doc__ = __doc__
    name = "pw-mark-static-subgraphs"
    summary = "Mark maximal static subgraphs (parallel dispatch) and what follows data-dependent steps"
    needs_verified_input = True

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        for program in ops.programs(module).values():
            mark_program(program)
