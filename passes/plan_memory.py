"""`pw-plan-memory`: frees after last use, and each island's static peak per device.

For every island plan that `pw-emit-plans` wrote, the pass inserts a
`pw.free` step right after the last reader of each buffer that is not a
program result (a buffer read by a host `pw.branch` is freed after that
branch; one nobody reads, right after its writer), then records the largest
number of bytes live at once on each device as `pw.peak_bytes` on the plan
module: flat `(begin, end, bytes)` triples over island-local device ranges,
so the attribute grows with the number of slices, never with the number of
devices. The analysis is `dialect/memory_plan.py`; this pass is the only
place it runs on a lowered module. The runtime admits a run on an island only
when this whole peak fits (per-run admission), so no step waits for memory.

Program inputs and values a branch puts on the island count from the start
of the run; results count to its end (they outlive it, owned by the
client). A result that its launch writes into a donated input's buffer
(`pw.donated` arguments, `memory_plan.reuses`) adds nothing. Free step ids
continue after the largest step id of the module.

Requires: the planned phase (pw-emit-plans), with no `pw.free` yet (running
it twice is an error at the module).

    // before
    module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
      "pw.buffer"() {id = 0, bytes_per_device = 64, home = {slice = @a, ...}, ...}
      "pw.buffer"() {id = 1, bytes_per_device = 64, home = {slice = @a, ...}, ...}
      "pw.buffer"() {id = 2, bytes_per_device = 64, home = {slice = @a, ...}, ...}
      "pw.launch"() {step = 0, inputs = array<i64: 0>, outputs = array<i64: 1>, ...}
      "pw.launch"() {step = 1, inputs = array<i64: 1>, outputs = array<i64: 2>, ...}
    }
    // after (buffer 2 is the program's result; @a is devices [0, 2); buffer 0 is freed right after step 0,
    // its last reader, so at most two 64-byte buffers are live at once)
    module @main_island0 attributes {pw.island_plan = {...}, pw.peak_bytes = array<i64: 0, 2, 128>} {
      ...
      "pw.launch"() {step = 0, ...}
      "pw.free"() {step = 2, after = array<i64: 0>, buffers = array<i64: 0>, subgraph = 0}
      "pw.launch"() {step = 1, ...}
      "pw.free"() {step = 3, after = array<i64: 1>, buffers = array<i64: 1>, subgraph = 0}
    }
"""

from __future__ import annotations

import itertools

from mlir import ir

from pathways_mlir.dialect import ops, plan_ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase
from pathways_mlir.dialect.memory_plan import island_memory
from pathways_mlir.dialect.plan import PlanError
from pathways_mlir.dialect.plan_steps import Free
from pathways_mlir.dialect.plan_reader import program_plans

from .registry import Pass, register


def _plan_ops(plan: ir.Operation) -> list[ir.Operation]:
    return [op.operation for op in plan.regions[0].blocks[0].operations]


def _create_free(free: Free, where: ir.InsertionPoint, loc: ir.Location) -> None:
    with where:
        plan_ops.build_free(step=free.id, after=free.after, buffers=free.buffers, subgraph=free.subgraph, loc=loc)


@register
class PlanMemoryPass(Pass):
    __doc__ = __doc__
    name = "pw-plan-memory"
    summary = "Free buffers after their last use and record each island's static peak bytes per device"
    requires_phase = Phase.PLANNED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        modules = [op for op in ops.top_level_ops(module) if op.name == "builtin.module"]
        island_plans = [op for op in modules if ops.ISLAND_PLAN in op.attributes]
        if any(op.name == "pw.free" for plan in island_plans for op in _plan_ops(plan)):
            diagnostics.error(module, "pw-plan-memory has already run on this module")
            return
        plans = program_plans(module)
        for plan_op in island_plans:
            program = ops.attr(plan_op, ops.ISLAND_PLAN)["program"]
            if program not in plans:
                diagnostics.error(plan_op, f"island plan of program @{program}, which has no host plan: "
                                           f"pw-emit-plans writes both")
                return
        for plan in plans.values():
            try:
                plan.topological_order             # memory planning walks it
            except PlanError as e:
                diagnostics.error(module, f"pw-plan-memory: {e}")
                return
        largest = max((s.id for p in plans.values() for ss in (*p.islands.values(), p.host_steps) for s in ss),
                      default=-1)
        step_ids = itertools.count(largest + 1)
        for plan_op in island_plans:
            mark = ops.attr(plan_op, ops.ISLAND_PLAN)
            plan, island = plans[mark["program"]], mark["island"]
            placed, _, peak_bytes = island_memory(plan, island, step_ids)
            contents = _plan_ops(plan_op)
            steps = [op for op in contents if op.name != "pw.buffer"]
            if None in placed:
                where = ir.InsertionPoint(steps[0]) if steps else ir.InsertionPoint(plan_op.regions[0].blocks[0])
                _create_free(placed[None], where, plan_op.location)
            for op in steps:
                free = placed.get(ops.attr(op, "step"))
                if free is not None:
                    _create_free(free, ir.InsertionPoint.after(op), plan_op.location)
            ops.set_attr(plan_op, ops.PEAK_BYTES, peak_bytes)
