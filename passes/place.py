"""`pw-place`: maps every virtual slice to physical devices of one island.

The resource manager's map, as a pass. Each slice gets `size` distinct
devices (one physical device per virtual device), consecutive among the
available devices of one island that meets its constraints: `device_kind`,
`island`, `min_memory_bytes` (per device); `same_island` always holds, since
a slice never spans islands. Its devices must also hold, per device, the
operands and results of each of its computations (shards of them): a slice
no island can hold is an error naming the bytes, the computation and its
largest value. Slices may share devices (their computations are then
time-multiplexed by the island's scheduler). Strategies:

- `strategy=auto` (default): the placement with the least estimated step
  time of the module's programs (the model below). With few choices (the
  combinations of each slice's candidates, times the module's ops, at most
  200,000) every combination is tried; beyond, slices are placed greedily in
  module order, then moved one at a time while that helps (at most 4 rounds). A slice's candidates are,
  per island, its least loaded window, and the devices of every slice
  already placed with its mesh shape (sharing them lets values stay put):
  O(slices + islands) candidates per slice, never O(devices). Ties go to
  the `spread` placement.
- `strategy=spread`: slices in module order, each on the window of
  consecutive available devices with the least load (the number of virtual
  devices each serves), ties broken towards the least loaded island, then
  the first island, then the first window; it ignores communication.
- `strategy=pack`: the first island that still has a window of idle
  devices, else the least loaded window anywhere.

The model (passes/placement_cost.py) estimates a step:

- compute: each `pw.compute` takes flops / F + bytes / B seconds on each
  device (its cost from pw-schedule's model: the work over its slice's
  shards), with (F, B) the device kind's rates from the machine profiles
  (`dialect/device_time.py`'s `DEVICE_RATES`, listed at the end; a kind no
  profile names gets `DEFAULT_RATES`);
- transfers: a value used on another slice or in another sharding moves once
  per (value, slice, sharding), as pw-insert-transfers moves it: inside an
  island each device receives its shard over ICI (latency + shard bytes /
  bandwidth); between islands the whole value crosses the DCN (latency +
  bytes / bandwidth); islands the DCN does not join cost infinity. Slices on
  the same devices with the same mesh shape alias (pw-alias-slices), so a
  value in the same layout moves nothing;
- the step time is the largest of: each program's critical path (computes
  and transfers along its dataflow; programs run side by side), each
  device's busy time (the compute of every slice sharing it, from every
  program: contention), and each island's DCN time (what it sends and
  receives);
- host values (program arguments, `pw.cond` results) start where they are
  first used, free; a `pw.cond`'s branches count as programs of their own;
  a loop inside a compiled function counts once per trip where its trip
  count is static, else once (passes/cost.py).

`explain=true` writes, per slice, `pw.placement_cost = {compute_ns,
transfer_ns, step_ns, runner_up = {island, devices, step_ns}}`: its computes'
time, the time of the transfers into it, the estimated step, and the best
other candidate for this slice with the others where they are (absent if it
had none); `unknown_trip_counts = n` says that n loops of its computations
were counted once, their trip count not being static. A step of -1 ns is a
placement that cannot run (islands the DCN does not join).

An elastic slice (constraint `min_shape`, and `max_shape` once placed) is
first given the largest shape in its range that an island it may use has the
available devices for and that divides every value sharded over it (memory
is checked after, at that shape): its `shape` becomes that one and
`max_shape` keeps the largest, so placing it again, onto more devices, grows
it back. With 4 of island0's 8 devices unavailable:

    // before
    "pw.virtual_slice"() {sym_name = "d", shape = array<i64: 8>, axes = ["data"],
                          constraints = {min_shape = array<i64: 2>}}
    // after
    "pw.virtual_slice"() {sym_name = "d", shape = array<i64: 4>, axes = ["data"],
                          constraints = {max_shape = array<i64: 8>, min_shape = array<i64: 2>}, pw.placement = ...}

`pin="v0=island1:4,v1=island0"` forces slice @v0 onto devices [4, 4+size) of
island1 and slice @v1 onto island0 (devices chosen by the strategy); a pin
must still meet the slice's constraints.

The placement is written as `pw.placement = {island, devices}` with devices
as half-open ranges of island-local ids in mesh order, so its size does not
grow with the device count; placing costs O(slices) per island whatever the
number of devices. The topology comes from option `topology` (a JSON file,
or `<islands>x<devices>`) or else from the module's `pw.topology`; the one
used is written to the module's `pw.topology`. Existing placements are
replaced.

Requires: IR that passes pw-verify (the driver runs its checks first), whose
values are not moved yet (a `pw.home` or `pw.result_homes` mark, or plans,
is an error at the module: place the module as it was before lowering), and
a topology (option `topology`, else the module's `pw.topology`).

    // before (topology=2x4, strategy=spread)
    "pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}}
    "pw.virtual_slice"() {sym_name = "b", shape = array<i64: 4>, axes = ["x"], constraints = {}}
    // after
    module attributes {pw.topology = {...}} {
    "pw.virtual_slice"() {..., pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, sym_name = "a"}
    "pw.virtual_slice"() {..., pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, sym_name = "b"}
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, replace
from typing import Sequence

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.device_time import DEFAULT_RATES, DEVICE_RATES
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.homes import sharded_on
from pathways_mlir.dialect.phases import holds_plans
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.dialect.topology import Island, Topology, TopologyError

from .placement_cost import Estimate, Loads, Model, Need, Window
from .registry import OptionError, Pass, option, register


class Strategy(enum.StrEnum):
    """How pw-place chooses among the windows that can hold a slice (see the module docstring)."""

    AUTO = "auto"
    SPREAD = "spread"
    PACK = "pack"


EXACT_WORK = 200_000  # combinations x ops estimated, at most, by the exhaustive search
LOCAL_ROUNDS = 4
_PIN = re.compile(r"(?P<slice>[\w.$-]+)=(?P<island>[\w.$-]+)(?::(?P<first>\d+))?")


def parse_pins(text: str) -> dict[str, tuple[str, int | None]]:
    """Parses `v0=island1:4,v1=island0` into {slice: (island, first device or None)}."""
    pins: dict[str, tuple[str, int | None]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _PIN.fullmatch(item)
        if match is None:
            raise OptionError(f"pin '{item}' of 'pw-place' must be slice=island or slice=island:first_device")
        first = match["first"]
        if match["slice"] in pins:          # two places for one slice: neither is what was asked
            raise OptionError(f"pin '{item}' of 'pw-place' pins slice '{match['slice']}' a second time")
        pins[match["slice"]] = (match["island"], None if first is None else int(first))
    return pins


def _needs(s: ops.VirtualSlice) -> str:
    """Says in words what a slice needs, for error messages."""
    c = s.constraints
    low, high = s.shape_range
    words = [f"{math.prod(low)} to {math.prod(high)} devices" if s.elastic else f"{s.size} devices"]
    if "device_kind" in c:
        words.append(f"of kind '{c['device_kind']}'")
    if "min_memory_bytes" in c:
        words.append(f"with at least {c['min_memory_bytes']} bytes each")
    words.append(f"in island '{c['island']}'" if "island" in c else "in one island")
    return " ".join(words)


def _memory(need: Need) -> str:
    """Says in words what a slice's buffers need, for error messages."""
    return (f"computation '{need.compute}' needs {need.bytes} bytes per device for its operands and results "
            f"(value {need.value} alone is {need.value_bytes} bytes per device)")


