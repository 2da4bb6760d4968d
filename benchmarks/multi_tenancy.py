"""Several clients on the same devices (the paper's Figures 8 and 9).

Every client runs one-computation programs on the same 4-device slice of one
island; the computation is a loop of elementwise work sized so that `jax.jit`
takes about 0.05, 0.5 or 2 ms for it on those devices (its measured duration
is reported). Aggregate throughput: P programs split evenly over 1, 2, 4 or
8 clients, each client a thread that starts its programs back to back and
then waits for them; programs per second relative to one client (the
baseline) doing all P alone. Shares: with the `share` scheduling policy, 4
clients weighted 1:1:1:1 or 1:2:4:8 each queue S programs of 0.5 ms before
the scheduler starts; a client's achieved share is its part of the programs
delivered while all clients still had work queued, and its error is the
relative difference from its weight's share.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "multi-tenancy"
HEADLINE = ("aggregate_4clients_over_1", "share_error_1248")
DEVICES = 4
WIDTH = 1024                       # floats per device
DURATIONS_MS = (0.05, 0.5, 2.0)
CLIENTS = (1, 2, 4, 8)
WEIGHTS = ((1, 1, 1, 1), (1, 2, 4, 8))


def work(iterations: int):
    """Returns a computation of `iterations` elementwise steps."""
    return lambda x: jax.lax.fori_loop(0, iterations, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x)


def sized_programs(x, sharding) -> dict[float, tuple[object, float]]:
    """Returns, per target duration, a one-computation program and `jax.jit`'s median ms for it."""
    def jax_ms(iterations):
        fn = jax.jit(work(iterations), out_shardings=sharding)
        times = harness.measure({"jax": lambda: fn(x).block_until_ready()}, repetitions=20, warmup=3)
        return harness.median(times["jax"]) * 1e3

    base, reference = jax_ms(1), jax_ms(1025)
    per_iteration = max((reference - base) / 1024, 1e-6)
    s = pw.virtual_slice(DEVICES, axes="x")
    programs = {}
    for target in DURATIONS_MS:
        iterations = max(1, round((target - base) / per_iteration))
        programs[target] = (pw.jit(work(iterations), slice=s, in_specs=P("x"), out_specs=P("x")),
                            jax_ms(iterations))
    return programs


def clients_case(program, clients: list[Client], x, total: int):
    """Returns a case: each client, in its own thread, runs total/len(clients) programs and waits."""
    def one_client(client):
        handles = [program.run(x, client=client) for _ in range(total // len(clients))]
        for h in handles:
            h.block_until_ready()

    def case():
        threads = [threading.Thread(target=one_client, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return case


def shares(program, x, weights: tuple[int, ...], queued: int) -> list[dict]:
    """Queues `queued` programs per client under the share policy; returns each client's share."""
    runtime = Runtime(embedded_device_map(1, DEVICES), policy="share")
    clients = [Client(runtime, weight=w) for w in weights]
    try:
        runtime.scheduler.hold()
        handles = [program.run(x, client=c) for _ in range(queued) for c in clients]
        runtime.scheduler.release()
        for h in handles:
            h.block_until_ready()
        order = [client_id for _, client_id in runtime.scheduler.delivered]
        ids = [c.id for c in clients]
        backlogged = next(i for i in range(len(order)) if order[:i + 1].count(order[i]) == queued) + 1
        counts = [order[:backlogged].count(i) for i in ids]
    finally:
        for c in clients:
            c.close()
        runtime.close()
    return [{"weights": ":".join(map(str, weights)), "client": n, "weight": w,
             "expected_share": w / sum(weights), "achieved_share": count / backlogged,
             "error": abs(count / backlogged - w / sum(weights)) / (w / sum(weights))}
            for n, (w, count) in enumerate(zip(weights, counts))]


def run(quick: bool) -> dict:
    """Measures aggregate throughput for each client count and size, then the weighted shares."""
    total, queued, repetitions = (16, 40, 3) if quick else (48, 100, 11)
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:DEVICES]), ("x",)), P("x"))
    x = jax.device_put(np.zeros(DEVICES * WIDTH, np.float32), sharding)
    programs = sized_programs(x, sharding)
    runtime = Runtime(embedded_device_map(1, DEVICES))
    clients = [Client(runtime) for _ in range(max(CLIENTS))]
    cases = {(d, n): clients_case(programs[d][0], clients[:n], x, total) for d in DURATIONS_MS for n in CLIENTS}
    try:
        times = harness.measure(cases, repetitions)
    finally:
        for c in clients:
            c.close()
        runtime.close()
    rows = [{"program_ms": d, "jax_ms": programs[d][1], "clients": n,
             "programs_per_s": total / harness.median(times[d, n]),
             "over_one_client": harness.median(times[d, 1]) / harness.median(times[d, n]),
             "spread": harness.spread(times[d, n])} for d, n in cases]
    share_rows = [row for w in WEIGHTS for row in shares(programs[0.5][0], x, w, queued)]
    aggregate = {(r["program_ms"], r["clients"]): r["over_one_client"] for r in rows}
    headline = {"aggregate_4clients_over_1": aggregate[0.5, 4],
                "share_error_1248": max(r["error"] for r in share_rows if r["weights"] == "1:2:4:8")}
    return harness.record(NAME, {"devices": DEVICES, "programs_per_case": total, "queued_per_client": queued,
                                 "repetitions": repetitions, "headline_program_ms": 0.5},
                          rows + share_rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 8: aggregate throughput over one client's, against the number of clients."""
    for d in DURATIONS_MS:
        points = [(r["clients"], r["over_one_client"]) for r in record["rows"] if r.get("program_ms") == d]
        ax.plot(*zip(*points), marker="o", label=f"{d:g} ms programs")
    errors = ", ".join(f"{w}: {max(r['error'] for r in record['rows'] if r.get('weights') == w):.1%}"
                       for w in ("1:1:1:1", "1:2:4:8"))
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set(xscale="log", xlabel="clients", ylabel="aggregate throughput / one client's",
           title=f"Clients sharing {DEVICES} devices (largest share error {errors})")
    ax.set_xticks(CLIENTS, [str(n) for n in CLIENTS])
    ax.legend(fontsize="small")
