"""Device time: one table of device rates, and what each plan step costs on a device.

The rates are (flops per second, memory bytes per second) of one device, by
device kind. Placement (`passes/placement_cost.py`) estimates step times
with them, the gang scheduler's `share` policy charges runs their estimated
device time with them before it has measured any (`runtime/scheduler.py`),
and the simulator's costs start from the same launch costs
(`sim/costs.py`).

A launch's cost is the work of its executable (its `pw.cost` flops, kept in
the plan) divided over the distinct shards of its largest output, and the
bytes of its input and output shards on one device; it takes as long as the
slower of the two at the device's rates (a roofline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .plan import Launch, ProgramPlan

# (flops per second, memory bytes per second) of one device, by device kind.
DEVICE_RATES = {"cpu": (1e11, 2e10), "gpu": (1e14, 2e12), "tpu": (1e14, 1e12)}
DEFAULT_RATES = (1e12, 1e11)


def device_rates(device_kind: str) -> tuple[float, float]:
    """Returns (flops per second, bytes per second) of one device of `device_kind`."""
    return DEVICE_RATES.get(device_kind, DEFAULT_RATES)


@dataclass(frozen=True)
class LaunchCost:
    """A launch's work on each device of its slice."""

    flops: int
    bytes: int


def launch_cost(plan: ProgramPlan, step: Launch, flops: int | None = None) -> LaunchCost:
    """Returns a launch's per-device cost; `flops` is its executable's whole flops (default: the plan's)."""
    flops = plan.flops.get(step.executable, 0) if flops is None else flops
    sizes = dict(zip(plan.slices[step.slice].axes, plan.slices[step.slice].shape))
    outputs = [plan.buffers[b] for b in step.outputs]
    ways = 1
    if outputs:
        largest = max(outputs, key=lambda b: math.prod(b.shape))
        ways = math.prod(sizes.get(a, 1) for axes in largest.sharding for a in axes)
    nbytes = sum(plan.buffers[b].bytes_per_device for b in (*step.inputs, *step.outputs))
    return LaunchCost(flops // ways, nbytes)


def launch_costs(plan: ProgramPlan, flops: dict[str, int] | None = None) -> dict[int, LaunchCost]:
    """Returns the per-device cost of every launch of `plan`, by step id (flops by executable: the plan's)."""
    flops = plan.flops if flops is None else flops
    return {step.id: launch_cost(plan, step, flops.get(step.executable, 0))
            for steps in plan.islands.values() for step in steps if isinstance(step, Launch)}


def device_seconds(plan: ProgramPlan) -> float:
    """Returns the device time one run of `plan` occupies: each launch's roofline time on its device
    kind, times the devices of its slice, summed (device-seconds)."""
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
