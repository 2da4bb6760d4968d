"""The discrete-event simulation of plans on a profile's machine.

What happens to one run, as the runtime does it (runtime/dispatch.py,
scheduler.py, island_program.py), with times from the profile:

1. The controller (one host thread) spends `run_us` on the call, then the
   run waits for admission: in ticket order, once its plan's whole static
   peak fits every device it uses (the runtime's own `MemoryLedger`); a
   run that does not fit holds back every run after it. Memory comes back
   when the run's device work is over (results are taken to be released
   then).
2. Parallel dispatch: the controller sends one message per island
   (`message_us` each, arriving `message_latency_us` later). Sequential
   dispatch: one message per island with the inputs, then, in dependency
   order, one message per step, each sent only once the buffers the step
   reads exist, that is once their producers are enqueued (asynchronous
   dispatch: not computed) or their data has arrived, which the controller
   learns one message latency after; each costs `sequential_step_us`, and
   the next call waits for the last.
3. Each island has one host thread. A run's message costs it `per_host_us`
   for each host the run uses on the island (the fan-out) and `input_us`
   per program input it puts on its devices (the data then crosses PCIe;
   inputs a submission says are resident already are not put; in parallel
   dispatch an input whose one reader is a launch on its slice,
   `ProgramPlan.launch_placed`, is placed by that launch instead, for
   `launch_input_us`), then
   `step_us` per launch, copy and send (and per free in sequential
   dispatch, where a free is a message of its own; parallel dispatch folds
   it into the step before it), and `recv_us` per recv whose data arrived
   (the delivery taken in). It takes runs in ticket order, one step
   at a time; a recv whose data has not arrived parks that run and the
   thread goes on with later runs: the gang scheduler's single order per
   island. With `host.inline` (the embedded runtime), a run admitted at its
   call has each island idle then run by the controller itself, island
   after island, until the run parks there or is done.
4. Devices run what is enqueued in order: a launch starts once it is
   enqueued, its inputs exist and its slice's devices are free, and takes
   its launch cost (sim/profile.py) on the accelerator's roofline plus the
   all-reduces of its outputs on the ICI (sim/network.py). Copies and sends
   go over their links (sim/network.py), a copy that changes its array's
   layout (another mesh shape or partitioning) after `reshard_us` (JAX
   reshards it; to the same layout it moves each shard as it is); a recv's
   data exists when it arrives. Where the devices share cores (a CPU), launches, copies and
   input puts all hold those cores, one at a time, and the host threads'
   work holds one core's share of them; with `accelerator.synchronous` a
   launch or copy also holds the thread that made it until it is over. With
   `host.interpreter_lock` (one Python process: the GIL) all host threads'
   work, the controller's and every island's, takes one lock in turn.
5. A `pw.cond` (sim/conds.py): the predicate's value is not computed, so
   the `BranchOutcomes` given say which branch each cond takes (a
   probability, or a recorded trace); the branch plan is then called as a
   run of its own (its operands and results moved as ICI copies), and the
   steps the cond held back follow its outputs; in parallel dispatch a
   run's conds run on a thread of their own (`cond_thread_us`).
"""

from __future__ import annotations

import collections
import heapq
import itertools
from typing import Callable

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_steps import Copy, Launch, Recv, Send, Step
from pathways_mlir.runtime.admission import MemoryLedger
from pathways_mlir.runtime.dispatch_mode import DispatchMode

from .branches import BranchOutcomes
from .conds import HostConds
from .network import Links
from .plan_view import PreparedPlan, check_describes, layout
from .profile import Profile
from .runs import RunRecord, RunState, SimError, SimResult, Span, Submission

__all__ = ["RunRecord", "SimError", "SimResult", "Simulator", "Span", "Submission"]

# The memory ledger keeps a count per device, so an island of more devices than this (a topology read from a
# file may say anything; placement itself never walks the devices) is refused rather than allocated.
MAX_SIMULATED_DEVICES = 1 << 22


