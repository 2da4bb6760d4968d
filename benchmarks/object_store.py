"""Objects in our store against objects in Ray's store.

Ours: M times, a host array is put into an island of the embedded cluster
(the `put` message: memory accounted, the array copied onto its device),
fetched back as a device array (`fetch`) and released (`release`), as a
program argument is. Baseline: M times `ray.put` of the same host array,
`ray.get` of it and dropping the reference, on a local Ray instance. Both
copy the host array into their store once; ours reads back a device array,
Ray a host array (zero-copy from its shared memory). Rates are objects per
second for a 32-byte and a 1 MiB array. Reclaim latency (ours only): the time
to release all M objects of one owner at once, per object, as when a client
ends.
"""

from __future__ import annotations

import itertools

import numpy as np

from pathways_mlir.dialect.plan import BufferInfo, ProgramPlan, SlicePlacement
from pathways_mlir.runtime.island import Island
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "object-store"
HEADLINE = ("handles_per_s_over_ray_put",)
SIZES = (32, 1 << 20)   # bytes


def one_buffer_plan(runtime: Runtime, host: np.ndarray) -> ProgramPlan:
    """A plan with one buffer on one device of island0, for `put` to place arrays in."""
    placement = SlicePlacement("s", (1,), ("x",), "island0", (0, 1))
    buffer = BufferInfo(0, tuple(host.shape), "f32", "s", ((),), host.nbytes)
    return ProgramPlan("objects", runtime.resources.topology, {"s": placement}, {0: buffer}, {}, (0,), (), {})


def ours_case(island: Island, key: int, host: np.ndarray, count: int, run_ids):
    """Returns a case that puts, fetches and releases `count` objects holding `host`."""
    def case():
        for _ in range(count):
            run_id = next(run_ids)
            island.put(run_id, key, 0, host, ("client", 0))
            island.fetch(run_id, key, 0).result()
            island.release(run_id, 0)
            island.release_run(run_id, 0)
    return case


def ray_case(ray, array: np.ndarray, count: int):
    """Returns a case that puts, gets and drops `count` Ray objects holding `array`."""
    def case():
        for _ in range(count):
            ray.get(ray.put(array))
    return case


def reclaim_seconds(island: Island, key: int, host: np.ndarray, count: int, repetitions: int,
                    run_ids) -> list[float]:
    """Times releasing `count` objects of one owner at once, `repetitions` times."""
    import time

    times = []
    for r in range(repetitions):
        owner = ("client", r + 1)
        for _ in range(count):
            island.put(next(run_ids), key, 0, host, owner)
        start = time.perf_counter()
        island.release_owner(owner)
        times.append(time.perf_counter() - start)
    return times


def run(quick: bool) -> dict:
    """Measures our put/fetch/release and Ray put/get rates for each size, interleaved, and our reclaim latency."""
    count, repetitions = (500, 3) if quick else (2000, 7)
    rows = []
    with harness.local_ray() as ray:      # before JAX starts its threads: Ray forks
        runtime = Runtime(islands=1, per_island=1, device_memory_bytes=1 << 40)
        island, run_ids = runtime.islands["island0"], itertools.count()
        for size in SIZES:
            host = np.zeros(size // 4, np.float32)
            key = runtime.load(one_buffer_plan(runtime, host))
            times = harness.measure({"ours": ours_case(island, key, host, count, run_ids),
                                     "Ray": ray_case(ray, host, count)}, repetitions, seed=size)
            rows += [{"bytes": size, "case": case, "objects_per_s": count / harness.median(times[case]),
                      "spread": harness.spread(times[case])} for case in ("ours", "Ray")]
            reclaim = reclaim_seconds(island, key, host, count, repetitions, run_ids)
            rows.append({"bytes": size, "case": "ours reclaim (release_owner)",
                         "reclaim_us_per_object": harness.median(reclaim) / count * 1e6,
                         "spread": harness.spread(reclaim)})
        runtime.close()
    rate = {(r["bytes"], r["case"]): r.get("objects_per_s") for r in rows}
    headline = {"handles_per_s_over_ray_put": rate[32, "ours"] / rate[32, "Ray"]}
    return harness.record(NAME, {"objects_per_case": count, "repetitions": repetitions, "sizes": SIZES},
                          rows, headline)


def plot(record: dict, ax) -> None:
    """Objects per second, ours and Ray, for each object size (bars, log scale)."""
    cases = ("ours", "Ray")
    for i, case in enumerate(cases):
        values = [r["objects_per_s"] for r in record["rows"] if r["case"] == case]
        ax.bar([j + 0.4 * i for j in range(len(values))], values, width=0.4, label=case)
    ax.set_xticks([j + 0.2 for j in range(len(SIZES))], [f"{s} B" for s in SIZES])
    ax.set(yscale="log", ylabel="objects put, read, released / s", title="Object store vs Ray")
    ax.legend(fontsize="small")
