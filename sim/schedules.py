"""Pipeline schedules chosen by simulation (`pw-sim pipeline`).

Each offered schedule's plan of one training step is simulated on a
profile; the report gives its step time, its bubble fraction (the share of
the step each stage's devices sit idle, averaged over the slices that run
launches) and the static peak memory of each stage's devices
(from pw-plan-memory, `dialect/memory_plan.py`). The pick is the fastest schedule whose every
peak fits the device memory. `check_here` runs every schedule of a real
`pw.pipeline` program on this machine, interleaved, and says how the
pick's measured step time compares with the fastest measured.
"""

from __future__ import annotations

from pathways_mlir.dialect.plan import ProgramPlan

from .engine import Simulator, Submission
from .profile import Profile


def report(plan: ProgramPlan, profile: Profile, memory_bytes: int | None = None,
           resident: frozenset[int] = frozenset()) -> dict:
    """Returns one schedule's simulated step time, bubble fraction, peak bytes per stage and fit."""
    result = Simulator(profile, record_spans=True).simulate([Submission(plan, resident=resident)], closed_loop=True)
    step = result.latency()
    busy: dict[str, float] = {}
    for span in result.spans:
        if span.kind == "launch":
            key = f"{span.island} {span.track}"
            busy[key] = busy.get(key, 0.0) + span.end - span.start
    peaks = {f"{island} devices {b}-{e - 1}": nbytes for island in plan.islands
             for b, e, nbytes in plan.peak(island)}
    limit = profile.accelerator.memory_bytes if memory_bytes is None else memory_bytes
    return {"step_ms": step * 1e3, "bubble_fraction": 1 - sum(busy.values()) / len(busy) / step if busy else 0.0,
            "peak_bytes": peaks, "fits": all(b <= limit for b in peaks.values()), "memory_bytes": limit}


def pick(reports: dict[str, dict]) -> str | None:
    """Returns the fastest schedule that fits, or None if none does."""
    fitting = [name for name, r in reports.items() if r["fits"]]
    return min(fitting, key=lambda name: reports[name]["step_ms"]) if fitting else None


def check_here(rounds: int, profile: Profile) -> dict:
    """Measures every schedule of `programs.training_pipeline` here and simulates it on `profile`."""
    import pathways_mlir as pw
    from pathways_mlir.runtime.client import default_client

    from . import programs
    from .measure import measure, prepare

    pw.configure(emulate_dcn=True)
    runtime = pw.get_runtime()
    cases = prepare(tuple((s, programs.training_pipeline(s), "parallel") for s in programs.SCHEDULES),
                    runtime.resources.topology)
    measured = measure(default_client(runtime), cases, rounds)
    reports = {c.name: {**report(c.plan, profile), "measured_ms": measured[c.name] * 1e3} for c in cases}
    chosen = pick(reports)
    best = min(reports, key=lambda name: reports[name]["measured_ms"])
    return {"kind": "schedules SIMULATED on " + profile.name + ", each also measured here", "rounds": rounds,
            "schedules": reports, "pick": chosen, "best_measured": best,
            "pick_over_best_measured": reports[best]["measured_ms"] / reports[chosen]["measured_ms"]}
