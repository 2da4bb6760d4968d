"""Dispatch throughput of tiny computations (the paper's Figure 5).

The computation is the paper's trivial gang-scheduled one: a scalar
all-reduce across the slice followed by a scalar add (each of the N devices
holds one float; every device gets the mean of all of them plus one). Each
case runs a chain of K such computations, the next consuming the previous
result, and reports computations per second, on slices of 1, 2, 4 and 8
devices of one island:

- ours OpByOp: K calls of the placed function, each one program run;
- ours Chained: one traced program of K calls, one run, lowered without
  launch fusion (the paper's Chained);
- ours Chained+fusion: the same program lowered with `pw-lower`'s launch
  fusion on;
- ours Fused: the K steps fused into one compiled function (a `fori_loop`),
  one run of a one-computation program;
- JAX OpByOp / JAX Fused: the same two with `jax.jit` on the same devices;
- Ray actor: K method calls on an actor that owns the N devices and runs
  the jitted computation on them (as a Ray-based island host would);
- Ray task: K chained tasks, each running the jitted computation in a Ray
  worker on its input fetched from Ray's object store.

Headline ratios are ours over the baseline's throughput (above 1: ours is
faster), at 1 and at 8 devices, and the worst over every device count: with
8 XLA CPU devices on 2 cores, device time hides our fixed host cost, so the
small slices are where it shows.

Ours and JAX's cases are interleaved with each other; the two Ray cases
with each other, in a pass of their own after them on each slice: Ray's
processes go on working after a case has its result (on these 2 cores a
fused call after a Ray case took 350-400 us of ours and about 175 us of
JAX's, against 65-210 and 30 after the others), so interleaved with the
rest they made the 1-device fused ratio a measure of what ran before it
(0.08-0.27 over four full runs, spreads 0.8-1.4 and 2-9; 0.33-0.35 with
the Ray cases apart, spreads 0.55-0.97 and 0.5).

A realistic op-by-op case on one device: a training-like step over a
pytree of `PYTREE_LEAVES` leaves (100 and 400: a model's parameters), each
leaf updated from a small batch, its result fed back as the next call's
argument, K calls; ours (`pw.jit` on a one-device slice) against `jax.jit`
of the same step, interleaved with each other. Rows give microseconds per
leaf per call; `opbyop_many_leaves_over_jax_*` is JAX's time over ours at
each size and the worst of them: the runtime's cost per argument and result
(handles, their release, the store, the completion tracker) shows there,
where the scalar cases have one leaf. A repetition is K = 128 calls (32
with --quick): a loop of hundreds of leaves makes Python's garbage collector
run a full collection every few hundred calls, which a training loop pays
and a median of short loops would leave out.

On an accelerator the slices are those of 1, 2, 4 and 8 devices that its
backend has (a one-GPU machine measures 1 device only; ratios at 8 devices
are then absent), and the Ray cases run only where Ray is installed.
"""

from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "dispatch"
DEVICES = (1, 2, 4, 8)
CASES = ("ours OpByOp", "ours Chained", "ours Chained+fusion", "ours Fused", "JAX OpByOp", "JAX Fused",
         "Ray actor", "Ray task")
# Headline ratios: name -> (ours, baseline); each at 1 and 8 devices and the worst over all.
RATIOS = {
    "chained_over_jax_opbyop": ("ours Chained", "JAX OpByOp"),
    "opbyop_over_jax_opbyop": ("ours OpByOp", "JAX OpByOp"),
    "chained_fused_over_jax_opbyop": ("ours Chained+fusion", "JAX OpByOp"),
    "fused_over_jax_fused": ("ours Fused", "JAX Fused"),
}
PYTREE_LEAVES = (100, 400)
PYTREE_CASES = ("ours OpByOp pytree", "JAX OpByOp pytree")
HEADLINE = (*(f"{name}_worst" for name in RATIOS), *(f"{name}_1dev" for name in RATIOS),
            *(f"{name}_8dev" for name in RATIOS), "opbyop_over_ray_8dev",
            *(f"opbyop_many_leaves_over_jax_{n}" for n in PYTREE_LEAVES), "opbyop_many_leaves_over_jax_worst")


