"""Clients fine-tuning heads on one shared frozen base (`examples/shared_base_finetune.py`).

Device bytes, from the runtime's memory ledger (`Runtime.usage`, after every
run is over): one client fine-tuning a head on the base, against 4 clients
each fine-tuning its own head, either reading one shared base
(`client.share`) or each holding its own copy of the base (the baseline
without sharing). The 4 plain-JAX jobs' bytes are those of the arrays each
holds (its copy of the base, its head and optimizer state), for reference.

The base is the example's (1.3 MB), with 50 KB of head and optimizer state
per client; batches come from the host each step and are not held.

Speed: the 4 sharing clients (each in its own thread, `steps` training steps
each, on the same one device of island0), the 4 clients with their own
copies, and 4 plain-JAX jobs on the same device (threads, each with its own
copy), interleaved, several repetitions, for batches of `BATCHES` rows
(the example's 64, where a step is about a millisecond of host work, and
512); every case starts from the same heads, and their losses are checked
equal.

Headlines: `shared_base_bytes_4_over_1` (goal <= 1.3),
`unshared_base_bytes_4_over_1` (the baseline without sharing, about 4),
`shared_over_plain_jax` and `shared_over_unshared` (the 4 plain-JAX jobs'
time, and the 4 clients-with-copies' time, over the 4 sharing clients' for
the same steps, so above 1 is ours faster; the worst over batch sizes).
"""

from __future__ import annotations

import jax
import numpy as np

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .examples import load_example

NAME = "shared-base"
HEADLINE = ("shared_base_bytes_4_over_1", "unshared_base_bytes_4_over_1", "shared_over_plain_jax",
            "shared_over_unshared")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("shared_base_bytes_4_over_1", "unshared_base_bytes_4_over_1")
BATCHES = (64, 512)


def run(quick: bool) -> dict:
    """Measures the ledger's bytes for 1 and 4 clients, with and without sharing, then the speed of the 4
    sharing clients against 4 plain-JAX jobs and 4 clients with their own copies."""
    ft = load_example("shared_base_finetune")
    steps, repetitions = (10, 3) if quick else (40, 7)
    clients_n = ft.CLIENTS
    base_values = ft.init_base()
    data = ft.batches(clients_n, steps, base_values)
    runtime = Runtime(embedded_device_map(2, 4))
    clients = [Client(runtime) for _ in range(clients_n)]
    device = jax.devices()[0]
    try:
        place, step = ft.placed()
        empty = sum(runtime.usage().values())
        owned, shared = ft.share_base(place, clients[0], base_values)
        one = ft.finetune(step, [shared], clients[:1], data)
        held_one = sum(runtime.usage().values()) - empty
        del one
        four = ft.finetune(step, [shared] * clients_n, clients, data)
        held_shared = sum(runtime.usage().values()) - empty
        del four
        copies = [owned] + [place.run(base_values, client=c) for c in clients[1:]]   # each client's own base
        unshared = ft.finetune(step, copies, clients, data)
        held_unshared = sum(runtime.usage().values()) - empty
        plain = ft.plain_jax_jobs(base_values, data, device)
        same = all(np.allclose(a[2], b[2], rtol=1e-4, atol=1e-5) for a, b in zip(unshared, plain))
        del unshared
        base_bytes = sum(a.nbytes for a in jax.tree.leaves(base_values))
        head_bytes = sum(np.asarray(a).nbytes for a in jax.tree.leaves(plain[0][:2]))
        del plain
        results = {}

        def case(key, call):
            def timed():
                results[key] = call()
            return timed

        cases = {}
        for size in BATCHES:
            sized = ft.batches(clients_n, steps, base_values, size)
            cases.update({
                ("shared", size): case(("shared", size), lambda d=sized: ft.finetune(step, [shared] * clients_n,
                                                                                    clients, d)),
                ("unshared", size): case(("unshared", size), lambda d=sized: ft.finetune(step, copies, clients, d)),
                ("plain_jax", size): case(("plain_jax", size), lambda d=sized: ft.plain_jax_jobs(base_values, d,
                                                                                               device))})
        times = harness.measure(cases, repetitions)
        same = same and all(np.allclose(a[2], b[2], rtol=1e-4, atol=1e-5) for size in BATCHES
                            for a, b in zip(results["shared", size], results["plain_jax", size]))
        results.clear()
    finally:
        for c in clients:
            c.close()
        runtime.close()
    rows = [{"case": "bytes", "clients": 1, "shared": True, "ledger_bytes": held_one},
            {"case": "bytes", "clients": clients_n, "shared": True, "ledger_bytes": held_shared,
             "over_one_client": held_shared / held_one},
            {"case": "bytes", "clients": clients_n, "shared": False, "ledger_bytes": held_unshared,
             "over_one_client": held_unshared / held_one},
            {"case": "bytes", "clients": clients_n, "plain_jax": True,
             "array_bytes": clients_n * (base_bytes + head_bytes),
             "over_one_job": clients_n}]
    median = {key: harness.median(t) for key, t in times.items()}
    rows += [{"case": name, "batch": size, "clients": clients_n, "steps_each": steps, "median_s": median[name, size],
              "spread": harness.spread(times[name, size]),
              "plain_jax_over_this": median["plain_jax", size] / median[name, size]}
             for name, size in times]
    headline = {"shared_base_bytes_4_over_1": held_shared / held_one,
                "unshared_base_bytes_4_over_1": held_unshared / held_one,
                "shared_over_plain_jax": harness.worst(median["plain_jax", s] / median["shared", s] for s in BATCHES),
                "shared_over_unshared": harness.worst(median["unshared", s] / median["shared", s] for s in BATCHES)}
    return harness.record(NAME, {"clients": clients_n, "steps_each": steps, "repetitions": repetitions,
                                 "base_bytes": base_bytes, "head_and_optimizer_bytes": head_bytes,
                                 "batches": BATCHES, "baseline_matches_ours": same}, rows, headline)


def plot(record: dict, ax) -> None:
    """Device bytes held by the clients, with and without a shared base, over one client's."""
    rows = [r for r in record["rows"] if r["case"] == "bytes" and "over_one_client" in r]
    labels = ["1 client"] + [f"{r['clients']} clients, " + ("shared base" if r["shared"] else "own bases")
                             for r in rows]
    ax.bar(labels, [1.0] + [r["over_one_client"] for r in rows], color=["grey", "tab:green", "tab:red"])
    ax.axhline(1.3, color="grey", linestyle=":")
    ax.set(ylabel="device bytes held / one client's",
           title=f"Fine-tuning heads on one frozen base\n(shared: "
                 f"{record['headline']['shared_base_bytes_4_over_1']:.2f}x; speed over plain JAX, worst: "
                 f"{record['headline']['shared_over_plain_jax']:.2f})")
