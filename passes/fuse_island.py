"""`pw-fuse-island`: one launch for an island's computations and copies across its slices.

Inside a static subgraph, a run of consecutive ops on one island (its
`pw.compute`s on several slices and the ICI copies between them, `pw.transfer`
/ `pw.scatter` / `pw.gather` with `link = "ici"`) becomes one `pw.compute` of
a new fused executable on the run's *cover*: the largest slice of the run whose
devices include every device the run touches. The runtime compiles the fused
executable as one `jax.jit` over the cover's mesh: each original computation
is called in order and each copy is a sharding constraint, the operands of
each call being constrained to that call's `in_shardings` (`pw.fused`'s calls
carry them). XLA then reshards between the computations inside the one
launch, and the island makes one dispatch instead of one per computation and
copy; the copies' buffers and frees disappear from the plan.

Each slice's shardings are written on the cover's mesh with the cover axes
that play its axes: the same size, and at every device of the slice the
cover's coordinate on that axis is the slice's own (on the three-block
example, slice_a's "data" is slice_b's "model"). A value in its home
sharding on the cover then has, on each device of its home slice, exactly
the shard it has at home (other cover devices hold copies), so a copy
between the two moves nothing on the home devices: the runtime assembles the
home array from those shards. In IR such a move is a `pw.transfer` when the
axis names agree, else a one-piece `pw.gather`.

Values that come from outside the run move onto the cover first; a program
argument used only inside the run is put there directly instead (its
`pw.home` becomes the cover). Results used after the run go back to their
home slices: the fused executable writes them in their home sharding on the
cover and a move after it brings each to its home slice. The executable's
`scratch_bytes` is the per-device size of the values only the run uses,
which `pw-plan-memory` counts on every device of the cover while the fused
launch runs (XLA holds them there at most).

A run is fused only when all of these hold:

- it has computations on at least two slices (one slice is
  `pw-fuse-launches`' case) and a cover slice exists;
- every slice it names has a renaming onto the cover's axes (above);
- no computation of it names its own slice's axes in its code
  (`jax.shard_map`, collectives, sharding constraints: its executable
  declares a Shardy mesh, `ops.names_its_mesh`), as it runs only on its
  slice's mesh: such a computation ends a run;
- no other program of the module uses a slice on any device of the cover:
  a fused launch holds all of them for its whole length, so a program that
  could run on some of them meanwhile (another entry point, a branch) would
  wait. Programs of other modules are not seen here; on both runtime
  backends an island runs every run's steps in one consistent order on one
  dispatch thread, so a fused launch takes no device from them that a
  single step would not;
- the cost model says it pays: the island steps it saves (the run's ops,
  less the fused launch and the moves it adds) times `step_us`, the host
  and launch time of one island step, exceed the ICI time of the moves it
  adds (latency plus bytes over the island's ICI bandwidth).

Requires: the partitioned phase (pw-place, pw-insert-transfers,
pw-mark-static-subgraphs); runs before pw-fuse-launches, whose fused
executables it cannot call (it reports one if it finds it), and before
pw-schedule, which costs and orders what it makes.

    // before: @a on devices [0, 2), @b (2x2, axes d, m) on [0, 4), @c on [2, 4) of island0
    %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0, ...}
    %1 = "pw.scatter"(%0) {dst = @b, link = "ici", src = @a, dst_sharding = [["d", "m"]], ...}
    %2 = "pw.compute"(%1) {callee = @g, slice = @b, in_shardings = [[["d", "m"]]], label = "g#0", ...}
    %3 = "pw.gather"(%2) {dst = @c, link = "ici", src = @b, dst_sharding = [["d"]], ...}
    %4 = "pw.compute"(%3) {callee = @h, slice = @c, label = "h#0", ...}
    return %4
    // after (%x, used only here, is now put on @b: its pw.home is {slice = @b, sharding = [["m"]]})
    %0 = "pw.compute"(%x) {callee = @island_f_0, slice = @b, in_shardings = [[["m"]]], out_shardings = [[["m"]]],
                           label = "f#0+g#0+h#0", pw.subgraph = 0, ...}
    %1 = "pw.gather"(%0) {dst = @c, dst_sharding = [["d"]], link = "ici", pieces = 1, src = @b, src_sharding = [["m"]]}
    return %1
    // appended to the module
    module @island_f_0 attributes {pw.executable, pw.fused = {calls = [
        {callee = @f, in_shardings = [[["m"]]], operands = array<i64: 0>, results = 1},
        {callee = @g, in_shardings = [[["d", "m"]]], operands = array<i64: 1>, results = 1},
        {callee = @h, in_shardings = [[["m"]]], operands = array<i64: 2>, results = 1}],
        results = array<i64: 3>, scratch_bytes = 48}} {
      func.func private @main(tensor<8xf32>) -> tensor<8xf32>
    }
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from mlir import ir
from mlir.dialects import func

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.attributes import Symbol
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase
from pathways_mlir.dialect.homes import Home, home_attribute, program_homes
from pathways_mlir.dialect.sharding import Sharding

from .registry import Pass, option, register


def _island_op(op: ir.Operation, islands: dict[str, str], bound: set[str]) -> str | None:
    """Returns the island of an op a run may hold (a compute whose executable is not `bound` to its own
    slice's mesh, or an ICI move inside one island), or None."""
    if ops.Compute.isa(op):
        return None if ops.Compute(op).callee in bound else islands[ops.Compute(op).slice]
    move = ops.DataMovement.match(op)
    if move is not None and move.link == "ici" and islands[move.src] == islands[move.dst]:
        return islands[move.src]
    return None


def _slices_of(op: ir.Operation) -> list[str]:
    if ops.Compute.isa(op):
        return [ops.Compute(op).slice]
    move = ops.DataMovement(op)
    return [move.src, move.dst]


def _runs(program: ir.Operation, islands: dict[str, str], bound: set[str]) -> list[list[ir.Operation]]:
    """Returns the maximal runs of consecutive ops of one island and one static subgraph, without
    leading or trailing moves, that compute on two slices or more, with no executable in `bound`."""
    static = {g["id"] for g in ops.attr(program, ops.SUBGRAPHS, []) if g["static"]}
    runs: list[list[ir.Operation]] = []
    current: list[ir.Operation] = []
    key = None
    for op in [*ops.program_body(program).operations, None]:
        op = op.operation if op is not None else None
        island = None if op is None else _island_op(op, islands, bound)
        subgraph = None if op is None else ops.attr(op, ops.SUBGRAPH, 0)
        here = (island, subgraph) if island is not None and subgraph in static else None
        if here is not None and here == key:
            current.append(op)
            continue
        while current and not ops.Compute.isa(current[-1]):
            current.pop()
        while current and not ops.Compute.isa(current[0]):
            current.pop(0)
        if len({ops.Compute(c).slice for c in current if ops.Compute.isa(c)}) > 1:
            runs.append(current)
        current, key = ([op], here) if here is not None else ([], None)
    return runs


Devices = dict[str, list[tuple[int, int]]]     # island -> sorted, disjoint half-open device ranges


def _merged(spans) -> Devices:
    """Merges (island, (begin, end)) spans into each island's sorted, disjoint ranges."""
    by_island: dict[str, list[tuple[int, int]]] = {}
    for island, span in spans:
        by_island.setdefault(island, []).append(tuple(span))
    merged: Devices = {}
    for island, ranges in by_island.items():
        out: list[tuple[int, int]] = []
        for b, e in sorted(ranges):
            if out and b <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((b, e))
        merged[island] = out
    return merged


def _covers(big: Devices, small: Devices) -> bool:
    """Whether every device of `small` is one of `big` (both merged)."""
    return all(any(b <= sb and se <= e for b, e in big.get(island, ())) for island, ranges in small.items()
               for sb, se in ranges)


def _overlap(a: Devices, b: Devices) -> bool:
    """Whether `a` and `b` share a device."""
    return any(ab < be and bb < ae for island, ranges in a.items() for ab, ae in ranges for bb, be in b.get(island, ()))


class _Fuser:
    """Fuses the runs of one module that qualify (see the module docstring)."""

    def __init__(self, module: ir.Operation, step_seconds: float):
        self.module = module
        self.step_seconds = step_seconds
        self.topology = ops.module_topology(module)
        self.slices = ops.virtual_slices(module)
        self.placements = {name: ops.attr(op, ops.PLACEMENT) for op in ops.top_level_ops(module)
                           if (name := ops.symbol_name(op)) in self.slices}
        self.islands = {name: p["island"] for name, p in self.placements.items()}
        self.taken = ops.symbol_names(module)
        self.bound = {name for name, op in ops.executables(module).items() if ops.names_its_mesh(op)}
        self.used = {name: self.devices([s for op in ops.program_body(program).operations
                                         if ops.Compute.isa(op) or ops.DataMovement.isa(op)
                                         for s in _slices_of(op.operation)])
                     for name, program in ops.programs(module).items()}

    def devices(self, slice_names) -> "Devices":
        """Returns the devices of some slices: per island, merged half-open ranges (O(slices), not O(devices))."""
        return _merged(((p["island"], r) for name in slice_names
                        for p in (self.placements[name],) for r in zip(p["devices"][::2], p["devices"][1::2])))

    def cover(self, run: list[ir.Operation]) -> str | None:
        """Returns the run's largest compute slice if its devices include all the run touches, else None."""
        touched = self.devices({s for op in run for s in _slices_of(op)})
        candidates = sorted({ops.Compute(op).slice for op in run if ops.Compute.isa(op)},
                            key=lambda s: (-self.slices[s].size, s))
        return next((s for s in candidates if _covers(self.devices([s]), touched)), None)

    def renaming(self, slice_name: str, cover: str) -> dict[str, str] | None:
        """Returns the cover axis that plays each axis of a slice: equal in size, and at every device of
        the slice the cover's coordinate on it is the slice's own; None if there is no such renaming."""
        s, c = self.slices[slice_name], self.slices[cover]
        where = {d: np.unravel_index(i, c.shape) for i, d in enumerate(self.device_list(cover))}
        mine = [(where[d], np.unravel_index(i, s.shape)) for i, d in enumerate(self.device_list(slice_name))]
        for axes in itertools.permutations(range(len(c.axes)), len(s.axes)):
            if all(c.shape[j] == n for j, n in zip(axes, s.shape)) and \
                    all(theirs[j] == own[k] for theirs, own in mine for k, j in enumerate(axes)):
                return {a: c.axes[j] for a, j in zip(s.axes, axes)}
        return None

    def device_list(self, slice_name: str) -> list[int]:
        """Returns a slice's island-local devices in mesh order."""
        p = self.placements[slice_name]["devices"]
        return [d for b, e in zip(p[::2], p[1::2]) for d in range(b, e)]

    def renamings(self, run: list[ir.Operation], cover: str) -> dict[str, dict[str, str]] | None:
        """Returns the renaming onto the cover of every slice the run names, or None if one has none."""
        found = {name: self.renaming(name, cover) for name in {s for op in run for s in _slices_of(op)}}
        return None if None in found.values() else found

    def move_bytes(self, value: ir.Value, home: Home) -> int:
        """Returns the bytes of one device's shard of `value` at `home`."""
        return ops.tensor_bytes(value.type) // home.sharding.ways(self.slices[home.slice].axis_sizes)

    def fuse_program(self, name: str, program: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        """Fuses the runs of program `name` that qualify."""
        others = _merged((island, r) for other, used in self.used.items() if other != name
                         for island, ranges in used.items() for r in ranges)
        for run in _runs(program, self.islands, self.bound):
            fused_callee = next((op for op in run if ops.Compute.isa(op)
                                 and ops.FUSED in ops.executables(self.module)[ops.Compute(op).callee].attributes),
                                None)
            if fused_callee is not None:
                diagnostics.error(fused_callee, f"pw-fuse-island cannot call fused executable "
                                                f"@{ops.attr(fused_callee, 'callee')}: run it before pw-fuse-launches")
                return
            cover = self.cover(run)
            renamings = None if cover is None or _overlap(self.devices([cover]), others) else self.renamings(run, cover)
            if renamings is not None:
                self.fuse(program, run, cover, renamings)

    def fuse(self, program: ir.Operation, run: list[ir.Operation], cover: str,
             renamings: dict[str, dict[str, str]]) -> None:
        """Replaces `run` by one compute on `cover` if the cost model says it pays."""
        homes = program_homes(program)

        def on_cover(home: Home) -> Sharding:
            rename = renamings[home.slice]
            return Sharding(tuple(tuple(rename[a] for a in axes) for axes in home.sharding.dims))

        inside = {op for op in run}
        made = [r for op in run for r in op.results]
        numbered: dict[ir.Value, int] = {}
        inputs: list[ir.Value] = []
        for op in run:
            for value in op.operands:
                if value not in numbered and value not in made:
                    numbered[value] = len(inputs)
                    inputs.append(value)
        if any(homes[v] is None for v in inputs):
            return
        count = len(inputs)
        calls = []
        for op in run:
            compute = ops.Compute.match(op)
            if compute is not None:
                calls.append({"callee": Symbol(compute.callee),
                              "operands": tuple(numbered[v] for v in op.operands), "results": len(op.results),
                              "in_shardings": [on_cover(Home(compute.slice, s)).to_python()
                                               for s in compute.in_shardings]})
                for result in op.results:
                    numbered[result], count = count, count + 1
            else:
                numbered[op.results[0]] = numbered[op.operands[0]]
        escaping = [r for r in made if any(use.owner.operation not in inside for use in r.uses)]
        arguments = list(ops.program_body(program).arguments)
        rehomed = [v for v in inputs if v in arguments and all(use.owner.operation in inside for use in v.uses)]
        moved_in = [v for v in inputs if v not in rehomed and homes[v].slice != cover]
        moved_out = [r for r in escaping if homes[r].slice != cover]
        saved = len(run) - 1 - len(moved_in) - len(moved_out)
        ici = self.topology.island(self.islands[cover]).ici
        added = sum(ici.transfer_seconds(self.move_bytes(v, homes[v])) for v in (*moved_in, *moved_out))
        if saved * self.step_seconds <= added:
            return
        scratch = sum(self.move_bytes(r, homes[r]) for r in made if r not in escaping)
        executable = ops.fresh_symbol(f"island_{ops.attr(run[0], 'callee')}", self.taken)
        with ir.InsertionPoint(self.module.regions[0].blocks[0]), run[0].location:
            module = ops.create("builtin.module", attributes={
                "sym_name": executable, ops.EXECUTABLE: None,
                ops.FUSED: {"calls": calls, "results": tuple(numbered[r] for r in escaping),
                            "scratch_bytes": scratch}}, regions=1)
            with ir.InsertionPoint(module.regions[0].blocks.append()):
                func.FuncOp("main", ir.FunctionType.get([v.type for v in inputs], [r.type for r in escaping]),
                            visibility="private")
        if rehomed:
            arg_attrs = ops.attr(program, "arg_attrs")
            for v in rehomed:
                index = arguments.index(v)
                arg_attrs[index] = {**arg_attrs[index], ops.HOME: home_attribute(Home(cover, on_cover(homes[v])))}
            ops.set_attr(program, "arg_attrs", arg_attrs)
        with ir.InsertionPoint(run[0]):
            operands = [self.move(v, homes[v], Home(cover, on_cover(homes[v])), run[0].location)
                        if v in moved_in else v for v in inputs]
        labels = "+".join(ops.Compute(op).label for op in run if ops.Compute.isa(op))
        with ir.InsertionPoint.after(run[-1]):
            fused = ops.build_compute(executable, cover, operands, [r.type for r in escaping],
                                      [on_cover(homes[v]) for v in inputs], [on_cover(homes[r]) for r in escaping],
                                      labels, loc=run[0].location)
            ops.set_attr(fused, ops.SUBGRAPH, ops.attr(run[0], ops.SUBGRAPH, 0))
        with ir.InsertionPoint.after(fused):
            back = [self.move(new, Home(cover, on_cover(homes[r])), homes[r], run[-1].location)
                    if r in moved_out else new for r, new in zip(escaping, fused.results)]
        for result, new in zip(escaping, back):
            result.replace_all_uses_with(new)
        for op in reversed(run):
            op.erase()
        for op in ops.program_body(program).operations:     # the moves made here join the run's subgraph
            if op.name != "func.return" and ops.SUBGRAPH not in op.operation.attributes:
                ops.set_attr(op.operation, ops.SUBGRAPH, ops.attr(fused, ops.SUBGRAPH))

    def move(self, value: ir.Value, have: Home, want: Home, loc: ir.Location) -> ir.Value:
        """Creates the ICI move of `value` between a slice and the cover, where each device keeps its
        shards: a `pw.transfer` if the sharding's axis names are the same, else a one-piece `pw.gather`."""
        if have.sharding == want.sharding:
            return ops.build_transfer(value, have.slice, want.slice, have.sharding, "ici", loc).result
        shard = have.sharding.shard_shape(ops.tensor_shape(value.type), self.slices[have.slice].axis_sizes)
        return ops.build_gather(value, have.slice, want.slice, have.sharding, want.sharding, 1, shard, "ici",
                                loc).result


@register
@dataclass
class FuseIslandPass(Pass):
    __doc__ = __doc__
    name = "pw-fuse-island"
    summary = "Fuse an island's computations and ICI copies across its slices into one launch on their cover"
    step_us: float = option(50.0, "host and launch time of one island step, in µs (the cost model's saving per "
                                  "step)")
    needs_verified_input = True
    requires_phase = Phase.PARTITIONED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        if ops.required_topology(module, diagnostics, "pw-fuse-island needs the module's pw.topology") is None:
            return
        fuser = _Fuser(module, self.step_us * 1e-6)
        for name, program in ops.programs(module).items():
            fuser.fuse_program(name, program, diagnostics)
