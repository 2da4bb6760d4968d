"""Lowering cost as shard counts grow: pw IR against per-shard materialisation.

The program is a two-computation chain, `a` on one N-device slice feeding `b`
on another, in a 2 x N topology. pw-place (strategy=auto) puts both slices on
island0's N devices, where pw-alias-slices makes them one mesh and
pw-fuse-island one launch, so nothing crosses DCN (the baseline keeps `b` on
island1, as a placement by hand would). For each N the benchmark lowers it
with `pw-lower` as `lower()` and `compile` do (the input and the output
checked in full, not each pass's; README, "Checks between passes") and
measures the IR (pw ops in the lowered module), the serialised plans (JSON
bytes) and the time of parse + pipeline + plan serialisation, median of
`reps` runs, every size's and the baseline's cases interleaved.

The baseline materialises the program per shard, as TF v1 did (Pathways
section 4.3): a networkx graph with one node per shard of each computation
and one edge per communicating shard pair (shard i of `a` feeds shard i of
`b`), each node placed on the least loaded device of its island, the graph
topologically sorted into a schedule, and one plan entry per node and edge
serialised to JSON. Its size and time grow with N; the pw IR's do not.

    pw-bench lowering-scale
    python benchmarks/lowering_scale.py [N ...]
"""

from __future__ import annotations

import heapq
import json
import sys

import networkx as nx
from mlir.ir import WalkResult

from pathways_mlir.dialect.topology import Topology
from pathways_mlir.passes import lower, program_plans

from . import harness

NAME = "lowering-scale"
HEADLINE = ("ops_65536_over_8", "time_65536_over_8", "baseline_over_ours_2048")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("ops_65536_over_8", "time_65536_over_8")
SIZES = (8, 64, 512, 2048, 8192, 65536)


def chain_program(n: int) -> str:
    """Returns the pw IR of the two-computation chain on slices of `n` devices."""
    t = f"tensor<{n}x128xf32>"
    slices = "".join(
        f'"pw.virtual_slice"() {{sym_name = "{s}", shape = array<i64: {n}>, axes = ["x"], constraints = {{}}}} '
        f': () -> ()\n' for s in ("va", "vb"))
    computes = "".join(
        f'  %{r} = "pw.compute"(%{a}) {{callee = @layer, slice = @{s}, in_shardings = [[["x"], []]], '
        f'out_shardings = [[["x"], []]], label = "{name}#0"}} : ({t}) -> {t}\n'
        for r, a, s, name in (("0", "x", "va", "a"), ("1", "0", "vb", "b")))
    return (slices
            + f'module @layer attributes {{pw.executable}} {{\n  func.func @main(%x: {t}) -> {t} {{\n'
            + f'    %0 = "stablehlo.tanh"(%x) : ({t}) -> {t}\n    return %0 : {t}\n  }}\n}}\n'
            + f"func.func @chain(%x: {t}) -> {t} attributes {{pw.program}} {{\n{computes}  return %1 : {t}\n}}\n")


def lower_chain(n: int) -> tuple[int, int]:
    """Lowers the chain on a 2 x n topology; returns (pw ops in the lowered module, plan JSON bytes)."""
    module = lower(chain_program(n), Topology.uniform(2, n))
    names: list[str] = []

    def visit(op):
        names.append(op.name)
        return WalkResult.ADVANCE

    module.operation.walk(visit)
    return sum(name.startswith("pw.") for name in names), len(program_plans(module)["chain"].to_json())


def per_shard_baseline(n: int) -> tuple[int, int, int]:
    """Materialises the chain per shard; returns (nodes, edges, plan JSON bytes)."""
    graph = nx.DiGraph()
    load = {island: [(0, d) for d in range(n)] for island in ("island0", "island1")}
    for computation, island in (("a", "island0"), ("b", "island1")):
        for shard in range(n):
            used, device = heapq.heappop(load[island])
            heapq.heappush(load[island], (used + 1, device))
            graph.add_node((computation, shard), island=island, device=device)
    graph.add_edges_from((("a", shard), ("b", shard)) for shard in range(n))
    steps = []
    for order, node in enumerate(nx.topological_sort(graph)):
        attrs = graph.nodes[node]
        steps.append({"id": order, "kind": "launch", "island": attrs["island"], "device": attrs["device"],
                      "executable": "layer", "label": f"{node[0]}#0/{node[1]}"})
    for src, dst in graph.edges:
        for kind, node, peer in (("send", src, dst), ("recv", dst, src)):
            steps.append({"kind": kind, "island": graph.nodes[node]["island"],
                          "device": graph.nodes[node]["device"], "peer_device": graph.nodes[peer]["device"],
                          "bytes": 128 * 4})
    return graph.number_of_nodes(), graph.number_of_edges(), len(json.dumps(steps, separators=(",", ":")))


