"""Where dispatch overhead stops mattering (the paper's Figure 6).

The computation is the Figure 5 one (a scalar all-reduce plus an add across
an 8-device slice) after a loop of elementwise work whose length sets its
duration. For each length, a chain of K computations runs as one traced
program of ours (Chained, lowered without launch fusion) and as K `jax.jit` calls on the same devices (the
baseline); the duration of a computation is the baseline's median time per
call. The result is our throughput over JAX's against duration, and the
duration at which it first reaches, and then stays at or above, 95% and 99%.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "crossover"
HEADLINE = ("crossover_ms_95", "crossover_ms_99")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("crossover_ms_95", "crossover_ms_99")
DEVICES = 8
WIDTH = 2048      # floats per device


def computation(iterations: int):
    """Returns the computation: `iterations` elementwise steps, then the all-reduce and add."""
    def fn(x):
        x = jax.lax.fori_loop(0, iterations, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x)
        return jnp.broadcast_to(jnp.mean(x), x.shape) + 1.0
    return fn


def crossover(points: list[tuple[float, float]], target: float) -> float | None:
    """Returns the duration from which every point's ratio is at least `target`, interpolated in
    log duration between the last point below it and the next; None if the last point is below."""
    points = sorted(points)
    below = [i for i, (_, ratio) in enumerate(points) if ratio < target]
    if not below:
        return points[0][0]
    i = below[-1]
    if i == len(points) - 1:
        return None
    (d0, r0), (d1, r1) = points[i], points[i + 1]
    t = (target - r0) / (r1 - r0)
    return math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))


def run(quick: bool) -> dict:
    """Measures ours Chained against JAX op by op for each computation length; crossovers in ms."""
    iterations, k, repetitions = ((1, 16, 256, 1024), 16, 3) if quick else \
        ((1, 4, 16, 64, 256, 1024, 4096), 32, 7)
    runtime = Runtime(embedded_device_map(1, DEVICES))
    client = Client(runtime)
    s = pw.virtual_slice(DEVICES, axes="x")
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:DEVICES]), ("x",)), P("x"))
    x = jax.device_put(np.zeros((DEVICES * WIDTH,), np.float32), sharding)
    rows = []
    try:
        for n in iterations:
            step = pw.jit(computation(n), slice=s, in_specs=P("x"), out_specs=P("x"))
            jax_step = jax.jit(computation(n), out_shardings=sharding)

            @pw.program
            def chained(y):
                for _ in range(k):
                    y = step(y)
                return y

            def jax_opbyop():
                y = x
                for _ in range(k):
                    y = jax_step(y)
                y.block_until_ready()

            chained_run = harness.compile_program(chained, (x,), runtime, fuse=False)   # the paper's Chained
            times = harness.measure({"ours": lambda: chained_run(client, x).block_until_ready(),
                                     "jax": jax_opbyop}, repetitions, seed=n)
            ours, theirs = harness.median(times["ours"]), harness.median(times["jax"])
            rows.append({"iterations": n, "duration_ms": theirs / k * 1e3, "ours_chained_per_s": k / ours,
                         "jax_opbyop_per_s": k / theirs, "ratio": theirs / ours,
                         "spread": harness.widest_spread(times["ours"], times["jax"])})
    finally:
        client.close()
        runtime.close()
    points = [(r["duration_ms"], r["ratio"]) for r in rows]
    headline = {"crossover_ms_95": crossover(points, 0.95), "crossover_ms_99": crossover(points, 0.99)}
    return harness.record(NAME, {"devices": DEVICES, "chain_length": k, "repetitions": repetitions,
                                 "floats_per_device": WIDTH}, rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 6: our Chained throughput over JAX op by op against computation duration."""
    points = sorted((r["duration_ms"], r["ratio"]) for r in record["rows"])
    ax.plot(*zip(*points), marker="o", label="ours Chained / JAX OpByOp")
    for target, style in ((0.95, ":"), (0.99, "--")):
        ax.axhline(target, color="grey", linestyle=style, label=f"{target:.0%}")
    ax.set(xscale="log", xlabel="computation duration (ms)", ylabel="throughput ratio",
           title=f"Crossover on {record['params']['devices']} devices")
    ax.legend(fontsize="small")
