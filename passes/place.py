"""`pw-place`: maps every virtual slice to physical devices of one island.

The resource manager's map, as a pass. Each slice gets `size` distinct
devices (one physical device per virtual device) of one island that meets
its constraints: `device_kind`, `island`, `min_memory_bytes` (per device);
`same_island` always holds, since a slice never spans islands. Unavailable
devices are skipped. Slices may share devices (their computations are then
time-multiplexed by the island's scheduler), so the heuristic balances the
number of virtual devices each physical device serves, as the paper's
resource manager does. Slices are placed in module order:

- `strategy=spread` (default): the window of consecutive available devices
  with the least load, ties broken towards the least loaded island, then the
  first island, then the first window;
- `strategy=pack`: the first island that still has a window of idle devices,
  else the least loaded window anywhere.

`pin="v0=island1:4,v1=island0"` forces slice @v0 onto devices [4, 4+size) of
island1 and slice @v1 onto island0 (devices chosen by the strategy); a pin
must still meet the slice's constraints.

The placement is written as `pw.placement = {island, devices}` with devices
as half-open ranges of island-local ids in mesh order, so its size does not
grow with the device count. The topology comes from option `topology`
(a JSON file, or `<islands>x<devices>`) or else from the module's
`pw.topology`; the one used is written to the module's `pw.topology`.
Existing placements are replaced.

Requires: a module whose slices pass pw-verify.

    // before (topology=2x4)
    "pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}}
    "pw.virtual_slice"() {sym_name = "b", shape = array<i64: 4>, axes = ["x"], constraints = {}}
    // after
    module attributes {pw.topology = {...}} {
    "pw.virtual_slice"() {..., pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, sym_name = "a"}
    "pw.virtual_slice"() {..., pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, sym_name = "b"}
"""

from __future__ import annotations

import re

import numpy as np
from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.topology import Island, Topology, TopologyError

from .registry import Option, OptionError, Pass, register

STRATEGIES = ("spread", "pack")
_PIN = re.compile(r"(?P<slice>[\w.$-]+)=(?P<island>[\w.$-]+)(?::(?P<first>\d+))?")