def allreduce_add(x):
    """One computation: the all-reduced mean of the slice's scalars, plus one, on every device."""
    return jnp.broadcast_to(jnp.mean(x), x.shape) + 1.0


def fused(k: int):
    """Returns the chain of `k` computations as one function (a loop XLA cannot simplify away)."""
    return lambda x: jax.lax.fori_loop(0, k, lambda _, y: allreduce_add(y), x)


def sharding(n: int) -> NamedSharding:
    """The layout of the slice's vector: one scalar on each of the first `n` devices."""
    return NamedSharding(Mesh(np.array(jax.devices()[:n]), ("x",)), P("x"))


@lru_cache(maxsize=None)
def _jitted(n: int):
    return jax.jit(allreduce_add, out_shardings=sharding(n))


class RayIsland:
    """A Ray actor that owns `n` devices and runs the computation on them, one call each."""

    def __init__(self, n: int):
        self.step_fn = _jitted(n)
        self.x = jax.device_put(np.zeros(n, np.float32), sharding(n))

    def step(self) -> None:
        self.x = self.step_fn(self.x)

    def ready(self) -> None:
        self.x.block_until_ready()


def ray_task_step(x: np.ndarray) -> np.ndarray:
    """A Ray task: one computation on the worker's first `len(x)` devices, result back in the store."""
    return np.asarray(_jitted(len(x))(jax.device_put(x, sharding(len(x)))))


