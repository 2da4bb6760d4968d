"""Device time: one table of device rates, and what each plan step costs on a device.

The rates are (flops per second, memory bytes per second) of one device, by
device kind, read from the machine profiles in `dialect/profiles/*.json`
(each cites its sources; `cpu-here` is fitted on this machine by `pw-sim
calibrate`). Placement (`passes/placement_cost.py`) estimates step times
with them, the gang scheduler's `share` policy charges runs their estimated
device time with them before it has measured any (`runtime/scheduler.py`),
and the simulator (`sim/`) reads the same profiles for its accelerators,
links and hosts. A device kind no profile names gets `DEFAULT_RATES`.

A launch's cost (`Launch.cost`, `dialect/plan_steps.py`) is its work and
bytes on each device of its slice; it takes as long as the slower of the two
at the device's rates (a roofline). The all-reduces that combine a launch's
outputs (`LaunchCost.all_reduces`) are timed by the simulator on the
island's ICI; `device_seconds` leaves them out (the table holds no link
rates).
"""

from __future__ import annotations

import json
import pathlib

from .plan import ProgramPlan
from .plan_steps import LaunchCost

PROFILE_DIR = pathlib.Path(__file__).parent / "profiles"
DEFAULT_RATES = (1e12, 1e11)


def _rates_of_profiles(directory: pathlib.Path) -> dict[str, tuple[float, float]]:
    """Returns (flops per second, bytes per second) by device kind, from every profile in `directory`."""
    rates: dict[str, tuple[float, float]] = {}
    for path in sorted(directory.glob("*.json")):
        value = json.loads(path.read_text())
        accelerator = value["accelerator"]
        for kind in value["device_kinds"]:
            if kind in rates:
                raise ValueError(f"{path}: device kind '{kind}' is described by another profile too")
            rates[kind] = (accelerator["peak_tflops"] * 1e12, accelerator["memory_gbytes_per_s"] * 1e9)
    return rates


# (flops per second, memory bytes per second) of one device, by device kind.
DEVICE_RATES = _rates_of_profiles(PROFILE_DIR)


def device_rates(device_kind: str) -> tuple[float, float]:
    """Returns (flops per second, bytes per second) of one device of `device_kind`."""
    return DEVICE_RATES.get(device_kind, DEFAULT_RATES)


def launch_costs(plan: ProgramPlan) -> dict[int, LaunchCost]:
    """Returns the per-device cost of every step of `plan` that computes (its launches), by step id."""
    return {step.id: cost for steps in plan.islands.values() for step in steps
            if (cost := step.cost(plan)) is not None}


def device_seconds(plan: ProgramPlan) -> float:
    """Returns the device time one run of `plan` occupies: each launch's roofline time on its device
    kind, times the devices of its slice, summed (device-seconds; collectives not counted)."""
    kinds = {island.name: island.device_kind for island in plan.topology.islands}
    total = 0.0
    for island, steps in plan.islands.items():
        flops_rate, bytes_rate = device_rates(kinds.get(island, ""))
        for step in steps:
            cost = step.cost(plan)
            if cost is not None:
                total += max(cost.flops / flops_rate, cost.bytes / bytes_rate) * cost.devices
    return total
