"""Python builders and accessors for `pw` ops.

Builders create ops at the current insertion point (`with ir.InsertionPoint`)
from Python values; accessors read an op's attributes back as Python values
(see `dialect.attributes`). Module-level helpers find the slices, compiled
functions and programs of a module.

Marks (discardable attributes) that the dialect defines on other ops:
    pw.program      (unit, on func.func)         the function is a pw program
    pw.executable   (unit, on builtin.module)    the module is a compiled function
    pw.export       (string, on an executable)   base64 of its `jax.export` form
    pw.island_plan  (dict, on builtin.module)    the module is one island's plan
    pw.topology     (dict, on the top module)    the physical cluster
    pw.placement    (dict, on pw.virtual_slice)  island and devices of a slice
    pw.placement_cost (dict, on pw.virtual_slice) pw-place{explain}: estimated
                                                 costs and the runner-up
    pw.alias        (symbol, on pw.virtual_slice) the slice's computations moved
                                                 to this slice on the same devices
    pw.home         (dict, on program arguments) slice and sharding the runtime
                                                 puts a host value on
    pw.result_homes (array, on pw.cond)          the same for each result
    pw.subgraph     (i64)                        static subgraph of an op
    pw.subgraphs    (array, on a program)        {id, static} of each subgraph
    pw.order        (i64)                        position in the module's consistent
                                                 order; each island runs its ops in
                                                 increasing pw.order
    pw.cost         (dict)                       estimated flops and bytes
    pw.host_plan    (dict, on builtin.module)    the module is a program's host plan
    pw.peak_bytes   (array, on an island plan)   a run's static peak: (begin, end, bytes)
                                                 per island-local device range
    pw.fused        (dict, on an executable)     {calls = [{callee, operands, results}],
                                                 results}: executables called in order
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mlir import ir

from .attributes import Symbol, to_attribute, to_python
from .sharding import Sharding
from .diagnostics import DiagnosticEngine
from .element_types import ELEMENT_BYTES
from .topology import Topology, TopologyError

PROGRAM = "pw.program"
EXECUTABLE = "pw.executable"
EXPORT = "pw.export"
ISLAND_PLAN = "pw.island_plan"
TOPOLOGY = "pw.topology"
PLACEMENT = "pw.placement"
PLACEMENT_COST = "pw.placement_cost"
ALIAS = "pw.alias"
HOME = "pw.home"
DONATED = "pw.donated"       # a program argument the caller donates (unit, in arg_attrs)
RESULT_HOMES = "pw.result_homes"
SUBGRAPH = "pw.subgraph"
SUBGRAPHS = "pw.subgraphs"
ORDER = "pw.order"
COST = "pw.cost"
HOST_PLAN = "pw.host_plan"
PEAK_BYTES = "pw.peak_bytes"
FUSED = "pw.fused"

LINKS = ("ici", "dcn")


def attrs(op: ir.Operation | ir.OpView) -> dict[str, Any]:
    """Returns every attribute of `op` as a Python value."""
    return {name: to_python(value) for name, value in op.operation.attributes.items()}


def attr(op: ir.Operation | ir.OpView, name: str, default: Any = None) -> Any:
    """Returns one attribute of `op` as a Python value, or `default` if absent."""
    value = op.operation.attributes.get(name)
    return default if value is None else to_python(value)


def set_attr(op: ir.Operation | ir.OpView, name: str, value: Any) -> None:
    """Sets attribute `name` of `op` from a Python value."""
    op.operation.attributes[name] = to_attribute(value)


def create(name: str, operands: Sequence[ir.Value] = (), result_types: Sequence[ir.Type] = (),
           attributes: Mapping[str, Any] | None = None, loc: ir.Location | None = None,
           regions: int = 0) -> ir.Operation:
    """Creates op `name` at the current insertion point from Python attribute values."""
    return ir.Operation.create(
        name,
        results=list(result_types),
        operands=list(operands),
        attributes={k: to_attribute(v) for k, v in (attributes or {}).items()},
        loc=loc,
        regions=regions,
    )


def tensor_shape(type_: ir.Type) -> tuple[int, ...]:
    """Returns the static shape of a ranked tensor type."""
    return tuple(ir.RankedTensorType(type_).shape)


def tensor_bytes(type_: ir.Type) -> int:
    """Returns the size in bytes of a statically shaped tensor type, counting its elements as the plans and
    the runtime do (`element_types.ELEMENT_BYTES`)."""
    tensor = ir.RankedTensorType(type_)
    size = ELEMENT_BYTES.get(str(tensor.element_type))
    if size is None:
        raise ValueError(f"element type {tensor.element_type} is not a pw element type")
    return math.prod(tensor.shape) * size


# ===--------------------------------------------------------------------=== #
# Typed views of program ops: `ops.Compute(op).callee` instead of name tests and attribute lookups
# ===--------------------------------------------------------------------=== #

class OpView:
    """A typed view of one `pw` op: `isa` tests its name, properties read its attributes as Python values."""

    NAMES: tuple[str, ...] = ()
    __slots__ = ("op",)

    def __init__(self, op: ir.Operation | ir.OpView):
        self.op = op.operation

    @classmethod
    def isa(cls, op: ir.Operation | ir.OpView) -> bool:
        """True if `op` is one of the ops this view reads."""
        return op.name in cls.NAMES

    @classmethod
    def match(cls, op: ir.Operation | ir.OpView) -> "OpView | None":
        """Returns the view of `op` if it is one of this view's ops, else None."""
        return cls(op) if op.name in cls.NAMES else None

    def _attr(self, name: str, default: Any = None) -> Any:
        return attr(self.op, name, default)

    label = property(lambda self: self._attr("label"), doc="the op's provenance label (`f#0`)")
    subgraph = property(lambda self: self._attr(SUBGRAPH), doc="its static subgraph (pw-mark-static-subgraphs)")
    order = property(lambda self: self._attr(ORDER), doc="its place in the consistent order (pw-schedule)")


