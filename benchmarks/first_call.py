"""Time to the first result: a new training step's first call, ours against `jax.jit`'s.

A user's first call of a step pays for tracing and compiling it. The step is
an MLP's optax Adam update (`LAYERS` square layers), its batch a NumPy array
split over the slice's devices, as a data loader gives it; the baseline is
`jax.jit` of the same function with the same shardings on the same devices.
Each repetition makes both functions anew, with a learning rate of its own
(so each first call traces and compiles: the runtime keeps an executable by
its code), calls each once with the same arguments and times it until the
loss is read, the two interleaved. Ours also exports the function, lowers the
program through the pass pipeline, places it and loads its plan on the
island, where its executable compiles. Each row also counts the XLA compiles
during a first call (JAX's `backend_compile` events): a launch of ours that
called the `jax.jit` function compiled its executable a second time, at its
first call with a NumPy argument (`runtime/executables.py`).

    pw-bench first-call
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax._src import monitoring
from jax._src.dispatch import BACKEND_COMPILE_EVENT
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "first-call"
HEADLINE = ("first_call_over_jax_worst",)
BATCH = 64
LEARNING_RATE = 1e-3


def make_step(tx):
    """Returns a new training step function (a new object each time: it traces and compiles anew)."""
    def loss(params, x, y):
        for w in params:
            x = jnp.tanh(x @ w)
        return ((x - y) ** 2).mean()

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    return step


def run(quick: bool) -> dict:
    """Measures the first call of a new step, ours and `jax.jit`'s, on 1 and 4 devices."""
    devices, layers, width, repetitions = ((1,), 3, 128, 2) if quick else ((1, 4), 8, 512, 5)
    runtime = Runtime(embedded_device_map(1, max(devices)))
    client = Client(runtime)
    compiles = []
    listener = lambda event, duration, **_: event == BACKEND_COMPILE_EVENT and compiles.append(duration)
    monitoring.register_event_duration_secs_listener(listener)
    rows = []
    try:
        for n in devices:
            rng = np.random.default_rng(n)
            tx = optax.adam(LEARNING_RATE)
            mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
            replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
            params = [jax.device_put(rng.normal(size=(width, width)).astype(np.float32) * 0.05, replicated)
                      for _ in range(layers)]
            opt_state = jax.device_put(tx.init(params), replicated)
            x = rng.normal(size=(BATCH, width)).astype(np.float32)
            y = rng.normal(size=(BATCH, width)).astype(np.float32)
            s = pw.virtual_slice(n, axes="data")
            times = {"ours": [], "jax": []}
            counts = {"ours": [], "jax": []}
            results = {}

            def ours(rate):
                step = pw.jit(make_step(optax.adam(rate)), slice=s, in_specs=(P(), P(), P("data"), P("data")))
                out = step.run(params, opt_state, x, y, client=client)
                float(out[2])
                results["ours"] = out

            def plain(rate):
                step = jax.jit(make_step(optax.adam(rate)), in_shardings=(replicated, replicated, split, split),
                               out_shardings=replicated)
                out = step(params, opt_state, x, y)
                float(out[2])
                results["jax"] = out

            cases = {"ours": ours, "jax": plain}
            for repetition in range(repetitions):
                # A learning rate of its own makes the repetition's step new code: ours keeps an executable by
                # its code (the runtime's cache), so the same step made again would not compile again.
                rate = LEARNING_RATE * (1 + repetition / 64)
                for name in (("ours", "jax") if repetition % 2 == 0 else ("jax", "ours")):
                    before = len(compiles)
                    start = time.perf_counter()
                    cases[name](rate)
                    times[name].append(time.perf_counter() - start)
                    counts[name].append(len(compiles) - before)
            assert harness.same_results(results["ours"], results["jax"]), "ours and jax.jit computed different steps"
            results.clear()
            ours_s, jax_s = harness.median(times["ours"]), harness.median(times["jax"])
            rows.append({"devices": n, "ours_first_call_s": ours_s, "jax_first_call_s": jax_s,
                         "ratio": jax_s / ours_s, "ours_xla_compiles": max(counts["ours"]),
                         "jax_xla_compiles": max(counts["jax"]),
                         "spread": harness.widest_spread(times["ours"], times["jax"])})
    finally:
        monitoring.unregister_event_duration_listener(listener)
        client.close()
        runtime.close()
    headline = {"first_call_over_jax_worst": harness.worst(r["ratio"] for r in rows)}
    return harness.record(NAME, {"devices": list(devices), "layers": layers, "width": width, "batch": BATCH,
                                 "repetitions": repetitions}, rows, headline)


def plot(record: dict, ax) -> None:
    """Seconds to the first result of a new step, ours and `jax.jit`'s, per device count."""
    rows = sorted(record["rows"], key=lambda r: r["devices"])
    labels = [str(r["devices"]) for r in rows]
    positions = np.arange(len(rows))
    ax.bar(positions - 0.2, [r["ours_first_call_s"] for r in rows], 0.4, label="ours (pw.jit)")
    ax.bar(positions + 0.2, [r["jax_first_call_s"] for r in rows], 0.4, label="jax.jit")
    ax.set_xticks(positions, labels)
    ax.set(xlabel="devices", ylabel="first call (s)", title="Time to the first result of a new training step")
    ax.legend(fontsize="small")
