"""`pw-insert-transfers`: makes every movement of data between device sets explicit.

Every operand of a `pw.compute` (and the input of existing data movement) is
needed on a slice in a sharding. Where the value lives elsewhere, the pass
inserts, right before its first such use (later uses share it):

- nothing, when it already lives on that slice in that sharding;
- `pw.transfer` when the sharding is the same on both slices and the shards
  have the same shape: the shards move as they are;
- `pw.scatter` when the destination cuts every source shard into `pieces`
  whole destination shards (N-way from M-way, each dimension's ways a
  multiple of the source's);
- `pw.gather` when every destination shard is assembled from `pieces` whole
  source shards (the converse), also one piece each when the tilings are the
  same under other axis names (1-device slices whose specs differ, say);
- otherwise (equal ways on other dimensions, or tilings that do not nest), a
  `pw.gather` to a replicated value on the source slice, then a `pw.scatter`
  from it: always correct, never per-device pieces in the IR.

The link is `ici` when both slices are in one island (also for resharding
inside one slice), `dcn` between islands; two islands that the topology's
`dcn_pairs` does not join are an error at the consumer.

Host values, the program's arguments and the results of `pw.cond`, have no
device until the runtime puts them on one: it puts each on the slice and in
the sharding of its first use, recorded as `pw.home = {slice, sharding}` in
the argument's attributes, or as `pw.result_homes` on the `pw.cond` (`{}` for
a result that no computation uses). Other uses are moved from there like any
value. Values read by the host (a `pw.cond`'s predicate and inputs, the
program's results) are not moved. After it every operand lives where it is
used: the lowered phase's rule (`dialect/phases.py`).

Requires: the placed phase (every slice placed, the module's `pw.topology`: pw-place).

    // before: %0 lives on @a (island0), @b is in island1
    %1 = "pw.compute"(%0) {slice = @b, in_shardings = [[["x"]]], ...}
    // after
    %t = "pw.transfer"(%0) {dst = @b, link = "dcn", sharding = [["x"]], src = @a}
    %1 = "pw.compute"(%t) {slice = @b, in_shardings = [[["x"]]], ...}
"""

from __future__ import annotations

import math

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase
from pathways_mlir.dialect.homes import Home, home_attribute, operand_homes, result_homes
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.dialect.topology import Topology, TopologyError

from .registry import Pass, register

class _Inserter:
    """Inserts the data movement of one module."""

    def __init__(self, topology: Topology, slices: dict[str, ops.VirtualSlice], islands: dict[str, str]):
        self.topology = topology
        self.slices = slices
        self.islands = islands  # slice name -> island

    def run_program(self, program: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        body = ops.program_body(program)
        homes: dict[ir.Value, Home | None] = {arg: None for arg in body.arguments}
        moved: dict[tuple[ir.Value, str, Sharding], ir.Value] = {}
        for op in list(body.operations):
            op = op.operation
            for index, want in operand_homes(op):
                value = op.operands[index]
                have = homes.get(value)
                if have is None:  # a host value: the runtime puts it where it is first used
                    homes[value] = want
                    continue
                if have == want:
                    continue
                key = (value, *want)
                if key not in moved:
                    try:
                        with ir.InsertionPoint(op):
                            moved[key] = self.move(value, have, want, op.location)
                    except TopologyError as e:
                        diagnostics.error(op, f"cannot move operand #{index} from @{have[0]} to @{want[0]}: {e}")
                        continue
                op.operands[index] = moved[key]
            for result, home in zip(op.results, result_homes(op)):
                homes[result] = home
        arg_attrs = ops.attr(program, "arg_attrs") or [{} for _ in body.arguments]
        ops.set_attr(program, "arg_attrs", [
            {**old, ops.HOME: home_attribute(homes[arg])} if homes[arg] is not None else old
            for arg, old in zip(body.arguments, arg_attrs)])
        for op in body.operations:
            if ops.Cond.isa(op):
                ops.set_attr(op, ops.RESULT_HOMES, [home_attribute(homes[r]) for r in op.results])

    def move(self, value: ir.Value, have: Home, want: Home, loc: ir.Location) -> ir.Value:
        """Creates the ops that bring `value` from `have` to `want`; returns the moved value."""
        (src_name, src_sh), (dst_name, dst_sh) = have, want
        src, dst = self.slices[src_name], self.slices[dst_name]
        link, _ = self.topology.link(self.islands[src_name], self.islands[dst_name])
        shape = ops.tensor_shape(value.type)
        src_ways, dst_ways = src_sh.dim_ways(src.axis_sizes), dst_sh.dim_ways(dst.axis_sizes)
        if src_sh == dst_sh and src_ways == dst_ways:
            return ops.build_transfer(value, src_name, dst_name, src_sh, link, loc).result
        if math.prod(dst_ways) > math.prod(src_ways) and all(d % s == 0 for s, d in zip(src_ways, dst_ways)):
            return self.reshard(ops.build_scatter, value, have, want, link, loc)
        if math.prod(src_ways) >= math.prod(dst_ways) and all(s % d == 0 for s, d in zip(src_ways, dst_ways)):
            return self.reshard(ops.build_gather, value, have, want, link, loc)
        whole = Home(src_name, Sharding.replicated(len(shape)))
        gathered = self.reshard(ops.build_gather, value, have, whole, "ici", loc)
        return self.reshard(ops.build_scatter, gathered, whole, want, link, loc)

    def reshard(self, build, value: ir.Value, have: Home, want: Home, link: str,
                loc: ir.Location) -> ir.Value:
        """Creates a `pw.scatter` or `pw.gather` (`build`) whose pieces are whole shards of the finer side."""
        (src_name, src_sh), (dst_name, dst_sh) = have, want
        src, dst = self.slices[src_name], self.slices[dst_name]
        shape = ops.tensor_shape(value.type)
        src_ways, dst_ways = src_sh.ways(src.axis_sizes), dst_sh.ways(dst.axis_sizes)
        if build is ops.build_scatter:
            pieces, piece_shape = dst_ways // src_ways, dst_sh.shard_shape(shape, dst.axis_sizes)
        else:
            pieces, piece_shape = src_ways // dst_ways, src_sh.shard_shape(shape, src.axis_sizes)
        return build(value, src_name, dst_name, src_sh, dst_sh, pieces, piece_shape, link, loc).result


@register
class InsertTransfersPass(Pass):
    __doc__ = __doc__
    name = "pw-insert-transfers"
    summary = "Insert transfers (ICI/DCN) and scatter/gather wherever a value changes device set or sharding"
    needs_verified_input = True
    requires_phase = Phase.PLACED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        slices, islands = {}, {}
        for op in ops.top_level_ops(module):
            if ops.SliceOp.isa(op):
                s = ops.VirtualSlice.from_op(op)
                slices[s.name], islands[s.name] = s, ops.attr(op, ops.PLACEMENT)["island"]
        topology = ops.required_topology(
            module, diagnostics, "pw-insert-transfers needs the module's pw.topology")
        if topology is None:
            return
        inserter = _Inserter(topology, slices, islands)
        for program in ops.programs(module).values():
            inserter.run_program(program, diagnostics)
