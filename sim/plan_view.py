"""What the simulator needs of a plan, worked out once per plan: launch durations, hosts, orders."""

from __future__ import annotations

from pathways_mlir.dialect.device_time import launch_costs
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_steps import Recv, Send
from pathways_mlir.runtime.admission import run_need

from .network import all_reduce_seconds
from .profile import Profile, ProfileError


class PreparedPlan:
    """What the simulator needs of a plan, computed once per plan."""

    def __init__(self, plan: ProgramPlan, profile: Profile):
        self.source = plan          # held, so that the id the simulator caches it by stays its own
        self.plan = plan            # with its frees and peaks (pw-plan-memory)
        self.need = run_need(self.plan)
        accel = profile.accelerator
        self.duration = {sid: accel.launch_seconds(c.flops, c.bytes, c.devices)
                         + sum(all_reduce_seconds(b, n, profile.ici) for b, n in c.all_reduces)
                         for sid, c in launch_costs(self.plan).items()}
        self.islands = tuple(i for i, steps in self.plan.islands.items() if steps)
        self.hosts = {i: _hosts_used(self.plan, i, accel.devices_per_host) for i in self.islands}
        self.island_of_step = {s.id: i for i, steps in self.plan.islands.items() for s in steps}
        self.inputs: dict[str, list[int]] = {}
        for b in self.plan.inputs:
            self.inputs.setdefault(self.plan.island_of(b), []).append(b)
        self.launch_placed = frozenset().union(*(self.plan.launch_placed(i) for i in self.islands))
        self.order = [self.plan.steps[sid] for sid in self.plan.topological_order]
        self.held = self.plan.conds_before
        self.first = {i: tuple(s for s in self.plan.islands[i] if not self.held[s.id]) for i in self.islands}
        sends = {s.dst_buffer: s.id for steps in self.plan.islands.values() for s in steps if isinstance(s, Send)}
        self.recv_of_send = {sends[r.dst_buffer]: r for steps in self.plan.islands.values() for r in steps
                             if isinstance(r, Recv)}


def _hosts_used(plan: ProgramPlan, island: str, per_host: int) -> int:
    """Returns how many hosts of `island` hold a device of a slice the plan uses there (O(slices))."""
    ranges = sorted(r for s in plan.slices.values() if s.island == island for r in s.ranges)
    hosts, last = 0, -1
    for begin, end in ranges:
        first = max(begin // per_host, last + 1)
        final = (end - 1) // per_host
        if final >= first:
            hosts += final - first + 1
            last = final
    return hosts


def check_describes(plan: ProgramPlan, profile: Profile) -> None:
    """Raises ProfileError if the plan's topology has devices the profile does not describe.

    Runs are admitted against the profile's device memory, whatever the topology says.
    """
    for island in plan.topology.islands:
        if island.device_kind not in profile.device_kinds:
            raise ProfileError(f"@{plan.program}: {island.name} has device kind '{island.device_kind}', which "
                               f"profile {profile.name} does not describe (it describes: "
                               f"{', '.join(profile.device_kinds)})")


def layout(plan: ProgramPlan, buffer: int) -> tuple:
    """Returns the layout of a device buffer: its slice's mesh shape, and for each dimension the mesh axes (by
    position, whatever their names) it is split over."""
    info = plan.buffers[buffer]
    placement = plan.slices[info.slice]
    return placement.shape, tuple(tuple(placement.axes.index(a) for a in dim) for dim in info.sharding)