def _mismatch(s: ops.VirtualSlice, island: Island, available: int, need: Need | None) -> str | None:
    """Returns why `island` cannot hold slice `s`, or None if it can."""
    c = s.constraints
    if "island" in c and c["island"] != island.name:
        return f"the slice asks for island '{c['island']}'"
    if "device_kind" in c and c["device_kind"] != island.device_kind:
        return f"its devices are of kind '{island.device_kind}'"
    if c.get("min_memory_bytes", 0) > island.device_memory_bytes:
        return f"its devices have {island.device_memory_bytes} bytes"
    if need is not None and need.bytes > island.device_memory_bytes:
        return f"its devices have {island.device_memory_bytes} bytes, but {_memory(need)}"
    if available < s.size:
        return f"it has {available} available devices"
    return None


class _Placer:
    """The load of every island's devices and the candidate windows of one slice at a time."""

    def __init__(self, topology: Topology, strategy: Strategy, needs: dict[str, Need]):
        self.topology = topology
        self.strategy = strategy
        self.needs = needs
        self.loads = Loads(topology)
        self.index = {i.name: n for n, i in enumerate(topology.islands)}

    def free(self) -> str:
        """Describes every island's available devices, for error messages."""
        return ", ".join(f"{i.name} has {self.loads.devices[i.name].count} of {i.num_devices} devices available "
                         f"({i.device_kind}, {i.device_memory_bytes} bytes each)" for i in self.topology.islands)

    def mismatch(self, s: ops.VirtualSlice, island: Island) -> str | None:
        """Returns why `island` cannot hold slice `s`, or None if it can."""
        return _mismatch(s, island, self.loads.devices[island.name].count, self.needs.get(s.name))

    def ranked(self, s: ops.VirtualSlice, islands: list[Island]) -> list[Window]:
        """Returns the least loaded window of each island, in the strategy's order of preference."""
        keyed = []
        for island in islands:
            load, window = self.loads.best_window(island.name, s.size)
            index = self.index[island.name]
            if self.strategy is Strategy.PACK:
                key = (0, index) if load == 0 else (1, load, index)
            else:
                key = (load, self.loads.total(island.name), index)
            keyed.append((key, window))
        return [w for _, w in sorted(keyed)]


