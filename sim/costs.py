"""Each launch's per-device flops and bytes, from the pass pipeline's cost model.

Whole-executable flops come from `passes/cost.py`: read from the `pw.cost`
of each `pw.executable` in a lowered module, or, for a plan JSON alone,
counted on the StableHLO of each executable's `jax.export` serialisation
(a fused executable is the sum of its calls). A launch then costs what
`compute_cost` gives a `pw.compute`: the work divided over the distinct
shards of its largest output, and the bytes of its input and output shards
on one device. An executable with no serialisation in a plan counts no
flops (its bytes still count).
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.context import make_context
from pathways_mlir.dialect.plan import Launch, ProgramPlan
from pathways_mlir.passes.cost import executable_cost


@dataclass(frozen=True)
class LaunchCost:
    """A launch's work on each device of its slice."""

    flops: int
    bytes: int


def module_flops(lowered: ir.Module) -> dict[str, int]:
    """Returns each executable's whole flops from the `pw.cost` marks of a lowered module."""
    return {ops.symbol_name(op): int(ops.attr(op, ops.COST)["flops"])
            for op in ops.top_level_ops(lowered)
            if ops.EXECUTABLE in op.attributes and ops.COST in op.attributes}


def plan_flops(plan: ProgramPlan) -> dict[str, int]:
    """Returns each executable's whole flops, counted on its serialised StableHLO."""
    import jax
    from jax import export

    flops: dict[str, int] = {}
    context = make_context()
    for name, blob in plan.executables.items():
        if not blob:
            flops[name] = 0
            continue
        exported = export.deserialize(bytearray(base64.b64decode(blob)))
        # Re-lowered through JAX to print in generic form, which these bindings parse without StableHLO.
        text = jax.jit(exported.call).lower(*exported.in_avals).compiler_ir("stablehlo").operation.get_asm(
            print_generic_op_form=True)
        with context:
            flops[name] = executable_cost(ir.Module.parse(text).operation).flops
    for name, fused in plan.fused.items():
        flops[name] = sum(flops.get(call.callee, 0) for call in fused.calls)
    return flops


def launch_costs(plan: ProgramPlan, flops: dict[str, int]) -> dict[int, LaunchCost]:
    """Returns the per-device cost of every launch of `plan`, by step id."""
    out = {}
    for steps in plan.islands.values():
        for step in steps:
            if isinstance(step, Launch):
                out[step.id] = _launch_cost(plan, step, flops.get(step.executable, 0))
    return out


def _launch_cost(plan: ProgramPlan, step: Launch, flops: int) -> LaunchCost:
    sizes = dict(zip(plan.slices[step.slice].axes, plan.slices[step.slice].shape))
    outputs = [plan.buffers[b] for b in step.outputs]
    ways = 1
    if outputs:
        largest = max(outputs, key=lambda b: math.prod(b.shape))
        ways = math.prod(sizes.get(a, 1) for axes in largest.sharding for a in axes)
    nbytes = sum(plan.buffers[b].bytes_per_device for b in (*step.inputs, *step.outputs))
    return LaunchCost(flops // ways, nbytes)
