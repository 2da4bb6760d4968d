"""Device time: one table of device rates, and what each plan step costs on a device.

The rates are (flops per second, memory bytes per second) of one device, by
device kind, read from the machine profiles in `dialect/profiles/*.json`
(each cites its sources; `cpu-here` is fitted on this machine by `pw-sim
calibrate`). Placement (`passes/placement_cost.py`) estimates step times
with them, the gang scheduler's `share` policy charges runs their estimated
device time with them before it has measured any (`runtime/scheduler.py`),
and the simulator (`sim/`) reads the same profiles for its accelerators,
links and hosts. A device kind no profile names gets `DEFAULT_RATES`.

A launch's cost is the work of its executable (its `pw.cost` flops, kept in
the plan) divided over the most distinct shards any of its operands has
(SPMD partitioning splits the work as finely as its most split operand),
and the bytes of its input and output shards on one device; it takes as
long as the slower of the two at the device's rates (a roofline). An output
with fewer distinct shards than the work was split into is combined across
the devices that computed its parts: an all-reduce among `ways / shards`
devices (`LaunchCost.all_reduces`), which the simulator times on the
island's ICI and `device_seconds` leaves out (the table holds no link rates).
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

from .plan import ProgramPlan
from .plan_steps import Launch

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


@dataclass(frozen=True)
class LaunchCost:
    """A launch's work on each device of its slice, and the all-reduces that combine its outputs.

    `all_reduces` holds (bytes per device, devices in each group) per output combined.
    """

    flops: int
    bytes: int
    all_reduces: tuple[tuple[int, int], ...] = ()


def launch_cost(plan: ProgramPlan, step: Launch, flops: int | None = None) -> LaunchCost:
    """Returns a launch's per-device cost; `flops` is its executable's whole flops (default: the plan's)."""
    flops = plan.flops.get(step.executable, 0) if flops is None else flops
    sizes = dict(zip(plan.slices[step.slice].axes, plan.slices[step.slice].shape))

    def shards(buffer: int) -> int:
        return math.prod(sizes.get(a, 1) for axes in plan.buffers[buffer].sharding for a in axes)
    operands = (*step.inputs, *step.outputs)
    ways = max((shards(b) for b in operands), default=1)
    nbytes = sum(plan.buffers[b].bytes_per_device for b in operands)
    reduces = tuple((plan.buffers[b].bytes_per_device, ways // shards(b)) for b in step.outputs
                    if shards(b) < ways)
    return LaunchCost(flops // ways, nbytes, reduces)


def launch_costs(plan: ProgramPlan, flops: dict[str, int] | None = None) -> dict[int, LaunchCost]:
    """Returns the per-device cost of every launch of `plan`, by step id (flops by executable: the plan's)."""
    flops = plan.flops if flops is None else flops
    return {step.id: launch_cost(plan, step, flops.get(step.executable, 0))
            for steps in plan.islands.values() for step in steps if isinstance(step, Launch)}


def device_seconds(plan: ProgramPlan) -> float:
    """Returns the device time one run of `plan` occupies: each launch's roofline time on its device
    kind, times the devices of its slice, summed (device-seconds; collectives not counted)."""
    kinds = {island.name: island.device_kind for island in plan.topology.islands}
    total = 0.0
    for island, steps in plan.islands.items():
        flops_rate, bytes_rate = device_rates(kinds.get(island, ""))
        for step in steps:
            if isinstance(step, Launch):
                cost = launch_cost(plan, step)
                devices = math.prod(plan.slices[step.slice].shape)
                total += max(cost.flops / flops_rate, cost.bytes / bytes_rate) * devices
    return total
