"""Islands: each runs its part of every plan on its own devices, behind messages.

An island owns its devices, its shard of the object store (the results
runs leave behind) and its cache of compiled executables. For each plan and
set of steps it builds an island program once (`island_program.py`); a
`start` message then places the run's inputs and executes the program's
instructions right away, which only enqueues work through JAX's
asynchronous dispatch. Work is executed in the order `start` messages
arrive, which the gang scheduler makes the same ticket order on every
island.

Nothing here ever blocks: a `Recv` whose array has not arrived parks the
run (its slots and program counter are kept) and the island goes on with
other runs; the peer's `deliver` resumes it. Memory was reserved for the
whole run before its first `start` (per-run admission), so no step waits
for memory either. A failing step fails its run alone, on every island the
run uses; other runs and clients go on.

The rest of the runtime talks to an island only through these messages,
whose arguments are plans, integer ids, work items and arrays, never shared
Python objects:

    load(plan_key, plan)                      keep a plan, check it, build its layout
    start(work)                               place inputs, run the steps (see IslandWork)
    deliver(run_id, plan_key, buffer, array)  a peer island's send arriving
    fail_run(run_id, error)                   the run failed elsewhere
    lose(), restored()                        fail as a dead host would; a fresh island in its place
    fetch(run_id, buffer, timeout) -> array   a result or intermediate, once produced
    release(run_id, buffer), release_owner(owner)
    run_done(run_id), wait_run(run_id, timeout)  whether the run's device work is over
    object_count(), owned_by(owner), compilations(), status(), close()
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Hashable, NamedTuple

from pathways_mlir.dialect.memory_plan import with_memory_plan
from pathways_mlir.dialect.plan import ProgramPlan

from .cluster import DeviceMap
from .executables import ExecutableCache, make_mesh
from .island_program import Instruction, IslandLayout, RecvInstruction, compile_steps
from .object_store import ObjectStore
from .tracing import Tracer
from .transfers import DcnTransport, copy_to

HISTORY = 100_000   # how many work items (and failed runs) an island remembers


class RunFailed(RuntimeError):
    """A run failed; raised by whatever reads its buffers."""


class IslandLost(RunFailed):
    """An island was lost (its host died): raised for its runs in flight and the results that lived there."""


class IslandWork(NamedTuple):
    """One run's steps for one island, delivered as one message in ticket order.

    `inputs` are (buffer, array) pairs placed on their home sharding first:
    program arguments, or values a host branch produced. `last` says no
    more work of this run will come to this island.
    """

    ticket: int
    run_id: int
    client_id: int
    plan_key: int
    step_ids: tuple[int, ...]
    inputs: tuple[tuple[int, Any], ...] = ()
    last: bool = True


class Islands(dict):
    """A runtime's islands by name, and how a run's work reaches them."""

    def start(self, run, works: dict[str, IslandWork]) -> None:
        """Delivers one run's work to its islands: one `start` message each, in ticket order."""
        for name, work in works.items():
            self[name].start(work)

    def close(self) -> None:
        """Closes every island (runs still under way there fail)."""
        for island in self.values():
            island.close()


def client_owner(client_id: int) -> tuple[str, int]:
    """The owner of a client's results in the object store."""
    return ("client", client_id)


class IslandRun:
    """What an island holds of one run under way: slots, queued programs, where it stopped."""

    __slots__ = ("id", "client_id", "plan_key", "layout", "slots", "queue", "pc", "tracked", "last", "executing")

    def __init__(self, run_id: int, client_id: int, plan_key: int, layout: IslandLayout):
        self.id, self.client_id, self.plan_key, self.layout = run_id, client_id, plan_key, layout
        self.slots: list = [None] * len(layout.slot)
        self.queue: collections.deque[tuple[Instruction, ...]] = collections.deque()
        self.pc = 0
        self.tracked: list = []          # arrays whose readiness means the run's device work is done
        self.last = False
        self.executing = False


def _waits_for(run: IslandRun) -> str:
    """Says what a run under way on an island waits for."""
    if run.executing:
        return "nothing: its steps are being enqueued"
    if run.queue:
        instruction = run.queue[0][run.pc]
        if isinstance(instruction, RecvInstruction) and run.slots[instruction.dst] is None:
            return f"recv of {instruction.what}"
    return "more work of this run from the scheduler (after a host cond, or the next sequential step)"


