"""A plan's memory: frees after last use, and each island's static peak per device.

One analysis, run by the `pw-plan-memory` pass only (which writes its
result into the IR); the runtime and the simulator read that result from
the plan. `with_memory_plan` applies it to a plan built by hand in Python
(the tests' plan builder), as the pass would.

A buffer that is not a program result is freed right after its last reader
in the plan's dependency order, `ProgramPlan.topological_order` (a host
`Branch` counts: the buffer is then freed after that branch; a buffer
nobody reads is freed right after its writer; an unused input before the
first step). The peak walks each island's steps in order:
program inputs and values a branch puts on the island count from the start
of the run, results to its end; while a fused launch runs, its executable's
`scratch_bytes` (the values only it uses) count on every device of its
slice. It is kept as (begin, end, bytes) triples over island-local device
ranges, merged where neighbours agree, so it grows with the number of
slices, never with the number of devices.

A donated input (`plan.donated`, from `donate_argnums`) is reused, as
`jax.jit` reuses it: where its last reader is a launch on its island, the
runtime compiles that launch with the input donated (`donated_at`), and the
launch writes one of its results with the same slice, shape, type and
sharding into the input's buffer (`reuses`), so the result adds no bytes to
the peak.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Iterator

from .plan import ProgramPlan
from .plan_steps import Free, Launch, Step


def frees(plan: ProgramPlan, island: str, step_ids: Iterator[int]) -> dict[int | None, Free]:
    """Returns the Free to place after each island step id (None: before the first step)."""
    steps = plan.islands.get(island, ())
    rank = _ranks(plan)
    local = [s.id for s in steps]
    # floor[k]: the smallest rank of local[k:]; it never decreases with k, so the island's last
    # listed step ranked no later than r is local[k] for the largest k with floor[k] <= r.
    floor = list(itertools.accumulate(reversed([rank[i] for i in local]), min))[::-1]
    outputs = set(plan.outputs)
    readers: dict[int, set[int]] = {}
    writer: dict[int, int] = {}
    for s in (*steps, *plan.host_steps):
        for b in s.consumed():
            readers.setdefault(b, set()).add(s.id)
        for b in s.produced():
            writer[b] = s.id
    dying: dict[int | None, list[int]] = {}
    last_users: dict[int | None, set[int]] = {}
    subgraph: dict[int | None, int] = {}
    by_id = {s.id: s for s in (*steps, *plan.host_steps)}
    for b in sorted(plan.buffers):
        if b in outputs or plan.island_of(b) != island:
            continue
        users = readers.get(b) or ({writer[b]} if b in writer else set())
        last = max(users, key=rank.__getitem__, default=None)
        # After the island's last listed step that the dependency order puts no later than `last`.
        k = -1 if last is None else bisect.bisect_right(floor, rank[last]) - 1
        position = None if k < 0 else local[k]
        dying.setdefault(position, []).append(b)
        last_users.setdefault(position, set()).update(users)
        subgraph[position] = max([subgraph.get(position, 0), *(by_id[u].subgraph for u in users)])
    return {position: Free(next(step_ids), tuple(sorted(last_users[position])), subgraph[position],
                           buffers=tuple(buffers))
            for position, buffers in dying.items()}


def donated_at(plan: ProgramPlan, island: str) -> dict[int, tuple[int, ...]]:
    """Returns, per launch step id on `island`, the donated inputs whose last reader it is: the runtime
    compiles it with them donated, as `jax.jit` compiles its donated arguments, and XLA may write any result
    of their size into their buffers.

    An input qualifies when it is donated, lives on `island`, is not a
    program result, is read by launches only (a copy or send may still hold
    its array after the launch), and its last reader is that launch, which
    reads it once.
    """
    if not plan.donated:
        return {}
    steps = plan.islands.get(island, ())
    rank = _ranks(plan)
    last_reader: dict[int, Step] = {}
    read_otherwise: set[int] = set()
    for s in (*steps, *plan.host_steps):
        for b in s.reads():
            if not isinstance(s, Launch):
                read_otherwise.add(b)
            if b not in last_reader or rank[s.id] > rank[last_reader[b].id]:
                last_reader[b] = s
    found: dict[int, tuple[int, ...]] = {}
    for b in plan.donated:
        launch = last_reader.get(b)
        if isinstance(launch, Launch) and plan.island_of(b) == island and b not in plan.outputs \
                and b not in read_otherwise and launch.inputs.count(b) == 1:
            found[launch.id] = found.get(launch.id, ()) + (b,)
    return found


def reuses(plan: ProgramPlan, island: str) -> dict[int, dict[int, int]]:
    """Returns, per launch step id on `island`, the donated inputs it overwrites: input buffer -> result.

    An input qualifies when that launch is its last reader (`donated_at`)
    and writes a result laid out exactly as it: the memory plan counts the
    two as one (XLA may also write a result of another shape or type into
    a donated input, as it does for `jax.jit`, which the plan does not count
    on).
    """
    found: dict[int, dict[int, int]] = {}
    for step, donated in donated_at(plan, island).items():
        launch = plan.steps[step]
        taken: dict[int, int] = {}
        for b in donated:
            layout = _layout(plan.buffers[b])
            result = next((r for r in launch.outputs if r not in taken.values() and
                           _layout(plan.buffers[r]) == layout), None)
            if result is not None:
                taken[b] = result
        if taken:
            found[step] = taken
    return found


def _ranks(plan: ProgramPlan) -> dict[int, int]:
    """Returns each step's position in the plan's dependency order (`ProgramPlan.topological_order`)."""
    return {sid: k for k, sid in enumerate(plan.topological_order)}


def _layout(info) -> tuple:
    return info.slice, info.shape, info.dtype, info.sharding, info.bytes_per_device


def peak(plan: ProgramPlan, island: str, steps: tuple[Step, ...],
         stored: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """Returns the largest live bytes per device range of `steps` (frees included) as flat triples; the
    input buffers in `stored` are objects the store holds already and count nothing."""
    mine = {b: plan.buffers[b] for b in plan.buffers if plan.island_of(b) == island}
    ranges = {b: plan.slices[info.slice].ranges for b, info in mine.items()}
    points = sorted({p for rs in ranges.values() for r in rs for p in r})
    segments = list(zip(points, points[1:]))
    covers = {b: [i for i, (lo, hi) in enumerate(segments) if any(b0 <= lo and hi <= e0 for b0, e0 in rs)]
              for b, rs in ranges.items()}
    live = [0] * len(segments)

    def add(buffers, sign: int) -> None:
        for b in buffers:
            for i in covers[b]:
                live[i] += sign * mine[b].bytes_per_device

    from_start = set(plan.inputs) | {b for s in plan.host_steps for b in s.produced()}
    alive = {b for b in mine if b in from_start} - stored
    add(alive, 1)
    high = list(live)
    reused = reuses(plan, island)
    for s in steps:
        if s.frees():
            gone = [b for b in s.frees() if b in alive]
            add(gone, -1)
            alive -= set(gone)
            continue
        overwritten = reused.get(s.id, {})
        alive -= set(overwritten)             # the results written in their place take over their bytes
        alive |= set(overwritten.values())
        fresh = [b for b in s.produced() if b in mine and b not in alive]
        add(fresh, 1)
        alive |= set(fresh)
        scratch = plan.fused[s.executable].scratch_bytes if isinstance(s, Launch) and s.executable in plan.fused \
            else 0
        held = [v + scratch * any(b <= lo and hi <= e for b, e in plan.slices[s.slice].ranges)
                for v, (lo, hi) in zip(live, segments)] if scratch else live
        high = [max(h, v) for h, v in zip(high, held)]
    merged: list[list[int]] = []
    for (lo, hi), nbytes in zip(segments, high):
        if nbytes == 0:
            continue
        if merged and merged[-1][1] == lo and merged[-1][2] == nbytes:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, nbytes])
    return tuple(v for triple in merged for v in triple)


def island_memory(plan: ProgramPlan, island: str, step_ids: Iterator[int]
                  ) -> tuple[dict[int | None, Free], tuple[Step, ...], tuple[int, ...]]:
    """Returns the memory plan of one island: the Free after each step id (None: before the first step,
    as `frees`), the island's steps with those frees in place, and its static peak (as `peak`)."""
    placed = frees(plan, island, step_ids)
    ordered: list[Step] = [placed[None]] if None in placed else []
    for s in plan.islands.get(island, ()):
        ordered.append(s)
        if s.id in placed:
            ordered.append(placed[s.id])
    return placed, tuple(ordered), peak(plan, island, tuple(ordered))


def with_memory_plan(plan: ProgramPlan, step_ids: Iterator[int] | None = None) -> ProgramPlan:
    """Returns `plan` with Free steps after last uses and its islands' peaks (if it has neither yet).

    Free step ids come from `step_ids` (default: after the plan's largest id).
    """
    if plan.peak_bytes or any(s.frees() for ss in plan.islands.values() for s in ss):
        return plan
    if step_ids is None:
        ids = [s.id for ss in plan.islands.values() for s in ss] + [s.id for s in plan.host_steps]
        step_ids = itertools.count(max(ids, default=-1) + 1)
    islands, peaks = {}, {}
    for island in plan.islands:
        _, islands[island], peaks[island] = island_memory(plan, island, step_ids)
    return dataclasses.replace(plan, islands=islands, peak_bytes=peaks)