def parse_pins(text: str) -> dict[str, tuple[str, int | None]]:
    """Parses `v0=island1:4,v1=island0` into {slice: (island, first device or None)}."""
    pins: dict[str, tuple[str, int | None]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _PIN.fullmatch(item)
        if match is None:
            raise OptionError(f"pin '{item}' of 'pw-place' must be slice=island or slice=island:first_device")
        first = match["first"]
        pins[match["slice"]] = (match["island"], None if first is None else int(first))
    return pins


def device_ranges(ids: np.ndarray) -> tuple[int, ...]:
    """Compresses sorted device ids into half-open ranges (b0, e0, b1, e1, ...)."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(ids)]))
    return tuple(int(v) for pair in zip(ids[starts], ids[ends - 1] + 1) for v in pair)


def _needs(s: ops.VirtualSlice) -> str:
    """Says in words what a slice needs, for error messages."""
    c = s.constraints
    words = [f"{s.size} devices"]
    if "device_kind" in c:
        words.append(f"of kind '{c['device_kind']}'")
    if "min_memory_bytes" in c:
        words.append(f"with at least {c['min_memory_bytes']} bytes each")
    words.append(f"in island '{c['island']}'" if "island" in c else "in one island")
    return " ".join(words)


def _mismatch(s: ops.VirtualSlice, island: Island, available: int) -> str | None:
    """Returns why `island` cannot hold slice `s`, or None if it can."""
    c = s.constraints
    if "island" in c and c["island"] != island.name:
        return f"the slice asks for island '{c['island']}'"
    if "device_kind" in c and c["device_kind"] != island.device_kind:
        return f"its devices are of kind '{island.device_kind}'"
    if c.get("min_memory_bytes", 0) > island.device_memory_bytes:
        return f"its devices have {island.device_memory_bytes} bytes"
    if available < s.size:
        return f"it has {available} available devices"
    return None


class _Placer:
    """Load per device and the choice of devices for one slice at a time."""

    def __init__(self, topology: Topology, strategy: str):
        self.topology = topology
        self.strategy = strategy
        self.available = {i.name: np.array(i.available(), dtype=np.int64) for i in topology.islands}
        self.load = {i.name: np.zeros(i.num_devices, dtype=np.int64) for i in topology.islands}

    def free(self) -> str:
        """Describes every island's available devices, for error messages."""
        return ", ".join(f"{i.name} has {len(self.available[i.name])} of {i.num_devices} devices available "
                         f"({i.device_kind}, {i.device_memory_bytes} bytes each)" for i in self.topology.islands)

    def mismatch(self, s: ops.VirtualSlice, island: Island) -> str | None:
        return _mismatch(s, island, len(self.available[island.name]))

    def best_window(self, island: str, size: int) -> tuple[int, int]:
        """Returns (load, start) of the least loaded window of `size` available devices."""
        loads = self.load[island][self.available[island]]
        sums = np.concatenate(([0], np.cumsum(loads)))
        windows = sums[size:] - sums[:-size]
        start = int(np.argmin(windows))
        return int(windows[start]), start

    def choose(self, s: ops.VirtualSlice, islands: list[Island]) -> tuple[str, np.ndarray]:
        """Picks the island and devices of slice `s` among islands that can hold it."""
        candidates = []
        for index, island in enumerate(islands):
            load, start = self.best_window(island.name, s.size)
            total = int(self.load[island.name].sum())
            if self.strategy == "spread":
                key = (load, total, index)
            else:
                key = (0, index) if load == 0 else (1, load, index)
            candidates.append((key, island.name, start))
        _, name, start = min(candidates)
        return name, self.available[name][start:start + s.size]

    def take(self, island: str, devices: np.ndarray) -> tuple[int, ...]:
        """Records the load of a placement and returns its device ranges."""
        self.load[island][devices] += 1
        return device_ranges(devices)


@register
class PlacePass(Pass):
    __doc__ = __doc__
    name = "pw-place"
    summary = "Map every virtual slice to devices of one island, spreading load"
    options = (
        Option("topology", str, "", "a JSON file or <islands>x<devices>; default: the module's pw.topology"),
        Option("strategy", str, "spread", "spread (balance load over islands and devices) or pack"),
        Option("pin", str, "", "slice=island[:first_device],... placements to force"),
    )

    def __init__(self, **options):
        super().__init__(**options)
        if self.values["strategy"] not in STRATEGIES:
            raise OptionError(f"option 'strategy' of 'pw-place' takes {' or '.join(STRATEGIES)}, "
                              f"not '{self.values['strategy']}'")
        self.pins = parse_pins(self.values["pin"])
        self.topology = None
        if self.values["topology"]:
            try:
                self.topology = Topology.from_option(self.values["topology"])
            except TopologyError as e:
                raise OptionError(str(e)) from None

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        topology = self.topology or ops.required_topology(
            module, diagnostics, "pw-place needs a topology: give option topology=<file.json or "
                                 "<islands>x<devices>> or set pw.topology on the module")
        if topology is None:
            return
        ops.set_attr(module, ops.TOPOLOGY, topology.to_python())
        slice_ops = {ops.symbol_name(op): op for op in ops.top_level_ops(module) if op.name == "pw.virtual_slice"}
        for name in self.pins:
            if name not in slice_ops:
                diagnostics.error(module, f"pin names slice @{name}, which is not in this module")
        placer = _Placer(topology, self.values["strategy"])
        for op in slice_ops.values():
            s = ops.VirtualSlice.from_op(op)
            placed = self.place_pinned(op, s, placer, diagnostics) if s.name in self.pins \
                else self.place_free(op, s, placer, diagnostics)
            if placed is not None:
                island, devices = placed
                ops.set_attr(op, ops.PLACEMENT, {"island": island, "devices": placer.take(island, devices)})

    def place_free(self, op: ir.Operation, s: ops.VirtualSlice, placer: _Placer,
                   diagnostics: DiagnosticEngine) -> tuple[str, np.ndarray] | None:
        fits = [i for i in placer.topology.islands if placer.mismatch(s, i) is None]
        if not fits:
            diagnostics.error(op, f"cannot place slice @{s.name}: it needs {_needs(s)}; free: {placer.free()}")
            return None
        return placer.choose(s, fits)

    def place_pinned(self, op: ir.Operation, s: ops.VirtualSlice, placer: _Placer,
                     diagnostics: DiagnosticEngine) -> tuple[str, np.ndarray] | None:
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
            return placer.choose(s, [island])
        devices = np.arange(first, first + s.size, dtype=np.int64)
        down = sorted(set(island.unavailable) & set(range(first, first + s.size)))
        if first + s.size > island.num_devices or down:
            problem = f"device {down[0]} is unavailable" if down else f"{island.name} has {island.num_devices} devices"
            diagnostics.error(op, f"slice @{s.name} is pinned to devices [{first}, {first + s.size}) of "
                                  f"{island.name}, but {problem}")
            return None
        return island.name, devices
