"""Pipeline schedules chosen by simulation (`pw-sim pipeline`).

Each offered schedule's plan of one training step is simulated on a
profile; the report gives its step time, its bubble fraction (the share of
the step each stage's devices sit idle, averaged over the slices that run
launches) and the static peak memory of each stage's devices
(from pw-plan-memory, `dialect/memory_plan.py`). The pick is the fastest schedule whose every
peak fits the device memory. `pw.pipeline(..., schedule="auto")` picks this
way (frontend/schedule_choice.py). `check_here` runs every schedule it
offers for a real `pw.pipeline` step on this machine, interleaved, and says
how the pick's measured step time compares with the fastest measured.
"""

from __future__ import annotations

import dataclasses

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.runtime.admission import MemoryLedger, by_device_range, run_need

from .engine import Simulator, Submission, check_simulated_size
from .profile import Profile


def report(plan: ProgramPlan, profile: Profile, memory_bytes: int | None = None,
           resident: frozenset[int] = frozenset()) -> dict:
    """Returns one schedule's simulated step time, bubble fraction, peak bytes per stage and fit.

    It fits if the runtime would admit it (`MemoryLedger.never_fits`) on devices of `memory_bytes` each
    (default: the topology's); its step is simulated either way, so that one that does not fit is shown too.
    """
    check_simulated_size(plan)
    ledger = MemoryLedger(plan.topology, memory_bytes)
    need = run_need(plan)
    roomy = max([profile.accelerator.memory_bytes, *(b for ranges in need.values() for _, _, b in ranges)])
    machine = dataclasses.replace(profile, accelerator=dataclasses.replace(profile.accelerator, memory_bytes=roomy))
    result = Simulator(machine, record_spans=True).simulate([Submission(plan, resident=resident)], closed_loop=True)
    step = result.latency()
    busy: dict[str, float] = {}
    for span in result.spans:
        if span.kind == "launch":
            key = f"{span.island} {span.track}"
            busy[key] = busy.get(key, 0.0) + span.end - span.start
    peaks = by_device_range(need)
    bubble = 1 - sum(busy.values()) / len(busy) / step if busy and step else 0.0     # none in a step of no time
    return {"step_ms": step * 1e3, "bubble_fraction": bubble,
            "peak_bytes": peaks, "fits": ledger.never_fits(need) is None,
            "memory_bytes": min(ledger.capacity[island] for island in need) if need else memory_bytes}


def pick(reports: dict[str, dict]) -> str | None:
    """Returns the fastest schedule that fits, or None if none does."""
    fitting = [name for name, r in reports.items() if r["fits"]]
    return min(fitting, key=lambda name: reports[name]["step_ms"]) if fitting else None


def check_here(rounds: int, profile: Profile) -> dict:
    """Measures every schedule that `pw.pipeline(..., schedule="auto")` offers for `programs.training_pipeline`,
    each as the plan it simulated on `profile`, and compares its pick with the fastest measured."""
    import jax

    import pathways_mlir as pw
    from pathways_mlir.runtime.client import default_client

    from . import programs
    from .measure import Case, measure

    pw.configure(emulate_dcn=True)
    runtime = pw.get_runtime()
    step, args = programs.training_pipeline(profile).build()
    choice = step.choose(*args, runtime=runtime)
    inputs = jax.tree_util.tree_leaves(args)
    cases = [Case(name, plan, inputs, "parallel") for name, plan in choice.plans.items()]
    measured = measure(default_client(runtime), cases, rounds)
    reports = {name: {**r, "measured_ms": measured[name] * 1e3} for name, r in choice.reports.items()}
    best = min(reports, key=lambda name: reports[name]["measured_ms"])
    return {"kind": "schedules SIMULATED on " + profile.name + ", each also measured here", "rounds": rounds,
            "schedules": reports, "not_offered": choice.not_offered, "pick": choice.pick, "best_measured": best,
            "pick_over_best_measured": reports[best]["measured_ms"] / reports[choice.pick]["measured_ms"]}
