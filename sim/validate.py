"""`pw-sim validate`: real runs on this machine against their simulation.

The calibration programs and the validation programs (sim/programs.py:
different programs, or the same program at another size or chain length)
are measured together, interleaved round by round, so both see the same
load on this shared machine. The `cpu-here` profile is fitted to the
calibration programs only (sim/calibrate.py), or a stored profile is used
as is; then each validation program's plan is simulated and compared with
its measured median. Targets (issue 26): median absolute error <= 8%,
worst <= 20%.
"""

from __future__ import annotations

import statistics

from . import calibrate, programs
from .measure import measure, prepare
from .profile import Profile

TARGET_MEDIAN = 0.08
TARGET_WORST = 0.20


def run_validation(rounds: int, profile: Profile | None = None) -> tuple[dict, Profile]:
    """Measures, fits (unless `profile` is given), simulates; returns the JSON record and the profile."""
    import pathways_mlir as pw
    from pathways_mlir.runtime.client import default_client

    pw.configure(emulate_dcn=True)
    runtime = pw.get_runtime()
    topology = runtime.resources.topology
    calibration = prepare(programs.CALIBRATION, topology)
    validation = prepare(programs.VALIDATION, topology)
    measured = measure(default_client(runtime), calibration + validation, rounds)
    fitted: dict[str, float] = {}
    if profile is None:
        profile, fitted = calibrate.fit(calibration, measured)
        profile = calibrate.with_sources(profile, calibrate.note(rounds))
    results = {}
    for case in validation:
        simulated = calibrate.simulate_case(profile, case)
        results[case.name] = {"measured_ms": measured[case.name] * 1e3, "simulated_ms": simulated * 1e3,
                              "error": (simulated - measured[case.name]) / measured[case.name]}
    errors = [abs(r["error"]) for r in results.values()]
    record = {
        "kind": "validation: measured on this machine against simulated with the profile below",
        "profile": profile.to_python(),
        "rounds": rounds,
        "cluster": f"{len(topology.islands)}x{topology.islands[0].num_devices} CPU devices, DCN emulated",
        "calibration": {c.name: {"measured_ms": measured[c.name] * 1e3,
                                 **({"fitted_ms": fitted[c.name] * 1e3} if fitted else {})} for c in calibration},
        "validation": results,
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "targets": {"median_abs_error": TARGET_MEDIAN, "worst_abs_error": TARGET_WORST},
        "met": statistics.median(errors) <= TARGET_MEDIAN and max(errors) <= TARGET_WORST,
    }
    return record, profile