def check_simulated_size(plan: ProgramPlan) -> None:
    """Raises SimError if an island of the plan's topology has more devices than pw-sim simulates."""
    for island in plan.topology.islands:
        if island.num_devices > MAX_SIMULATED_DEVICES:
            raise SimError(f"@{plan.program}: {island.name} has {island.num_devices} devices; pw-sim simulates "
                           f"islands of at most {MAX_SIMULATED_DEVICES} (its memory ledger counts each device)")


class Simulator(HostConds):
    """Simulates submissions of plans on one profile's machine (see the module docstring); `branches` says
    which way each `pw.cond` goes (sim/branches.py), and plans with conds need it."""

    def __init__(self, profile: Profile, record_spans: bool = False, branches: BranchOutcomes | None = None):
        self.profile = profile
        self.record_spans = record_spans
        self.branches = branches
        self._prepared: dict[int, PreparedPlan] = {}

    # -- public -------------------------------------------------------------

    def simulate(self, submissions: list[Submission], closed_loop: bool = False) -> SimResult:
        """Runs `submissions` in order; with `closed_loop`, each call waits for the previous results."""
        if not submissions:
            raise SimError("nothing to simulate")
        for sub in submissions:
            if self._prepare(sub.plan).plan.host_steps and self.branches is None:
                raise SimError(f"@{sub.plan.program} has host branch steps (pw.cond): give a branch probability "
                               f"(--branch-probability P) or a trace of predicate values (--branch-trace FILE)")
            if sub.plan.topology != submissions[0].plan.topology:
                raise SimError(f"@{sub.plan.program} was lowered for another topology than "
                               f"@{submissions[0].plan.program}: simulate one cluster at a time")
        self._reset(submissions[0].plan)
        self.outcomes = self.branches.stream() if self.branches else None
        self.closed_loop = closed_loop
        self.pending = list(submissions)
        self.records = [RunRecord(s.plan.program, s.dispatch, s.at) for s in submissions]
        self._at(submissions[0].at, lambda: self._call(0))
        while self.events:
            self.now, _, action = heapq.heappop(self.events)
            action()
        unfinished = [r for r in self.records if r.done < 0]
        if unfinished:
            raise SimError(f"run of @{unfinished[0].program} never finished (a recv without its send?)")
        return SimResult(self.records, self.spans)

    # -- setup --------------------------------------------------------------

    def _prepare(self, plan: ProgramPlan) -> PreparedPlan:
        key = id(plan)
        if key not in self._prepared:
            check_describes(plan, self.profile)
            prep = self._prepared[key] = PreparedPlan(plan, self.profile)
            for cond in prep.plan.host_steps:
                self._prepare(cond.then_plan)
                self._prepare(cond.else_plan)
        return self._prepared[key]

    def _reset(self, plan: ProgramPlan) -> None:
        check_simulated_size(plan)
        self.now = 0.0
        self.events: list = []
        self.seq = itertools.count()
        self.spans: list[Span] = []
        self.links = Links()
        self.ledger = MemoryLedger(plan.topology, self.profile.accelerator.memory_bytes)
        self.controller_free = 0.0
        self.lock_free = 0.0                        # when the interpreter lock is free (host.interpreter_lock)
        self.admission: collections.deque[RunState] = collections.deque()
        # island -> heap of (ticket, run): every run with work for the island's thread (and some without,
        # dropped when found at the top), so the thread takes the next in ticket order without a scan
        self.with_work: dict[str, list[tuple[int, RunState]]] = {}
        self.in_with_work: dict[str, set[int]] = {}    # island -> the tickets in its heap
        self.island_busy: dict[str, bool] = {}
        self.inline: dict[str, tuple] = {}          # island -> (run, resume the controller) while run inline
        self.device_free: dict[tuple, float] = {}   # (island, segment start), or the shared cores -> free at
        self.tickets = itertools.count()
        points: dict[str, set[int]] = {}
        for prep in self._prepared.values():
            for s in prep.plan.slices.values():
                points.setdefault(s.island, set()).update(p for r in s.ranges for p in r)
        self.points = {i: sorted(p) for i, p in points.items()}
        self.covers: dict[tuple[str, tuple], list[int]] = {}

    def _at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (max(time, self.now), next(self.seq), action))

    def _span(self, name, kind, island, track, start, end) -> None:
        if self.record_spans:
            self.spans.append(Span(name, kind, island, track, start, end))

    # -- controller ---------------------------------------------------------

    def _call(self, index: int) -> None:
        sub, record = self.pending[index], self.records[index]
        record.submitted = max(record.submitted, self.now)
        start = self._controller_work(self.profile.host.run_us * 1e-6)
        self._span(f"call @{sub.plan.program}", "controller", "", "controller", start, self.controller_free)
        run = RunState(index, next(self.tickets), self._prepared[id(sub.plan)], sub, record)
        run.after_dispatch = lambda: self._next_call(index + 1)
        never = self.ledger.never_fits(run.prep.need)
        if never:
            raise SimError(f"run of @{sub.plan.program} {never}")
        self._at(self.controller_free, lambda: self._submit(run))

    def _submit(self, run: RunState) -> None:
        """The call's end: the run queues for admission, and is admitted at once (inline) if it can be."""
        self.admission.append(run)
        self._admit(caller=run)

    def _next_call(self, index: int) -> None:
        """Makes call `index` once the client may: at once, or after the previous results (closed loop)."""
        if index >= len(self.pending):
            return
        if not self.closed_loop:
            self._at(max(self.pending[index].at, self.controller_free), lambda: self._call(index))

    def _admit(self, caller: RunState | None = None) -> None:
        """Admits runs in ticket order while they fit; `caller`, if admitted at its own call, runs inline."""
        while self.admission and self.ledger.fits(self.admission[0].prep.need):
            run = self.admission.popleft()
            self.ledger.take(run.prep.need)
            run.record.admitted = self.now
            self._dispatch(run, inline=run is caller and bool(self.profile.host.inline))

    def _dispatch(self, run: RunState, inline: bool) -> None:
        """Sends the run's first message to each island. With `inline`, the islands idle now are the
        controller's to run, one after another, until each parks or is done (the runtime's `run_inline`);
        the controller goes on only after that."""
        host = self.profile.host
        parallel = run.sub.dispatch is DispatchMode.PARALLEL
        for b in run.prep.inputs.get(None, ()):               # host values: the client has them
            run.ready[b] = self.now
            run.set_exists(b, self.now)
        self._finish_if_over(run)
        steps = {i: run.prep.first[i] if parallel else () for i in run.prep.islands}
        own = [i for i in run.prep.islands if inline and self._idle(i)]
        for island in run.prep.islands:
            self._controller_work(host.message_us * 1e-6, hold_cores=False)
            if island in own:
                self.inline[island] = (run, None)        # held for the controller: its turn comes
                continue
            arrive = self.controller_free + host.message_latency_us * 1e-6
            self._at(arrive, lambda i=island: self._receive(run, i, steps[i], first=True))
        then = run.after_dispatch if parallel else (lambda: self._sequential(run, 0))
        if parallel and run.prep.plan.host_steps:
            then = lambda: self._cond_thread(run, run.after_dispatch)
        self._at(self.controller_free, lambda: self._run_inline(run, own, steps, then))

    def _run_inline(self, run: RunState, islands: list[str], steps: dict, then: Callable[[], None]) -> None:
        """The controller runs the run's work on `islands[0]` itself, then on the rest, then goes on."""
        if not islands:
            then()
            return
        island = islands[0]
        self.inline[island] = (run, lambda: self._at(self.controller_free,
                                                     lambda: self._run_inline(run, islands[1:], steps, then)))
        self._receive(run, island, steps[island], first=True)

    def _idle(self, island: str) -> bool:
        """Whether nothing is queued or under way on the island's host thread."""
        return not self.island_busy.get(island) and island not in self.inline and self._first_with_work(island) is None

    def _sequential(self, run: RunState, position: int) -> None:
        """Sends step `position` of the run's dependency order once the buffers it reads exist (a cond:
        runs it)."""
        order = run.prep.order
        if position == len(order):
            run.after_dispatch()
            return
        step = order[position]
        needs = (*step.reads(), *step.arrives())
        missing = [b for b in needs if b not in run.exists]
        if missing:
            run.waiters.setdefault(missing[0], []).append(lambda: self._sequential(run, position))
            return
        if step.on_host:
            self._cond(run, step, lambda: self._sequential(run, position + 1))
            return
        host = self.profile.host
        known = max([self.now, *((run.exists[b] + host.message_latency_us * 1e-6) for b in needs)])
        if known > self.now:
            self._at(known, lambda: self._sequential(run, position))
            return
        start = self._controller_work(host.sequential_step_us * 1e-6)
        self._span(f"send step {step.id}", "controller", "", "controller", start, self.controller_free)
        island = run.prep.island_of_step[step.id]
        self._at(self.controller_free + host.message_latency_us * 1e-6,
                 lambda: self._receive(run, island, (step,), first=False))
        self._at(self.controller_free, lambda: self._sequential(run, position + 1))

    # -- islands ------------------------------------------------------------

    def _receive(self, run: RunState, island: str, steps, first: bool) -> None:
        if first:
            inputs = [b for b in run.prep.inputs.get(island, ()) if b not in run.sub.resident]
            for b in run.sub.resident.intersection(run.prep.inputs.get(island, ())):
                run.ready[b] = self.now
                run.set_exists(b, self.now)
            run.fanout[island] = self.profile.host.per_host_us * run.prep.hosts[island] * 1e-6
            self._put(run, island, inputs)
        run.delivered[island].extend(steps)
        self._has_work(run, island)
        self._pump(island)

    def _has_work(self, run: RunState, island: str) -> None:
        """Notes that `run` may have work for the island's thread now (a delivery, a fan-out or an arrival)."""
        tickets = self.in_with_work.setdefault(island, set())
        if run.ticket not in tickets:
            tickets.add(run.ticket)
            heapq.heappush(self.with_work.setdefault(island, []), (run.ticket, run))

    def _first_with_work(self, island: str) -> RunState | None:
        """The run of lowest ticket that has work for the island's thread (a fan-out, or a step it can take),
        if any: the thread's next, in gang order."""
        heap = self.with_work.get(island)
        while heap:
            run = heap[0][1]
            if run.fanout.get(island) or self._available(run, island) is not None:
                return run
            heapq.heappop(heap)
            self.in_with_work[island].discard(run.ticket)
        return None

    def _put(self, run: RunState, island: str, buffers) -> None:
        """The island's thread puts `buffers` on their devices once their source value is computed: a value of
        the host (`input_us` each, then over PCIe), or one a cond moves from another slice of this island (the
        runtime's `copy_to` of a device array, as an ICI copy is: `step_us`, then over ICI)."""
        plan, host = run.prep.plan, self.profile.host
        sources = {b: run.on_devices.get(b, (None, None, None)) for b in buffers}
        moved = {b: source for b, (on, source, _) in sources.items() if on == island}   # buffer -> its slice here
        launched = [b for b in buffers if b not in moved and b in run.prep.launch_placed] \
            if run.sub.dispatch is DispatchMode.PARALLEL else []
        run.fanout[island] = run.fanout.get(island, 0.0) + (
            host.input_us * (len(buffers) - len(moved) - len(launched)) + host.launch_input_us * len(launched)
            + host.step_us * len(moved)) * 1e-6
        for b in buffers:
            dst = plan.buffers[b].slice
            link = (("ici", "out", island, moved[b]), ("ici", "in", island, dst)) if b in moved \
                else (("pcie", island, dst),)
            reshard = self._reshard_seconds(sources[b][2], plan, b) if b in moved else 0.0
            start, arrival = self.links.transfer(max(self.now + run.fanout[island], run.ready.get(b, 0.0)) + reshard,
                                                 (*link, *self._cores()), plan.buffers[b].bytes_per_device,
                                                 self.profile.ici if b in moved else self.profile.pcie)
            self._span(f"input {b}", "input", island, f"{link[0][0]} {dst}", start, arrival)
            run.ready[b] = arrival
            run.set_exists(b, self.now + run.fanout[island])

    def _available(self, run: RunState, island: str) -> Step | None:
        position = run.cursor[island]
        if position >= len(run.delivered[island]):
            return None
        step = run.delivered[island][position]
        if step.arrives() and step.id not in run.arrived:
            return None
        return step

    def _pump(self, island: str) -> None:
        """Lets the island's host thread (or the controller, running the island's work inline) take the
        next piece of work, in ticket order, if it is idle: a run's fan-out and input puts, or a step."""
        if self.island_busy.get(island):
            return
        inline = self.inline.get(island)
        if inline is not None and inline[1] is None:
            return                                       # held for the controller, whose turn has not come
        host = self.profile.host
        run = inline[0] if inline else self._first_with_work(island)
        if run is None:
            return
        fanout = run.fanout.pop(island, 0.0)
        step = None if fanout else self._available(run, island)
        if inline and not fanout and (step is None or step.arrives()):
            del self.inline[island]                      # parked (a delivery waits for the executor) or done
            inline[1]()
            self._pump(island)
            return
        folded = step is not None and step.frees() and run.sub.dispatch is DispatchMode.PARALLEL
        cost = fanout or (host.recv_us * 1e-6 if step.arrives() else 0.0 if folded else host.step_us * 1e-6)
        self.island_busy[island] = True
        start = self._locked(max(self.now, self.controller_free) if inline else self.now, cost)
        if inline:
            self.controller_free = start + cost
        if step is not None:
            run.cursor[island] += 1
        if cost:
            self._span(f"prepare step {step.id}" if step else f"inputs of @{run.prep.plan.program}", "host",
                       island, "controller" if inline else "host", start, start + cost)
        self._hold_cores(cost)
        self._at(start + cost, lambda: self._enqueue(run, island, step))

    def _enqueue(self, run: RunState, island: str, step: Step | None) -> None:
        self.island_busy[island] = False
        if step is None:
            self._pump(island)
            return
        prep, plan = run.prep, run.prep.plan
        now = blocked = self.now
        synchronous = self.profile.accelerator.synchronous
        if isinstance(step, Launch):
            ranges = plan.slices[step.slice].ranges
            keys = self._cores() or [(island, p) for p in self._segments(island, ranges)]
            start = max([now, *(run.ready[b] for b in step.inputs), *(self.device_free.get(k, 0.0) for k in keys)])
            end = start + prep.duration[step.id]
            for k in keys:
                self.device_free[k] = end
            for b in step.outputs:
                run.ready[b] = end
            self._span(step.label or step.executable, "launch", island, _devices(ranges), start, end)
            run.last_end = max(run.last_end, end)
            blocked = end if synchronous else now
        elif isinstance(step, (Copy, Send)):
            src, dst = plan.buffers[step.src_buffer].slice, plan.buffers[step.dst_buffer].slice
            link = "ici" if isinstance(step, Copy) else "dcn"
            spec = self.profile.ici if link == "ici" else self.profile.dcn
            peer = island if isinstance(step, Copy) else step.peer
            keys = ((link, "out", island, src), (link, "in", peer, dst), *(self._cores() if link == "ici" else ()))
            reshard = self._reshard_seconds(layout(plan, step.src_buffer), plan, step.dst_buffer) \
                if isinstance(step, Copy) else 0.0
            start, arrival = self.links.transfer(max(now, run.ready[step.src_buffer]) + reshard, keys, step.bytes,
                                                 spec)
            self._span(step.label or f"{step.kind} {step.src_buffer}->{step.dst_buffer}", step.kind, island,
                       f"{link} out {src}", start, arrival)
            run.last_end = max(run.last_end, arrival)
            if isinstance(step, Copy):
                run.ready[step.dst_buffer] = arrival
                blocked = arrival if synchronous else now
            else:
                recv = prep.recv_of_send[step.id]
                self._at(arrival, lambda: self._arrive(run, step.peer, recv, arrival))
        if not step.arrives():
            for b in step.produced():
                run.set_exists(b, blocked)
        self._finish_step(run, island)
        if blocked > now:                                # the thread that made the step waits for it
            self.island_busy[island] = True
            if island in self.inline:
                self.controller_free = max(self.controller_free, blocked)
            self._at(blocked, lambda: self._enqueue(run, island, None))
            return
        self._pump(island)

    def _reshard_seconds(self, source: tuple, plan: ProgramPlan, buffer: int) -> float:
        """Returns what a copy of an array of layout `source` to `buffer` of `plan` costs before its transfer: the
        profile's `reshard_us` if the layout changes (JAX's `device_put` reshards), else nothing (it moves each
        shard as it is)."""
        return self.profile.accelerator.reshard_us * 1e-6 if source != layout(plan, buffer) else 0.0

    def _controller_work(self, seconds: float, hold_cores: bool = True) -> float:
        """The controller's thread does `seconds` of work once it (and the interpreter lock) is free; returns
        when it starts."""
        start = self._locked(max(self.now, self.controller_free), seconds)
        self.controller_free = start + seconds
        if hold_cores:
            self._hold_cores(seconds)
        return start

    def _locked(self, start: float, seconds: float) -> float:
        """Returns when host work that could start at `start` does: with `host.interpreter_lock`, once the
        host work before it has let go of the one lock all host threads share, which it then holds."""
        if self.profile.host.interpreter_lock and seconds:
            start = max(start, self.lock_free)
            self.lock_free = start + seconds
        return start

    def _hold_cores(self, seconds: float) -> None:
        """Charges `seconds` of one host thread's work to the shared cores, if the devices share them: the
        host threads run on the same cores as the devices' work (a CPU), one core of `shared_cores`."""
        for key in self._cores():
            self.device_free[key] = max(self.now, self.device_free.get(key, 0.0)) + \
                seconds / self.profile.accelerator.shared_cores

    def _cores(self) -> list[tuple]:
        """Returns the key of the cores every device shares, if they share them (a CPU), else nothing."""
        return [("shared cores", 0)] if self.profile.accelerator.shared_cores else []

    def _segments(self, island: str, ranges) -> list[int]:
        """Returns the starts of the device segments (between any slices' bounds) that `ranges` cover."""
        key = (island, tuple(ranges))
        if key not in self.covers:
            points = self.points[island]
            self.covers[key] = [p for b, e in ranges for p in points if b <= p < e]
        return self.covers[key]

    def _arrive(self, run: RunState, island: str, recv: Recv, arrival: float) -> None:
        run.arrived.add(recv.id)
        run.ready[recv.dst_buffer] = arrival
        run.set_exists(recv.dst_buffer, arrival)
        self._has_work(run, island)
        self._pump(island)

    def _finish_step(self, run: RunState, island: str) -> None:
        run.remaining -= 1
        self._finish_if_over(run)

    def _finish_if_over(self, run: RunState) -> None:
        """Ends the run once all its steps are enqueued and its conds' branch runs are over."""
        if run.remaining == 0 and run.open_conds == 0:
            self._at(max(self.now, run.last_end), lambda: self._done(run))

    def _done(self, run: RunState) -> None:
        run.record.done = self.now + self.profile.host.message_latency_us * 1e-6
        if run.parent is None:                           # a branch run took nothing: its parent reserved it
            self.ledger.give(run.prep.need)
        self._admit()
        if run.parent is not None:                       # a branch run: its parent may be over now
            run.parent.last_end = max(run.parent.last_end, self.now)
            run.parent.open_conds -= 1
            self._finish_if_over(run.parent)
        elif self.closed_loop:
            index = run.index + 1
            if index < len(self.pending):
                self._at(max(run.record.done, self.pending[index].at), lambda: self._call(index))


def _devices(ranges) -> str:
    return ", ".join(f"devices {b}-{e - 1}" for b, e in ranges)
