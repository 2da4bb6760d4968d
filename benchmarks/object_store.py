"""Object store handles against Ray's object store.

Ours: M times, register a device array already on a device of the embedded
cluster in the object store under a new key and owner, wrap it in a handle,
read the array back through the handle and delete the handle (which frees
its memory accounting). Baseline: M times `ray.put` of the same array's host
copy, `ray.get` of it and dropping the reference, on a local Ray instance.
Both are rates in objects per second, for a 32-byte and a 1 MiB array. The
designs differ, and the figure shows what that costs: our buffers stay on
their devices and a handle is bookkeeping, while Ray serialises each object
into its shared-memory store. Reclaim latency (ours only): the time to
release all M objects of one owner at once, per object, as when a client
ends.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np

from pathways_mlir.dialect.plan import BufferInfo
from pathways_mlir.runtime.handles import Handle
from pathways_mlir.runtime.object_store import ObjectStore

from . import harness

NAME = "object-store"
HEADLINE = ("handles_per_s_over_ray_put",)
SIZES = (32, 1 << 20)   # bytes
DEVICE = ("island0", 0)


def ours_case(store: ObjectStore, array, count: int):
    """Returns a case that creates, reads and releases `count` handles to `array`."""
    info = BufferInfo(0, tuple(array.shape), "f32", None, (), array.nbytes)
    keys = itertools.count()

    def case():
        for _ in range(count):
            key = next(keys)
            obj = store.add(key, ("client", 0), [DEVICE], array.nbytes)
            obj.future.set_result(array)
            handle = Handle(store, key, info, obj.future)
            handle.result()
            handle.delete()
    return case


def ray_case(ray, array: np.ndarray, count: int):
    """Returns a case that puts, gets and drops `count` Ray objects holding `array`."""
    def case():
        for _ in range(count):
            ray.get(ray.put(array))
    return case


def reclaim_seconds(store: ObjectStore, array, count: int, repetitions: int) -> list[float]:
    """Times releasing `count` objects of one owner at once, `repetitions` times."""
    import time

    times = []
    for r in range(repetitions):
        owner = ("client", r + 1)
        for i in range(count):
            store.add((owner, i), owner, [DEVICE], array.nbytes).future.set_result(array)
        start = time.perf_counter()
        store.release_owner(owner)
        times.append(time.perf_counter() - start)
    return times


def run(quick: bool) -> dict:
    """Measures handle and Ray put/get rates for each size, interleaved, and our reclaim latency."""
    count, repetitions = (500, 3) if quick else (2000, 7)
    rows = []
    with harness.local_ray() as ray:      # before JAX starts its threads: Ray forks
        store = ObjectStore({DEVICE: 1 << 40})
        device = jax.devices()[0]
        for size in SIZES:
            host = np.zeros(size // 4, np.float32)
            array = jax.device_put(host, device)
            times = harness.measure({"ours": ours_case(store, array, count), "Ray": ray_case(ray, host, count)},
                                    repetitions, seed=size)
            rows += [{"bytes": size, "case": case, "objects_per_s": count / harness.median(times[case]),
                      "spread": harness.spread(times[case])} for case in ("ours", "Ray")]
            reclaim = reclaim_seconds(store, array, count, repetitions)
            rows.append({"bytes": size, "case": "ours reclaim (release_owner)",
                         "reclaim_us_per_object": harness.median(reclaim) / count * 1e6,
                         "spread": harness.spread(reclaim)})
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
    ax.set(yscale="log", ylabel="objects created, read, released / s", title="Object store handles vs Ray")
    ax.legend(fontsize="small")