class Island:
    """One island of devices and the work it is given."""

    def __init__(self, name: str, device_map: DeviceMap, transport: DcnTransport | None,
                 peer: Callable[[str], "Island"], lock: threading.RLock | None = None):
        self.name = name
        self.device_map = device_map
        self.cache = ExecutableCache()
        self.store = ObjectStore()
        self.lock = lock or threading.RLock()   # embedded: one lock for all islands (see Runtime)
        self._changed = threading.Condition(self.lock)
        self._waiting = 0
        self._transport = transport
        self._peer = peer
        self.tracer: Tracer | None = None    # set while the runtime records a trace
        self._plans: dict[int, tuple[ProgramPlan, IslandLayout | None]] = {}
        self._programs: dict[tuple[int, tuple[int, ...]], tuple[Instruction, ...]] = {}
        self._meshes: dict[tuple, object] = {}
        self._runs: dict[int, IslandRun] = {}
        self._early: dict[int, dict[int, Any]] = {}      # run -> deliveries before its first start
        self._in_flight: dict[int, list] = {}            # run -> tracked arrays, dispatch over
        self._failed: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
        self._dropped: set[tuple[int, int]] = set()      # results released before they existed
        self._closed = False
        self.lost: IslandLost | None = None     # set once the island was lost
        # The latest (ticket, run id, step count) started, for order checks; bounded for long runs.
        self.executed: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=HISTORY)

    # -- messages ------------------------------------------------------------

    def load(self, plan_key: int, plan: ProgramPlan) -> None:
        """Keeps `plan` under `plan_key` (with frees and peaks added if it was built without them)."""
        with self.lock:
            if plan_key not in self._plans:
                self._plans[plan_key] = (with_memory_plan(plan), None)

    def plan(self, plan_key: int) -> ProgramPlan:
        """Returns the plan kept under `plan_key`."""
        return self._plans[plan_key][0]

    def start(self, work: IslandWork) -> None:
        """Places the work's inputs and executes its steps now (parking at a Recv not yet arrived)."""
        with self.lock:
            self.executed.append((work.ticket, work.run_id, len(work.step_ids)))
            if work.run_id in self._failed:
                return
            if self._closed:
                if self.lost is not None:        # a lost island's peers learn of it; a closed one stays silent
                    self._fail(work.run_id, self.lost, plan_key=work.plan_key)
                else:
                    self._fail(work.run_id, RunFailed(f"{self.name} is closed"))
                return
            try:
                run = self._runs.get(work.run_id)
                if run is None:
                    run = self._runs[work.run_id] = IslandRun(work.run_id, work.client_id, work.plan_key,
                                                              self._layout(work.plan_key))
                    for buffer, array in self._early.pop(work.run_id, {}).items():
                        run.slots[run.layout.slot[buffer]] = array
                for buffer, value in work.inputs:
                    run.slots[run.layout.slot[buffer]] = copy_to(value, run.layout.shardings[buffer])
                if work.step_ids:
                    run.queue.append(self._program(work.plan_key, work.step_ids))
                run.last = work.last
            except BaseException as error:  # noqa: BLE001  (the run fails alone)
                self._fail(work.run_id, error)
                return
            self._advance(run)

    def deliver(self, run_id: int, plan_key: int, buffer: int, array) -> None:
        """Receives a buffer a peer island sent, on its home sharding; resumes a run parked on it."""
        with self.lock:
            if run_id in self._failed or self._closed:
                return
            try:
                layout = self._layout(plan_key)
                moved = copy_to(array, layout.shardings[buffer])
            except BaseException as error:  # noqa: BLE001
                self._fail(run_id, error)
                return
            run = self._runs.get(run_id)
            if run is None:
                self._early.setdefault(run_id, {})[buffer] = moved
                self._notify()
                return
            run.slots[run.layout.slot[buffer]] = moved
            if not run.executing:
                self._advance(run)
            else:
                self._notify()

    def fail_run(self, run_id: int, error: BaseException) -> None:
        """Fails a run here because it failed elsewhere (or was cancelled)."""
        with self.lock:
            if run_id not in self._failed:
                self._fail(run_id, error, tell_peers=False)

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        """Returns the array of a run's buffer, waiting until it is produced; raises if the run failed."""
        with self.lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                found = self.store.get((run_id, buffer))
                if found is not None:
                    return found
                if run_id in self._failed:
                    raise self._failed[run_id]
                if (run_id, buffer) in self._dropped:
                    raise ValueError(f"buffer {buffer} of run {run_id} was released")
                run = self._runs.get(run_id)
                if run is not None and buffer in run.layout.slot and run.slots[run.layout.slot[buffer]] is not None:
                    return run.slots[run.layout.slot[buffer]]
                early = self._early.get(run_id, {}).get(buffer)
                if early is not None:
                    return early
                if run is None and run_id in self._in_flight:
                    raise ValueError(f"buffer {buffer} of run {run_id} is not kept: the run is over and the "
                                     f"buffer was no result, or its result was released")
                if self._closed:
                    raise self.lost or RunFailed(f"{self.name} is closed")
                self._wait(deadline, f"buffer {buffer} of run {run_id} was not produced within {timeout} s")

    def release(self, run_id: int, buffer: int) -> None:
        """Drops a result (its handle was deleted); one not produced yet is dropped when it is."""
        with self.lock:
            if self.store.release((run_id, buffer)):
                tracked = self._in_flight.get(run_id)
                if tracked is not None and all(a.is_ready() for a in tracked):
                    del self._in_flight[run_id]        # nothing of the run needs to stay alive now
            elif run_id not in self._failed and run_id not in self._in_flight:
                self._dropped.add((run_id, buffer))

    def release_owner(self, owner: Hashable) -> int:
        """Drops every result of `owner`; returns how many."""
        with self.lock:
            return self.store.release_owner(owner)

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over (dispatched, and its device work finished)."""
        with self.lock:
            if run_id in self._runs:
                return False
            tracked = self._in_flight.get(run_id)
            if tracked is None:
                return True
            if all(a.is_ready() for a in tracked):
                del self._in_flight[run_id]
                return True
            return False

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        """Waits until the run's work here is over; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while run_id in self._runs:
                self._wait(deadline, f"run {run_id} is still under way on {self.name}")
            tracked = self._in_flight.get(run_id, ())
        for array in tracked:
            array.block_until_ready()
        with self.lock:
            self._in_flight.pop(run_id, None)

    def owned_by(self, owner: Hashable) -> list:
        """Returns the keys of the results `owner` holds here."""
        with self.lock:
            return self.store.owned_by(owner)

    def object_count(self) -> int:
        """Returns how many results the island holds."""
        with self.lock:
            return len(self.store)

    def compilations(self) -> int:
        """Returns how many executables the island has compiled."""
        return self.cache.compilations

    def status(self) -> dict:
        """Returns each run under way here with what it waits for, the runs whose device work is not
        over yet, and each client's objects and bytes."""
        with self.lock:
            runs = [{"run": run.id, "client": run.client_id, "program": self._plans[run.plan_key][0].program,
                     "waits_for": _waits_for(run)} for run in self._runs.values()]
            clients: dict[int, dict[str, int]] = {}
            for owner, array in self.store.owners():
                entry = clients.setdefault(owner[1], {"objects": 0, "bytes": 0})
                entry["objects"] += 1
                entry["bytes"] += int(getattr(array, "nbytes", 0))
            busy = sorted(r for r, tracked in self._in_flight.items() if not all(a.is_ready() for a in tracked))
            return {"runs": runs, "device_work": busy, "clients": clients}

    def close(self) -> None:
        """Fails every run still under way here (a run parked forever cannot hold up closing)."""
        with self.lock:
            self._closed = True
            for run_id in list(self._runs):
                self._fail(run_id, RunFailed(f"{self.name} closed while run {run_id} was under way"),
                           tell_peers=False)
            self._changed.notify_all()

    def lose(self) -> None:
        """Fails this island as a dead host would: its runs fail (and their peers), its results are gone,
        and both raise `IslandLost`; it accepts no more work."""
        with self.lock:
            self._closed = True
            self.lost = IslandLost(f"island {self.name} was lost")
            for run_id, run in list(self._runs.items()):
                program = self._plans[run.plan_key][0].program
                self._fail(run_id, IslandLost(f"island {self.name} was lost while run {run_id} of {program} "
                                              f"was under way there"))
            for run_id in ({key[0] for key in self.store.keys()} | set(self._in_flight)) - set(self._failed):
                self._failed[run_id] = IslandLost(f"island {self.name} was lost, with the results of run {run_id} "
                                                  f"that lived there")
            self.store = ObjectStore()
            self._in_flight.clear()
            self._early.clear()
            self._changed.notify_all()

    def restored(self) -> "Island":
        """Returns a fresh island in place of this lost one; the results lost here still raise `IslandLost`."""
        fresh = Island(self.name, self.device_map, self._transport, self._peer, self.lock)
        fresh.tracer = self.tracer
        with self.lock:
            fresh._failed.update(self._failed)
        return fresh

    # -- execution -----------------------------------------------------------

    def _advance(self, run: IslandRun) -> None:
        """Executes the run's queued programs from where it stopped, until done or parked."""
        run.executing = True
        try:
            while run.queue:
                program = run.queue[0]
                pc, end = run.pc, len(program)
                while pc < end:
                    if not program[pc].execute(self, run):
                        run.pc = pc
                        return
                    pc += 1
                run.queue.popleft()
                run.pc = 0
            if run.last:
                self._finish(run)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail(run.id, error)
        finally:
            run.executing = False
            self._notify()

    def _finish(self, run: IslandRun) -> None:
        """The run's work here is dispatched: keep its results, remember what marks it done."""
        del self._runs[run.id]
        owner = client_owner(run.client_id)
        for buffer, slot in run.layout.outputs:
            key = (run.id, buffer)
            if key in self._dropped:
                self._dropped.discard(key)
            else:
                self.store.add(key, owner, run.slots[slot])
        self._in_flight[run.id] = run.tracked

    def _fail(self, run_id: int, error: BaseException, tell_peers: bool = True, plan_key: int | None = None) -> None:
        run = self._runs.pop(run_id, None)
        plan_key = run.plan_key if run is not None else plan_key
        self._early.pop(run_id, None)
        self._dropped = {k for k in self._dropped if k[0] != run_id}
        self._failed[run_id] = error if isinstance(error, RunFailed) else RunFailed(
            f"run {run_id} failed on {self.name}: {type(error).__name__}: {error}")
        self._failed[run_id].__cause__ = error if not isinstance(error, RunFailed) else error.__cause__
        while len(self._failed) > HISTORY:
            self._failed.popitem(last=False)
        self._notify()
        if tell_peers and plan_key is not None:
            plan = self._plans[plan_key][0]
            for island in plan.islands:
                if island != self.name:
                    self._peer(island).fail_run(run_id, self._failed[run_id])

    def _wait(self, deadline: float | None, late: str) -> None:
        """Waits (holding the lock) until something changes; TimeoutError(`late`) once `deadline` passed."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(late)
        self._waiting += 1
        try:
            self._changed.wait(remaining)
        finally:
            self._waiting -= 1

    def _notify(self) -> None:
        if self._waiting:
            self._changed.notify_all()

    def send(self, run: IslandRun, peer: str, peer_buffer: int, array, nbytes: int, link) -> None:
        """Hands `array` to `peer` as its `peer_buffer` of the run (DCN), emulating the link if asked."""
        target = self._peer(peer)
        if self._transport is None or self._transport.inline:
            target.deliver(run.id, run.plan_key, peer_buffer, array)
            return
        self._transport.send(array, nbytes, link, lambda moved: target.deliver(run.id, run.plan_key, peer_buffer,
                                                                               moved),
                             lambda error: target.fail_run(run.id, error))

    # -- host work, once per plan --------------------------------------------

    def _layout(self, plan_key: int) -> IslandLayout:
        plan, layout = self._plans[plan_key]
        if layout is None:
            layout = IslandLayout.build(self, plan)
            self._plans[plan_key] = (plan, layout)
        return layout

    def _program(self, plan_key: int, step_ids: tuple[int, ...]) -> tuple[Instruction, ...]:
        program = self._programs.get((plan_key, step_ids))
        if program is None:
            plan = self._plans[plan_key][0]
            wanted = set(step_ids)
            steps = tuple(s for s in plan.islands.get(self.name, ()) if s.id in wanted)
            program = self._programs[(plan_key, step_ids)] = compile_steps(self, plan, self._layout(plan_key),
                                                                           steps)
        return program

    def prepare(self, plan_key: int, step_ids: tuple[int, ...]) -> None:
        """Builds the island program of these steps now (compiling its executables)."""
        with self.lock:
            self._program(plan_key, tuple(step_ids))

    def mesh(self, plan: ProgramPlan, slice_name: str):
        """Returns the JAX mesh of one of this island's slices (cached)."""
        placement = plan.slices[slice_name]
        key = (placement.devices, placement.shape, placement.axes)
        mesh = self._meshes.get(key)
        if mesh is None:
            devices = [self.device_map.device(self.name, d) for d in placement.device_ids()]
            mesh = self._meshes[key] = make_mesh(devices, placement.shape, placement.axes)
        return mesh

    def trace(self, name: str, kind: str, devices, arrays) -> None:
        """Records a step in the trace being taken (see `Runtime.start_tracing`)."""
        if self.tracer is not None:
            self.tracer.record(name, kind, self.name, devices, arrays)
