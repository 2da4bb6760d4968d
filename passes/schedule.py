"""`pw-schedule`: one consistent order of all computations, and their costs.

Gang scheduling needs every two computations that share devices to be
enqueued in the same relative order on all of them, or collectives deadlock.
The pass gives every op of every program in the module (computations, data
movement, data-dependent steps) `pw.order = n`, its position in one
module-wide order; an island runs the ops that touch it in increasing
`pw.order`, so any two ops are ordered alike on every island they share, and
two programs that share an island interleave consistently.

The order is FIFO, as the paper's island schedulers: programs in module
order; inside a program, static subgraph 0 first (so it can be dispatched
whole before a data-dependent decision), then each later subgraph, each in
program order. Sorting by (subgraph, position) respects every data
dependence, since an op's subgraph is never below its inputs'.

It also records the estimated cost (see passes/cost.py): `pw.cost = {flops,
bytes}` on every compiled function (the whole function) and on every
`pw.compute` (per device of its slice: the work divided over the shards of
its largest result, and the bytes of the device's shards).

Requires: pw-mark-static-subgraphs (an op without `pw.subgraph` counts as 0);
`pw-verify-schedule` checks the result.

    // before
    %0 = "pw.compute"(%x) {callee = @f, slice = @a, ...}
    %1 = "pw.transfer"(%0) {...}
    // after
    module @f attributes {pw.cost = {bytes = 64 : i64, flops = 8 : i64}, pw.executable} {...}
    %0 = "pw.compute"(%x) {callee = @f, ..., pw.cost = {bytes = 32 : i64, flops = 4 : i64}, pw.order = 0 : i64, ...}
    %1 = "pw.transfer"(%0) {..., pw.order = 1 : i64, ...}
"""

from __future__ import annotations

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine

from .cost import compute_cost, executable_cost, fused_cost
from .registry import Pass, register


@register
class SchedulePass(Pass):
    __doc__ = __doc__
    name = "pw-schedule"
    summary = "Give every op one module-wide consistent order (pw.order) and estimate costs (pw.cost)"
    needs_verified_input = True

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        costs = {}
        # Fused executables last: their cost is their parts'.
        for name, executable in sorted(ops.executables(module).items(), key=lambda e: ops.FUSED in e[1].attributes):
            fused = ops.FUSED in executable.attributes
            costs[name] = fused_cost(executable, costs) if fused else executable_cost(executable)
            ops.set_attr(executable, ops.COST, costs[name].to_python())
        slices = ops.virtual_slices(module)
        order = 0
        for program in ops.programs(module).values():
            body = [op.operation for op in ops.program_body(program).operations if op.name != "func.return"]
            for op in sorted(body, key=lambda o: ops.attr(o, ops.SUBGRAPH, 0)):
                ops.set_attr(op, ops.ORDER, order)
                order += 1
                compute = ops.Compute.match(op)
                if compute is not None:
                    cost = compute_cost(op, costs[compute.callee], slices[compute.slice])
                    ops.set_attr(op, ops.COST, cost.to_python())
