"""`pw-emit-plans`: one execution plan per island and program, in schedule order.

For every program the pass appends to the module:

- per island the program uses, `module @<program>_<island> attributes
  {pw.island_plan = {island, program}}`: a `pw.buffer` for every buffer that
  lives on the island (shape, home, bytes per device: all allocation is
  known up front), then the island's steps in increasing `pw.order`:
  `pw.launch` per computation, `pw.copy` per data movement inside the
  island, `pw.send` / `pw.recv` per data movement between islands;
- `module @<program>_host attributes {pw.host_plan = {program, inputs,
  outputs, subgraphs}}`: the buffers of host values and a `pw.branch` step
  per `pw.cond`, which runs the plans of its branch programs. Inputs whose
  program argument is marked `pw.donated` are listed as `donated` too.

A plan's name that a symbol of the module (or another plan) has already gets
the first free `_N` suffix (`@main_host_0` beside an executable `@main_host`,
or for an island named "host"): readers find plans by their marks, not their
names.

Every SSA value becomes one buffer id, however many shards it has. Step ids
follow `pw.order` across the whole module, so they are unique and an island
running steps in increasing id keeps the consistent order even between
programs; `after` lists the steps that produce a step's inputs (a
`pw.recv` waits for its `pw.send`).
`dialect.plan_reader.program_plans` turns the result into `ProgramPlan`s
(dialect/plan.py) that serialise to JSON.

Requires: the scheduled phase (pw-insert-transfers, pw-mark-static-subgraphs,
pw-schedule), and a module without plans (writing them again would drop
pw-plan-memory's frees and peaks); no program may reach itself through branches.

    // before (a on island0, b on island1)
    %0 = "pw.compute"(%x) {callee = @f, slice = @a, pw.order = 0, ...}
    %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, pw.order = 1, ...}
    // after, appended
    module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
      "pw.buffer"() {id = 0, home = {sharding = [["x"]], slice = @a}, ...}
      "pw.buffer"() {id = 1, ...}
      "pw.launch"() {step = 0, after = array<i64>, executable = @f, inputs = array<i64: 0>, outputs = array<i64: 1>, ...}
      "pw.send"() {step = 1, after = array<i64: 0>, buffer = 1, peer = "island1", peer_buffer = 2, ...}
    }
    module @main_island1 attributes {...} {
      "pw.buffer"() {id = 2, ...}
      "pw.recv"() {step = 2, after = array<i64: 1>, buffer = 2, peer = "island0", peer_buffer = 1, ...}
    }
    module @main_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 2>, ...}} {}
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import networkx as nx
from mlir import ir

from pathways_mlir.dialect import ops, plan_ops
from pathways_mlir.dialect.attributes import Symbol
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase
from pathways_mlir.dialect.homes import bytes_per_device, home_attribute, program_homes

from .registry import Pass, register

# The key of the host plan's buffers and steps beside the islands' names: an island may be named "host".
HOST = None


class _ProgramEmitter:
    """Builds the plan modules of one program; step ids come from a counter shared by the module."""

    def __init__(self, program: ir.Operation, slices: dict[str, ops.VirtualSlice], placements: dict[str, dict],
                 step_ids: Iterator[int]):
        self.program = program
        self.slices = slices
        self.placements = placements
        self.step_ids = step_ids
        self.homes = program_homes(program)
        self.buffer_ids: dict[ir.Value, int] = {}
        self.buffers: dict[str | None, list[dict]] = {}   # island (or HOST) -> pw.buffer attributes
        self.steps: dict[str | None, list[tuple[Callable[..., ir.Operation], dict, ir.Location]]] = {}
        self.producer: dict[int, int] = {}            # buffer -> step that writes it
        body = ops.program_body(program)
        self.inputs = tuple(self.buffer(arg) for arg in body.arguments)
        arg_attrs = ops.attr(program, "arg_attrs") or [{} for _ in body.arguments]
        self.donated = tuple(b for b, a in zip(self.inputs, arg_attrs) if isinstance(a, dict) and ops.DONATED in a)
        for op in body.operations:
            for result in op.results:
                self.buffer(result)
            if op.name == "func.return":
                self.outputs = tuple(self.buffer(v) for v in op.operands)

    def island(self, slice_name: str) -> str:
        return self.placements[slice_name]["island"]

    def bytes_per_device(self, value: ir.Value) -> int:
        return bytes_per_device(value.type, self.homes[value], self.slices)

    def buffer(self, value: ir.Value) -> int:
        """Returns the buffer id of a value, declaring the buffer on first sight."""
        if value not in self.buffer_ids:
            self.buffer_ids[value] = len(self.buffer_ids)
            home = self.homes[value]
            self.buffers.setdefault(HOST if home is None else self.island(home.slice), []).append({
                "id": self.buffer_ids[value], "type": value.type, "home": home_attribute(home),
                "bytes_per_device": self.bytes_per_device(value)})
        return self.buffer_ids[value]

    def after(self, buffers) -> tuple[int, ...]:
        return tuple(sorted({self.producer[b] for b in buffers if b in self.producer}))

    def add(self, where: str | None, build, attributes: dict, loc: ir.Location, writes: tuple[int, ...]) -> int:
        """Records a step to create with `build` (an `ops.build_*`); returns its id."""
        step = next(self.step_ids)
        self.steps.setdefault(where, []).append((build, {"step": step, **attributes}, loc))
        for b in writes:
            self.producer[b] = step
        return step

    def emit(self, op: ir.Operation) -> None:
        """Adds the steps of one op of the program."""
        inputs = tuple(self.buffer(v) for v in op.operands)
        outputs = tuple(self.buffer(r) for r in op.results)
        subgraph = ops.attr(op, ops.SUBGRAPH, 0)
        if ops.Compute.isa(op):
            slice_name = ops.attr(op, "slice")
            self.add(self.island(slice_name), plan_ops.build_launch, {
                "after": self.after(inputs), "executable": ops.attr(op, "callee"),
                "slice": slice_name, "devices": self.placements[slice_name]["devices"],
                "inputs": inputs, "outputs": outputs,
                "output_bytes": tuple(self.bytes_per_device(r) for r in op.results),
                "subgraph": subgraph, "label": ops.attr(op, "label")}, op.location, outputs)
        elif ops.Cond.isa(op):
            self.add(HOST, plan_ops.build_branch, {
                "after": self.after(inputs), "pred": inputs[0], "inputs": inputs[1:], "outputs": outputs,
                "then_program": ops.attr(op, "then_program"), "else_program": ops.attr(op, "else_program"),
                "subgraph": subgraph, "label": ops.attr(op, "label")}, op.location, outputs)
        else:
            self.add_movement(op, inputs[0], outputs[0], subgraph)

    def add_movement(self, op: ir.Operation, src: int, dst: int, subgraph: int) -> None:
        src_slice, dst_slice = ops.attr(op, "src"), ops.attr(op, "dst")
        src_island, dst_island = self.island(src_slice), self.island(dst_slice)
        common = {"bytes": self.bytes_per_device(op.results[0]), "link": ops.attr(op, "link"), "subgraph": subgraph}
        if src_island == dst_island:
            self.add(src_island, plan_ops.build_copy,
                     {"after": self.after((src,)), "src_buffer": src, "dst_buffer": dst, **common}, op.location, (dst,))
            return
        send = self.add(src_island, plan_ops.build_send, {
            "after": self.after((src,)), "buffer": src, "peer_buffer": dst, "peer": dst_island,
            "devices": self.placements[src_slice]["devices"], **common}, op.location, ())
        self.add(dst_island, plan_ops.build_recv, {
            "after": (send,), "buffer": dst, "peer_buffer": src, "peer": src_island,
            "devices": self.placements[dst_slice]["devices"], **common}, op.location, (dst,))

    def build(self, islands: list[str], taken: set[str]) -> None:
        """Creates the plan modules at the current insertion point, named after the program and island (or
        host) unless a symbol in `taken` has that name: readers find plans by their marks, not their names."""
        name = ops.symbol_name(self.program)
        for island in [i for i in islands if i in self.buffers or i in self.steps]:
            self.build_module(ops.fresh_symbol(f"{name}_{island}", taken, numbered=False), ops.ISLAND_PLAN,
                              {"island": island, "program": Symbol(name)}, island)
        self.build_module(ops.fresh_symbol(f"{name}_host", taken, numbered=False), ops.HOST_PLAN, {
            "program": Symbol(name), "inputs": self.inputs, "outputs": self.outputs,
            "subgraphs": ops.attr(self.program, ops.SUBGRAPHS, []),
            **({"donated": self.donated} if self.donated else {})}, HOST)

    def build_module(self, sym_name: str, mark: str, value: dict, where: str | None) -> None:
        module = ops.create("builtin.module", attributes={"sym_name": sym_name, mark: value},
                            loc=self.program.location, regions=1)
        with ir.InsertionPoint(module.regions[0].blocks.append()):
            for buffer in self.buffers.get(where, []):
                plan_ops.build_buffer(**buffer, loc=self.program.location)
            for build, attributes, loc in self.steps.get(where, []):
                build(**attributes, loc=loc)


def _check(module: ir.Operation, diagnostics: DiagnosticEngine) -> bool:
    """Reports what pw-emit-plans requires beyond its phase (no program reaches itself through conds, a
    topology that reads); True if nothing."""
    calls = nx.DiGraph()
    for name, program in ops.programs(module).items():
        for op in ops.program_body(program).operations:
            op = op.operation
            if ops.Cond.isa(op):
                for key in ("then_program", "else_program"):
                    calls.add_edge(name, ops.attr(op, key), op=op)
    try:
        cycle = nx.find_cycle(calls)
    except nx.NetworkXNoCycle:
        return ops.required_topology(
            module, diagnostics, "pw-emit-plans needs the module's pw.topology") is not None
    path = " -> ".join(f"@{u}" for u, _ in cycle) + f" -> @{cycle[0][0]}"
    op = calls.edges[cycle[0]]["op"]
    diagnostics.error(op, f"'pw.cond' op makes program @{cycle[0][0]} reach itself ({path}): "
                          f"a plan cannot contain itself")
    return False


@register
class EmitPlansPass(Pass):
    __doc__ = __doc__
    name = "pw-emit-plans"
    summary = "Emit one plan per island (and a host plan) for every program, in schedule order"
    needs_verified_input = True
    requires_phase = Phase.SCHEDULED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        if not _check(module, diagnostics):
            return
        slices = ops.virtual_slices(module)
        placements = {op_name: ops.attr(op, ops.PLACEMENT) for op in ops.top_level_ops(module)
                      if (op_name := ops.symbol_name(op)) in slices}
        islands = [i.name for i in ops.module_topology(module).islands]
        step_ids = itertools.count()
        emitters = {name: _ProgramEmitter(program, slices, placements, step_ids)
                    for name, program in ops.programs(module).items()}
        scheduled = [(name, op.operation) for name, program in ops.programs(module).items()
                     for op in ops.program_body(program).operations if op.name != "func.return"]
        for name, op in sorted(scheduled, key=lambda item: ops.attr(item[1], ops.ORDER)):
            emitters[name].emit(op)
        taken = ops.symbol_names(module)
        with ir.InsertionPoint(module.regions[0].blocks[0]):
            for emitter in emitters.values():
                emitter.build(islands, taken)
