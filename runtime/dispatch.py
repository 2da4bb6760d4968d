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

The dispatcher reaches islands only through their messages (`load`,
`prepare`, `put`, `fetch`, `submit` through the gang scheduler, `release`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan, Step

from .island import client_owner, run_owner
from .run import Run
from .scheduler import Submission

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
    return deps


class Dispatcher:
    """Runs plans for one client, talking to islands only through their messages."""

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
        values = []
        for buffer, value in zip(plan.inputs, args):
            value = value if hasattr(value, "shape") else np.asarray(value)
            if tuple(value.shape) != plan.buffers[buffer].shape:
                raise TypeError(f"argument for buffer {buffer} of {plan.program} has shape "
                                f"{tuple(value.shape)}, expected {plan.buffers[buffer].shape}")
            values.append(value)
        run = Run(plan, self.client_id)
        key = self.runtime.load(plan)
        for buffer, value in zip(plan.inputs, values):
            self._put(run, key, buffer, value)
        run.outputs = {b: self._future(run, key, b) for b in plan.outputs}
        deps = _dependencies(plan)
        if mode == "parallel":
            for island, steps in plan.islands.items():
                if steps:
                    self.runtime.islands[island].prepare(key, [s.id for s in steps])
            waits_on = _conds_before(plan, deps)
            first = [s.id for island in plan.islands.values() for s in island if not waits_on[s.id]]
            if plan.host_steps:
                self._submit(run, key, first)
                threading.Thread(target=self._after_conds, args=(run, key, waits_on, mode),
                                 name="pw-cond", daemon=True).start()
            else:
                self._submit(run, key, first, on_executed=lambda: self._watch(run))
        else:
            self._sequential(run, key, deps, mode)
        return run

    def _put(self, run: Run, key: int, buffer: int, value) -> None:
        """Places a host value on its home island, or keeps it on the host if it has no home."""
        island = run.island_of(buffer)
        if island is None:
            run.host.setdefault(buffer, Future()).set_result(value)
            return
        owner = client_owner(self.client_id) if buffer in run.plan.outputs else run_owner(self.client_id, run.id)
        self.runtime.islands[island].put(run.id, key, buffer, value, owner)

    def _future(self, run: Run, key: int, buffer: int) -> Future:
        """Returns the future of a buffer's array (a `fetch` message to its island)."""
        island = run.island_of(buffer)
        if island is None:
            return run.host.setdefault(buffer, Future())
        return self.runtime.islands[island].fetch(run.id, key, buffer)

    def _submit(self, run: Run, key: int, step_ids, on_executed=lambda: None) -> None:
        wanted = set(step_ids)
        steps = {island: tuple(s.id for s in ss if s.id in wanted) for island, ss in run.plan.islands.items()}
        cost = float(sum(len(v) for v in steps.values()))
        self.runtime.scheduler.submit(Submission(self.client_id, self.weight, cost, run.id, key, steps, on_executed))

    # -- parallel ------------------------------------------------------------

    def _after_conds(self, run: Run, key: int, waits_on: dict[int, set[int]], mode: str) -> None:
        """Runs the conds in order; after each, submits the steps it was holding back."""
        island_steps = [s.id for ss in run.plan.islands.values() for s in ss]
        done: set[int] = set()
        try:
            for cond in run.plan.host_steps:
                self._run_cond(run, key, cond, mode)
                done.add(cond.id)
                self._submit(run, key, [s for s in island_steps if cond.id in waits_on[s] and waits_on[s] <= done])
        except BaseException as error:  # noqa: BLE001  (reported through the run)
            run.fail(error)
        # Delivered after everything this run submitted, so the watcher never waits on undelivered work.
        self._submit(run, key, [], on_executed=lambda: self._watch(run))

    def _run_cond(self, run: Run, key: int, cond: Step, mode: str) -> None:
        """The host step: read the predicate, run the chosen branch, place its results."""
        predicate = bool(np.asarray(self._future(run, key, cond.pred_buffer).result()))
        branch = cond.then_plan if predicate else cond.else_plan
        inner = self.start(branch, [self._future(run, key, b).result() for b in cond.inputs], mode)
        for buffer, inner_buffer in zip(cond.outputs, branch.outputs):
            self._put(run, key, buffer, inner.outputs[inner_buffer].result())
        inner.done.add_done_callback(lambda _: self._release(inner, final=True))

    # -- sequential ----------------------------------------------------------

    def _sequential(self, run: Run, key: int, deps: dict[int, set[int]], mode: str) -> None:
        by_id = {s.id: (island, s) for island, ss in run.plan.islands.items() for s in ss}
        by_id.update({s.id: (None, s) for s in run.plan.host_steps})
        try:
            for step_id in _topological(deps):
                island, step = by_id[step_id]
                for b in consumed(step):
                    self._future(run, key, b).result()     # predecessors enqueued, outputs exist
                if step.kind == "cond":
                    self._run_cond(run, key, step, mode)
                    continue
                if step.kind == "recv":
                    self._future(run, key, step.dst_buffer).result()
                self.runtime.islands[island].prepare(key, [step_id])   # this step's host work, only now
                executed = Future()
                self._submit(run, key, [step_id], lambda f=executed: f.set_result(None))
                executed.result()                       # the island has enqueued it
        except BaseException as error:  # noqa: BLE001
            run.fail(error)
        self._watch(run)

    # -- completion ----------------------------------------------------------

    def _watch(self, run: Run) -> None:
        """Completes the run once its outputs are ready; its intermediates are then freed."""
        def wait():
            try:
                for future in run.outputs.values():
                    value = future.result()
                    if hasattr(value, "block_until_ready"):
                        value.block_until_ready()
            except BaseException as error:  # noqa: BLE001
                run.fail(error)
            self._release(run, final=False)
            if not run.done.done():
                run.done.set_result(run)
        self.runtime.watchers.submit(wait)

    def _release(self, run: Run, final: bool) -> None:
        """Frees a run's intermediates on every island (and its outputs too if `final`)."""
        for island in run.islands():
            self.runtime.islands[island].release_run(run.id, run.client_id)
            if final:
                for b in run.plan.outputs:
                    self.runtime.islands[island].release(run.id, b)


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
