"""Parallel against sequential asynchronous dispatch (the paper's Figure 7).

A program is a chain of K stages (K = 1, 2, 4, 8, 16), stage k a tiny
computation (add one to one float) on island k of a cluster of 16
one-device islands, so every hop between stages crosses the emulated DCN,
whose one-way latency is 0, 100 us or 1 ms. A host-heavy variant (at 1 ms)
runs the computation 8 times in a row on each stage's island, so each
island has 8 launches' host work per stage. Both modes run the same plans
on the same runtime: parallel dispatch hands every island its steps up front
and returns, sequential dispatch does each step's host work in the caller's
thread only after its predecessors' outputs exist (here: after each DCN
transfer has landed).

Two measures, each with the same driver for both modes: latency, one run
started and waited for (R = 1); and throughput, R = 8 runs in flight, each
started and waited for by its own thread of a pool (so sequential dispatch
has R runs in flight too, and the only difference is how each run's host
work is ordered), as stage computations per second. Headline ratios are
parallel over sequential (above 1: parallel is faster), at 16 stages and
1 ms, and the worst over every case.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.topology import Link
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import EMBEDDED_DCN, embedded_device_map
from pathways_mlir.runtime.dispatch_mode import DispatchMode
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "parallel-dispatch"
HEADLINE = ("parallel_over_sequential_latency_k16_1ms", "parallel_over_sequential_throughput_k16_1ms",
            "parallel_over_sequential_latency_k16_1ms_heavy", "parallel_over_sequential_throughput_k16_1ms_heavy",
            "parallel_over_sequential_worst", "parallel_k16_over_k1_1ms")
STAGES = (1, 2, 4, 8, 16)
LATENCIES_US = (0.0, 100.0, 1000.0)
MEASURES = ("latency", "throughput")
HEAVY = 8           # launches per stage in the host-heavy variant
HEAVY_LATENCY_US = 1000.0
IN_FLIGHT = 8       # runs in flight for throughput


def add_one(x):
    """One stage's computation."""
    return x + 1.0


def chain_program(k: int, launches: int = 1):
    """Returns a program that runs `add_one` `launches` times on each of islands 0 .. k-1 in turn."""
    stages = [pw.jit(add_one, slice=pw.virtual_slice(1, axes="x", island=f"island{i}"),
                     in_specs=P("x"), out_specs=P("x")) for i in range(k)]

    @pw.program
    def chain(x):
        for stage in stages:
            for _ in range(launches):
                x = stage(x)
        return x
    return chain


def runtime_with_dcn(latency_us: float) -> Runtime:
    """Returns a runtime of max(STAGES) one-device islands whose emulated DCN has this latency."""
    device_map = embedded_device_map(max(STAGES), 1)
    topology = dataclasses.replace(device_map.topology, dcn=Link(latency_us, EMBEDDED_DCN.bandwidth_gbps))
    return Runtime(dataclasses.replace(device_map, topology=topology), emulate_dcn=True)


def run(quick: bool) -> dict:
    """Measures latency and throughput of both dispatch modes for every K and DCN latency, and the
    host-heavy variant at 1 ms, interleaved in one process."""
    repetitions = 3 if quick else 7
    x = np.zeros(1, np.float32)
    variants = [(k, lat, 1) for k in STAGES for lat in LATENCIES_US] + [(k, HEAVY_LATENCY_US, HEAVY) for k in STAGES]
    programs = {(k, launches): chain_program(k, launches) for k, _, launches in variants}
    runtimes = {lat: runtime_with_dcn(lat) for lat in LATENCIES_US}
    clients = {lat: Client(rt) for lat, rt in runtimes.items()}
    pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="bench-run")

    def one_run(k, lat, launches, mode):
        programs[k, launches].run(x, dispatch=mode, client=clients[lat]).block_until_ready()

    def case(k, lat, launches, mode, measure):
        if measure == "latency":
            return lambda: one_run(k, lat, launches, mode)

        def in_flight():
            for future in [pool.submit(one_run, k, lat, launches, mode) for _ in range(IN_FLIGHT)]:
                future.result()
        return in_flight

    cases = {(*v, mode, measure): case(*v, mode, measure)
             for v in variants for mode in DispatchMode for measure in MEASURES}
    try:
        times = harness.measure(cases, repetitions)
    finally:
        pool.shutdown()
        for lat in LATENCIES_US:
            clients[lat].close()
            runtimes[lat].close()
    rows = []
    for (k, lat, launches, mode, measure), t in times.items():
        runs = 1 if measure == "latency" else IN_FLIGHT
        rows.append({"stages": k, "dcn_latency_us": lat, "launches_per_stage": launches, "dispatch": mode,
                     "measure": measure, "ms_per_case": harness.median(t) * 1e3,
                     "computations_per_s": k * launches * runs / harness.median(t), "spread": harness.spread(t)})
    rate = {(r["stages"], r["dcn_latency_us"], r["launches_per_stage"], r["dispatch"], r["measure"]):
            r["computations_per_s"] for r in rows}

    def ratio(k, lat, launches, measure):
        return rate[k, lat, launches, "parallel", measure] / rate[k, lat, launches, "sequential", measure]

    headline = {
        "parallel_over_sequential_latency_k16_1ms": ratio(16, 1000.0, 1, "latency"),
        "parallel_over_sequential_throughput_k16_1ms": ratio(16, 1000.0, 1, "throughput"),
        "parallel_over_sequential_latency_k16_1ms_heavy": ratio(16, HEAVY_LATENCY_US, HEAVY, "latency"),
        "parallel_over_sequential_throughput_k16_1ms_heavy": ratio(16, HEAVY_LATENCY_US, HEAVY, "throughput"),
        "parallel_over_sequential_worst": harness.worst(ratio(*v, m) for v in variants for m in MEASURES),
        "parallel_k16_over_k1_1ms": rate[16, 1000.0, 1, "parallel", "throughput"]
        / rate[1, 1000.0, 1, "parallel", "throughput"],
    }
    return harness.record(NAME, {"runs_in_flight": IN_FLIGHT, "repetitions": repetitions, "stages": STAGES,
                                 "dcn_latency_us": LATENCIES_US, "heavy_launches_per_stage": HEAVY,
                                 "dcn_bandwidth_gbps": EMBEDDED_DCN.bandwidth_gbps}, rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 7: stage computations per second against stages with R runs in flight, per mode and
    DCN latency (the host-heavy variant dotted)."""
    for lat, launches in [(lat, 1) for lat in LATENCIES_US] + [(HEAVY_LATENCY_US, HEAVY)]:
        for mode in DispatchMode:
            points = [(r["stages"], r["computations_per_s"]) for r in record["rows"]
                      if r["dcn_latency_us"] == lat and r["dispatch"] == mode and r["measure"] == "throughput"
                      and r["launches_per_stage"] == launches]
            ax.plot(*zip(*points), marker="o",
                    linestyle=":" if launches > 1 else "-" if mode == "parallel" else "--",
                    label=f"{mode}, DCN {lat:g} us" + (f", {launches} launches/stage" if launches > 1 else ""))
    ax.set(xscale="log", yscale="log", xlabel="pipeline stages (one island each)",
           ylabel="stage computations / s", title=f"Parallel vs sequential dispatch, {IN_FLIGHT} runs in flight")
    ax.set_xticks(STAGES, [str(k) for k in STAGES])
    ax.legend(fontsize="x-small")
