"""The cost model and device bookkeeping behind `pw-place` (its --pass-help describes the model).

Devices are addressed per island by *position* among its available devices,
and a slice's devices are a `Window` of consecutive positions, so every query
here costs O(slices + unavailable devices), never O(devices). `Model` reads a
module's programs once and estimates the step time of any placement.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.device_time import device_rates
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.dialect.topology import Island, Topology

from .cost import compute_cost, executable_cost


Home = tuple[str, Sharding]


@dataclass(frozen=True, order=True)
class Window:
    """Devices [start, start + size) by position among an island's available devices."""

    island: str
    start: int
    size: int

    @property
    def end(self) -> int:
        """Returns the position after the window's last device."""
        return self.start + self.size


class Devices:
    """An island's available devices, by position; O(unavailable) per query."""

    def __init__(self, island: Island):
        self.island = island
        self.down = tuple(sorted(island.unavailable))
        self.count = island.num_devices - len(self.down)

    def position(self, device: int) -> int:
        """Returns the position of available device `device`."""
        return device - bisect.bisect_left(self.down, device)

    def ranges(self, window: Window) -> tuple[int, ...]:
        """Returns a window's devices as half-open ranges of island-local ids (b0, e0, b1, e1, ...)."""
        device = window.start
        for u in self.down:  # the window's first device: skip every unavailable device before it
            if u > device:
                break
            device += 1
        out: list[int] = []
        remaining = window.size
        i = bisect.bisect_right(self.down, device)
        while remaining:
            end = device + remaining if i == len(self.down) else min(device + remaining, self.down[i])
            out += [device, end]
            remaining -= end - device
            device = end
            while i < len(self.down) and self.down[i] == device:
                device, i = device + 1, i + 1
        return tuple(out)


class Loads:
    """The windows placed on each island: a device's load is the number of windows covering it."""

    def __init__(self, topology: Topology):
        self.devices = {i.name: Devices(i) for i in topology.islands}
        self.windows: dict[str, list[Window]] = {i.name: [] for i in topology.islands}

    def add(self, window: Window) -> None:
        """Records a placed window."""
        self.windows[window.island].append(window)

    def remove(self, window: Window) -> None:
        """Forgets one placed window."""
        self.windows[window.island].remove(window)

    def total(self, island: str) -> int:
        """Returns the summed load of an island's devices."""
        return sum(w.size for w in self.windows[island])

    def load(self, window: Window) -> int:
        """Returns the summed load of a window's devices."""
        return sum(max(0, min(w.end, window.end) - max(w.start, window.start)) for w in self.windows[window.island])

    def best_window(self, island: str, size: int) -> tuple[int, Window]:
        """Returns (load, window) of the first least loaded window of `size` available devices.

        A window's load changes slope only where a placed window starts or
        ends, so the first minimum starts at 0, at such a point, or `size`
        before one.
        """
        last = self.devices[island].count - size
        points = {0, last}
        for w in self.windows[island]:
            points.update((w.start, w.end, w.start - size, w.end - size))
        return min((self.load(Window(island, s, size)), Window(island, s, size))
                   for s in points if 0 <= s <= last)


@dataclass(frozen=True)
class Need:
    """The most memory a slice's computations need per device, and the largest value in it."""

    bytes: int
    compute: str
    value: str
    value_bytes: int
    location: ir.Location      # the computation's, where an error that it fits nowhere is reported


@dataclass
class _Node:
    slice: str | None              # None: a host step (pw.cond, or data movement already inserted)
    flops: int
    bytes: int
    inputs: list[tuple[int, Home | None]]   # (value id, where it is used; None: the host reads it)
    outputs: list[tuple[int, Home | None]]  # (value id, where it is made; None: a host value)


@dataclass
class Estimate:
    """A placement's estimated step time and, per slice, its compute and incoming transfer time."""

    step_s: float
    compute_s: dict[str, float] = field(default_factory=dict)
    transfer_s: dict[str, float] = field(default_factory=dict)


