"""`pw-verify-plans`: checks the per-island and host plans before any host or device work.

The runtime trusts a plan: a launch reading a buffer nothing writes, or an
island order that contradicts the dependencies, would hang it. This pass
checks every `module {pw.island_plan}` and `module {pw.host_plan}` of the
module, per program, and reports each problem at the plan op at fault,
naming the step or buffer:

- marks: each plan names its program (and its island, one of the
  topology's); one host plan per program, one island plan per island;
- buffers: ids unique; a statically shaped tensor type of known element
  size, every dimension positive, at most `MAX_BUFFER_BYTES` in all; a home
  on a placed slice of the plan's island (none in the host plan), whose
  sharding splits the shape evenly; `bytes_per_device` equal to the size
  computed from shape, element type and sharding;
- steps: ids unique in the module; every referenced buffer declared, on the
  island the step runs on (a send's peer buffer on its peer island); a
  launch's executable and slice exist, its devices are its slice's, within
  the island; sizes (`bytes`, `output_bytes`) equal their buffers'; a
  branch's programs have plans;
- dataflow: every buffer written by at most one step; every buffer read has
  a writer (or is a program input) that the reader waits for (`after`);
  every recv has its send and every send its recv, the recv waiting for it;
- order: `after` names steps of the same program, each island lists a step
  after the steps of its island it waits for, and the island orders with
  the `after` dependencies have no cycle (which would deadlock).

Requires: pw-emit-plans (and the module's `pw.topology`); changes nothing.

    // error: step 1 reads buffer 7, which no plan of @main declares
    module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
      "pw.launch"() {step = 1 : i64, inputs = array<i64: 7>, ...} : () -> ()
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.homes import Home, bytes_per_device
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.dialect.topology import Topology

from .registry import Pass, register

# A bound on one buffer, far above any device's memory: sizes stay exact
# integers in i64 and in JSON.
MAX_BUFFER_BYTES = 1 << 50
HOST = "host"
ISLAND_STEPS = ("pw.launch", "pw.copy", "pw.send", "pw.recv", "pw.free")
# What each step reads and writes (attribute names holding buffer ids).
# Array attributes of each step (ids, device ranges, sizes).
ARRAYS = {"pw.launch": ("inputs", "outputs", "devices", "output_bytes"), "pw.branch": ("inputs", "outputs"),
          "pw.send": ("devices",), "pw.recv": ("devices",), "pw.copy": (), "pw.free": ("buffers",)}
READS = {"pw.launch": ("inputs",), "pw.copy": ("src_buffer",), "pw.send": ("buffer",), "pw.branch": ("pred", "inputs")}
WRITES = {"pw.launch": ("outputs",), "pw.copy": ("dst_buffer",), "pw.recv": ("buffer",), "pw.branch": ("outputs",)}


class _Invalid(Exception):
    """An attribute of the wrong kind, already reported."""


@dataclass
class _Buffer:
    op: ir.Operation
    where: str                      # island name, or HOST
    bytes_per_device: int | None    # None: the declaration is malformed


@dataclass
class _Step:
    op: ir.Operation
    where: str
    id: int
    after: tuple[int, ...]
    attrs: dict[str, Any]


@dataclass
class _Program:
    """The plans of one program, as read from the module."""

    name: str
    host: ir.Operation | None = None
    host_mark: dict[str, Any] = field(default_factory=dict)
    islands: dict[str, ir.Operation] = field(default_factory=dict)
    buffers: dict[int, _Buffer] = field(default_factory=dict)
    steps: dict[int, _Step] = field(default_factory=dict)
    order: dict[str, list[int]] = field(default_factory=dict)   # island -> step ids as listed


class _Checker:
    """Reads and checks the plans of one module."""

    def __init__(self, module: ir.Operation, topology: Topology, diagnostics: DiagnosticEngine):
        self.module = module
        self.topology = topology
        self.islands = {i.name: i for i in topology.islands}
        self.diagnostics = diagnostics
        self.slices: dict[str, tuple[ops.VirtualSlice, dict]] = {}
        for op in ops.top_level_ops(module):
            placement = ops.attr(op, ops.PLACEMENT) if op.name == "pw.virtual_slice" else None
            placed = isinstance(placement, dict) and isinstance(placement.get("island"), str) \
                and isinstance(placement.get("devices"), tuple)
            s = ops.VirtualSlice.from_op(op) if placed else None
            if s is not None and s.well_formed:
                self.slices[s.name] = (s, placement)
        self.executables = ops.executables(module)
        self.program_names = set(ops.programs(module))
        self.programs: dict[str, _Program] = {}
        self.step_ids: dict[int, ir.Operation] = {}

    def error(self, op: ir.Operation, message: str) -> None:
        self.diagnostics.error(op, f"'{op.name}' op {message}")

    def value(self, op: ir.Operation, key: str, kind: type, what: str) -> Any:
        """Returns attribute `key` as a Python value of `kind`; reports and raises _Invalid otherwise."""
        value = ops.attr(op, key)
        if kind is tuple:
            ok = isinstance(value, tuple) and all(type(v) is int for v in value)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            self.error(op, f"attribute '{key}' must be {what}")
            raise _Invalid
        return value

    # -- reading -------------------------------------------------------------

    def read(self) -> None:
        for op in ops.top_level_ops(self.module):
            try:
                if ops.HOST_PLAN in op.attributes:
                    self.read_host(op)
                elif ops.ISLAND_PLAN in op.attributes:
                    self.read_island(op)
            except _Invalid:
                continue

    def program(self, op: ir.Operation, mark: dict) -> _Program:
        name = mark.get("program")
        if not isinstance(name, str) or name not in self.program_names:
            self.error(op, f"is a plan of @{name}, which is not a program of this module")
            raise _Invalid
        return self.programs.setdefault(name, _Program(name))

    def read_host(self, op: ir.Operation) -> None:
        mark = self.value(op, ops.HOST_PLAN, dict, "a dictionary {program, inputs, outputs, subgraphs}")
        program = self.program(op, mark)
        if program.host is not None:
            self.error(op, f"is a second host plan of @{program.name}")
            raise _Invalid
        for key in ("inputs", "outputs"):
            if not (isinstance(mark.get(key), tuple) and all(isinstance(b, int) for b in mark[key])):
                self.error(op, f"host plan of @{program.name} needs '{key}' = array<i64: buffer ids>")
                raise _Invalid
        program.host, program.host_mark = op, mark
        self.read_contents(op, program, HOST)

    def read_island(self, op: ir.Operation) -> None:
        mark = self.value(op, ops.ISLAND_PLAN, dict, "a dictionary {island, program}")
        program = self.program(op, mark)
        island = mark.get("island")
        if not isinstance(island, str) or island not in self.islands:
            self.error(op, f"is a plan of @{program.name} for island '{island}', which the topology does not have "
                           f"(islands: {', '.join(self.islands)})")
            raise _Invalid
        if island in program.islands:
            self.error(op, f"is a second plan of @{program.name} for island '{island}'")
            raise _Invalid
        program.islands[island] = op
        self.read_contents(op, program, island)

    def read_contents(self, plan: ir.Operation, program: _Program, where: str) -> None:
        program.order.setdefault(where, [])
        for op in plan.regions[0].blocks[0].operations:
            op = op.operation
            try:
                if op.name == "pw.buffer":
                    self.read_buffer(op, program, where)
                elif op.name in ISLAND_STEPS and where != HOST or op.name == "pw.branch" and where == HOST:
                    self.read_step(op, program, where)
                else:
                    self.error(op, f"is not a step of {'a host' if where == HOST else 'an island'} plan")
            except _Invalid:
                continue

    def read_buffer(self, op: ir.Operation, program: _Program, where: str) -> None:
        buffer = self.value(op, "id", int, "an integer buffer id")
        if buffer in program.buffers:
            self.error(op, f"declares buffer {buffer} of @{program.name} a second time")
            raise _Invalid
        # Declared, even if malformed: its uses are not reported again.
        program.buffers[buffer] = found = _Buffer(op, where, None)
        type_ = self.value(op, "type", ir.Type, "a tensor type")
        home_value = self.value(op, "home", dict, "a dictionary {slice, sharding}, or {} on the host")
        declared = self.value(op, "bytes_per_device", int, "an integer")
        size = self.tensor_size(op, buffer, type_)
        home = self.home(op, buffer, home_value, type_, where)
        expected = bytes_per_device(type_, home, {n: s for n, (s, _) in self.slices.items()})
        if declared != expected:
            self.error(op, f"buffer {buffer} declares {declared} bytes per device, but {type_} "
                           f"{'on the host' if home is None else f'split {size // expected}-way on @{home.slice}'} "
                           f"is {expected}")
        found.bytes_per_device = expected

    def tensor_size(self, op: ir.Operation, buffer: int, type_: ir.Type) -> int:
        if not (isinstance(type_, ir.RankedTensorType) and ir.RankedTensorType(type_).has_static_shape):
            self.error(op, f"buffer {buffer} has type {type_}, but buffers are statically shaped tensors")
            raise _Invalid
        shape = ops.tensor_shape(type_)
        if any(d <= 0 for d in shape):
            self.error(op, f"buffer {buffer} has shape {list(shape)}: every dimension must be positive")
            raise _Invalid
        try:
            size = ops.tensor_bytes(type_)
        except ValueError as e:
            self.error(op, f"buffer {buffer}: {e}")
            raise _Invalid from None
        if size > MAX_BUFFER_BYTES:
            self.error(op, f"buffer {buffer} of type {type_} has {size} bytes, more than {MAX_BUFFER_BYTES}")
            raise _Invalid
        return size

    def home(self, op: ir.Operation, buffer: int, value: dict, type_: ir.Type, where: str) -> Home | None:
        """Returns a buffer's checked home (None on the host); reports and raises _Invalid if wrong."""
        if not value:
            if where != HOST:
                self.error(op, f"buffer {buffer} has no home slice, but only host buffers have none")
                raise _Invalid
            return None
        if where == HOST:
            self.error(op, f"buffer {buffer} of the host plan has a home on a slice")
            raise _Invalid
        slice_name, sharding = value.get("slice"), value.get("sharding")
        if not isinstance(slice_name, str) or slice_name not in self.slices:
            self.error(op, f"buffer {buffer} lives on @{slice_name}, which is not a placed slice of this module")
            raise _Invalid
        s, placement = self.slices[slice_name]
        if placement.get("island") != where:
            self.error(op, f"buffer {buffer} lives on @{slice_name} in {placement.get('island')}, "
                           f"but is declared in the plan of {where}")
            raise _Invalid
        checked = Sharding.checked(sharding)
        if checked is None:
            self.error(op, f"buffer {buffer} has a sharding that is not a list of lists of axis names")
            raise _Invalid
        problems = checked.problems(ops.tensor_shape(type_), s.axis_sizes)
        if problems:
            self.error(op, f"buffer {buffer} on @{slice_name}: {problems[0]}")
            raise _Invalid
        return Home(slice_name, checked)

    def read_step(self, op: ir.Operation, program: _Program, where: str) -> None:
        step = self.value(op, "step", int, "an integer step id")
        if step in self.step_ids:
            self.error(op, f"step {step} reuses the id of another step")
            raise _Invalid
        self.step_ids[step] = op
        after = self.value(op, "after", tuple, "array<i64: step ids>")
        attrs = {k: self.value(op, k, tuple, "array<i64: ...>") for k in ARRAYS[op.name]}
        for key in ("src_buffer", "dst_buffer", "buffer", "peer_buffer", "bytes", "pred"):
            if key in op.attributes:
                attrs[key] = self.value(op, key, int, "an integer")
        for key in ("peer", "executable", "slice", "then_program", "else_program"):
            if key in op.attributes:
                attrs[key] = self.value(op, key, str, "a name")
        program.steps[step] = _Step(op, where, step, after, attrs)
        program.order[where].append(step)

    # -- checking ------------------------------------------------------------

    def check(self) -> None:
        for program in self.programs.values():
            if program.host is None:
                anchor = next(iter(program.islands.values()))
                self.error(anchor, f"is a plan of @{program.name}, which has no host plan")
                continue
            for step in program.steps.values():
                self.check_step(program, step)
            self.check_dataflow(program)
            self.check_order(program)

    def buffer(self, program: _Program, step: _Step, buffer: int, where: str | None = None) -> _Buffer | None:
        found = program.buffers.get(buffer)
        if found is None:
            self.error(step.op, f"step {step.id} uses buffer {buffer}, which no plan of @{program.name} declares")
            return None
        where = step.where if where is None else where
        if step.where != HOST and found.where != where:
            self.error(step.op, f"step {step.id} on {where} uses buffer {buffer}, which lives on {found.where}")
            return None
        return found

    def check_devices(self, step: _Step, island: str, ranges: tuple[int, ...]) -> bool:
        """Reports device ranges outside the island; True if they are within it."""
        count = self.islands[island].num_devices
        if len(ranges) % 2 or not all(0 <= b < e <= count for b, e in zip(ranges[::2], ranges[1::2])):
            self.error(step.op, f"step {step.id} runs on devices {list(ranges)}, which are not ranges "
                                f"[begin, end) within the {count} devices of {island}")
            return False
        return True

    def check_step(self, program: _Program, step: _Step) -> None:
        a, op = step.attrs, step.op
        for b in _buffers(step, ("inputs", "outputs", "src_buffer", "dst_buffer", "pred", "buffers")):
            self.buffer(program, step, b)
        if op.name == "pw.launch":
            self.check_launch(program, step)
        elif op.name in ("pw.send", "pw.recv"):
            self.check_exchange(program, step)
        elif op.name == "pw.copy":
            dst = program.buffers.get(a["dst_buffer"])
            if dst is not None and dst.bytes_per_device not in (None, a["bytes"]):
                self.error(op, f"step {step.id} copies {a['bytes']} bytes, but buffer {a['dst_buffer']} "
                               f"has {dst.bytes_per_device} per device")
        elif op.name == "pw.branch":
            for key in ("then_program", "else_program"):
                if a[key] not in self.programs or self.programs[a[key]].host is None:
                    self.error(op, f"step {step.id} runs @{a[key]} ('{key}'), which has no plans")

    def check_launch(self, program: _Program, step: _Step) -> None:
        a, op = step.attrs, step.op
        if a["executable"] not in self.executables:
            self.error(op, f"step {step.id} launches @{a['executable']}, which is not a compiled function "
                           f"of this module")
        placed = self.slices.get(a["slice"])
        if placed is None or placed[1].get("island") != step.where:
            self.error(op, f"step {step.id} runs on @{a['slice']}, which is not a slice placed on {step.where}")
            return
        if self.check_devices(step, step.where, a["devices"]) and a["devices"] != placed[1].get("devices"):
            self.error(op, f"step {step.id} runs on devices {list(a['devices'])}, but @{a['slice']} "
                           f"is placed on {list(placed[1].get('devices'))}")
        sizes = tuple(program.buffers[b].bytes_per_device if b in program.buffers else None for b in a["outputs"])
        if None not in sizes and a["output_bytes"] != sizes:
            self.error(op, f"step {step.id} has output_bytes {list(a['output_bytes'])}, but its outputs "
                           f"have {list(sizes)} bytes per device")

    def check_exchange(self, program: _Program, step: _Step) -> None:
        a, op = step.attrs, step.op
        peer = a["peer"]
        if peer not in self.islands or peer == step.where:
            self.error(op, f"step {step.id} exchanges with island '{peer}', which is not another island "
                           f"of the topology")
            return
        self.check_devices(step, step.where, a["devices"])
        self.buffer(program, step, a["buffer"])
        peer_buffer = self.buffer(program, step, a["peer_buffer"], where=peer)
        dst = peer_buffer if op.name == "pw.send" else program.buffers.get(a["buffer"])
        if dst is not None and dst.bytes_per_device not in (None, a["bytes"]):
            self.error(op, f"step {step.id} moves {a['bytes']} bytes, but the received buffer has "
                           f"{dst.bytes_per_device} per device")
        other = "pw.recv" if op.name == "pw.send" else "pw.send"
        match = [s for s in program.steps.values() if s.op.name == other and s.where == peer
                 and s.attrs["buffer"] == a["peer_buffer"] and s.attrs["peer_buffer"] == a["buffer"]
                 and s.attrs["peer"] == step.where]
        if not match:
            self.error(op, f"step {step.id} has no matching '{other}' of buffer {a['peer_buffer']} on {peer}")
        elif op.name == "pw.recv" and not any(s.id in step.after for s in match):
            self.error(op, f"step {step.id} does not wait for its send (step {match[0].id})")

    def check_dataflow(self, program: _Program) -> None:
        writer: dict[int, int] = {}
        for step in program.steps.values():
            for b in _buffers(step, WRITES.get(step.op.name, ())):
                if b in writer:
                    self.error(step.op, f"step {step.id} writes buffer {b}, which step {writer[b]} writes too")
                writer.setdefault(b, step.id)
        inputs = set(program.host_mark["inputs"])
        for step in program.steps.values():
            for b in _buffers(step, READS.get(step.op.name, ())):
                if b in writer:
                    if writer[b] not in step.after:
                        self.error(step.op, f"step {step.id} reads buffer {b} but does not wait for "
                                            f"step {writer[b]}, which writes it")
                elif b not in inputs and b in program.buffers:
                    self.error(step.op, f"step {step.id} reads buffer {b}, which no step writes and "
                                        f"which is not an input of @{program.name}")
        readers: dict[int, set[int]] = {}
        for step in program.steps.values():
            for b in _buffers(step, READS.get(step.op.name, ())):
                readers.setdefault(b, set()).add(step.id)
        for step in program.steps.values():
            if step.op.name != "pw.free":
                continue
            for b in step.attrs["buffers"]:
                early = sorted(readers.get(b, set()) - set(step.after))
                if early:
                    self.error(step.op, f"step {step.id} frees buffer {b} without waiting for step {early[0]}, "
                                        f"which reads it")
                elif b not in writer and b not in inputs:
                    self.error(step.op, f"step {step.id} frees buffer {b}, which no step writes and which is "
                                        f"not an input of @{program.name}")
                if b in program.host_mark["outputs"]:
                    self.error(step.op, f"step {step.id} frees buffer {b}, a result of @{program.name}")
        for b in program.host_mark["outputs"]:
            if b not in program.buffers:
                self.error(program.host, f"host plan of @{program.name} returns buffer {b}, which it does not declare")
            elif b not in writer and b not in inputs:
                self.error(program.host, f"host plan of @{program.name} returns buffer {b}, which no step writes")
        for b in program.host_mark["inputs"]:
            if b not in program.buffers:
                self.error(program.host, f"host plan of @{program.name} takes buffer {b}, which it does not declare")

    def check_order(self, program: _Program) -> None:
        graph = nx.DiGraph()
        for where, listed in program.order.items():
            position = {s: k for k, s in enumerate(listed)}
            for k, s in enumerate(listed):
                graph.add_node(s)
                if k and where != HOST:
                    graph.add_edge(listed[k - 1], s)
                step = program.steps[s]
                for dep in step.after:
                    if dep not in program.steps:
                        self.error(step.op, f"step {s} waits for step {dep}, which no plan of "
                                            f"@{program.name} has")
                    elif dep in position and position[dep] > k and where != HOST:
                        self.error(step.op, f"step {s} waits for step {dep}, which {where} runs after it")
                    else:
                        graph.add_edge(dep, s)
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            return
        path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        self.error(program.steps[cycle[0][1]].op, f"steps of @{program.name} wait for each other ({path}): "
                                                   f"the island orders and 'after' deadlock")


def _buffers(step: _Step, keys: tuple[str, ...]) -> list[int]:
    """Returns the buffer ids a step names under `keys` (single ids or arrays)."""
    found = []
    for key in keys:
        value = step.attrs.get(key, ())
        found.extend(value if isinstance(value, tuple) else (value,))
    return found


@register
class VerifyPlansPass(Pass):
    __doc__ = __doc__
    name = "pw-verify-plans"
    summary = "Check the emitted plans: buffers, steps, sizes, devices, dataflow and a deadlock-free order"
    changes_ir = False

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        topology = ops.required_topology(
            module, diagnostics, "pw-verify-plans needs the module's pw.topology: run pw-place first")
        if topology is None:
            return
        checker = _Checker(module, topology, diagnostics)
        checker.read()
        checker.check()