class _Search:
    """Each slice's candidate windows, and strategy=auto's search among them (see the pass's docstring)."""

    def __init__(self, placer: _Placer, model: Model, slices: dict[str, ops.VirtualSlice],
                 allowed: dict[str, Window | list[Island]]):
        self.placer, self.model, self.slices, self.allowed = placer, model, slices, allowed
        self.order = list(allowed)

    def candidates(self, name: str, plan: dict[str, Window]) -> list[Window]:
        """Returns a slice's candidate windows given the others in `plan`, the strategy's choice first."""
        allowed = self.allowed[name]
        if isinstance(allowed, Window):
            return [allowed]
        out = self.placer.ranked(self.slices[name], allowed)
        islands = {i.name for i in allowed}
        for other, window in plan.items():
            if window.island in islands and self.slices[other].shape == self.slices[name].shape \
                    and window not in out:
                out.append(window)
        return out

    def cost(self, plan: dict[str, Window]) -> float:
        """Returns the estimated step time of a (partial) plan."""
        return self.model.estimate(plan).step_s

    def run(self) -> dict[str, Window]:
        """Returns the chosen window of every allowed slice."""
        combinations = 1
        for n, name in enumerate(self.order):
            allowed = self.allowed[name]
            same = sum(self.slices[o].shape == self.slices[name].shape for o in self.order[:n])
            combinations *= 1 if isinstance(allowed, Window) else len(allowed) + same
        return self.exact() if combinations * max(1, self.model.ops) <= EXACT_WORK else self.local(self.greedy())

    def place(self, plan: dict[str, Window], name: str, window: Window) -> None:
        """Puts slice `name` on `window` in `plan` and in the loads."""
        plan[name] = window
        self.placer.loads.add(window)

    def unplace(self, plan: dict[str, Window], name: str) -> Window:
        """Takes slice `name` out of `plan` and the loads; returns its window."""
        window = plan.pop(name)
        self.placer.loads.remove(window)
        return window

    def exact(self) -> dict[str, Window]:
        """Tries every combination of candidates, depth first; the first cheapest wins."""
        best: list = [math.inf, None]
        self._visit(0, {}, best)
        for window in best[1].values():
            self.placer.loads.add(window)
        return best[1]

    def _visit(self, depth: int, plan: dict[str, Window], best: list) -> None:
        """Places the slices from `depth` on in every way, keeping the cheapest whole plan in `best`."""
        if depth == len(self.order):
            cost = self.cost(plan)
            if best[1] is None or cost < best[0] * (1 - 1e-9):
                best[:] = [cost, dict(plan)]
            return
        name = self.order[depth]
        for window in self.candidates(name, plan):
            self.place(plan, name, window)
            self._visit(depth + 1, plan, best)
            self.unplace(plan, name)

    def best_move(self, name: str, plan: dict[str, Window], current: float) -> tuple[float, Window | None]:
        """Returns the cheapest candidate of an unplaced slice if it costs less than `current`."""
        best: tuple[float, Window | None] = (current, None)
        for window in self.candidates(name, plan):
            self.place(plan, name, window)
            cost = self.cost(plan)
            self.unplace(plan, name)
            if cost < best[0] * (1 - 1e-9):
                best = (cost, window)
        return best

    def greedy(self) -> dict[str, Window]:
        """Places slices in module order, each on its cheapest candidate given those before it; a slice no
        computation runs on costs the same anywhere, so it takes the strategy's choice."""
        plan: dict[str, Window] = {}
        for name in self.order:
            first = self.candidates(name, plan)[0]
            self.place(plan, name, first)
            if name not in self.model.used_slices:
                continue
            current = self.cost(plan)
            self.unplace(plan, name)
            _, window = self.best_move(name, plan, current)
            self.place(plan, name, window or first)
        return plan

    def local(self, plan: dict[str, Window]) -> dict[str, Window]:
        """Moves one slice that a computation runs on at a time to a cheaper candidate, for at most
        LOCAL_ROUNDS rounds."""
        for _ in range(LOCAL_ROUNDS):
            moved = False
            for name in [name for name in self.order if name in self.model.used_slices]:
                current = self.cost(plan)
                old = self.unplace(plan, name)
                _, window = self.best_move(name, plan, current)
                self.place(plan, name, window or old)
                moved |= window is not None
            if not moved:
                break
        return plan

    def explain(self, name: str, plan: dict[str, Window], estimate: Estimate) -> dict:
        """Returns the `pw.placement_cost` of one slice of a finished plan."""
        old = self.unplace(plan, name)
        others = []
        for window in self.candidates(name, plan):
            if window != old:
                self.place(plan, name, window)
                others.append((self.cost(plan), window))
                self.unplace(plan, name)
        self.place(plan, name, old)
        value = {"compute_ns": _ns(estimate.compute_s[name]), "transfer_ns": _ns(estimate.transfer_s[name]),
                 "step_ns": _ns(estimate.step_s)}
        if name in self.model.unknown_trip_counts:
            value["unknown_trip_counts"] = self.model.unknown_trip_counts[name]
        if others:
            cost, window = min(others)
            value["runner_up"] = {"island": window.island, "step_ns": _ns(cost),
                                  "devices": self.placer.loads.devices[window.island].ranges(window)}
        return value