def rename_axes(sharding: Sharding, src: ops.VirtualSlice, dst: ops.VirtualSlice) -> Sharding:
    """Returns `sharding` over `src`'s axes written with `dst`'s axes (same mesh shape, axis by axis)."""
    names = dict(zip(src.axes, dst.axes))
    return Sharding(tuple(tuple(names[a] for a in axes) for axes in sharding.dims))


def same_layout(have: Home, want: Home, slices: dict[str, ops.VirtualSlice]) -> bool:
    """True if two slices of the same mesh shape hold a value in the same layout, axis by axis."""
    src, dst = slices[have[0]], slices[want[0]]
    return src.shape == dst.shape and rename_axes(have[1], src, dst) == want[1]


class Model:
    """A module's programs, read once, and the estimated step time of any placement."""

    def __init__(self, module: ir.Operation, topology: Topology, slices: dict[str, ops.VirtualSlice]):
        self.topology = topology
        self.slices = slices
        self.islands = {i.name: i for i in topology.islands}
        self.programs: list[list[_Node]] = []
        self.values: list[int] = []  # bytes by value id
        self.needs: dict[str, Need] = {}
        self.unknown_trip_counts: dict[str, int] = {}  # per slice: loops its computations count once
        self._layouts: dict[tuple[Home, Home], bool] = {}  # (have, want) -> same_layout
        costs = {name: executable_cost(e) for name, e in ops.executables(module).items()}
        for program in ops.programs(module).values():
            self.programs.append(self._read(program, costs))
        self.ops = sum(len(nodes) for nodes in self.programs)  # what one estimate walks
        # The slices computations run on or values live on: where any other slice goes changes no estimate.
        self.used_slices = {node.slice for nodes in self.programs for node in nodes} | {
            home[0] for nodes in self.programs for node in nodes for _, home in (*node.inputs, *node.outputs) if home}

    def _value(self, value: ir.Value, ids: dict[ir.Value, int]) -> int:
        if value not in ids:
            ids[value] = len(self.values)
            self.values.append(ops.tensor_bytes(value.type) if isinstance(value.type, ir.RankedTensorType) else 0)
        return ids[value]

    def _read(self, program: ir.Operation, costs) -> list[_Node]:
        ids: dict[ir.Value, int] = {}
        state = ir.AsmState(program)
        nodes = []
        for op in ops.program_body(program).operations:
            op = op.operation
            compute = ops.Compute.match(op)
            if compute is not None:
                name = compute.slice
                s = self.slices.get(name)
                if s is None or compute.callee not in costs:
                    continue  # pw-verify reports it
                cost = compute_cost(op, costs[compute.callee], s)
                if cost.unknown_trip_counts:
                    self.unknown_trip_counts[name] = self.unknown_trip_counts.get(name, 0) + cost.unknown_trip_counts
                inputs = [(self._value(v, ids), (name, sh)) for v, sh in zip(op.operands, ops.in_shardings(op))]
                outputs = [(self._value(v, ids), (name, sh)) for v, sh in zip(op.results, ops.out_shardings(op))]
                nodes.append(_Node(name, cost.flops, cost.bytes, inputs, outputs))
                self._note_need(op, s, state)
            elif op.name != "func.return":  # a host step: it reads its operands, its results start on the host
                nodes.append(_Node(None, 0, 0, [(self._value(v, ids), None) for v in op.operands],
                                   [(self._value(v, ids), None) for v in op.results]))
        return nodes

    def _note_need(self, op: ir.Operation, s: ops.VirtualSlice, state: ir.AsmState) -> None:
        """Records the per-device bytes of a computation's operands and results if the most on its slice."""
        sizes = s.axis_sizes
        parts = [(ops.tensor_bytes(v.type) // sh.ways(sizes), v) for v, sh in
                 [*zip(op.operands, ops.in_shardings(op)), *zip(op.results, ops.out_shardings(op))]
                 if isinstance(v.type, ir.RankedTensorType)]
        if not parts:
            return
        total = sum(b for b, _ in parts)
        if total > (self.needs[s.name].bytes if s.name in self.needs else -1):
            largest, value = max(parts, key=lambda p: p[0])
            self.needs[s.name] = Need(total, ops.attr(op, "label") or op.name,
                                      f"{value.get_name(state)} ({value.type})", largest, op.location)

    # -- estimates ---------------------------------------------------------

    def compute_seconds(self, node: _Node, island: str) -> float:
        """Returns one computation's time on each device of its slice, on `island`'s kind of device."""
        flops_rate, bytes_rate = device_rates(self.islands[island].device_kind)
        return node.flops / flops_rate + node.bytes / bytes_rate

    def move_seconds(self, value: int, have: Home, want: Home, plan: dict[str, Window]) -> tuple[float, bool]:
        """Returns the time to move a value from `have` to `want`, and whether it crosses the DCN."""
        if have == want:
            return 0.0, False
        a, b = plan[have[0]], plan[want[0]]
        if a == b and self._same_layout(have, want):
            return 0.0, False
        nbytes = self.values[value]
        if a.island == b.island:
            ici = self.islands[a.island].ici
            dst = self.slices[want[0]]
            shard = nbytes // max(1, math.prod(want[1].dim_ways(dst.axis_sizes)))
            return ici.transfer_seconds(shard), False
        if not self.topology.connected(a.island, b.island):
            return math.inf, True
        return self.topology.dcn.transfer_seconds(nbytes), True

    def _same_layout(self, have: Home, want: Home) -> bool:
        """`same_layout`, computed once per pair of homes (the search asks again for every candidate)."""
        same = self._layouts.get((have, want))
        if same is None:
            same = self._layouts[have, want] = same_layout(have, want, self.slices)
        return same

    def estimate(self, plan: dict[str, Window]) -> Estimate:
        """Returns the estimated step time of `plan`; slices it does not place cost nothing."""
        result = Estimate(0.0, {s: 0.0 for s in plan}, {s: 0.0 for s in plan})
        dcn: dict[str, float] = {}            # DCN seconds per island that sends or receives (few: not all islands)
        for nodes in self.programs:
            ready: dict[int, float] = {}
            homes: dict[int, Home | None] = {}
            moved: dict[tuple[int, Home], float] = {}
            for node in nodes:
                start = 0.0
                for value, want in node.inputs:
                    have = homes.get(value)
                    at = ready.get(value, 0.0)
                    if want is not None and have is None:
                        homes[value] = want  # a host value starts where it is first used
                    elif want is not None and have[0] in plan and want[0] in plan:
                        if (value, want) not in moved:
                            seconds, crosses = self.move_seconds(value, have, want, plan)
                            moved[value, want] = seconds
                            result.transfer_s[want[0]] += seconds
                            if crosses:
                                for island in (plan[have[0]].island, plan[want[0]].island):
                                    dcn[island] = dcn.get(island, 0.0) + seconds
                        at += moved[value, want]
                    start = max(start, at)
                finish = start
                if node.slice in plan:
                    seconds = self.compute_seconds(node, plan[node.slice].island)
                    result.compute_s[node.slice] += seconds
                    finish += seconds
                for value, home in node.outputs:
                    ready[value], homes[value] = finish, home
                result.step_s = max(result.step_s, finish)
        result.step_s = max(result.step_s, *dcn.values(), self._busiest(plan, result.compute_s))
        return result

    def _busiest(self, plan: dict[str, Window], compute_s: dict[str, float]) -> float:
        """Returns the largest busy time of any device: the compute of every window covering it."""
        events: dict[str, list[tuple[int, float]]] = {}
        for name, window in plan.items():
            if compute_s[name]:                  # (a slice nothing computes on adds no busy time)
                events.setdefault(window.island, []).extend(
                    [(window.start, compute_s[name]), (window.end, -compute_s[name])])
        busiest = 0.0
        for points in events.values():
            busy = 0.0
            for _, delta in sorted(points, key=lambda p: (p[0], p[1] > 0)):
                busy += delta
                busiest = max(busiest, busy)
        return busiest
