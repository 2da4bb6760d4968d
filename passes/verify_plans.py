"""`pw-verify-plans`: checks the per-island and host plans before any host or device work.

The runtime trusts a plan: a launch reading a buffer nothing writes, or an
island order that contradicts the dependencies, would hang it. This pass
reads every `module {pw.island_plan}` and `module {pw.host_plan}` of the
module into one `ProgramPlan` per program (`dialect/plan.py`, its steps
built by their classes in `dialect/plan_steps.py`), runs
`ProgramPlan.validate` on it, and reports each problem at the op at fault
(the step or buffer op whose id the `PlanError` names; the host plan
otherwise). What only the IR form says is checked here, op by op:

- marks: each plan names its program (and its island, one of the
  topology's); one host plan per program, one island plan per island;
- attributes: each step op's attributes have the kinds its step class
  declares (`op_attributes`); buffer ids unique, their type a statically
  shaped tensor with positive dimensions, their home on a placed slice of the plan's island (none
  in the host plan) with a well-formed sharding; step ids unique in the
  module; a branch's programs have plans;
- sizes and devices: a launch runs on its slice's devices, within the
  island; `bytes` and `output_bytes` equal their buffers' bytes per device;
- types: a launch's input and output buffers have the types of its
  executable's entry function;
- dataflow: every step names in `after` the writer of each buffer it reads.

`ProgramPlan.validate` checks the rest: buffers' sizes against their shape,
element type and sharding; every buffer read has a writer (or is a
program input) on the reader's island; every recv has its send in `after`
and every send its recv; frees wait for every reader and spare the
results; each island lists a step after the steps of its island it
depends on, and the island orders with the dependencies have no cycle.

Requires: IR that passes pw-verify (the driver runs its checks first: the
plans are read against the slices, placements and topology it checks, and a
slice whose mesh does not match its axes would otherwise be reported as "not
a placed slice" at every buffer on it) and the module's `pw.topology` (an
error without it); it checks the plans pw-emit-plans writes, and a module
without plans has none to check and passes. Changes nothing.

    module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
      "pw.launch"() {step = 1, inputs = array<i64: 7>, ...} : () -> ()
    }
    // error: 'pw.launch' op plan of @main: step 1 (launch) names buffer 7, which is not declared
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.plan import BufferInfo, PlanError, ProgramPlan, SlicePlacement
from pathways_mlir.dialect.plan_reader import read_buffer, read_slice, read_step
from pathways_mlir.dialect.plan_steps import STEP_OPS, Branch, Launch, Move, Step
from pathways_mlir.dialect.sharding import Sharding, zero_size
from pathways_mlir.dialect.topology import Topology

from .registry import Pass, register

# The key of the host plan's buffers and steps beside the islands' names: an island may be named "host".
HOST = None
KIND_NAMES = {int: "an integer", tuple: "array<i64: ...>", str: "a name", dict: "a dictionary",
              ir.Type: "a tensor type"}


class _Invalid(Exception):
    """An op already reported: the rest of it is not read."""


@dataclass
class _Program:
    """The plans of one program as read from the module, and the op of each step and buffer."""

    name: str
    host: ir.Operation | None = None
    mark: dict[str, Any] = field(default_factory=dict)
    islands: dict[str, ir.Operation] = field(default_factory=dict)
    buffers: dict[int, BufferInfo] = field(default_factory=dict)
    steps: dict[str | None, list[Step]] = field(default_factory=dict)   # island (or HOST) -> steps as listed
    ops: dict[int, ir.Operation] = field(default_factory=dict)     # step id -> its op
    buffer_ops: dict[int, ir.Operation] = field(default_factory=dict)
    errors: int = 0


class _Checker:
    """Reads and checks the plans of one module."""

    def __init__(self, module: ir.Operation, topology: Topology, diagnostics: DiagnosticEngine):
        self.module = module
        self.topology = topology
        self.islands = {i.name: i for i in topology.islands}
        self.diagnostics = diagnostics
        self.slices: dict[str, SlicePlacement] = {}
        for op in ops.top_level_ops(module):
            placement = ops.attr(op, ops.PLACEMENT) if op.name == "pw.virtual_slice" else None
            placed = isinstance(placement, dict) and placement.get("island") in self.islands \
                and isinstance(placement.get("devices"), tuple)
            if placed and ops.VirtualSlice.from_op(op).well_formed:
                s = read_slice(op)
                self.slices[s.name] = s
        self.executables = ops.executables(module)
        self.program_names = set(ops.programs(module))
        self.programs: dict[str, _Program] = {}
        self.step_ids: set[int] = set()

    def error(self, op: ir.Operation, message: str, program: _Program | None = None) -> None:
        self.diagnostics.error(op, f"'{op.name}' op {message}")
        if program is not None:
            program.errors += 1

    def value(self, op: ir.Operation, key: str, kind: type, program: _Program | None = None) -> Any:
        """Returns attribute `key` as a Python value of `kind`; reports and raises _Invalid otherwise."""
        value = ops.attr(op, key)
        if kind is tuple:
            ok = isinstance(value, tuple) and all(type(v) is int for v in value)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            self.error(op, f"attribute '{key}' must be {KIND_NAMES.get(kind, kind)}", program)
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

    def program(self, op: ir.Operation, mark: Any) -> _Program:
        name = mark.get("program") if isinstance(mark, dict) else None
        if not isinstance(name, str) or name not in self.program_names:
            self.error(op, f"is a plan of @{name}, which is not a program of this module")
            raise _Invalid
        return self.programs.setdefault(name, _Program(name))

    def read_host(self, op: ir.Operation) -> None:
        mark = ops.attr(op, ops.HOST_PLAN)
        program = self.program(op, mark)
        if program.host is not None:
            self.error(op, f"is a second host plan of @{program.name}", program)
            raise _Invalid
        program.host = op
        for key in ("inputs", "outputs", "donated"):
            value = mark.get(key, () if key == "donated" else None)
            if not (isinstance(value, tuple) and all(type(b) is int for b in value)):
                self.error(op, f"host plan of @{program.name} needs '{key}' = array<i64: buffer ids>", program)
                raise _Invalid
        program.mark = mark
        self.read_contents(op, program, HOST)

    def read_island(self, op: ir.Operation) -> None:
        mark = ops.attr(op, ops.ISLAND_PLAN)
        program = self.program(op, mark)
        island = mark.get("island")
        if not isinstance(island, str) or island not in self.islands:
            self.error(op, f"is a plan of @{program.name} for island '{island}', which the topology does not have "
                           f"(islands: {', '.join(self.islands)})", program)
            raise _Invalid
        if island in program.islands:
            self.error(op, f"is a second plan of @{program.name} for island '{island}'", program)
            raise _Invalid
        peak = ops.attr(op, ops.PEAK_BYTES, ())
        if not (isinstance(peak, tuple) and all(type(v) is int for v in peak)):
            self.error(op, f"attribute '{ops.PEAK_BYTES}' must be array<i64: begin, end, bytes, ...>", program)
            raise _Invalid
        program.islands[island] = op
        self.read_contents(op, program, island)

    def read_contents(self, plan: ir.Operation, program: _Program, where: str | None) -> None:
        program.steps.setdefault(where, [])
        for op in plan.regions[0].blocks[0].operations:
            op = op.operation
            kind = STEP_OPS.get(op.name)
            try:
                if op.name == "pw.buffer":
                    self.read_buffer(op, program, where)
                elif kind is not None and kind.on_host == (where == HOST):
                    self.read_step(op, kind, program, where)
                else:
                    self.error(op, f"is not a step of {'a host' if where == HOST else 'an island'} plan", program)
            except _Invalid:
                continue

    def read_buffer(self, op: ir.Operation, program: _Program, where: str | None) -> None:
        buffer = self.value(op, "id", int, program)
        if buffer in program.buffer_ops:
            self.error(op, f"declares buffer {buffer} of @{program.name} a second time", program)
            raise _Invalid
        program.buffer_ops[buffer] = op
        type_ = self.value(op, "type", ir.Type, program)
        home = self.value(op, "home", dict, program)
        self.value(op, "bytes_per_device", int, program)
        if not (isinstance(type_, ir.RankedTensorType) and ir.RankedTensorType(type_).has_static_shape):
            self.error(op, f"buffer {buffer} has type {type_}, but buffers are statically shaped tensors", program)
            raise _Invalid
        shape = ops.tensor_shape(type_)
        if any(d < 0 for d in shape):
            self.error(op, f"buffer {buffer} has shape {list(shape)}: a dimension is negative", program)
            raise _Invalid
        if not home and where != HOST:
            self.error(op, f"buffer {buffer} has no home slice, but only host buffers have none", program)
            raise _Invalid
        if home:
            self.check_home(op, program, buffer, shape, home, where)
        program.buffers[buffer] = read_buffer(op)

    def check_home(self, op: ir.Operation, program: _Program, buffer: int, shape: tuple[int, ...], home: dict,
                   where: str | None) -> None:
        """Reports (and raises _Invalid for) a home other than a placed slice of the plan's island with a
        well-formed sharding (replicated for a buffer of `shape` with no elements)."""
        if where == HOST:
            self.error(op, f"buffer {buffer} of the host plan has a home on a slice", program)
            raise _Invalid
        slice_name, sharding = home.get("slice"), Sharding.checked(home.get("sharding"))
        placement = self.slices.get(slice_name) if isinstance(slice_name, str) else None
        if placement is None:
            self.error(op, f"buffer {buffer} lives on @{slice_name}, which is not a placed slice of this module",
                       program)
            raise _Invalid
        if placement.island != where:
            self.error(op, f"buffer {buffer} lives on @{slice_name} in {placement.island}, but is declared in the "
                           f"plan of {where}", program)
            raise _Invalid
        if sharding is None:
            self.error(op, f"buffer {buffer} has a sharding that is not a list of lists of axis names", program)
            raise _Invalid
        if zero_size(shape) and sharding.used_axes():
            self.error(op, f"buffer {buffer} has shape {list(shape)}, no elements, but is sharded: a zero-size "
                           f"buffer is replicated", program)
            raise _Invalid

    def read_step(self, op: ir.Operation, kind: type[Step], program: _Program, where: str | None) -> None:
        step_id = self.value(op, "step", int, program)
        if step_id in self.step_ids:
            self.error(op, f"step {step_id} reuses the id of another step", program)
            raise _Invalid
        self.step_ids.add(step_id)
        program.ops[step_id] = op
        for key, kind_of in kind.op_attributes.items():
            self.value(op, key, kind_of, program)
        program.steps[where].append(read_step(op, {}))

    # -- checking ------------------------------------------------------------

    def check(self) -> None:
        for program in self.programs.values():
            if program.host is None:
                anchor = next(iter(program.islands.values()))
                self.error(anchor, f"is a plan of @{program.name}, which has no host plan")
                continue
            if program.errors:
                continue                       # what is left of it would report the same problem again
            plan = self.plan(program)
            try:
                plan.validate(f"plan of @{program.name}")
            except PlanError as e:
                at = program.ops.get(e.step, program.buffer_ops.get(e.buffer, program.host))
                self.error(at, str(e))
                continue
            writers = {b: s.id for s in plan.steps.values() for b in s.produced()}
            for island, steps in program.steps.items():
                for step in steps:
                    self.check_step(program, plan, writers, island, step)

    def plan(self, program: _Program) -> ProgramPlan:
        """Returns the program's plans as one ProgramPlan (executables by name only: their code is not read)."""
        mark = program.mark
        return ProgramPlan(
            program=program.name, topology=self.topology, slices=self.slices,
            buffers=dict(sorted(program.buffers.items())), executables={name: "" for name in self.executables},
            inputs=mark["inputs"], outputs=mark["outputs"], donated=mark.get("donated", ()),
            islands={island: tuple(steps) for island, steps in program.steps.items() if island != HOST},
            host_steps=tuple(program.steps.get(HOST, ())),
            peak_bytes={island: ops.attr(op, ops.PEAK_BYTES, ()) for island, op in program.islands.items()})

    def check_step(self, program: _Program, plan: ProgramPlan, writers: dict[int, int], island: str | None,
                   step: Step) -> None:
        """Checks what only the step's op says: its `after` names the `writers` of what it reads, and its
        devices and sizes."""
        op = program.ops[step.id]
        a = ops.attrs(op)
        for b in step.reads():
            if b in writers and writers[b] not in step.after:
                self.error(op, f"step {step.id} reads buffer {b} but does not wait for step {writers[b]}, "
                               f"which writes it")
        if "devices" in a:
            self.check_devices(op, step, island, a["devices"])
        if isinstance(step, Launch):
            sizes = [plan.buffers[b].bytes_per_device for b in step.outputs]
            if list(a["output_bytes"]) != sizes:
                self.error(op, f"step {step.id} has output_bytes {list(a['output_bytes'])}, but its outputs "
                               f"have {sizes} bytes per device")
            self.check_launch_type(program, op, step)
        if isinstance(step, Move) and step.bytes != plan.buffers[step.dst_buffer].bytes_per_device:
            self.error(op, f"step {step.id} moves {step.bytes} bytes, but buffer {step.dst_buffer} has "
                           f"{plan.buffers[step.dst_buffer].bytes_per_device} per device")
        for key in ("then_program", "else_program") if isinstance(step, Branch) else ():
            if a[key] not in self.programs or self.programs[a[key]].host is None:
                self.error(op, f"step {step.id} runs @{a[key]} ('{key}'), which has no plans")

    def check_launch_type(self, program: _Program, op: ir.Operation, step: Launch) -> None:
        """Reports a launch whose buffers' types are not its executable's signature. The runtime finds an
        argument of another type only when it runs the plan, and an extra one not at all (a fused executable
        reads the arguments its calls name)."""
        entry = ops.executable_entry(self.executables[step.executable])
        if entry is None:
            return                             # reported by pw-verify
        inputs, outputs = ([ops.attr(program.buffer_ops[b], "type") for b in buffers]
                           for buffers in (step.inputs, step.outputs))
        actual, expected = ir.FunctionType.get(inputs, outputs), ops.function_type(entry)
        if actual != expected:
            self.error(op, f"step {step.id} launches @{step.executable} on buffers of type {actual}, but its "
                           f"entry has type {expected}")

    def check_devices(self, op: ir.Operation, step: Step, island: str, ranges: tuple[int, ...]) -> None:
        """Reports device ranges outside the island, and a launch's devices other than its slice's."""
        count = self.islands[island].num_devices
        if len(ranges) % 2 or not all(0 <= b < e <= count for b, e in zip(ranges[::2], ranges[1::2])):
            self.error(op, f"step {step.id} runs on devices {list(ranges)}, which are not ranges "
                           f"[begin, end) within the {count} devices of {island}")
        elif isinstance(step, Launch) and ranges != self.slices[step.slice].devices:
            self.error(op, f"step {step.id} runs on devices {list(ranges)}, but @{step.slice} "
                           f"is placed on {list(self.slices[step.slice].devices)}")


@register
class VerifyPlansPass(Pass):
    __doc__ = __doc__
    name = "pw-verify-plans"
    summary = "Check the emitted plans: buffers, steps, sizes, devices, dataflow and a deadlock-free order"
    changes_ir = False
    needs_verified_input = True

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        topology = ops.required_topology(
            module, diagnostics, "pw-verify-plans needs the module's pw.topology: run pw-place first")
        if topology is None:
            return
        checker = _Checker(module, topology, diagnostics)
        checker.read()
        checker.check()
