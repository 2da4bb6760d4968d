"""`pw-alias-slices`: slices placed on the same devices share one mesh, so nothing moves between them.

Two slices that pw-place put on the same devices of one island, in the same
order, with the same mesh shape, are one device mesh under two names: a
value made on one and used on the other in the same layout is already where
it is needed. The pass moves every `pw.compute` of the later slice (in
module order) onto the first, writing its shardings with the first slice's
axis names (axis by axis), and marks the later slice `pw.alias = @first`.
pw-insert-transfers then uses the same buffer where the layouts agree, and
still reshards (over ICI, inside the one slice) where they differ. Slices on
the same devices with different mesh shapes keep their copies.

Requires: IR that passes pw-verify (the driver runs its checks first); it
aliases placed slices (pw-place) and leaves unplaced ones alone. Nothing but
computations may name a slice it aliases: a data movement op, or a `pw.home`
of an argument or a `pw.cond` result, naming one is an error at it, and a
module that holds plans is an error at the module (pw-insert-transfers and
pw-emit-plans write those, so the pass runs before them).

    // before: @a and @c both placed on devices [0, 2) of island0
    "pw.virtual_slice"() {axes = ["data"], ..., pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, sym_name = "a"}
    "pw.virtual_slice"() {axes = ["x"], ..., pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, sym_name = "c"}
    %1 = "pw.compute"(%0) {in_shardings = [[["x"]]], out_shardings = [[["x"]]], slice = @c, ...}
    // after
    "pw.virtual_slice"() {axes = ["x"], ..., pw.alias = @a, pw.placement = {...}, sym_name = "c"}
    %1 = "pw.compute"(%0) {in_shardings = [[["data"]]], out_shardings = [[["data"]]], slice = @a, ...}
"""

from __future__ import annotations

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.attributes import Symbol
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.homes import argument_homes, result_homes
from pathways_mlir.dialect.phases import holds_plans
from pathways_mlir.dialect.sharding import Sharding

from .placement_cost import rename_axes
from .registry import Pass, register


@register
class AliasSlicesPass(Pass):
    __doc__ = __doc__
    name = "pw-alias-slices"
    summary = "Move the computations of slices placed on the same devices onto one slice, so their values need no copy"
    needs_verified_input = True

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        if holds_plans(module):
            diagnostics.error(module, "pw-alias-slices runs on programs before their plans exist (pw-emit-plans), "
                                      "but this module holds plans")
            return
        first: dict[tuple, str] = {}
        alias: dict[str, str] = {}
        slices = {}
        for op in ops.top_level_ops(module):
            if not ops.SliceOp.isa(op) or ops.SliceOp(op).placement is None:
                continue
            s = ops.VirtualSlice.from_op(op)
            slices[s.name] = s
            placement = ops.SliceOp(op).placement
            key = (placement["island"], tuple(placement["devices"]), s.shape)
            if key in first:
                alias[s.name] = first[key]
                ops.set_attr(op, ops.ALIAS, Symbol(first[key]))
            else:
                first[key] = s.name
        errors = diagnostics.error_count
        for op, name in _other_references(module, alias):
            diagnostics.error(op, f"'{op.name}' op names @{name}, whose computations pw-alias-slices moves onto "
                                  f"@{alias[name]}: it runs before pw-insert-transfers, which writes such references")
        if diagnostics.error_count > errors:
            return
        for program in ops.programs(module).values():
            for op in ops.program_body(program).operations:
                if ops.Compute.isa(op) and ops.Compute(op).slice in alias:
                    src = slices[ops.Compute(op).slice]
                    dst = slices[alias[src.name]]
                    for key in ("in_shardings", "out_shardings"):
                        ops.set_attr(op, key, [rename_axes(Sharding.from_python(sh), src, dst).to_python()
                                               for sh in ops.attr(op, key)])
                    ops.set_attr(op, "slice", Symbol(dst.name))


def _other_references(module: ir.Operation, alias: dict[str, str]):
    """Yields (op, slice) for each reference to a slice of `alias` that is not a computation's: data
    movement's ends, and the homes of a program's arguments (at the program) and of a `pw.cond`'s results."""
    for program in ops.programs(module).values():
        for home in argument_homes(program):
            if home is not None and home.slice in alias:
                yield program, home.slice
        for op in ops.program_body(program).operations:
            op = op.operation
            if ops.DataMovement.isa(op):
                named = (ops.DataMovement(op).src, ops.DataMovement(op).dst)
            elif ops.Cond.isa(op):
                named = tuple(home.slice for home in result_homes(op) if home is not None)
            else:
                continue
            for name in dict.fromkeys(named):
                if name in alias:
                    yield op, name