def _ns(seconds: float) -> int:
    """Returns seconds as whole nanoseconds (-1 for a plan that cannot run)."""
    return -1 if math.isinf(seconds) else round(seconds * 1e9)


def fitted_shape(s: ops.VirtualSlice, topology: Topology, values: Sequence[tuple[tuple[int, ...], Sharding]] = (),
                 island: str | None = None) -> tuple[int, ...] | None:
    """Returns the largest shape in an elastic slice's range that divides `values` and that an island meeting
    its constraints (`island` only, if given) has the available devices for; None if there is none."""
    loads = Loads(topology)
    islands = [i for i in topology.islands if island in (None, i.name)]
    for shape in s.shapes(values):
        candidate = replace(s, shape=shape)
        if any(_mismatch(candidate, i, loads.devices[i.name].count, None) is None for i in islands):
            return shape
    return None


def _values_moved(module: ir.Operation) -> bool:
    """Whether pw-insert-transfers has run on the module: a program argument or a cond's results have homes."""
    for program in ops.top_level_ops(module):
        if not ops.is_program(program):
            continue
        if any(ops.HOME in attrs for attrs in ops.attr(program, "arg_attrs") or ()):
            return True
        if any(ops.RESULT_HOMES in op.attributes for op in ops.program_body(program).operations):
            return True
    return False


