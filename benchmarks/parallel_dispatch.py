"""Parallel against sequential asynchronous dispatch (the paper's Figure 7).

A program is a chain of K stages (K = 1, 2, 4, 8, 16), stage k a tiny
computation (add one to one float) on island k of a cluster of 16
one-device islands, so every hop between stages crosses the emulated DCN,
whose one-way latency is 0, 100 us or 1 ms. A case starts R runs of the
program back to back, then waits for all of them; throughput is stage
computations per second (K x R over the time). Both modes run the same plans
on the same runtime: parallel dispatch hands every island its steps up front
and returns, sequential dispatch does each step's host work only after its
predecessors' outputs exist (here: after each DCN transfer has landed).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.topology import Link
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import EMBEDDED_DCN, embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "parallel-dispatch"
HEADLINE = ("parallel_over_sequential_k16_1ms", "parallel_k16_over_k1_1ms")
STAGES = (1, 2, 4, 8, 16)
LATENCIES_US = (0.0, 100.0, 1000.0)
MODES = ("parallel", "sequential")


def add_one(x):
    """One stage's computation."""
    return x + 1.0


def chain_program(k: int):
    """Returns a program that runs `add_one` on islands 0 .. k-1 in turn."""
    stages = [pw.jit(add_one, slice=pw.virtual_slice(1, axes="x", island=f"island{i}"),
                     in_specs=P("x"), out_specs=P("x")) for i in range(k)]

    @pw.program
    def chain(x):
        for stage in stages:
            x = stage(x)
        return x
    return chain


def runtime_with_dcn(latency_us: float) -> Runtime:
    """Returns a runtime of max(STAGES) one-device islands whose emulated DCN has this latency."""
    device_map = embedded_device_map(max(STAGES), 1)
    topology = dataclasses.replace(device_map.topology, dcn=Link(latency_us, EMBEDDED_DCN.bandwidth_gbps))
    return Runtime(dataclasses.replace(device_map, topology=topology), emulate_dcn=True)


def run(quick: bool) -> dict:
    """Measures both dispatch modes for every K and DCN latency, interleaved in one process."""
    runs, repetitions = (4, 3) if quick else (8, 7)
    x = np.zeros(1, np.float32)
    programs = {k: chain_program(k) for k in STAGES}
    runtimes = {lat: runtime_with_dcn(lat) for lat in LATENCIES_US}
    clients = {lat: Client(rt) for lat, rt in runtimes.items()}

    def case(k, lat, mode):
        def runs_back_to_back():
            handles = [programs[k].run(x, dispatch=mode, client=clients[lat]) for _ in range(runs)]
            for h in handles:
                h.block_until_ready()
        return runs_back_to_back

    cases = {(k, lat, mode): case(k, lat, mode) for k in STAGES for lat in LATENCIES_US for mode in MODES}
    try:
        times = harness.measure(cases, repetitions)
    finally:
        for lat in LATENCIES_US:
            clients[lat].close()
            runtimes[lat].close()
    rows = [{"stages": k, "dcn_latency_us": lat, "dispatch": mode,
             "computations_per_s": k * runs / harness.median(times[k, lat, mode]),
             "spread": harness.spread(times[k, lat, mode])} for k, lat, mode in cases]
    rate = {(r["stages"], r["dcn_latency_us"], r["dispatch"]): r["computations_per_s"] for r in rows}
    headline = {
        "parallel_over_sequential_k16_1ms": rate[16, 1000.0, "parallel"] / rate[16, 1000.0, "sequential"],
        "parallel_k16_over_k1_1ms": rate[16, 1000.0, "parallel"] / rate[1, 1000.0, "parallel"],
    }
    return harness.record(NAME, {"runs_per_case": runs, "repetitions": repetitions, "stages": STAGES,
                                 "dcn_latency_us": LATENCIES_US,
                                 "dcn_bandwidth_gbps": EMBEDDED_DCN.bandwidth_gbps}, rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 7: stage computations per second against stages, per mode and DCN latency."""
    for lat in LATENCIES_US:
        for mode in MODES:
            points = [(r["stages"], r["computations_per_s"]) for r in record["rows"]
                      if r["dcn_latency_us"] == lat and r["dispatch"] == mode]
            ax.plot(*zip(*points), marker="o", linestyle="-" if mode == "parallel" else "--",
                    label=f"{mode}, DCN {lat:g} us")
    ax.set(xscale="log", yscale="log", xlabel="pipeline stages (one island each)",
           ylabel="stage computations / s", title="Parallel vs sequential dispatch")
    ax.set_xticks(STAGES, [str(k) for k in STAGES])
    ax.legend(fontsize="small")