def cases(client: Client, n: int, k: int) -> dict:
    """Returns ours and JAX's cases on `n` devices, each running `k` computations and waiting for the last."""
    s = pw.virtual_slice(n, axes="x")
    step = pw.jit(allreduce_add, slice=s, in_specs=P("x"), out_specs=P("x"))
    fused_step = pw.jit(fused(k), slice=s, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def chained(x):
        for _ in range(k):
            x = step(x)
        return x

    x = jax.device_put(np.zeros(n, np.float32), sharding(n))
    chained_plain = harness.compile_program(chained, (x,), client.runtime, fuse=False)
    chained_fused = harness.compile_program(chained, (x,), client.runtime, fuse=True)
    jax_step, jax_fused = _jitted(n), jax.jit(fused(k), out_shardings=sharding(n))

    def ours_opbyop():
        y = x
        for _ in range(k):
            y = step.run(y, client=client)
        y.block_until_ready()

    def jax_opbyop():
        y = x
        for _ in range(k):
            y = jax_step(y)
        y.block_until_ready()

    every = {
        "ours OpByOp": ours_opbyop,
        "ours Chained": lambda: chained_plain(client, x).block_until_ready(),
        "ours Chained+fusion": lambda: chained_fused(client, x).block_until_ready(),
        "ours Fused": lambda: fused_step.run(x, client=client).block_until_ready(),
        "JAX OpByOp": jax_opbyop,
        "JAX Fused": lambda: jax_fused(x).block_until_ready(),
    }
    return every


def update(params: dict, batch):
    """A training-like step: every leaf of `params` moved by an amount the batch gives."""
    return jax.tree.map(lambda w: w - 0.01 * batch.mean(), params)


def pytree_cases(client: Client, leaves: int, k: int) -> dict:
    """Returns ours and JAX's op-by-op loop of `k` steps over a pytree of `leaves` leaves on one device, each
    step's result the next one's argument."""
    device = jax.devices()[0]
    params = {f"w{i}": jax.device_put(jnp.full((16,), float(i)), device) for i in range(leaves)}
    batch = jax.device_put(jnp.ones(4), device)
    step = pw.jit(update, slice=pw.virtual_slice(1, axes="x"))
    jax_step = jax.jit(update)

    def ours():
        p = params
        for _ in range(k):
            p = step.run(p, batch, client=client)
        for leaf in jax.tree.leaves(p):
            leaf.block_until_ready()

    def plain():
        p = params
        for _ in range(k):
            p = jax_step(p, batch)
        jax.block_until_ready(p)
    return {"ours OpByOp pytree": ours, "JAX OpByOp pytree": plain}


def ray_cases(ray, n: int, k: int) -> dict:
    """Returns the two Ray baselines on `n` devices, each running `k` computations."""
    actor = ray.remote(RayIsland).options(num_cpus=0).remote(n)
    task = ray.remote(ray_task_step)
    ray.get(actor.ready.remote())
    host_x = np.zeros(n, np.float32)

    def ray_actor():
        for _ in range(k):
            actor.step.remote()
        ray.get(actor.ready.remote())

    def ray_task():
        ref = ray.put(host_x)
        for _ in range(k):
            ref = task.remote(ref)
        ray.get(ref)
    return {"Ray actor": ray_actor, "Ray task": ray_task}


def run(quick: bool) -> dict:
    """Measures computations per second for every case and slice size; ratios at 1 and 8 devices
    and the worst over all."""
    k, repetitions = (32, 3) if quick else (128, 11)
    pytree_k = 32 if quick else 128     # loops long enough to hold the garbage collector's full collections
    rows = []
    with harness.local_ray(required=False) as ray:      # before JAX starts its threads: Ray forks
        runtime = Runtime(embedded_device_map(1, max(DEVICES)))
        client = Client(runtime)
        counts = tuple(n for n in DEVICES if n <= len(jax.devices()))
        try:
            for n in counts:
                times = harness.measure(cases(client, n, k), repetitions, seed=n)
                if ray is not None:
                    times.update(harness.measure(ray_cases(ray, n, k), repetitions, seed=n))
                rows += [{"devices": n, "case": case, "computations_per_s": k / harness.median(times[case]),
                          "spread": harness.spread(times[case])} for case in CASES if case in times]
            for leaves in PYTREE_LEAVES:
                times = harness.measure(pytree_cases(client, leaves, pytree_k), repetitions, seed=leaves)
                rows += [{"devices": 1, "case": case, "leaves": leaves,
                          "us_per_leaf": 1e6 * harness.median(times[case]) / pytree_k / leaves,
                          "spread": harness.spread(times[case])} for case in PYTREE_CASES]
        finally:
            client.close()
            runtime.close()
    rate = {(r["devices"], r["case"]): r["computations_per_s"] for r in rows if r["case"] in CASES}
    per_leaf = {(r["leaves"], r["case"]): r["us_per_leaf"] for r in rows if r["case"] in PYTREE_CASES}

    def ratio(n, ours, baseline):
        if (n, baseline) not in rate:
            return None
        return rate[n, ours] / rate[n, baseline]

    headline = {}
    for name, (ours, baseline) in RATIOS.items():
        headline[f"{name}_worst"] = harness.worst(ratio(n, ours, baseline) for n in counts)
        headline[f"{name}_1dev"] = ratio(1, ours, baseline)
        headline[f"{name}_8dev"] = ratio(8, ours, baseline)
    headline["opbyop_over_ray_8dev"] = ratio(8, "ours OpByOp", "Ray actor")
    for leaves in PYTREE_LEAVES:
        headline[f"opbyop_many_leaves_over_jax_{leaves}"] = \
            per_leaf[leaves, "JAX OpByOp pytree"] / per_leaf[leaves, "ours OpByOp pytree"]
    headline["opbyop_many_leaves_over_jax_worst"] = harness.worst(
        headline[f"opbyop_many_leaves_over_jax_{leaves}"] for leaves in PYTREE_LEAVES)
    headline = {key: headline[key] for key in HEADLINE}
    return harness.record(NAME, {"chain_length": k, "repetitions": repetitions, "devices": counts,
                                 "computation": "scalar all-reduce (mean) + add",
                                 "pytree_steps": pytree_k, "pytree_leaves": PYTREE_LEAVES,
                                 "pytree_step": "every leaf (16 floats) minus 0.01 x a batch's mean"}, rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 5: computations per second against devices, one line per case (log scale)."""
    for case in CASES:
        points = [(r["devices"], r["computations_per_s"]) for r in record["rows"] if r["case"] == case]
        if points:
            ax.plot(*zip(*points), marker="o", linestyle="-" if case.startswith("ours") else "--", label=case)
    ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="computations / s",
           title="Dispatch throughput of a scalar all-reduce + add")
    counts = sorted({r["devices"] for r in record["rows"]})
    ax.set_xticks(counts, [str(d) for d in counts])
    ax.legend(fontsize="small")