@register
@dataclass
class PlacePass(Pass):
    __doc__ = __doc__
    name = "pw-place"
    needs_verified_input = True
    summary = "Map every virtual slice to devices of one island, minimising the estimated step time"
    topology: str = option("", "a JSON file or <islands>x<devices>; default: the module's pw.topology")
    strategy: Strategy = option(Strategy.AUTO, "auto (least estimated step time), spread (balance load) or pack")
    pin: str = option("", "slice=island[:first_device],... placements to force")
    explain: bool = option(False, "attach pw.placement_cost (estimated costs, runner-up) to every slice")

    @classmethod
    def description(cls) -> str:
        """Returns the docstring, then the device rates the cost model reads (the machine profiles')."""
        rates = [f"  {kind}: {flops:.4g} flop/s, {memory:.4g} B/s" for kind, (flops, memory) in DEVICE_RATES.items()]
        other = f"  any other kind: {DEFAULT_RATES[0]:.4g} flop/s, {DEFAULT_RATES[1]:.4g} B/s"
        return "\n".join([super().description(), "", "Device rates (F, B) per device kind:", *rates, other])

    def __post_init__(self):
        super().__post_init__()
        self.pins = parse_pins(self.pin)
        self.given_topology = None
        if self.topology:
            try:
                self.given_topology = Topology.from_option(self.topology)
            except TopologyError as e:       # one that names its place in the file is said as it is
                raise OptionError(str(e) if ": error: " in str(e) else f"option 'topology' of 'pw-place': {e}") \
                    from None

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        if holds_plans(module) or _values_moved(module):
            diagnostics.error(module, "pw-place runs on programs before pw-insert-transfers moves their values for "
                                      "a placement, but this module's are moved already (it holds pw.home marks or "
                                      "plans): place the module as it was before lowering")
            return
        topology = self.given_topology or ops.required_topology(
            module, diagnostics, "pw-place needs a topology: give option topology=<file.json or "
                                 "<islands>x<devices>> or set pw.topology on the module")
        if topology is None:
            return
        ops.set_topology(module, topology)
        slice_ops = {ops.symbol_name(op): op for op in ops.top_level_ops(module) if ops.SliceOp.isa(op)}
        for name in self.pins:
            if name not in slice_ops:
                diagnostics.error(module, f"pin names slice @{name}, which is not in this module")
        self.fit_elastic(module, slice_ops, topology)
        slices = {name: ops.VirtualSlice.from_op(op) for name, op in slice_ops.items()}
        model = Model(module, topology, slices)
        placer = _Placer(topology, self.strategy, model.needs)
        allowed = {}
        for name, op in slice_ops.items():
            choice = self.pinned(op, slices[name], placer, diagnostics) if name in self.pins \
                else self.fitting(op, slices[name], placer, diagnostics)
            if choice is not None:
                allowed[name] = choice
        search = _Search(placer, model, slices, allowed)
        if self.strategy is Strategy.AUTO:
            plan = search.run()
        else:
            plan = {}
            for name in allowed:
                search.place(plan, name, search.candidates(name, {})[0])
        estimate = model.estimate(plan) if self.explain else None
        for name, window in list(plan.items()):
            devices = placer.loads.devices[window.island].ranges(window)
            ops.set_attr(slice_ops[name], ops.PLACEMENT, {"island": window.island, "devices": devices})
            if estimate is not None:
                ops.set_attr(slice_ops[name], ops.PLACEMENT_COST, search.explain(name, plan, estimate))

    def fit_elastic(self, module: ir.Operation, slice_ops: dict[str, ir.Operation], topology: Topology) -> None:
        """Gives each elastic slice its `fitted_shape` (else the smallest shape that divides its values, for
        `fitting` to report), keeping the largest of its range as `max_shape`."""
        elastic = {name: s for name, s in ((n, ops.VirtualSlice.from_op(op)) for n, op in slice_ops.items())
                   if s.well_formed and s.elastic and s.range_problem() is None}
        values = sharded_on(module) if elastic else {}
        for name, s in elastic.items():
            island = self.pins[name][0] if name in self.pins else None
            dividing = s.shapes(values.get(name, ()))
            if not dividing:
                continue                       # pw-verify reports the shape that does not divide
            shape = fitted_shape(s, topology, values.get(name, ()), island) or dividing[-1]
            ops.set_attr(slice_ops[name], "shape", shape)
            ops.set_attr(slice_ops[name], "constraints", {**s.constraints, "max_shape": s.shape_range[1]})

    def fitting(self, op: ir.Operation, s: ops.VirtualSlice, placer: _Placer,
                diagnostics: DiagnosticEngine) -> list[Island] | None:
        """Returns the islands that can hold slice `s`, or reports that none can."""
        fits = [i for i in placer.topology.islands if placer.mismatch(s, i) is None]
        if fits:
            return fits
        need = placer.needs.get(s.name)
        names = [i.name for i in placer.topology.islands]
        if "island" in s.constraints and s.constraints["island"] not in names:
            diagnostics.error(op, f"cannot place slice @{s.name}: it asks for island '{s.constraints['island']}', "
                                  f"which the topology does not have (islands: {', '.join(names)})")
        elif need is not None and all(need.bytes > i.device_memory_bytes for i in placer.topology.islands):
            most = max(i.device_memory_bytes for i in placer.topology.islands)
            diagnostics.error(need.location, f"cannot place slice @{s.name}: {_memory(need)}, but no island's "
                                             f"devices have more than {most} bytes")
        else:
            diagnostics.error(op, f"cannot place slice @{s.name}: it needs {_needs(s)}; free: {placer.free()}")
        return None

    def pinned(self, op: ir.Operation, s: ops.VirtualSlice, placer: _Placer,
               diagnostics: DiagnosticEngine) -> Window | list[Island] | None:
        """Returns the pinned island (or window) of slice `s`, or reports why it cannot hold it."""
        island_name, first = self.pins[s.name]
        try:
            island = placer.topology.island(island_name)
        except TopologyError as e:
            diagnostics.error(op, f"slice @{s.name} is pinned to island '{island_name}': {e}")
            return None
        why = placer.mismatch(s, island)
        if why is not None:
            diagnostics.error(op, f"slice @{s.name} is pinned to {island.name}, which cannot hold it: {why} "
                                  f"(the slice needs {_needs(s)})")
            return None
        if first is None:
            return [island]
        devices = placer.loads.devices[island.name]
        down = [d for d in devices.down if first <= d < first + s.size]
        if first + s.size > island.num_devices or down:
            problem = f"device {down[0]} is unavailable" if down else f"{island.name} has {island.num_devices} devices"
            diagnostics.error(op, f"slice @{s.name} is pinned to devices [{first}, {first + s.size}) of "
                                  f"{island.name}, but {problem}")
            return None
        return Window(island.name, devices.position(first), s.size)
