"""The shared service (`pw-serve`, a client attached with `pw.connect`) against the embedded runtime.

The README's three-block program (`examples/three_blocks.py`) runs on 2
islands of 4 CPU devices from a host array of 8x16 floats, its result read
back as a NumPy array: through a `pw-serve` process on this machine (the
program lowered here, the plan sent once, arguments and results over the
loopback socket), and on an embedded runtime in this process (the
baseline: what the client would do without a service). One run at a time
(latency) and 8 runs in flight before their results are read (throughput),
interleaved. Headlines: embedded time over service time, so 1 means the
service costs nothing; the results are checked to be equal.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile

import numpy as np

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .three_blocks import SHAPE, load_example

NAME = "service"
HEADLINE = ("service_over_embedded", "service_over_embedded_8_in_flight")
IN_FLIGHT = 8
START_TIMEOUT = 120.0   # seconds for pw-serve to say it listens


def start_service(directory: str) -> tuple[subprocess.Popen, str]:
    """Starts `pw-serve` (2 islands x 4 devices, any free port) with its service file in `directory`;
    returns the process and the service file once it listens."""
    service_file = os.path.join(directory, "service.json")
    proc = subprocess.Popen([sys.executable, "-m", "pathways_mlir.cli.pw_serve", "--islands", "2", "--per-island",
                             "4", "--port", "0", "--service-file", service_file],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
    if not ready:
        stop_service(proc)
        raise RuntimeError(f"pw-serve did not say it serves within {START_TIMEOUT:g} s")
    if not proc.stdout.readline().startswith("pw-serve: serving"):
        said = stop_service(proc).strip().splitlines()
        raise RuntimeError(f"pw-serve did not start: {said[-1] if said else 'it exited without a word'}")
    return proc, service_file


def stop_service(proc: subprocess.Popen) -> str:
    """Stops `pw-serve` as Ctrl-C would (killed if it does not stop within a minute); returns what it
    wrote to stderr, read before its pipes are closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate(timeout=60)
    return stderr


def run(quick: bool) -> dict:
    """Measures milliseconds per run of the three-block program through a service and embedded, interleaved."""
    from pathways_mlir.runtime.service import open_connection

    runs, repetitions = (24, 5) if quick else (96, 15)      # runs: a multiple of IN_FLIGHT
    example = load_example()
    x = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    runtime = Runtime(embedded_device_map(2, 4))
    local = Client(runtime)
    with tempfile.TemporaryDirectory(prefix="pw-bench-service-") as directory:
        proc, service_file = start_service(directory)
        remote = open_connection(service_file, timeout=START_TIMEOUT)

        def one_at_a_time(client):
            def case():
                for _ in range(runs):
                    np.asarray(example.three_blocks.run(x, client=client))
            return case

        def in_flight(client):
            def case():
                for _ in range(runs // IN_FLIGHT):
                    for out in [example.three_blocks.run(x, client=client) for _ in range(IN_FLIGHT)]:
                        np.asarray(out)
            return case

        try:
            times = harness.measure({"service": one_at_a_time(remote), "embedded": one_at_a_time(local),
                                     "service, 8 in flight": in_flight(remote),
                                     "embedded, 8 in flight": in_flight(local)}, repetitions)
            same = harness.same_results(np.asarray(example.three_blocks.run(x, client=remote)),
                                        np.asarray(example.three_blocks.run(x, client=local)))
        finally:
            remote.close()
            stop_service(proc)
            local.close()
            runtime.close()
    per_run = {case: harness.median(t) / runs for case, t in times.items()}
    rows = [{"case": case, "ms_per_run": per_run[case] * 1e3, "spread": harness.spread(times[case])}
            for case in times]
    headline = {"service_over_embedded": per_run["embedded"] / per_run["service"],
                "service_over_embedded_8_in_flight": per_run["embedded, 8 in flight"]
                / per_run["service, 8 in flight"]}
    return harness.record(NAME, {"shape": SHAPE, "runs_per_case": runs, "repetitions": repetitions,
                                 "in_flight": IN_FLIGHT, "cluster": "2 islands x 4 devices",
                                 "baseline_matches_ours": same}, rows, headline)


def plot(record: dict, ax) -> None:
    """Milliseconds per run of the three-block program, through a service and embedded (bars)."""
    rows = record["rows"]
    ax.bar([r["case"] for r in rows], [r["ms_per_run"] for r in rows],
           color=["tab:blue" if r["case"].startswith("service") else "tab:orange" for r in rows])
    ax.set(ylabel="ms per run (result read back)", title="A shared service against the embedded runtime")
    ax.tick_params(axis="x", labelrotation=20)
