"""`pw-fuse-launches`: one launch for a run of consecutive computations on one slice.

Consecutive `pw.compute` ops of a program that run on the same slice in the
same static subgraph, with nothing in between, become one `pw.compute` of a
new fused executable. The fused executable calls the originals in order
(`pw.fused`: its calls and which of their results it returns), so the
runtime compiles it as one XLA computation: one dispatch instead of many,
and XLA optimises across the old boundaries. Values only the group uses
stay inside it; values used after it (or returned) become its results.
Its `@main` is a declaration with the group's signature, which is what
the verifier and the cost model read; its cost is the sum of its parts.
The new compute's label joins the group's labels with `+` (`first..last`
for a group of more than four).

Ops in a non-static subgraph are left alone: their resources are not known
up front. Requires: the partitioned phase (after pw-insert-transfers, an
operand that needs moving has its transfer between the two ops, which ends a
group; after pw-mark-static-subgraphs, the subgraphs); runs before pw-schedule.

    // before
    %0 = "pw.compute"(%x) {callee = @f, slice = @a, label = "f#0", pw.subgraph = 0, ...}
    %1 = "pw.compute"(%0) {callee = @g, slice = @a, label = "g#0", pw.subgraph = 0, ...}
    return %1
    // after
    %0 = "pw.compute"(%x) {callee = @fused_f_0, slice = @a, label = "f#0+g#0", pw.subgraph = 0, ...}
    return %0
    // appended to the module
    module @fused_f_0 attributes {pw.executable, pw.fused = {calls = [
        {callee = @f, operands = array<i64: 0>, results = 1},
        {callee = @g, operands = array<i64: 1>, results = 1}], results = array<i64: 2>}} {
      func.func private @main(tensor<8xf32>) -> tensor<8xf32>
    }
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import func

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.attributes import Symbol
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase

from .registry import Pass, register


def _groups(program: ir.Operation) -> list[list[ir.Operation]]:
    """Returns the runs of two or more consecutive computes on one slice in one static subgraph."""
    static = {g["id"] for g in ops.attr(program, ops.SUBGRAPHS, []) if g["static"]}
    groups: list[list[ir.Operation]] = []
    current: list[ir.Operation] = []
    for op in ops.program_body(program).operations:
        op = op.operation
        fusable = ops.Compute.isa(op) and ops.Compute(op).subgraph in static
        if fusable and current and ops.Compute(op).slice == ops.Compute(current[0]).slice and \
                ops.Compute(op).subgraph == ops.Compute(current[0]).subgraph:
            current.append(op)
            continue
        if len(current) > 1:
            groups.append(current)
        current = [op] if fusable else []
    if len(current) > 1:
        groups.append(current)
    return groups


def _fuse(module: ir.Operation, group: list[ir.Operation], name: str) -> None:
    """Replaces `group` by one compute of a new fused executable `name`."""
    numbered: dict[ir.Value, int] = {}          # value -> its number in the fused executable
    operands: list[ir.Value] = []
    in_shardings = []
    calls = []
    made_inside = {result for op in group for result in op.results}
    for op in group:
        for value, sharding in zip(op.operands, ops.in_shardings(op)):
            if value not in numbered and value not in made_inside:
                numbered[value] = len(operands)
                operands.append(value)
                in_shardings.append(sharding)
    count = len(operands)
    produced: list[tuple[ir.Value, object]] = []
    for op in group:
        calls.append({"callee": Symbol(ops.attr(op, "callee")),
                      "operands": tuple(numbered[v] for v in op.operands), "results": len(op.results)})
        for result, sharding in zip(op.results, ops.out_shardings(op)):
            numbered[result] = count
            count += 1
            produced.append((result, sharding))
    # A result escapes if some use is outside the group (ops hash and compare as the op they wrap).
    inside = set(group)
    escaping = [(r, s) for r, s in produced if any(use.owner.operation not in inside for use in r.uses)]
    types = [v.type for v in operands]
    results = [r.type for r, _ in escaping]
    with ir.InsertionPoint(module.regions[0].blocks[0]), group[0].location:
        executable = ops.create("builtin.module", attributes={
            "sym_name": name, ops.EXECUTABLE: None,
            ops.FUSED: {"calls": calls, "results": tuple(numbered[r] for r, _ in escaping)}}, regions=1)
        with ir.InsertionPoint(executable.regions[0].blocks.append()):
            func.FuncOp("main", ir.FunctionType.get(types, results), visibility="private")
    last = group[-1]
    with ir.InsertionPoint.after(last):
        fused = ops.build_compute(name, ops.attr(group[0], "slice"), operands, results, in_shardings,
                                  [s for _, s in escaping], "+".join(ops.attr(op, "label") for op in group)
                                  if len(group) <= 4 else f"{ops.attr(group[0], 'label')}..{ops.attr(last, 'label')}",
                                  loc=group[0].location)
        ops.set_attr(fused, ops.SUBGRAPH, ops.attr(group[0], ops.SUBGRAPH, 0))
    for (result, _), new in zip(escaping, fused.results):
        result.replace_all_uses_with(new)
    for op in reversed(group):
        op.erase()


@register
class FuseLaunchesPass(Pass):
    __doc__ = __doc__
    name = "pw-fuse-launches"
    summary = "Fuse consecutive computations on one slice of a static subgraph into one launch"
    requires_phase = Phase.PARTITIONED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        taken = ops.symbol_names(module)
        for program in ops.programs(module).values():
            for group in _groups(program):
                _fuse(module, group, ops.fresh_symbol(f"fused_{ops.attr(group[0], 'callee')}", taken))