def rows(sizes=SIZES, reps: int = 3) -> list[dict]:
    """Returns one row per N: pw ops, plan bytes and time, beside the per-shard baseline's; the
    times are medians of `reps` repetitions of every (N, side) case, interleaved, and the row's
    `spread` the wider of the two sides'."""
    sizes_of = {n: (lower_chain(n), per_shard_baseline(n)) for n in sizes}     # also the warm-up
    cases = {(side, n): (lambda fn=fn, n=n: fn(n)) for n in sizes
             for side, fn in (("ours", lower_chain), ("baseline", per_shard_baseline))}
    times = harness.measure(cases, reps, warmup=0)
    out = []
    for n, ((ops_count, plan_bytes), (nodes, edges, baseline_bytes)) in sizes_of.items():
        out.append({
            "N": n, "ops": ops_count, "plan_bytes": plan_bytes, "time_s": harness.median(times["ours", n]),
            "baseline_nodes": nodes, "baseline_edges": edges, "baseline_plan_bytes": baseline_bytes,
            "baseline_time_s": harness.median(times["baseline", n]),
            "spread": harness.widest_spread(times["ours", n], times["baseline", n]),
        })
    return out


def format_table(table: list[dict]) -> str:
    """Formats rows as an aligned text table."""
    header = ("N", "ops", "plan bytes", "time (ms)", "baseline nodes+edges", "baseline bytes", "baseline (ms)")
    lines = [header] + [(str(r["N"]), str(r["ops"]), str(r["plan_bytes"]), f"{r['time_s'] * 1e3:.1f}",
                         str(r["baseline_nodes"] + r["baseline_edges"]), str(r["baseline_plan_bytes"]),
                         f"{r['baseline_time_s'] * 1e3:.1f}") for r in table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def run(quick: bool) -> dict:
    """Measures pw IR size and lowering time against the per-shard baseline for every N."""
    reps = 3 if quick else 15
    table = rows(SIZES, reps)
    by_n = {r["N"]: r for r in table}
    headline = {"ops_65536_over_8": by_n[65536]["ops"] / by_n[8]["ops"],
                "time_65536_over_8": by_n[65536]["time_s"] / by_n[8]["time_s"],
                "baseline_over_ours_2048": by_n[2048]["baseline_time_s"] / by_n[2048]["time_s"]}
    return harness.record(NAME, {"sizes": SIZES, "repetitions": reps,
                                 "program": "a -> b, 2 x N (placed on one island, fused)"}, table, headline)


def plot(record: dict, ax) -> None:
    """Section 4.3: lowering time and program size against shard count, ours and per shard."""
    table = record["rows"]
    n = [r["N"] for r in table]
    ax.plot(n, [r["time_s"] * 1e3 for r in table], marker="o", label="ours: lowering time (ms)")
    ax.plot(n, [r["baseline_time_s"] * 1e3 for r in table], marker="o", linestyle="--",
            label="per shard: time (ms)")
    ax.plot(n, [r["ops"] for r in table], marker="s", label="ours: pw ops")
    ax.plot(n, [r["baseline_nodes"] + r["baseline_edges"] for r in table], marker="s", linestyle="--",
            label="per shard: nodes + edges")
    ax.set(xscale="log", yscale="log", xlabel="shards per computation (N)", title="Lowering cost vs shard count")
    ax.legend(fontsize="small")


if __name__ == "__main__":
    sizes = tuple(int(a) for a in sys.argv[1:]) or SIZES
    print(format_table(rows(sizes)))
