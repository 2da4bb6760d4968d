"""Each executable's whole flops, from the pass pipeline's cost model.

Flops come from `passes/cost.py`: read from the `pw.cost` of each
`pw.executable` in a lowered module, or, for a plan JSON without them,
counted on the StableHLO of each executable's `jax.export` serialisation
(a fused executable is the sum of its calls). What a launch then costs on
one device is `dialect/device_time.py`'s `launch_cost`, which the runtime's
admission uses too. An executable with no serialisation in a plan counts no
flops (its bytes still count).
"""

from __future__ import annotations

import base64

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.context import make_context
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.passes.cost import executable_cost


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
