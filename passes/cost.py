"""A simple, honest cost model of compiled functions, read from their StableHLO.

FLOPs count the arithmetic the ops ask for, not what a backend fuses away:

- `dot_general`: 2 x (result elements) x (product of the contracting
  dimensions); `dot`: the same with the last dimension of the left operand;
- `convolution`: 2 x (result elements) x (kernel elements / output features);
- `reduce`: one per element of the reduced inputs;
- elementwise arithmetic, comparisons, selects and conversions: one per
  result element;
- everything else (constants, reshapes, broadcasts, slices, ...): none.

Counting starts at the entry function and follows `func.call`s, so a
function counts once per call. A `stablehlo.while` counts its condition and
body once per trip when the trip count is static (a counter that starts at a
constant, is compared `LT` with a constant and grows by a constant step, as
`jax.lax.fori_loop` writes it); otherwise they count once, and the cost says
how many loops it could not count (`unknown_trip_counts`). The combiner
regions of reductions, scatters and sorts are part of their op's count.

Bytes are the compiled function's argument and result bytes: the memory
traffic it cannot avoid. Shapes must be static.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mlir import ir

from pathways_mlir.dialect import ops

COMBINERS = frozenset(f"stablehlo.{name}" for name in (
    "all_reduce", "reduce", "reduce_scatter", "reduce_window", "scatter", "select_and_scatter", "sort"))
ELEMENTWISE = frozenset(f"stablehlo.{name}" for name in (
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "convert", "cosine", "divide",
    "exponential", "exponential_minus_one", "floor", "log", "log_plus_one", "logistic", "maximum",
    "minimum", "multiply", "negate", "not", "or", "power", "remainder", "round_nearest_afz",
    "round_nearest_even", "rsqrt", "select", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "xor"))


@dataclass(frozen=True)
class Cost:
    """Estimated floating-point operations and bytes of memory traffic."""

    flops: int
    bytes: int
    unknown_trip_counts: int = 0  # loops counted once because their trip count is not static

    def to_python(self) -> dict[str, int]:
        """Returns the `pw.cost` attribute value, each estimate held within an i64
        (`unknown_trip_counts` only when there are some)."""
        value = {"flops": min(self.flops, _I64_MAX), "bytes": min(self.bytes, _I64_MAX)}
        if self.unknown_trip_counts:
            value["unknown_trip_counts"] = self.unknown_trip_counts
        return value


_I64_MAX = (1 << 63) - 1


def _static(type_: ir.Type) -> bool:
    return isinstance(type_, ir.RankedTensorType) and ir.RankedTensorType(type_).has_static_shape


def _elements(type_: ir.Type) -> int:
    return math.prod(ops.tensor_shape(type_)) if _static(type_) else 0


def _attr_text(op: ir.Operation, name: str) -> str:
    try:
        return str(op.attributes[name])
    except KeyError:
        return ""


def _dims(text: str, key: str) -> list[int]:
    match = re.search(rf"{key} = \[([\d, ]*)\]", text)
    return [int(d) for d in match[1].split(",") if d.strip()] if match else []


def op_flops(op: ir.Operation) -> int:
    """Returns the FLOPs of one StableHLO op (see the module docstring)."""
    name = op.name
    if name in ELEMENTWISE:
        return sum(_elements(r.type) for r in op.results)
    if name == "stablehlo.reduce":
        return sum(_elements(v.type) for v in list(op.operands)[:len(op.operands) // 2])
    if name in ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution") and not (
            len(op.operands) >= 2 and len(op.results) == 1
            and all(_static(t) for t in (op.operands[0].type, op.operands[1].type, op.results[0].type))):
        return 0  # malformed: left for the op's own verifier
    if name in ("stablehlo.dot_general", "stablehlo.dot"):
        lhs = ops.tensor_shape(op.operands[0].type)
        contracting = _dims(_attr_text(op, "dot_dimension_numbers"), "lhs_contracting_dimensions") \
            if name == "stablehlo.dot_general" else [len(lhs) - 1]
        if not all(0 <= d < len(lhs) for d in contracting):
            return 0
        return 2 * _elements(op.results[0].type) * math.prod(lhs[d] for d in contracting)
    if name == "stablehlo.convolution":
        kernel = ops.tensor_shape(op.operands[1].type)
        spec = re.search(r"x\[([^\]]*)\]->", _attr_text(op, "dimension_numbers"))
        layout = [d.strip() for d in spec[1].split(",")] if spec else []
        out_features = kernel[layout.index("o")] if "o" in layout and len(layout) == len(kernel) else \
            (kernel[-1] if kernel else 0)
        return 2 * _elements(op.results[0].type) * (math.prod(kernel) // out_features) if out_features > 0 else 0
    return 0


def _constant(value: ir.Value) -> int | None:
    """Returns the integer a scalar `stablehlo.constant` holds, or None."""
    op = ops.producer(value)
    if op is None or op.name != "stablehlo.constant":
        return None
    attr = op.attributes["value"]
    if not isinstance(attr, ir.DenseIntElementsAttr) or len(ir.DenseIntElementsAttr(attr)) != 1:
        return None
    return int(ir.DenseIntElementsAttr(attr)[0])


def trip_count(loop: ir.Operation) -> int | None:
    """Returns the static trip count of a `stablehlo.while`, or None (see the module docstring)."""
    cond, body = (region.blocks[0] for region in loop.regions)
    compare = ops.producer(list(cond.operations)[-1].operands[0])
    if compare is None or compare.name != "stablehlo.compare" \
            or "LT" not in _attr_text(compare, "comparison_direction"):
        return None
    counter, limit = compare.operands
    if not isinstance(counter, ir.BlockArgument) or _constant(limit) is None:
        return None
    index = ir.BlockArgument(counter).arg_number
    start = _constant(loop.operands[index])
    step_op = ops.producer(list(body.operations)[-1].operands[index])
    if start is None or step_op is None or step_op.name != "stablehlo.add":
        return None
    steps = [_constant(v) for v in step_op.operands
             if not (isinstance(v, ir.BlockArgument) and ir.BlockArgument(v).arg_number == index)]
    if len(steps) != 1 or steps[0] is None or steps[0] <= 0:
        return None
    return max(0, -(-(_constant(limit) - start) // steps[0]))


def _flops(op: ir.Operation, functions: dict[str, ir.Operation], seen: tuple[str, ...]) -> tuple[int, int]:
    """Returns (FLOPs, loops of unknown trip count) of the ops inside `op`'s regions."""
    flops = unknown = 0
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                if child.name == "func.call":
                    callee = ops.attr(child, "callee")
                    if callee in functions and callee not in seen:
                        f, u = _flops(functions[callee], functions, (*seen, callee))
                        flops, unknown = flops + f, unknown + u
                    continue
                flops += op_flops(child)
                if child.name in COMBINERS:
                    continue
                f, u = _flops(child, functions, seen)
                if child.name == "stablehlo.while":
                    trips = trip_count(child)
                    f, u = (f, u + 1) if trips is None else (f * trips, u * min(trips, 1))
                flops, unknown = flops + f, unknown + u
    return flops, unknown


