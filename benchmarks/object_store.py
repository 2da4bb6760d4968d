"""Objects in our store, through the client, against objects in Ray's store.

Ours: M times, a host array goes through a `Client` as a user's data does:
the client runs a one-computation identity program on one device (the
argument put into the island's store, an on-device copy, the result's handle
returned), reads the result back to the host (`np.asarray`) and deletes the
handle. This goes through the client, dispatcher, gang scheduler and island
on the embedded backend and on our Ray backend (one island actor). Our client
has no bare put/get, so ours also does the identity launch, which Ray does
not. Baseline: M times `ray.put` of the same host array, `ray.get` of it
(zero-copy from Ray's shared memory) and dropping the reference, on the same
local Ray instance. Rates are objects per second for a 32-byte and a 1 MiB
array; the headline ratios are ours over Ray (above 1: ours is faster) at
the worse of the two sizes. Reclaim latency: the time `Client.close()` takes
to release M/10 objects the client holds (M/100 on our Ray backend), per object,
as when a client ends.
Device memory is set far above what any case holds, so nothing waits on it.
"""

from __future__ import annotations

import time

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "object-store"
HEADLINE = ("embedded_over_ray_put_worst", "ray_backend_over_ray_put_worst")
SIZES = (32, 1 << 20)   # bytes
BACKENDS = ("embedded", "ray")
# Objects per case on our Ray backend, as a fraction of the others' (each object is a few actor calls),
# and objects held at once for the reclaim figure, as the same fraction.
RAY_BACKEND_FRACTION = 10
# Device memory large enough that no case waits on it: this measures the store, not back-pressure.
DEVICE_MEMORY_BYTES = 1 << 40


def identity(x):
    """The one computation of an object's round trip."""
    return x


def round_trip(runtime: Runtime, host: np.ndarray):
    """Returns `run(client)`: the identity program for `host`'s shape, compiled once for `runtime`."""
    step = pw.jit(identity, slice=pw.virtual_slice(1, axes="x"), in_specs=P(), out_specs=P())
    return harness.compile_program(step, (host,), runtime)


def ours_case(program, client: Client, host: np.ndarray, count: int):
    """Returns a case that sends `count` objects holding `host` through the client, reads each back
    and deletes it."""
    def case():
        for _ in range(count):
            handle = program(client, host)
            np.asarray(handle)
            handle.delete()
    return case


def ray_case(ray, array: np.ndarray, count: int):
    """Returns a case that puts, gets and drops `count` Ray objects holding `array`."""
    def case():
        for _ in range(count):
            ray.get(ray.put(array))
    return case


def reclaim_seconds(program, runtime: Runtime, host: np.ndarray, count: int, repetitions: int) -> list[float]:
    """Times `Client.close()` releasing `count` objects the client holds, `repetitions` times."""
    times = []
    for _ in range(repetitions):
        client = Client(runtime)
        handles = [program(client, host) for _ in range(count)]
        for h in handles:
            h.block_until_ready()
        start = time.perf_counter()
        client.close()
        times.append(time.perf_counter() - start)
    return times


def run(quick: bool) -> dict:
    """Measures objects per second through our client on both backends and through Ray's put/get,
    for each size, interleaved, and our reclaim latency."""
    count, repetitions = (200, 3) if quick else (2000, 7)
    counts = {"embedded": count, "ray": count // RAY_BACKEND_FRACTION, "Ray put/get": count}
    rows = []
    with harness.local_ray() as ray:      # before JAX starts its threads: Ray forks
        runtimes = {backend: Runtime(islands=1, per_island=1, backend=backend, device_memory_bytes=DEVICE_MEMORY_BYTES)
                    for backend in BACKENDS}
        clients = {backend: Client(rt) for backend, rt in runtimes.items()}
        try:
            for size in SIZES:
                host = np.zeros(size // 4, np.float32)
                programs = {backend: round_trip(rt, host) for backend, rt in runtimes.items()}
                cases = {backend: ours_case(programs[backend], clients[backend], host, counts[backend])
                         for backend in BACKENDS}
                cases["Ray put/get"] = ray_case(ray, host, count)
                times = harness.measure(cases, repetitions, seed=size)
                rows += [{"bytes": size, "case": case, "objects_per_case": counts[case],
                          "objects_per_s": counts[case] / harness.median(times[case]),
                          "spread": harness.spread(times[case])} for case in cases]
                for backend in BACKENDS:
                    held = counts[backend] // RAY_BACKEND_FRACTION
                    reclaim = reclaim_seconds(programs[backend], runtimes[backend], host, held, repetitions)
                    rows.append({"bytes": size, "case": f"{backend} reclaim (Client.close)",
                                 "objects_per_case": held,
                                 "reclaim_us_per_object": harness.median(reclaim) / held * 1e6,
                                 "spread": harness.spread(reclaim)})
        finally:
            for backend in BACKENDS:
                clients[backend].close()
                runtimes[backend].close()
    rate = {(r["bytes"], r["case"]): r.get("objects_per_s") for r in rows}
    headline = {name: harness.worst(rate[size, backend] / rate[size, "Ray put/get"] for size in SIZES)
                for name, backend in zip(HEADLINE, BACKENDS)}
    return harness.record(NAME, {"objects_per_case": count, "ray_backend_objects_per_case": counts["ray"],
                                 "repetitions": repetitions, "sizes": SIZES}, rows, headline)


def plot(record: dict, ax) -> None:
    """Objects per second, ours (both backends) and Ray, for each object size (bars, log scale)."""
    cases = ("embedded", "ray", "Ray put/get")
    labels = {"embedded": "ours, embedded", "ray": "ours, Ray backend", "Ray put/get": "Ray put/get"}
    for i, case in enumerate(cases):
        values = [r["objects_per_s"] for r in record["rows"] if r["case"] == case]
        ax.bar([j + 0.27 * i for j in range(len(values))], values, width=0.27, label=labels[case])
    ax.set_xticks([j + 0.27 for j in range(len(SIZES))], [f"{s} B" for s in SIZES])
    ax.set(yscale="log", ylabel="objects put, read, released / s", title="Object store through the client vs Ray")
    ax.legend(fontsize="small")
