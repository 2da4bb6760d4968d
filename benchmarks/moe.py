"""The mixture-of-experts layer of `examples/moe.py`: routed buckets against a dense exchange.

`routed` is the example's layer: the router sends each expert only its
bucket of CAPACITY rows and gets only that back. `dense exchange` is the same
layer with a dense all-to-all: every expert receives every token, runs on
all of them, and sends all its outputs back; the router picks each token's
expert output (nothing is dropped). Both run on the same slices (experts 0
and 1 on island0, 2 and 3 on island1, emulated DCN). `plain JAX` is the
dense reference on one device. Bytes moved are the plan's copies and sends,
per device; times are medians of one layer call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .examples import load_example

NAME = "moe"
HEADLINE = ("moe_bytes_over_dense", "moe_time_over_dense")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("moe_bytes_over_dense", "moe_time_over_dense")


def dense_layer(moe):
    """The example's layer with a dense all-to-all: every token to every expert and back."""
    router_slice = pw.virtual_slice(2, axes="tokens", island="island0", name="router")

    def gates(router, tokens):
        return moe.gate(router, tokens)

    def pick(choice, probability, outputs):
        return jnp.take_along_axis(jnp.stack(outputs, 1), choice[:, None, None], 1)[:, 0] * probability[:, None]

    gating = pw.jit(gates, slice=router_slice, in_specs=None, out_specs=None)
    picking = pw.jit(pick, slice=router_slice, in_specs=None, out_specs=P("tokens"))
    experts = [pw.jit(moe.expert, slice=pw.virtual_slice(1, axes="rows", island=island, name=f"expert{e}"))
               for e, island in enumerate(("island0", "island0", "island1", "island1"))]

    @pw.program
    def dense_moe(router, expert_params, tokens):
        choice, probability = gating(router, tokens)
        return picking(choice, probability, [run(p, tokens) for run, p in zip(experts, expert_params)])
    return dense_moe


def moved_bytes(plan) -> int:
    """The bytes per device that a plan's copies and sends move."""
    return sum(s.bytes for steps in plan.islands.values() for s in steps if type(s).__name__ in ("Copy", "Send"))


def run(quick: bool) -> dict:
    """Times the routed layer, the dense exchange and plain JAX; counts the bytes each moves."""
    repetitions = 5 if quick else 21
    moe = load_example("moe")
    router, experts = moe.init()
    tokens = np.random.default_rng(1).normal(size=(moe.TOKENS, moe.WIDTH)).astype(np.float32)
    runtime = Runtime(embedded_device_map(2, 4), emulate_dcn=True)
    client = Client(runtime)
    try:
        layers = {"routed": moe.layer(), "dense exchange": dense_layer(moe)}
        compiled = {name: layer.lower(router, experts, tokens).compile(runtime) for name, layer in layers.items()}
        cases = {name: (lambda c: lambda: jax.block_until_ready(
            [h.result() for h in jax.tree.leaves(c(router, experts, tokens, client=client))]))(c)
            for name, c in compiled.items()}
        reference = jax.jit(moe.dense_reference)
        cases["plain JAX"] = lambda: jax.block_until_ready(reference(router, experts, tokens))
        times = harness.measure(cases, repetitions)
        dropped = int(np.asarray(compiled["routed"](router, experts, tokens, client=client)[1]))
    finally:
        client.close()
        runtime.close()
    moved = {name: moved_bytes(c.plan) for name, c in compiled.items()}
    step = {name: harness.median(t) for name, t in times.items()}
    rows = [{"variant": name, "ms": step[name] * 1e3, "bytes_moved": moved.get(name),
             "over_dense": step[name] / step["dense exchange"], "spread": harness.spread(times[name])}
            for name in times]
    headline = {"moe_bytes_over_dense": moved["routed"] / moved["dense exchange"],
                "moe_time_over_dense": step["routed"] / step["dense exchange"]}
    return harness.record(NAME, {"tokens": moe.TOKENS, "width": moe.WIDTH, "experts": moe.EXPERTS,
                                 "capacity": moe.CAPACITY, "dropped": dropped, "repetitions": repetitions},
                          rows, headline)


def plot(record: dict, ax) -> None:
    """Bytes moved between slices by the routed layer and by the dense exchange."""
    rows = [r for r in record["rows"] if r["bytes_moved"] is not None]
    ax.bar([r["variant"] for r in rows], [r["bytes_moved"] / 1024 for r in rows])
    ax.set(ylabel="KiB moved per layer", title="MoE: routed buckets vs dense all-to-all")
