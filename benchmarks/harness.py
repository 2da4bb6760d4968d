"""Measuring side by side: interleaved repetitions, medians, ratios, records.

The machines are shared and noisy, so a benchmark never reports one absolute
time: every case (ours and the baselines) runs in the same process, the cases
are interleaved within each repetition in a shuffled order, and the result of
a case is the median over repetitions. Headline figures are ratios between
cases measured this way.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import math
import os
import platform
import random
import statistics
import time
from typing import Any, Callable, Iterator, Mapping

# XLA CPU devices every benchmark process asks for (`pw-bench` sets it before
# JAX starts). 16 gives the 16 one-device islands of `parallel-dispatch`, and
# it is also what an 8-way collective needs here: with 8 to 12 host devices on
# this 2-core machine, an all-reduce over 8 of them waits forever for its last
# participant; with 14 or 16 it runs.
HOST_DEVICES = 16


# `pw-bench all` names its run in this variable for the processes it starts, so
# that a report can tell records of one run from a mix.
RUN_ID_VARIABLE = "PW_BENCH_RUN"


def measure(cases: Mapping[str, Callable[[], Any]], repetitions: int, seed: int = 0,
            warmup: int = 1) -> dict[str, list[float]]:
    """Times each case `repetitions` times, interleaved in a shuffled order.

    A case is a callable that does one unit of work and returns once it is
    complete (the caller blocks on device results inside it). Returns the
    seconds of every repetition for each case.
    """
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    rng = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for _ in range(repetitions):
        rng.shuffle(names)
        for name in names:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    return times


def compile_program(traceable, args: tuple, runtime, fuse: bool = True) -> Callable[..., Any]:
    """Lowers a program (or placed function) for `args` on `runtime`'s topology, with launch fusion
    (pw-lower's `fuse`) on or off; returns `run(client, *args)`, which starts one run
    and returns its outputs as handles."""
    import jax

    from pathways_mlir.passes import lower_to_plans

    lowered = traceable.lower(*jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args))
    topology = runtime.resources.snapshot()[1]
    plan = lower_to_plans(lowered.module, topology, fuse=fuse)[lowered.program]

    def run(client, *call_args):
        handles = client.run(plan, jax.tree_util.tree_leaves(call_args))
        return jax.tree_util.tree_unflatten(lowered.out_tree, handles)
    return run


def same_results(ours, baseline, rtol: float = 1e-4) -> bool:
    """Whether two pytrees of arrays (handles or JAX arrays) hold the same numbers, within `rtol`:
    a check that a baseline does the same work as ours."""
    import jax
    import numpy as np

    a, b = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(baseline)
    return len(a) == len(b) and all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=rtol) for x, y in zip(a, b))


def worst(ratios) -> float | None:
    """Returns the smallest of some ours-over-baseline ratios (None when any is missing)."""
    ratios = list(ratios)
    return None if not ratios or any(r is None or math.isnan(r) for r in ratios) else float(min(ratios))


def median(values) -> float:
    """Returns the median of a non-empty sequence."""
    return float(statistics.median(values))


def spread(values) -> float | None:
    """Returns the relative interquartile range of a sequence (None for fewer than 4 values: too few to say;
    a report shows it as a dash)."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return float((q[2] - q[0]) / q[1]) if q[1] else 0.0


def widest_spread(*samples) -> float | None:
    """Returns the largest `spread` of several sequences (None when any has too few values to say)."""
    spreads = [spread(values) for values in samples]
    return None if None in spreads else max(spreads)


def machine_info() -> dict[str, Any]:
    """Returns what the results depend on: machine, Python and package versions."""
    versions = {}
    for package in ("pathways-mlir", "jax", "jaxlib", "numpy", "xtc-mlir-python-bindings", "ray"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "run": os.environ.get(RUN_ID_VARIABLE),
        "packages": versions,
        "jax_devices": jax_devices(),
    }


def jax_devices() -> str:
    """Names the devices of JAX's default backend, e.g. '16 x cpu' or '1 x NVIDIA H200'."""
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind}"


def record(benchmark: str, params: Mapping[str, Any], rows: list[Mapping[str, Any]],
           headline: Mapping[str, float]) -> dict[str, Any]:
    """Returns the JSON record of one benchmark run."""
    return {
        "benchmark": benchmark,
        "params": dict(params),
        "rows": [dict(r) for r in rows],
        "headline": {k: (None if v is None else float(v)) for k, v in headline.items()},
        "machine": machine_info(),
    }


@contextlib.contextmanager
def local_ray(required: bool = True) -> Iterator[Any]:
    """Starts a private Ray instance on this machine only (2 CPUs, no dashboard); shuts it down after.
    Where Ray is not installed it raises, or yields None when not `required` (a benchmark whose Ray
    cases are extra baselines, on a machine image without Ray)."""
    try:
        import ray
    except ImportError:
        if not required:
            yield None
            return
        raise RuntimeError("this benchmark's baseline needs Ray: pip install 'pathways-mlir[bench]'") from None
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