def executable_cost(executable: ir.Operation) -> Cost:
    """Returns the cost of a compiled function (a module marked `pw.executable`)."""
    entry = ops.executable_entry(executable)
    functions = {ops.symbol_name(op): op for op in ops.top_level_ops(executable) if op.name == "func.func"}
    flops, unknown = _flops(entry, functions, (ops.symbol_name(entry),))
    signature = ops.function_type(entry)
    nbytes = sum(ops.tensor_bytes(t) for t in [*signature.inputs, *signature.results] if _static(t))
    return Cost(flops, nbytes, unknown)


def compute_cost(compute: ir.Operation, whole: Cost, slice_: ops.VirtualSlice) -> Cost:
    """Returns the cost of a `pw.compute` on each device of its slice.

    The work divides over the distinct shards of its largest result (a
    replicated result means every device does all of it); the bytes are the
    device's shards of the operands and results.
    """
    sizes = slice_.axis_sizes
    results = list(zip([r.type for r in compute.results], ops.out_shardings(compute)))
    operands = list(zip([v.type for v in compute.operands], ops.in_shardings(compute)))
    ways = max(results, key=lambda r: _elements(r[0]))[1].ways(sizes) if results else 1
    nbytes = sum(ops.tensor_bytes(t) // s.ways(sizes) for t, s in operands + results)
    return Cost(whole.flops // ways, nbytes, whole.unknown_trip_counts)


def fused_cost(executable: ir.Operation, parts: dict[str, Cost]) -> Cost:
    """Returns the cost of a fused executable (`pw.fused`): its parts' work, its own signature's bytes."""
    signature = ops.function_type(ops.executable_entry(executable))
    nbytes = sum(ops.tensor_bytes(t) for t in [*signature.inputs, *signature.results])
    called = [parts[c["callee"]] for c in ops.attr(executable, ops.FUSED)["calls"]]
    return Cost(sum(c.flops for c in called), nbytes, sum(c.unknown_trip_counts for c in called))


def program_cost(module: ir.Module | ir.Operation, program: str) -> Cost:
    """Returns the cost of one run of `program` in a device-agnostic module (as traced): the whole cost of
    each computation it calls, once per `pw.compute`; a `pw.cond` counts its costlier branch, by FLOPs (as
    XLA's cost analysis counts a conditional). Data movement between slices is not counted."""
    programs = ops.programs(module)
    executables = ops.executables(module)
    costs: dict[str, Cost] = {}

    def one_run(name: str) -> Cost:
        flops = nbytes = unknown = 0
        for op in ops.program_body(programs[name]).operations:
            compute, cond = ops.Compute.match(op), ops.Cond.match(op)
            if compute is not None:
                if compute.callee not in costs:
                    costs[compute.callee] = executable_cost(executables[compute.callee])
                cost = costs[compute.callee]
            elif cond is not None:
                cost = max(one_run(cond.then_program), one_run(cond.else_program), key=lambda c: c.flops)
            else:
                continue
            flops, nbytes, unknown = flops + cost.flops, nbytes + cost.bytes, unknown + cost.unknown_trip_counts
        return Cost(flops, nbytes, unknown)

    return one_run(program)
