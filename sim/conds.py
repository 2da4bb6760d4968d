"""The host steps of a simulated run: `pw.cond`, as runtime/dispatch.py runs them.

The predicate is read once its value is computed (the runtime reads it to
the host); which branch it takes comes from the simulation's
`BranchOutcomes` (sim/branches.py), since no value is computed here. The
chosen branch plan is called as a run of its own (`cond_us` and the
controller's `run_us`, admitted at once within its parent's reservation,
which counts the largest branch's need as the runtime's does, its inputs the
parent's buffers), and once its outputs exist the controller puts them on
the parent's islands, one message per island, with the steps that no cond
holds back any more (parallel dispatch; in sequential dispatch the next
steps follow one by one). A value a cond moves between slices of one island
(the branch's inputs, its outputs) is an ICI copy, as the runtime's
`copy_to` of a device array is (profiled here: 408-886 us, where they were
put as program inputs, at 160-210 us); one from another island is put as a
program input is. In parallel dispatch a run's conds go one after another
on a thread of the run's own, beside its other steps: the caller starts it
once its inline work is over and it ends after the last cond, each costing
half of `cond_thread_us` of host work (profiled here: the new thread ran
123-198 us after `Thread.start`, and after its last cond the island's
executor took the held-back step 132-336 us after it was sent, against
33-148 us from the caller's own thread in sequential dispatch). The parent
is over once its steps and its branch runs are.
"""

from __future__ import annotations

from typing import Callable

from pathways_mlir.dialect.plan_steps import Branch
from pathways_mlir.runtime.dispatch_mode import DispatchMode

from .plan_view import layout
from .runs import RunRecord, RunState, Submission


class HostConds:
    """The simulator's part that runs host conds (mixed into `Simulator`, whose state it shares)."""

    def _cond_thread(self, run: RunState, then: Callable[[], None]) -> None:
        """Parallel dispatch, once the call's inline work is over: the controller starts the run's cond thread
        (half of `cond_thread_us`), which takes the conds; then `then`."""
        self._thread_work(run, "start")
        self._conds(run, 0)
        then()

    def _conds(self, run: RunState, position: int) -> None:
        """Parallel dispatch: the run's conds, one after another (the runtime's `_after_conds` thread), then
        the thread's end (half of `cond_thread_us`: its last message and its exit)."""
        conds = run.prep.plan.host_steps
        if position < len(conds):
            self._cond(run, conds[position], lambda: self._conds(run, position + 1))
        else:
            self._thread_work(run, "end")

    def _thread_work(self, run: RunState, what: str) -> None:
        """The controller's half of `cond_thread_us` to start or end the run's cond thread."""
        seconds = self.profile.host.cond_thread_us * 0.5e-6
        if seconds:
            start = self._controller_work(seconds)
            self._span(f"{what} cond thread of @{run.prep.plan.program}", "controller", "", "controller", start,
                       self.controller_free)

    def _cond(self, run: RunState, cond: Branch, then: Callable[[], None]) -> None:
        """Reads the predicate once its value is computed (`cond_us` of host work: the read to the host), takes
        the branch the outcomes say, and calls its plan as a run of its own on the cond's inputs (moved to the
        branch's devices); `then` once the branch's outputs are on the run's islands."""
        missing = [b for b in cond.consumed() if b not in run.exists]
        if missing:
            run.waiters.setdefault(missing[0], []).append(lambda: self._cond(run, cond, then))
            return
        known = max(self.now, run.ready.get(cond.pred_buffer, self.now) + self.profile.host.message_latency_us * 1e-6)
        if known > self.now:
            self._at(known, lambda: self._cond(run, cond, then))
            return
        branch = cond.then_plan if self.outcomes.next(run.prep.plan.program) else cond.else_plan
        child = RunState(-1, next(self.tickets), self._prepared[id(branch)],
                     Submission(branch, run.sub.dispatch),
                     RunRecord(branch.program, run.sub.dispatch, self.now))
        child.parent = run
        for outer, inner in zip(cond.inputs, branch.inputs):
            child.ready[inner] = run.ready.get(outer, self.now)
            if run.prep.plan.island_of(outer) is not None:
                child.on_devices[inner] = (run.prep.plan.island_of(outer), run.prep.plan.buffers[outer].slice,
                                           layout(run.prep.plan, outer))
        start = self._controller_work((self.profile.host.cond_us + self.profile.host.run_us) * 1e-6)
        self._span(f"call @{branch.program} (cond)", "controller", "", "controller", start, self.controller_free)
        self._at(self.controller_free, lambda: self._start_branch(child, cond, then))

    def _start_branch(self, child: RunState, cond: Branch, then: Callable[[], None]) -> None:
        child.record.admitted = self.now     # within its parent's reservation, which counts its largest branch
        self._dispatch(child, inline=bool(self.profile.host.inline))
        self._when_exist(child, list(child.prep.plan.outputs), lambda: self._branch_over(child, cond, then))

    def _when_exist(self, run: RunState, buffers: list[int], action: Callable[[], None]) -> None:
        missing = [b for b in buffers if b not in run.exists]
        if missing:
            run.waiters.setdefault(missing[0], []).append(lambda: self._when_exist(run, buffers, action))
            return
        self._at(max([self.now, *(run.exists[b] for b in buffers)]), action)

    def _branch_over(self, child: RunState, cond: Branch, then: Callable[[], None]) -> None:
        """The branch's outputs exist: the controller puts them on the run's islands, with the steps they
        held back (parallel dispatch), one message per island."""
        run, host = child.parent, self.profile.host
        puts: dict[str, list[int]] = {}
        for outer, inner in zip(cond.outputs, child.prep.plan.outputs):
            run.ready[outer] = child.ready.get(inner, self.now)
            if child.prep.plan.island_of(inner) is not None:
                run.on_devices[outer] = (child.prep.plan.island_of(inner), child.prep.plan.buffers[inner].slice,
                                         layout(child.prep.plan, inner))
            island = run.prep.plan.island_of(outer)
            if island is None:
                run.set_exists(outer, self.now)
            else:
                puts.setdefault(island, []).append(outer)
        run.conds_done |= {cond.id}
        steps = {}
        if run.sub.dispatch is DispatchMode.PARALLEL:
            held = run.prep.held
            steps = {i: tuple(s for s in run.prep.plan.islands[i] if cond.id in held[s.id]
                              and held[s.id] <= run.conds_done) for i in run.prep.islands}
        for island in sorted(set(puts) | {i for i, ss in steps.items() if ss}):
            self._controller_work(host.message_us * 1e-6, hold_cores=False)
            self._at(self.controller_free + host.message_latency_us * 1e-6,
                     lambda i=island: self._continue(run, i, steps.get(i, ()), puts.get(i, ())))
        self._at(self.controller_free, then)

    def _continue(self, run: RunState, island: str, steps, puts) -> None:
        """More work of a run on an island: a cond's outputs to put on its devices, and steps."""
        self._put(run, island, puts)
        self._receive(run, island, steps, first=False)
