"""Fitting the `cpu-here` profile to measured calibration programs.

The simulator is a black box of a few parameters: the controller's work per
run, per message and per sequential step, an island's work per step and per
input it puts (or, in parallel dispatch, that its launch places), the
device's fixed cost per launch, its flop rate and memory bandwidth, a copy's
reshard, the ICI bandwidth and the DCN latency. Robust least squares (soft L1, in log space,
so every parameter stays positive) finds the values whose simulated run times best
match the measured medians of the calibration programs (the devices share
this machine's cores, a measured fact, not a fitted one), with a weak pull
towards the starting values so that a parameter the programs barely touch
stays sensible. A message's latency is fitted too: in one process it is the
handoff to the thread that takes it (a wake-up under the GIL on 2 shared
cores, not a flight). Fixed, not fitted: one host, the DCN bandwidth the
embedded backend emulates, and one interpreter lock for all host threads (the
runtime's threads are Python threads of one process: CPython's GIL).
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from .branches import BranchOutcomes
from .engine import Simulator, Submission
from .measure import Case
from .profile import Accelerator, Host, LinkSpec, Profile

# (record, field, starting value)
PARAMETERS = (
    ("host", "run_us", 100.0), ("host", "input_us", 100.0), ("host", "launch_input_us", 20.0),
    ("pcie", "bandwidth_gbps", 20.0),
    ("host", "message_us", 10.0), ("host", "message_latency_us", 50.0), ("host", "step_us", 20.0),
    ("host", "recv_us", 100.0), ("host", "cond_us", 100.0), ("host", "cond_thread_us", 100.0),
    ("host", "sequential_step_us", 40.0), ("accelerator", "launch_us", 20.0), ("accelerator", "launch_device_us", 20.0),
    ("accelerator", "reshard_us", 50.0),
    ("accelerator", "peak_tflops", 0.02), ("accelerator", "memory_gbytes_per_s", 5.0),
    ("ici", "latency_us", 20.0), ("ici", "bandwidth_gbps", 20.0), ("dcn", "latency_us", 300.0),
)
PRIOR_WEIGHT = 0.05
DCN_EMULATED_GBPS = 25.0   # runtime/cluster.py EMBEDDED_DCN: what --emulate-dcn sleeps for


def cpu_profile(values: dict[tuple[str, str], float], sources: dict[str, str]) -> Profile:
    """Returns the `cpu-here` profile with the fitted `values` ((record, field) -> value)."""
    def get(record, name, default=0.0):
        return values.get((record, name), default)
    return Profile(
        name="cpu-here", device_kinds=("cpu",),
        accelerator=Accelerator(get("accelerator", "peak_tflops"), get("accelerator", "memory_gbytes_per_s"),
                                1 << 30, get("accelerator", "launch_us"), devices_per_host=8,
                                shared_cores=os.cpu_count() or 1, synchronous=1,
                                launch_device_us=get("accelerator", "launch_device_us"),
                                reshard_us=get("accelerator", "reshard_us")),
        ici=LinkSpec(get("ici", "latency_us"), get("ici", "bandwidth_gbps")),
        dcn=LinkSpec(get("dcn", "latency_us"), DCN_EMULATED_GBPS),
        pcie=LinkSpec(0.0, get("pcie", "bandwidth_gbps")),
        host=Host(get("host", "run_us"), get("host", "input_us"), get("host", "message_us"),
                  get("host", "message_latency_us"), 0.0,
                  get("host", "step_us"), get("host", "sequential_step_us"), get("host", "recv_us"),
                  get("host", "cond_us"), cond_thread_us=get("host", "cond_thread_us"), inline=1, interpreter_lock=1,
                  launch_input_us=get("host", "launch_input_us")),
        sources=sources)


def simulate_case(profile: Profile, case: Case) -> float:
    """Returns the simulated latency of one run of `case` on `profile` (its conds go as in the real run)."""
    sim = Simulator(profile, branches=BranchOutcomes(trace=case.predicates) if case.predicates else None)
    return sim.simulate([Submission(case.plan, case.dispatch)], closed_loop=True).latency()


def fit(cases: list[Case], measured: dict[str, float]) -> tuple[Profile, dict[str, float]]:
    """Returns the profile fitted to `measured` (case name -> seconds) and each case's simulated time."""
    from scipy.optimize import least_squares

    start = np.log([v for _, _, v in PARAMETERS])

    def profile_of(x) -> Profile:
        return cpu_profile({(r, f): float(math.exp(v)) for (r, f, _), v in zip(PARAMETERS, x)}, {})

    def residuals(x):
        profile = profile_of(x)
        errors = [math.log(simulate_case(profile, c) / measured[c.name]) for c in cases]
        return np.array(errors + list(PRIOR_WEIGHT * (x - start)))

    # soft_l1: a calibration program measured under a burst of load pulls the fit less than squares would.
    best = least_squares(residuals, start, diff_step=0.05, max_nfev=400, loss="soft_l1", f_scale=0.1)
    profile = profile_of(best.x)
    return profile, {c.name: simulate_case(profile, c) for c in cases}


def with_sources(profile: Profile, note: str) -> Profile:
    """Returns `profile` with sources saying every figure was fitted, and how."""
    sources = {"accelerator": f"fitted: {note}", "ici": f"fitted: {note}",
               "dcn": f"fitted latency; bandwidth {DCN_EMULATED_GBPS} Gbit/s is what the embedded backend "
                      f"emulates (runtime/cluster.py): {note}",
               "pcie": f"fitted bandwidth, latency 0 (host_us holds the fixed cost): {note}",
               "host": f"fitted; one host; a message's latency is the handoff to the thread that takes it: {note}"}
    return dataclasses.replace(profile, sources=sources)


def calibrate_here(rounds: int) -> tuple[Profile, dict[str, dict[str, float]]]:
    """Measures the calibration programs on this machine and fits; returns the profile and each fit."""
    import pathways_mlir as pw
    from pathways_mlir.runtime.client import default_client

    from . import programs
    from .measure import measure, prepare

    pw.configure(emulate_dcn=True)
    runtime = pw.get_runtime()
    cases = prepare(programs.CALIBRATION, runtime.resources.topology)
    measured = measure(default_client(runtime), cases, rounds)
    profile, fitted = fit(cases, measured)
    return with_sources(profile, note(rounds)), {c.name: {"measured_ms": measured[c.name] * 1e3,
                                                         "fitted_ms": fitted[c.name] * 1e3} for c in cases}


def note(rounds: int) -> str:
    """Returns the provenance line of a fit: when, where, how many rounds of which programs."""
    import datetime
    import platform

    from . import programs

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    names = ", ".join(name for name, _, _ in programs.CALIBRATION)
    return (f"pw-sim calibrate, {when}, {platform.machine()} with {os.cpu_count()} cores, medians over {rounds} "
            f"interleaved rounds of the fastest of 3 runs in a row of the calibration programs ({names})")
