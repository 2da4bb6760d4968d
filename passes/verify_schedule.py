"""`pw-verify-schedule`: proves that the module's order cannot deadlock.

Every island runs the ops that touch its devices in increasing `pw.order`
(a computation touches its slice's island; data movement both its source's
and its destination's; a `pw.cond` runs on the host and touches none). The
schedule is sound when:

- every op of every program has a `pw.order`;
- no two ops that touch a common island have the same `pw.order`: such an
  inconsistent pair could be enqueued in one order on one island and the
  other order on another;
- the graph of data dependencies (producer before consumer) and island
  queues (each op before the next on every island it touches), across all
  programs, has no cycle: a cycle is a set of ops each waiting for the next,
  a deadlock. networkx finds one, reported at the op that waits for a value
  ordered after it, with the whole cycle.

Requires: the scheduled phase (every op ordered: pw-schedule); changes nothing.

    // f#0 is enqueued after f#1 on @a's island, but f#1 waits for it
    %0 = "pw.compute"(%x) {label = "f#0", slice = @a, pw.order = 1 : i64, ...}
    %1 = "pw.compute"(%0) {label = "f#1", slice = @a, pw.order = 0 : i64, ...}
    // error: 'pw.compute' op is ordered 0 but uses a value of 'f#0', ordered 1: the schedule deadlocks in the
    //   cycle 'f#0' -> 'f#1' -> 'f#0'
"""

from __future__ import annotations

import networkx as nx
from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase

from .registry import Pass, register


def _name(op: ir.Operation) -> str:
    """Names an op in messages: its label, else its kind and order."""
    label = ops.attr(op, "label")
    return f"'{label}'" if label else f"{op.name} #{ops.attr(op, ops.ORDER)}"


def touched_islands(op: ir.Operation, islands: dict[str, str]) -> tuple[str, ...]:
    """Returns the islands whose queues an op is in (slice name -> island in `islands`)."""
    if ops.Compute.isa(op):
        return (islands[ops.Compute(op).slice],)
    if ops.DataMovement.isa(op):
        move = ops.DataMovement(op)
        return tuple(dict.fromkeys((islands[move.src], islands[move.dst])))
    return ()


@register
class VerifySchedulePass(Pass):
    __doc__ = __doc__
    name = "pw-verify-schedule"
    summary = "Prove the module-wide order consistent and deadlock free, or show a counterexample"
    changes_ir = False
    requires_phase = Phase.SCHEDULED

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        islands = {ops.SliceOp(op).symbol: ops.SliceOp(op).placement["island"]
                   for op in ops.top_level_ops(module) if ops.SliceOp.isa(op)}
        nodes: list[ir.Operation] = []
        graph = nx.DiGraph()
        for program in ops.programs(module).values():
            producers: dict[ir.Value, int] = {}
            for op in ops.program_body(program).operations:
                op = op.operation
                if op.name == "func.return":
                    continue
                graph.add_node(len(nodes))
                for value in op.operands:
                    if value in producers:
                        graph.add_edge(producers[value], len(nodes))
                for result in op.results:
                    producers[result] = len(nodes)
                nodes.append(op)
        queues: dict[str, list[int]] = {}
        for n, op in enumerate(nodes):
            for island in touched_islands(op, islands):
                queues.setdefault(island, []).append(n)
        for island, queue in queues.items():
            queue.sort(key=lambda n: ops.attr(nodes[n], ops.ORDER))
            for a, b in zip(queue, queue[1:]):
                order = ops.attr(nodes[a], ops.ORDER)
                if order == ops.attr(nodes[b], ops.ORDER):
                    diagnostics.error(nodes[b], f"'{nodes[b].name}' op has pw.order {order} like {_name(nodes[a])}, "
                                                f"and both run on {island}: the island may enqueue them either way")
                    return
                graph.add_edge(a, b)
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            return
        # Queue edges go up in order, so the cycle has a data edge that goes down.
        producer, consumer = next((u, v) for u, v in cycle
                                  if ops.attr(nodes[u], ops.ORDER) > ops.attr(nodes[v], ops.ORDER))
        path = " -> ".join(_name(nodes[u]) for u, _ in cycle) + f" -> {_name(nodes[cycle[0][0]])}"
        diagnostics.error(nodes[consumer],
                          f"'{nodes[consumer].name}' op is ordered {ops.attr(nodes[consumer], ops.ORDER)} but uses "
                          f"a value of {_name(nodes[producer])}, ordered {ops.attr(nodes[producer], ops.ORDER)}: "
                          f"the schedule deadlocks in the cycle {path}")
