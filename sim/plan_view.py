"""What the simulator needs of a plan, worked out once per plan: launch durations, hosts, orders."""

from __future__ import annotations

import heapq

from pathways_mlir.dialect.device_time import launch_costs
from pathways_mlir.dialect.memory_plan import with_memory_plan
from pathways_mlir.dialect.plan import Launch, ProgramPlan, Recv, Send, Step
from pathways_mlir.runtime.admission import run_need

from .network import all_reduce_seconds
from .profile import Profile, ProfileError


class PreparedPlan:
    """What the simulator needs of a plan, computed once per plan."""

    def __init__(self, plan: ProgramPlan, profile: Profile):
        self.source = plan          # held, so that the id the simulator caches it by stays its own
        self.plan = with_memory_plan(plan)
        self.need = run_need(self.plan)
        accel = profile.accelerator
        launches = {s.id: s for steps in self.plan.islands.values() for s in steps if isinstance(s, Launch)}
        self.duration = {sid: accel.launch_seconds(c.flops, c.bytes, _size(self.plan, launches[sid].slice))
                         + sum(all_reduce_seconds(b, n, profile.ici) for b, n in c.all_reduces)
                         for sid, c in launch_costs(self.plan).items()}
        self.islands = tuple(i for i, steps in self.plan.islands.items() if steps)
        self.hosts = {i: _hosts_used(self.plan, i, accel.devices_per_host) for i in self.islands}
        self.island_of_step = {s.id: i for i, steps in self.plan.islands.items() for s in steps}
        self.inputs: dict[str, list[int]] = {}
        for b in self.plan.inputs:
            self.inputs.setdefault(self.plan.island_of(b), []).append(b)
        deps = _dependencies(self.plan)
        self.order = _topological(self.plan, deps)
        self.held = _conds_before(self.plan, self.order, deps)
        self.first = {i: tuple(s for s in self.plan.islands[i] if not self.held[s.id]) for i in self.islands}
        sends = {s.dst_buffer: s.id for steps in self.plan.islands.values() for s in steps if isinstance(s, Send)}
        self.recv_of_send = {sends[r.dst_buffer]: r for steps in self.plan.islands.values() for r in steps
                             if isinstance(r, Recv)}


def _size(plan: ProgramPlan, slice_name: str) -> int:
    return sum(e - b for b, e in plan.slices[slice_name].ranges)


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


def _steps(plan: ProgramPlan) -> dict[int, Step]:
    return {s.id: s for s in (*(s for ss in plan.islands.values() for s in ss), *plan.host_steps)}


def _dependencies(plan: ProgramPlan) -> dict[int, set[int]]:
    """Returns, for every step id (island and host steps), the step ids it must follow."""
    steps = _steps(plan)
    producer = {b: s.id for s in steps.values() for b in s.produced()}
    return {sid: set(s.after) | {producer[b] for b in s.consumed() if b in producer} - {sid}
            for sid, s in steps.items()}


def _conds_before(plan: ProgramPlan, order: list[Step], deps: dict[int, set[int]]) -> dict[int, frozenset[int]]:
    """Returns, for every step, the host conds it waits for, directly or not (the runtime holds it back
    until they are over)."""
    conds = {s.id for s in plan.host_steps}
    held: dict[int, frozenset[int]] = {}
    for step in order:
        held[step.id] = frozenset().union(*((held[d] | ({d} & conds)) for d in deps[step.id]))
    return held


def _topological(plan: ProgramPlan, deps: dict[int, set[int]]) -> list[Step]:
    """Returns the plan's steps (island and host) in dependency order (smallest id first among the ready)."""
    steps = _steps(plan)
    deps = {sid: set(before) for sid, before in deps.items()}
    users: dict[int, list[int]] = {}
    for sid, before in deps.items():
        for b in before:
            users.setdefault(b, []).append(sid)
    ready = [sid for sid, before in deps.items() if not before]
    heapq.heapify(ready)
    order = []
    while ready:
        sid = heapq.heappop(ready)
        order.append(steps[sid])
        for user in users.get(sid, ()):
            deps[user].discard(sid)
            if not deps[user]:
                heapq.heappush(ready, user)
    return order


def check_describes(plan: ProgramPlan, profile: Profile) -> None:
    """Raises ProfileError if the plan's topology has devices the profile does not describe.

    Runs are admitted against the profile's device memory, whatever the topology says.
    """
    for island in plan.topology.islands:
        if island.device_kind not in profile.device_kinds:
            raise ProfileError(f"@{plan.program}: {island.name} has device kind '{island.device_kind}', which "
                               f"profile {profile.name} does not describe (it describes: "
                               f"{', '.join(profile.device_kinds)})")