class SliceOp(OpView):
    """`pw.virtual_slice`: its symbol and, once placed, its placement."""

    NAMES = ("pw.virtual_slice",)
    symbol = property(lambda self: symbol_name(self.op))
    placement = property(lambda self: self._attr(PLACEMENT), doc="{island, devices} (pw-place), or None")


class Compute(OpView):
    """`pw.compute`: a compiled function called on a slice."""

    NAMES = ("pw.compute",)
    callee = property(lambda self: self._attr("callee"))
    slice = property(lambda self: self._attr("slice"))
    in_shardings = property(lambda self: in_shardings(self.op))
    out_shardings = property(lambda self: out_shardings(self.op))


class Cond(OpView):
    """`pw.cond`: a host branch between two programs."""

    NAMES = ("pw.cond",)
    then_program = property(lambda self: self._attr("then_program"))
    else_program = property(lambda self: self._attr("else_program"))


class DataMovement(OpView):
    """`pw.transfer`, `pw.scatter` or `pw.gather`: a value moved from slice `src` to slice `dst` over `link`."""

    NAMES = ("pw.transfer", "pw.scatter", "pw.gather")
    src = property(lambda self: self._attr("src"))
    dst = property(lambda self: self._attr("dst"))
    link = property(lambda self: self._attr("link"))


DATA_MOVEMENT_OPS = DataMovement.NAMES
PROGRAM_OPS = (*Compute.NAMES, *Cond.NAMES, *DataMovement.NAMES)   # the ops of a program body


# ===--------------------------------------------------------------------=== #
# Virtual slices
# ===--------------------------------------------------------------------=== #

# `min_shape`: the smallest mesh an elastic slice may be placed with (pw-place picks the largest that fits);
# `max_shape`: its largest, written by pw-place when it places the slice smaller than its `shape`.
CONSTRAINT_KINDS = {"device_kind": str, "island": str, "min_memory_bytes": int, "same_island": bool,
                    "min_shape": tuple, "max_shape": tuple}


