"""Reading the plans that `pw-emit-plans` and `pw-plan-memory` wrote into a module as `ProgramPlan`s.

The IR plan modules (`module {pw.island_plan}` per island, `module
{pw.host_plan}` per program) and `ProgramPlan` (plan.py) are one plan in two
forms: this module is the one reader from the first to the second, used by
`pw-plan-memory` and everything that runs a lowered module. It expects plans
as those passes write them; `pw-verify-plans` checks a module's plans before
anyone trusts them (`passes.load_plans` runs it on plans written elsewhere),
reading each op with `read_slice`, `read_buffer` and `read_step` once it has
checked its attributes.
"""

from __future__ import annotations

from mlir import ir

from . import ops
from .plan import BufferInfo, FusedCall, FusedExecutable, ProgramPlan, SlicePlacement, Subgraph
from .plan_steps import STEP_OPS, Branch, Launch, Step


def read_slice(op: ir.Operation) -> SlicePlacement:
    """Returns the placement of a placed `pw.virtual_slice` op."""
    s, placement = ops.VirtualSlice.from_op(op), ops.attr(op, ops.PLACEMENT)
    return SlicePlacement(s.name, s.shape, s.axes, placement["island"], placement["devices"])


def read_step(op: ir.Operation, plans: dict[str, ProgramPlan]) -> Step:
    """Returns the step a step op describes (its class: `STEP_OPS`); `plans` holds the programs it may run."""
    return STEP_OPS[op.name].from_attrs(ops.attrs(op), plans)


def read_buffer(op: ir.Operation) -> BufferInfo:
    """Returns the buffer a `pw.buffer` op declares."""
    a = ops.attrs(op)
    tensor = ir.RankedTensorType(a["type"])
    home = a["home"]
    return BufferInfo(a["id"], tuple(tensor.shape), str(tensor.element_type), home.get("slice"),
                      tuple(tuple(axes) for axes in home.get("sharding", ())), a["bytes_per_device"])


def program_plans(module: ir.Module | ir.Operation) -> dict[str, ProgramPlan]:
    """Returns the `ProgramPlan` of every program, read from the plans pw-emit-plans wrote.

    A `pw.cond`'s branch programs appear both under their own names and as
    the `then_plan` / `else_plan` of its host `cond` step.
    """
    module = module.operation
    topology = ops.module_topology(module)
    slices = {s.name: s for s in (read_slice(op) for op in ops.top_level_ops(module)
                                  if op.name == "pw.virtual_slice" and ops.PLACEMENT in op.attributes)}
    module_executables = ops.executables(module)
    exports = {name: ops.attr(exe, ops.EXPORT, "") for name, exe in module_executables.items()}
    flops = {name: int(ops.attr(exe, ops.COST)["flops"]) for name, exe in module_executables.items()
             if ops.COST in exe.attributes}
    hosts: dict[str, ir.Operation] = {}
    islands: dict[str, dict[str, ir.Operation]] = {}
    for op in ops.top_level_ops(module):
        if ops.HOST_PLAN in op.attributes:
            hosts[ops.attr(op, ops.HOST_PLAN)["program"]] = op
        elif ops.ISLAND_PLAN in op.attributes:
            mark = ops.attr(op, ops.ISLAND_PLAN)
            islands.setdefault(mark["program"], {})[mark["island"]] = op
    plans: dict[str, ProgramPlan] = {}

    def build(name: str) -> ProgramPlan:
        if name in plans:
            return plans[name]
        host = hosts[name]
        parts = [host, *islands.get(name, {}).values()]
        contents = {id(part): [op.operation for op in part.regions[0].blocks[0].operations] for part in parts}
        for op in contents[id(host)]:
            for key in ("then_program", "else_program") if op.name == Branch.op else ():
                build(ops.attr(op, key))
        buffers = {b.id: b for b in (read_buffer(op) for part in parts for op in contents[id(part)]
                                     if op.name == "pw.buffer")}
        steps = {island: tuple(read_step(op, plans) for op in contents[id(part)] if op.name != "pw.buffer")
                 for island, part in islands.get(name, {}).items()}
        mark = ops.attr(host, ops.HOST_PLAN)
        executables, fused = {}, {}
        for launch in (s for ss in steps.values() for s in ss if isinstance(s, Launch)):
            calls = ops.attr(module_executables[launch.executable], ops.FUSED)
            if calls is None:
                executables[launch.executable] = exports[launch.executable]
                continue
            entry = ops.executable_entry(module_executables[launch.executable])
            fused[launch.executable] = FusedExecutable(
                len(ops.function_type(entry).inputs),
                tuple(FusedCall(c["callee"], c["operands"], c["results"],
                                tuple(tuple(map(tuple, s)) for s in c.get("in_shardings", ())))
                      for c in calls["calls"]),
                calls["results"], calls.get("scratch_bytes", 0))
            executables.update({c["callee"]: exports[c["callee"]] for c in calls["calls"]})
        launched = {*executables, *fused}
        plan_flops = {e: flops[e] for e in sorted(launched) if e in flops}
        plan_flops.update({e: sum(flops.get(c.callee, 0) for c in f.calls) for e, f in fused.items()
                           if e not in plan_flops})
        plans[name] = ProgramPlan(
            program=name, topology=topology, slices=slices, buffers=dict(sorted(buffers.items())),
            executables=executables, fused=fused, flops=plan_flops,
            peak_bytes={island: ops.attr(part, ops.PEAK_BYTES, ()) for island, part in islands.get(name, {}).items()},
            inputs=mark["inputs"], outputs=mark["outputs"], donated=tuple(mark.get("donated", ())), islands=steps,
            subgraphs=tuple(Subgraph(g["id"], g["static"], tuple(i for i, ss in steps.items()
                                                                 if any(s.subgraph == g["id"] for s in ss)))
                            for g in mark["subgraphs"]),
            host_steps=tuple(read_step(op, plans) for op in contents[id(host)] if op.name in STEP_OPS))
        return plans[name]

    for name in hosts:
        build(name)
    del build   # it refers to itself through its closure: a cycle that only the cyclic collector would free
    return plans
