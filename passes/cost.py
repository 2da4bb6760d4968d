"""A simple, honest cost model of compiled functions, read from their StableHLO.

FLOPs count the arithmetic the ops ask for, not what a backend fuses away:

- `dot_general`: 2 x (result elements) x (product of the contracting
  dimensions); `dot`: the same with the last dimension of the left operand;
- `convolution`: 2 x (result elements) x (kernel elements / output features);
- `reduce`: one per element of the reduced inputs;
- elementwise arithmetic, comparisons, selects and conversions: one per
  result element;
- everything else (constants, reshapes, broadcasts, slices, ...): none.

Every function of the compiled module counts once, and so does the body of
a loop (trip counts are not known statically); the combiner regions of
reductions, scatters and sorts are part of their op's count.

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

    def to_python(self) -> dict[str, int]:
        """Returns the `pw.cost` attribute value, each estimate held within an i64."""
        return {"flops": min(self.flops, _I64_MAX), "bytes": min(self.bytes, _I64_MAX)}


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


def _walk(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                if child.operation.name not in COMBINERS:
                    yield from _walk(child.operation)


def executable_cost(executable: ir.Operation) -> Cost:
    """Returns the cost of a compiled function (a module marked `pw.executable`)."""
    flops = sum(op_flops(op) for op in _walk(executable))
    entry = ops.executable_entry(executable)
    signature = ops.function_type(entry)
    nbytes = sum(ops.tensor_bytes(t) for t in [*signature.inputs, *signature.results] if _static(t))
    return Cost(flops, nbytes)


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
    return Cost(whole.flops // ways, nbytes)