@dataclass(frozen=True)
class VirtualSlice:
    """A virtual device mesh: shape, axis names and placement constraints."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    constraints: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Returns the number of devices in the slice."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def well_formed(self) -> bool:
        """True if the shape is positive integers, one distinct non-empty axis name each."""
        return (bool(self.shape) and len(self.axes) == len(self.shape)
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in self.shape)
                and all(isinstance(a, str) and a for a in self.axes) and len(set(self.axes)) == len(self.axes))

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Returns {axis name: size}."""
        return dict(zip(self.axes, self.shape))

    @property
    def shape_range(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Returns the smallest and largest shapes the slice may be placed with (both `shape` unless elastic)."""
        return (tuple(self.constraints.get("min_shape", self.shape)),
                tuple(self.constraints.get("max_shape", self.shape)))

    @property
    def elastic(self) -> bool:
        """True if the slice may be placed with more than one shape."""
        low, high = self.shape_range
        return low != high

    def range_problem(self) -> str | None:
        """Returns why `min_shape`/`max_shape` do not bound `shape`, per axis (None if they do)."""
        for key, bound in zip(("min_shape", "max_shape"), self.shape_range):
            if len(bound) != len(self.shape) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in bound):
                return f"constraint '{key}' must be {len(self.shape)} positive integers, not {list(bound)}"
        low, high = self.shape_range
        if not all(lo <= d <= hi for lo, d, hi in zip(low, self.shape, high)):
            return f"shape {list(self.shape)} is not between min_shape {list(low)} and max_shape {list(high)}"
        return None

    def shapes(self, values: Sequence[tuple[Sequence[int], Sharding]] = ()) -> list[tuple[int, ...]]:
        """Returns the shapes in the slice's range that divide every (tensor shape, sharding) in `values`
        (e.g. `homes.sharded_on`'s), the most devices first (ties: the larger leading axes)."""
        low, high = self.shape_range
        shapes = [()]
        for lo, hi in zip(low, high):
            shapes = [s + (d,) for s in shapes for d in range(lo, hi + 1)]
        return sorted((shape for shape in shapes if not any(
            sharding.problems(tensor, dict(zip(self.axes, shape))) for tensor, sharding in values)),
            key=lambda s: (math.prod(s), s), reverse=True)

    @staticmethod
    def from_op(op: ir.Operation | ir.OpView) -> "VirtualSlice":
        """Reads a `pw.virtual_slice` op."""
        return VirtualSlice(attr(op, "sym_name"), tuple(attr(op, "shape")), tuple(attr(op, "axes")),
                            attr(op, "constraints"))

    def build(self, loc: ir.Location | None = None) -> ir.Operation:
        """Creates the `pw.virtual_slice` op for this slice."""
        return create("pw.virtual_slice", attributes={
            "sym_name": self.name,
            "shape": tuple(self.shape),
            "axes": list(self.axes),
            "constraints": dict(self.constraints),
        }, loc=loc)


# ===--------------------------------------------------------------------=== #
# Computations
# ===--------------------------------------------------------------------=== #


def build_compute(callee: str, slice_name: str, inputs: Sequence[ir.Value],
                  result_types: Sequence[ir.Type], in_shardings: Sequence[Sharding],
                  out_shardings: Sequence[Sharding], label: str,
                  loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.compute` calling executable `callee` on slice `slice_name`."""
    return create("pw.compute", inputs, result_types, {
        "callee": Symbol(callee),
        "slice": Symbol(slice_name),
        "in_shardings": [s.to_python() for s in in_shardings],
        "out_shardings": [s.to_python() for s in out_shardings],
        "label": label,
    }, loc)


def in_shardings(op: ir.Operation | ir.OpView) -> list[Sharding]:
    """Returns the input shardings of a `pw.compute`."""
    return [Sharding.from_python(s) for s in attr(op, "in_shardings")]


def out_shardings(op: ir.Operation | ir.OpView) -> list[Sharding]:
    """Returns the output shardings of a `pw.compute`."""
    return [Sharding.from_python(s) for s in attr(op, "out_shardings")]


def build_cond(pred: ir.Value, inputs: Sequence[ir.Value], result_types: Sequence[ir.Type],
               then_program: str, else_program: str, label: str,
               loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.cond` that runs one of two programs on the host's reading of `pred`."""
    return create("pw.cond", [pred, *inputs], result_types, {
        "then_program": Symbol(then_program),
        "else_program": Symbol(else_program),
        "label": label,
    }, loc)


# ===--------------------------------------------------------------------=== #
# Data movement
# ===--------------------------------------------------------------------=== #


def build_transfer(value: ir.Value, src: str, dst: str, sharding: Sharding, link: str,
                   loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.transfer` moving `value`'s shards unchanged from slice `src` to slice `dst`."""
    return create("pw.transfer", [value], [value.type], {
        "link": link, "src": Symbol(src), "dst": Symbol(dst), "sharding": sharding.to_python()}, loc)


def build_scatter(value: ir.Value, src: str, dst: str, src_sharding: Sharding, dst_sharding: Sharding,
                  pieces: int, piece_shape: Sequence[int], link: str, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.scatter` cutting each source shard into `pieces` destination shards."""
    return _reshard("pw.scatter", value, src, dst, src_sharding, dst_sharding, pieces, piece_shape, link, loc)


def build_gather(value: ir.Value, src: str, dst: str, src_sharding: Sharding, dst_sharding: Sharding,
                 pieces: int, piece_shape: Sequence[int], link: str, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.gather` assembling each destination shard from `pieces` source shards."""
    return _reshard("pw.gather", value, src, dst, src_sharding, dst_sharding, pieces, piece_shape, link, loc)


def _reshard(name: str, value: ir.Value, src: str, dst: str, src_sharding: Sharding, dst_sharding: Sharding,
             pieces: int, piece_shape: Sequence[int], link: str, loc: ir.Location | None) -> ir.Operation:
    return create(name, [value], [value.type], {
        "link": link, "src": Symbol(src), "dst": Symbol(dst),
        "src_sharding": src_sharding.to_python(), "dst_sharding": dst_sharding.to_python(),
        "pieces": pieces, "piece_shape": tuple(piece_shape)}, loc)


# ===--------------------------------------------------------------------=== #
# Module contents
# ===--------------------------------------------------------------------=== #


def module_topology(module: ir.Module | ir.Operation) -> Topology | None:
    """Returns the module's `pw.topology`, or None; raises TopologyError if malformed."""
    global _last_topology
    attribute = module.operation.attributes.get(TOPOLOGY)
    if attribute is None:
        return None
    # Most passes of a lowering read the topology: the last one read is kept with its attribute, which is
    # equal to another only if it is the same attribute of the same context (MLIR uniques attributes).
    # Keeping it keeps that one context alive until another topology is read.
    last = _last_topology
    if last is not None and last[0] == attribute:
        return last[1]
    topology = Topology.from_python(to_python(attribute), TOPOLOGY)
    _last_topology = (attribute, topology)
    return topology


_last_topology: tuple[ir.Attribute, Topology] | None = None


def set_topology(module: ir.Module | ir.Operation, topology: Topology) -> None:
    """Sets the module's `pw.topology` to `topology`; `module_topology` then returns the topology checked from
    the value written, without reading the attribute back."""
    global _last_topology
    value = topology.to_python()
    set_attr(module.operation, TOPOLOGY, value)
    _last_topology = (module.operation.attributes[TOPOLOGY], Topology.from_python(value, TOPOLOGY))


def required_topology(module: ir.Module | ir.Operation, diagnostics: DiagnosticEngine,
                      missing: str) -> Topology | None:
    """Returns the module's `pw.topology`; reports `missing`, or what is malformed, and returns None."""
    try:
        topology = module_topology(module)
    except TopologyError as e:
        diagnostics.error(module, str(e))
        return None
    if topology is None:
        diagnostics.error(module, missing)
    return topology


def top_level_ops(module: ir.Module | ir.Operation) -> list[ir.Operation]:
    """Returns the ops directly inside a module (a snapshot: the module may change while a caller goes
    through them)."""
    root = module.operation
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op == root:
            return ir.WalkResult.ADVANCE
        found.append(op)
        return ir.WalkResult.SKIP

    # A pre-order walk hands over plain operations; going through `block.operations` builds a typed view
    # of each op first, which costs twice as much (the passes list top-level ops hundreds of times a lowering).
    walk(root, visit, ir.WalkOrder.PRE_ORDER)
    return found


def walk(root: ir.Operation, visit, order: ir.WalkOrder = ir.WalkOrder.POST_ORDER) -> None:
    """`root.walk(visit, order)`, except that what `visit` raises is raised again as it is (the bindings make
    it a RuntimeError quoting it, a KeyboardInterrupt from Ctrl-C too); the walk stops there."""
    raised: list[BaseException] = []

    def guarded(op: ir.Operation) -> ir.WalkResult:
        try:
            return visit(op)
        except BaseException as error:  # noqa: BLE001  (raised again below, past the bindings)
            raised.append(error)
            return ir.WalkResult.INTERRUPT

    root.walk(guarded, order)
    if raised:
        raise raised[0]


def symbol_name(op: ir.Operation) -> str | None:
    """Returns the `sym_name` of an op, or None."""
    name = op.attributes.get("sym_name")
    return None if name is None else ir.StringAttr(name).value


def symbol_names(module: ir.Module | ir.Operation) -> set[str]:
    """Returns the names of the symbols directly inside a module (slices, programs, executables, plans)."""
    return {name for op in top_level_ops(module) if (name := symbol_name(op)) is not None}


def fresh_symbol(base: str, taken: set[str], numbered: bool = True) -> str:
    """Returns the first of `base_0`, `base_1`, ... not in `taken` (with `numbered=False`, `base` itself
    first), and adds it to `taken`: the one way passes name the symbols they add, so that none redefines a
    symbol of the module or another added one."""
    candidates = itertools.chain(() if numbered else (base,), (f"{base}_{n}" for n in itertools.count()))
    name = next(name for name in candidates if name not in taken)
    taken.add(name)
    return name


def virtual_slices(module: ir.Module | ir.Operation) -> dict[str, VirtualSlice]:
    """Returns the module's virtual slices by name."""
    slices = [VirtualSlice.from_op(op) for op in top_level_ops(module) if op.name == "pw.virtual_slice"]
    return {s.name: s for s in slices}


def is_executable(op: ir.Operation) -> bool:
    """True for a nested module marked `pw.executable`."""
    return op.name == "builtin.module" and EXECUTABLE in op.attributes


def is_plan(op: ir.Operation) -> bool:
    """True for a `builtin.module` marked `pw.island_plan` or `pw.host_plan`."""
    return op.name == "builtin.module" and (ISLAND_PLAN in op.attributes or HOST_PLAN in op.attributes)


def is_program(op: ir.Operation) -> bool:
    """True for a `func.func` marked `pw.program`."""
    return op.name == "func.func" and PROGRAM in op.attributes


def executables(module: ir.Module | ir.Operation) -> dict[str, ir.Operation]:
    """Returns the module's compiled functions by symbol name."""
    return {symbol_name(op): op for op in top_level_ops(module) if is_executable(op)}


def programs(module: ir.Module | ir.Operation) -> dict[str, ir.Operation]:
    """Returns the module's programs by symbol name."""
    return {symbol_name(op): op for op in top_level_ops(module) if is_program(op)}


def names_its_mesh(executable: ir.Operation) -> bool:
    """True if a compiled function's code names its slice's axes (`jax.shard_map`, collectives, sharding
    constraints by `PartitionSpec`): its module declares a Shardy mesh (`sdy.mesh`), so it runs only on a
    mesh of its own slice's axes."""
    return any(op.name == "sdy.mesh" for op in top_level_ops(executable))


def executable_entry(executable: ir.Operation) -> ir.Operation | None:
    """Returns the public entry function of a compiled function (`main`, or the only one)."""
    funcs = [op for op in top_level_ops(executable) if op.name == "func.func"]
    for func in funcs:
        if symbol_name(func) == "main":
            return func
    return funcs[0] if len(funcs) == 1 else None


def function_type(func: ir.Operation) -> ir.FunctionType:
    """Returns the type of a `func.func`."""
    return ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)


def producer(value: ir.Value) -> ir.Operation | None:
    """Returns the op that defines `value`, or None for a block argument."""
    if isinstance(value, ir.OpResult):
        return ir.OpResult(value).owner.operation
    return None


def program_body(program: ir.Operation) -> ir.Block:
    """Returns the single block of a program."""
    return program.regions[0].blocks[0]
