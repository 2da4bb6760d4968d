"""Dispatching a program plan: parallel or sequential asynchronous dispatch.

Parallel dispatch (the default, the paper's section 4.5): the host work for a
whole static subgraph is done before any of it runs: every buffer gets its
future, every executable is compiled or found in the cache, and each island
receives its part of the subgraph in one message. The client returns at once
with handles; islands enqueue steps as soon as their inputs' producers have
been enqueued.

Sequential dispatch (the fallback when resource needs depend on data, and the
baseline the paper measures against): steps are handled one at a time in
dependency order, and the host work for a step starts only once its
predecessors have been enqueued and their outputs exist.

A `cond` host step splits a plan: steps that depend on its results are held
back until the host has read the predicate and run the chosen branch plan.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan, Step

from .executables import named_sharding
from .run import Run
from .scheduler import Submission
from .transfers import copy_to

if TYPE_CHECKING:
    from .runtime import Runtime

MODES = ("parallel", "sequential")


def consumed(step: Step) -> tuple[int, ...]:
    """Returns the buffers a step reads."""
    if step.kind == "launch":
        return step.inputs
    if step.kind in ("copy", "send"):
        return (step.src_buffer,)
    if step.kind == "cond":
        return (step.pred_buffer, *step.inputs)
    return ()


def produced(step: Step) -> tuple[int, ...]:
    """Returns the buffers a step writes (a send writes its receiver's buffer)."""
    if step.kind in ("launch", "cond"):
        return step.outputs
    if step.kind in ("copy", "send"):
        return (step.dst_buffer,)
    return ()


def _dependencies(plan: ProgramPlan) -> dict[int, set[int]]:
    """Returns, for every step id, the step ids it must follow."""
    steps = [s for ss in plan.islands.values() for s in ss] + list(plan.host_steps)
    producer = {b: s.id for s in steps for b in produced(s)}
    deps = {}
    for s in steps:
        deps[s.id] = set(s.after) | {producer[b] for b in consumed(s) if b in producer}
        if s.kind == "recv":
            deps[s.id].discard(s.id)
    return deps


class Dispatcher:
    """Runs plans for one client on a runtime."""

    def __init__(self, runtime: "Runtime", client_id: int, weight: float = 1.0):
        self.runtime = runtime
        self.client_id = client_id
        self.weight = weight

    def start(self, plan: ProgramPlan, args: Sequence, mode: str = "parallel") -> Run:
        """Starts a run of `plan` on `args` (host or device arrays); returns at once in parallel mode."""
        if mode not in MODES:
            raise ValueError(f"unknown dispatch mode '{mode}' (choose from {', '.join(MODES)})")
        if len(args) != len(plan.inputs):
            raise TypeError(f"program {plan.program} takes {len(plan.inputs)} arrays, got {len(args)}")
        run = Run(plan, self.client_id)
        for buffer, value in zip(plan.inputs, args):
            info = plan.buffers[buffer]
            value = value if hasattr(value, "shape") else np.asarray(value)
            if tuple(value.shape) != info.shape:
                raise TypeError(f"argument for buffer {buffer} of {plan.program} has shape "
                                f"{tuple(value.shape)}, expected {info.shape}")
            run.resolve(buffer, self._place_input(run, info, value))
        deps = _dependencies(plan)
        if mode == "parallel":
            self._prepare(plan)
            waits_on = _conds_before(plan, deps)
            first = [s.id for island in plan.islands.values() for s in island if not waits_on[s.id]]
            if plan.host_steps:
                self._submit(run, first)
                threading.Thread(target=self._after_conds, args=(run, waits_on, mode),
                                 name="pw-cond", daemon=True).start()
            else:
                self._submit(run, first, on_executed=lambda: self._watch(run))
        else:
            self._sequential(run, deps, mode)
        return run

    def _place_input(self, run: Run, info, value):
        """Puts an argument on the slice and sharding of its first use (its home in the plan)."""
        if info.slice is None:
            return value if hasattr(value, "sharding") else np.asarray(value)
        placement = run.plan.slices[info.slice]
        executor = self.runtime.executors[placement.island]
        self.runtime.store.add(run.key(info.id), run.owner_of(info.id),
                               [(placement.island, d) for d in placement.device_ids()], info.bytes_per_device,
                               run.futures[info.id])
        return copy_to(value, named_sharding(executor.mesh(run.plan, info.slice), info.sharding))

    # -- parallel ------------------------------------------------------------

    def _prepare(self, plan: ProgramPlan, step_ids=None) -> None:
        """Host work up front: compile (or find) executables, build shardings, for the given steps."""
        for island, steps in plan.islands.items():
            executor = self.runtime.executors[island]
            for s in steps:
                if step_ids is None or s.id in step_ids:
                    executor.prepare(plan, s)

    def _submit(self, run: Run, step_ids, on_executed=lambda: None) -> None:
        wanted = set(step_ids)
        steps = {island: tuple(s for s in ss if s.id in wanted) for island, ss in run.plan.islands.items()}
        cost = float(sum(len(v) for v in steps.values()))
        self.runtime.scheduler.submit(Submission(self.client_id, self.weight, cost, run, steps, on_executed))

    def _after_conds(self, run: Run, waits_on: dict[int, set[int]], mode: str) -> None:
        """Runs the conds in order; after each, submits the steps it was holding back."""
        island_steps = [s.id for ss in run.plan.islands.values() for s in ss]
        done: set[int] = set()
        try:
            for cond in run.plan.host_steps:
                self._run_cond(run, cond, mode)
                done.add(cond.id)
                ready = [s for s in island_steps if waits_on[s] and waits_on[s] <= done
                         and not waits_on[s] <= done - {cond.id}]
                self._submit(run, ready)
        except BaseException as error:  # noqa: BLE001  (reported through the run)
            run.fail(error)
        # Delivered after everything this run submitted, so the watcher never waits on undelivered work.
        self._submit(run, [], on_executed=lambda: self._watch(run))

    def _run_cond(self, run: Run, cond: Step, mode: str) -> None:
        predicate = bool(np.asarray(run.value(cond.pred_buffer)))
        branch = cond.then_plan if predicate else cond.else_plan
        inner = self.start(branch, [run.value(b) for b in cond.inputs], mode)
        for buffer, inner_buffer in zip(cond.outputs, branch.outputs):
            run.resolve(buffer, inner.value(inner_buffer))
        inner.done.add_done_callback(lambda f: self.runtime.store.release_owner(inner.owner))

    # -- sequential ----------------------------------------------------------

    def _sequential(self, run: Run, deps: dict[int, set[int]], mode: str) -> None:
        by_id = {s.id: s for ss in run.plan.islands.values() for s in ss}
        by_id.update({s.id: s for s in run.plan.host_steps})
        try:
            for step_id in _topological(deps):
                step = by_id[step_id]
                for b in consumed(step):
                    run.futures[b].result()       # predecessors enqueued, outputs exist
                if step.kind == "cond":
                    self._run_cond(run, step, mode)
                    continue
                if step.kind == "recv":
                    run.futures[step.dst_buffer].result()
                self._prepare(run.plan, {step_id})  # this step's host work, only now
                executed = Future()
                self._submit(run, [step_id], lambda f=executed: f.set_result(None))
                executed.result()                 # the island has enqueued it
        except BaseException as error:  # noqa: BLE001
            run.fail(error)
        self._watch(run)

    # -- completion ----------------------------------------------------------

    def _watch(self, run: Run) -> None:
        """Completes the run once its outputs are ready; its intermediates are then freed."""
        def wait():
            try:
                for b in run.plan.outputs:
                    value = run.value(b)
                    if hasattr(value, "block_until_ready"):
                        value.block_until_ready()
            except BaseException as error:  # noqa: BLE001
                run.fail(error)
            self.runtime.store.release_owner(run.owner)
            if not run.done.done():
                run.done.set_result(run)
        self.runtime.watchers.submit(wait)


def _conds_before(plan: ProgramPlan, deps: dict[int, set[int]]) -> dict[int, set[int]]:
    """Returns, for every step, the cond host steps it depends on, directly or not."""
    conds = {s.id for s in plan.host_steps}
    memo: dict[int, set[int]] = {}
    for step in _topological(deps):
        memo[step] = set()
        for before in deps[step]:
            memo[step] |= memo[before] | ({before} & conds)
    return memo


def _topological(deps: dict[int, set[int]]) -> list[int]:
    order, done, visiting = [], set(), set()

    def visit(n):
        if n in done:
            return
        if n in visiting:
            raise ValueError(f"plan steps form a cycle through step {n}")
        visiting.add(n)
        for m in sorted(deps.get(n, ())):
            visit(m)
        visiting.discard(n)
        done.add(n)
        order.append(n)
    for n in sorted(deps):
        visit(n)
    return order
