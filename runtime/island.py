"""Islands: each runs its part of every plan on its own devices, on its own thread.

An island owns its devices, its shard of the object store (the results
runs leave behind), its cache of compiled executables and one executor
thread. For each plan and set of steps it builds an island program once
(`island_program.py`), on the caller's thread (`prepare`), so no compile
ever runs on the executor. A `start` message only registers the run and
enqueues its work; the executor takes work items and peers' deliveries off
its queue in the order they came and executes the instructions. Work is
executed in the order `start` messages arrive, which the gang scheduler
makes the same ticket order on every island.

The executor thread is where an island's computations are launched (XLA's
CPU client may compute on the launching thread; jax 0.10.2 dispatches most
asynchronously: a loop of 160 ms on 1, 2 or 4 devices returns from its
call within 1-12 ms), so a long launch delays only the work of its own
island, and nothing else in the process (the scheduler, other islands,
clients, status reports) waits for it. The
executor holds the island's lock only for bookkeeping, never while it
executes an instruction.

Nothing here waits for memory or for peers: a `Recv` whose array has not
arrived parks the run (its slots and program counter are kept) and the
executor goes on with other work; the peer's delivery resumes it. Memory
was reserved for the whole run before its first `start` (per-run
admission). A failing step fails its run alone, on every island the run
uses; other runs and clients go on. A failed run's error is kept without
its traceback (whose frames would hold the run's arrays), for the latest
`FAILED_HISTORY` runs.

An island whose executor has run one instruction for longer than the
runtime's `wedge_timeout` is wedged (`wedge`): the runs under way there
fail with `IslandWedged`, naming the run and program it is stuck in, and
so does new work, until the instruction returns; other islands go on.

The rest of the runtime talks to an island only through these messages,
whose arguments are plans, integer ids, work items and arrays, never shared
Python objects:

    load(plan_key, plan)                      keep a plan, check it, build its layout
    has_plan(plan_key)                        whether a plan is kept here (none of a lost island's, once restored)
    prepare(plan_key, step_ids)               build (compile) an island program now
    start(work)                               place inputs, run the steps (see IslandWork)
    start_lane(...), run_lane(...)            the same for a fast lane's run, executed by its caller
    deliver(run_id, plan_key, buffer, array)  a peer island's send arriving
    argument(run_id, buffer, array)           a PeerRef argument arriving from the island that keeps it
    lend(run_id, buffer, give)                hand a kept result to `give` once it exists (for a peer)
    returned(run_id, buffer)                  a peer is done with a result lent to it
    fail_run(run_id, error)                   the run failed elsewhere (or was cancelled)
    lose(), restored()                        fail as a dead host would; a fresh island in its place
    fetch(run_id, buffer, timeout, reader)    a result or intermediate (an array), once produced
    produced(run_id, buffer, timeout)         the same, bringing nothing back
    release(run_id, buffer), release_owner(owner)
    run_done(run_id), wait_run(run_id, timeout)  whether the run's device work is over
    device_seconds(run_id)                    the device time a finished run took here (once)
    object_count(), owned_by(owner), compilations(), status(client), close()
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Iterable

from pathways_mlir.dialect.plan import ProgramPlan

from .cluster import DeviceMap
from .device_clock import DeviceClock
from .device_estimates import DeviceTimeEstimates
from .executables import CONTEXT_MESH, ExecutableCache, make_mesh, without_context_mesh
from .island_executor import AWAIT_PAUSE, IN_FLIGHT, IslandExecutor, RunWaiters
from .island_program import Instruction, IslandLayout, compile_steps
from .island_work import (ORDER_HISTORY, IslandLost, IslandRun, IslandWedged, IslandWork, PeerRef, Readable, RunFailed,
                          StoreRef, client_owner, computed, debug_checks, host_arrays_copied, raised, waits_for)
from .object_store import ObjectStore
from .status import first_listed, unreachable
from .tracing import Tracer
from .transfers import DcnTransport, copy_to, fresh_copy


class Island(IslandExecutor):
    """One island of devices, its executor thread and the work it is given."""

    def __init__(self, name: str, device_map: DeviceMap, transport: DcnTransport | None,
                 peer: Callable[[str], "Island"]):
        self.name = name
        self.device_map = device_map
        self.cache = ExecutableCache()
        self.store = ObjectStore()
        self.lock = threading.Lock()
        self._waiters: dict[int, RunWaiters] = {}    # run -> the threads waiting on it (see `_wait`)
        self._transport = transport
        self._peer = peer
        self.tracer: Tracer | None = None    # set while the runtime records a trace
        # Plans by key (weakly: whoever loaded one keeps it while it runs) and their layouts here.
        self._plans: dict[int, tuple[weakref.ref, IslandLayout | None]] = {}
        self._programs: dict[tuple[int, tuple[int, ...]], tuple[Instruction, ...]] = {}
        self._meshes: dict[tuple, object] = {}
        self._runs: dict[int, IslandRun] = {}
        self._early: dict[int, dict[int, Any]] = {}      # run -> deliveries before its first start
        self._in_flight: dict[int, list] = {}            # run -> tracked arrays, dispatch over
        self._failed: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
        self._dropped: set[tuple[int, int]] = set()      # results released before they existed
        self._awaited_results: dict[tuple[int, int], list[Callable]] = {}   # result -> waiters (see `_kept`)
        self._lent: collections.Counter[tuple[int, int]] = collections.Counter()   # result -> lends not returned
        self._returns: dict[tuple[int, int], list[Callable]] = {}   # lent result -> runs donating it, waiting
        self._seconds: collections.OrderedDict[int, float | None] = collections.OrderedDict()  # run -> s
        self._clock = DeviceClock(widest=2 * AWAIT_PAUSE)    # looks are at most AWAIT_PAUSE apart
        self._timed_plans: set[int] = set()     # plans whose first run here is over (that one is not timed)
        self._durations = DeviceTimeEstimates()  # each plan's runs' time on the devices here (`_track`'s pauses)
        self._closed = False
        self.lost: IslandLost | None = None     # set once the island was lost
        self._successor: Island | None = None   # the island restored in this lost one's place (`restored`)
        self._executing: tuple[IslandRun, float] | None = None   # the run whose instructions run, since when
        self._awaited: tuple[IslandRun, float] | None = None     # the run whose device work is awaited, since
        self.wedged: IslandWedged | None = None  # set while the island is stuck (see `wedge`)
        self.on_done: Callable[[], None] | None = None   # told whenever a run's device work is over
        # The latest (ticket, run id, step count) started, for order checks; bounded for long runs.
        self.executed: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=ORDER_HISTORY)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0                # work items queued or executing (on the executor or inline)
        self._inline = False             # a caller runs work inline now (see `start`)
        self._inline_run: int | None = None   # the run whose caller holds that turn (see `interrupted`)
        self._turn = threading.Condition(self.lock)
        self._turn_waits = 0             # the executor waits for its turn (see `_serve`)
        # Runs whose dispatch is over, for the tracker; appended without waking it (see `_track`).
        self._completions: collections.deque[IslandRun] = collections.deque()
        self._looking = threading.Lock()         # held by whoever looks for completions (`look`)
        self._lane_started = 0.0                 # when a fast lane's run last started here (monotonic)
        self._previous_end = 0.0                 # when the latest run retired here was seen over
        self._tracker_idle = threading.Event()   # set to end the tracker's idle pause (see `_track`)
        self._tracker_pausing = False            # the tracker pauses with nothing awaited
        self._tracker_asleep = False             # it sleeps until woken (`_track`)
        self._thread = threading.Thread(target=self._serve, name=f"pw-{name}", daemon=True)
        self._thread.start()
        self._tracker = threading.Thread(target=self._track, name=f"pw-{name}-done", daemon=True)
        self._tracker.start()

    # -- messages ------------------------------------------------------------

    @property
    def dying(self) -> bool:
        """Never: an embedded island is taken out (`Runtime.lose_island`) before anything sees it lost."""
        return False

    def load(self, plan_key: int, plan: ProgramPlan) -> None:
        """Keeps `plan` (with its frees and peaks, from pw-plan-memory) under `plan_key`."""
        with self.lock:
            self._plans.setdefault(plan_key, (weakref.ref(plan), None))

    def has_plan(self, plan_key: int) -> bool:
        """Whether a plan is kept here under `plan_key` (a restored island has none of the lost one's)."""
        return plan_key in self._plans

    def unload(self, plan_key: int) -> None:
        """Forgets a plan and its island programs (the runtime's `_forget_unused`: its runs are over here);
        executables that no other program calls go with them (`ExecutableCache` keeps them weakly)."""
        with self.lock:
            self._plans.pop(plan_key, None)
            for key in [k for k in self._programs if k[0] == plan_key]:
                del self._programs[key]
            self._timed_plans.discard(plan_key)
            self._durations.forget(plan_key)

    def plan(self, plan_key: int) -> ProgramPlan:
        """Returns the plan kept under `plan_key`."""
        return self._plans[plan_key][0]()

    def start(self, work: IslandWork, inline: bool = False) -> bool:
        """Registers the run (so it is under way from now on) and queues its work for the executor. With
        `inline`, and nothing queued or executing here, returns True instead: the caller then runs the work
        itself (`run_inline`), before anything started after it, and saves a handoff to the executor."""
        with self.lock:
            self.executed.append((work.ticket, work.run_id, len(work.step_ids)))
            if work.run_id in self._failed:
                return
            if self._closed or self.wedged is not None:
                if self.lost is not None:        # a lost island's peers learn of it; a closed one stays silent
                    peers = self._fail(work.run_id, self.lost, plan_key=work.plan_key)
                elif self.wedged is not None:
                    peers = self._fail(work.run_id, IslandWedged(f"{self.wedged}; run {work.run_id} was not "
                                                                 f"started"), plan_key=work.plan_key)
                else:
                    peers = self._fail(work.run_id, RunFailed(f"{self.name} is closed"))
            else:
                try:
                    if work.run_id not in self._runs:
                        plan = self.plan(work.plan_key)
                        run = self._runs[work.run_id] = IslandRun(work.run_id, work.client_id, work.plan_key,
                                                                  plan.program, self._layout(work.plan_key))
                        run.checks = work.checks
                        for buffer, array in self._early.pop(work.run_id, {}).items():
                            run.slots[run.layout.slot[buffer]] = array
                    run = self._runs[work.run_id]
                    for buffer, value in work.inputs:
                        if isinstance(value, StoreRef):
                            self._reference(run, buffer, value)
                        elif isinstance(value, PeerRef):
                            run.awaiting += 1        # its pull hands it over (`argument`)
                    self._pending += 1
                    if inline and self._pending == 1 and len(self._completions) < IN_FLIGHT:
                        self._inline = True      # (with IN_FLIGHT runs computing, the executor waits, not the caller)
                        self._inline_run = work.run_id
                        return True
                    if inline:                   # the caller's arguments, placed once the executor takes them
                        work = work._replace(inputs=host_arrays_copied(work.inputs))
                    self._inbox.put((self._started, work))
                    return False
                except BaseException as error:  # noqa: BLE001  (the run fails alone)
                    peers = self._fail(work.run_id, error, plan_key=work.plan_key)
        self._tell(peers, work.run_id)
        return False

    def _reference(self, run: IslandRun, buffer: int, ref: StoreRef) -> None:
        """Takes the kept array `ref` names for `run`'s input `buffer` now, so that no later release can take
        it away; one its run has not produced yet is awaited (`_produced`), and so is one the run donates
        while a peer has yet to pull it (`returned`): the run may overwrite it. Under the lock."""
        donated = buffer in self.plan(run.plan_key).donated
        arrived = functools.partial(self._arrived, run, buffer, ref.run_id)
        if donated:
            arrived = functools.partial(self._unlent, ref, arrived)
        array = self._kept(ref, f"run {run.id}", arrived)
        if array is None or (donated and ref in self._lent):
            run.awaiting += 1
            if array is not None:
                arrived(array, None)
        else:
            run.referenced[buffer] = array

    def _kept(self, key: tuple[int, int], reader: str, waiter: Callable) -> Any:
        """The array of the result `key` ((run id, buffer), or a `StoreRef`) kept here; None if its run, under
        way here, has not produced it yet: `waiter(array, error)` is then called under the lock once it has
        (error None), or has failed (array None). Raises if it failed or is not kept. Under the lock."""
        if key[0] in self._failed:
            raise RunFailed(f"{reader} takes a result of run {key[0]}, which failed: {self._failed[key[0]]}")
        array = self.store.get(key)
        producer = self._runs.get(key[0])
        if array is None and producer is not None and key[1] in producer.layout.slot:
            if producer.slots[producer.layout.slot[key[1]]] is None:
                self._awaited_results.setdefault(key, []).append(waiter)
                return None
            array = _handed_out(producer, key[1])
        if array is None:
            raise ValueError(f"buffer {key[1]} of run {key[0]} is not kept on {self.name}: it was released")
        return array

    def lend(self, run_id: int, buffer: int, reader: str, give: Callable) -> Any:
        """Returns a result kept here for `reader` (a peer's run); None if its run, under way here, has not
        produced it yet: `give(array, error)` is then called, maybe under the island's lock, once it has (or
        has failed), and no release meanwhile takes it away. Raises if it failed or is not kept. A run here
        that donates it waits until it is `returned`."""
        with self.lock:
            array = self._kept((run_id, buffer), reader, give)
            self._lent[(run_id, buffer)] += 1
            return array

    def returned(self, run_id: int, buffer: int) -> None:
        """A peer is done with a result `lend` lent it (pulled, or lost): a run donating it may go on."""
        with self.lock:
            self._lent[(run_id, buffer)] -= 1
            if self._lent[(run_id, buffer)] <= 0:
                del self._lent[(run_id, buffer)]
                for hand_over in self._returns.pop((run_id, buffer), ()):
                    hand_over()

    def argument(self, run_id: int, buffer: int, array) -> None:
        """A `PeerRef` argument of a run here arrived from the island that keeps it (its data plane)."""
        with self.lock:
            run = self._runs.get(run_id)
            if run is not None:                  # else the run failed meanwhile
                self._arrived(run, buffer, None, array, None)

    def run_inline(self, work: IslandWork) -> None:
        """Runs work that `start` handed back to the caller, on the caller's thread (holding no lock); the
        executor takes what came after it once it is done."""
        try:
            with without_context_mesh():
                self._started(work, inline=True)
        except BaseException as error:  # noqa: BLE001  (raised again: the run fails here if it did not run)
            self.interrupted(work.run_id, error)
            raise
        self._inline_over()

    def interrupted(self, run_id: int, error: BaseException) -> None:
        """The thread that started run `run_id` was interrupted (Ctrl-C) before the run was its caller's: the
        run fails here with `error`, unless it failed already (a run over here loses its results), and the
        inline turn that thread took for it here (`start`, `start_lane`), if it still holds it, ends: the
        executor serves again. Called by that thread only, so the turn it finds held for the run is its own."""
        with self.lock:
            peers = () if run_id in self._failed else self._fail(run_id, error)
            if self._inline and self._inline_run == run_id:
                self._end_inline()
        self._tell(peers, run_id)

    def start_lane(self, ticket: int, run_id: int, client_id: int, plan_key: int, name: str, layout: IslandLayout,
                   program: tuple[Instruction, ...], collective: bool, inputs: Iterable[tuple[int, Any]],
                   inline: bool = True) -> IslandRun | None:
        """Registers a fast lane's run (`runtime/fast_lane.py`) of program `name`, all of whose steps are
        `program` (`collective`: it launches a collective, `runs_collective`) on `inputs` ((buffer, array) pairs,
        iterated once: here if the run is queued, else by `run_lane`) in the plan's `layout` here, if the island
        is open and not wedged; otherwise takes nothing and returns None. If the island is idle and the caller
        executes work `inline`, it then executes it (`run_lane`); if not, its work is queued for the executor
        behind what is there (`run.queued` tells which)."""
        with self.lock:
            if self._closed or self.wedged is not None:
                return None
            run = self._runs[run_id] = IslandRun(run_id, client_id, plan_key, name, layout)
            self.executed.append((ticket, run_id, len(program)))
            self._pending += 1
            self._lane_started = time.monotonic()
            if inline and self._pending == 1:
                self._inline = True
                self._inline_run = run_id
            else:
                run.queued = True
                run.checks = debug_checks()      # the caller's: the executor launches it
                self._inbox.put((self._lane_work, (run, program, collective, host_arrays_copied(inputs))))
            return run

    def run_lane(self, run: IslandRun, program: tuple[Instruction, ...], collective: bool,
                 inputs: Iterable[tuple[int, Any]]):
        """Executes a fast lane's run that `start_lane` registered, on the caller's thread (holding no lock):
        places its arguments (`inputs`: (buffer, array) pairs) and runs its program."""
        mesh = CONTEXT_MESH.value
        if mesh is None or mesh.empty:           # (`without_context_mesh` with nothing to do: no context)
            self._lane_work((run, program, collective, inputs), inline=True)
        else:
            with without_context_mesh():
                self._lane_work((run, program, collective, inputs), inline=True)

    def copied(self, plan_key: int, buffer: int, array):
        """A peer's array about to be sent here as `buffer`, copied to its home sharding now (the sender's
        thread): the peer's later runs may donate the original (`IslandExecutor.send`)."""
        return copy_to(array, self._layout(plan_key).shardings[buffer])

    def deliver(self, run_id: int, plan_key: int, buffer: int, array) -> None:
        """A buffer a peer island sent: the executor puts it on its home sharding and resumes the run."""
        with self.lock:
            self._pending += 1
        self._inbox.put((self._delivered, (run_id, plan_key, buffer, array)))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        """Fails a run here because it failed elsewhere (or was cancelled); takes effect at once."""
        with self.lock:
            if run_id not in self._failed:
                self._fail(run_id, error)

    def failures(self, run_ids) -> dict[int, BaseException]:
        """The errors those of `run_ids` failed with here (none for a run that has not failed here, or too
        long ago to remember), read under one take of the lock."""
        with self.lock:
            return {r: self._failed[r] for r in run_ids if r in self._failed}

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None, reader: Readable | None = None):
        """Returns the array of a run's buffer, waiting until it is produced; raises if the run failed. Before each
        wait, under the lock, `reader._check()` (what reads it: a handle, a shared reference) raises if the result
        was released: once its run is over here, a released result looks like one whose run has not started here
        yet, and a reader whose handle was released after its own check waited for ever. A release wakes the
        readers waiting on its run (`release`, `release_owner`), which check again."""
        found = self.store.get((run_id, buffer))      # a result kept: one dict read, no lock needed
        if found is not None and not self._closed:
            return found
        with self.lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if self._closed:
                    raise raised(self.lost) if self.lost is not None else RunFailed(f"{self.name} is closed")
                found = self.store.get((run_id, buffer))
                if found is not None:
                    return found
                if run_id in self._failed:
                    raise raised(self._failed[run_id])
                # A result released while its run is still here is only not kept at its end (`_dropped`): the
                # run's own host steps may read it still (a later cond's input), as its steps here do.
                run = self._runs.get(run_id)
                if run is not None and buffer in run.layout.slot and run.slots[run.layout.slot[buffer]] is not None:
                    return _handed_out(run, buffer)
                early = self._early.get(run_id, {}).get(buffer)
                if early is not None:
                    return early
                if (run_id, buffer) in self._dropped:
                    raise ValueError(f"buffer {buffer} of run {run_id} was released")
                if run is None and run_id in self._in_flight:
                    raise ValueError(f"buffer {buffer} of run {run_id} is not kept: the run is over and the "
                                     f"buffer was no result, or its result was released")
                if reader is not None:
                    reader._check()
                self._wait(run_id, deadline,
                           f"buffer {buffer} of run {run_id} was not produced within {timeout} s")

    def produced(self, run_id: int, buffer: int, timeout: float | None = None) -> None:
        """Returns once a run's buffer exists here; raises as `fetch` does."""
        self.fetch(run_id, buffer, timeout)

    def want(self, run_id: int, buffer: int, nbytes: int) -> None:
        """Nothing: a result read soon (`Handle.copy_to_host_async`) is in this process already."""

    def release(self, run_id: int, buffer: int) -> None:
        """Drops a result (its handle was deleted); one not produced yet is dropped when it is."""
        key = (run_id, buffer)
        with self.lock:
            if not self.store.release(key) and run_id not in self._failed and run_id not in self._in_flight:
                self._dropped.add(key)
            if self._waiters:
                self._notify(run_id)         # a reader of it checks its handle again (`fetch`)

    def keep_host_value(self, run, buffer: int, array) -> None:
        """Keeps `array`, on devices here, as result `buffer` of `run` (a dispatcher's `Run`) for its client: a
        value its host keeps (`Runtime.keep_on_devices`). Not once the run failed here, nor once its handle was
        released: `Client.release` marks `run.released` before it looks for the value here, and this looks
        under the lock, so the value is dropped either way (embedded islands only)."""
        with self.lock:
            if run.id not in self._failed and buffer not in run.released:
                self.store.add((run.id, buffer), client_owner(run.client_id), array)

    def drop_host_value(self, run_id: int, buffer: int) -> None:
        """Drops a value `keep_host_value` kept, if it did (its handle was released)."""
        with self.lock:
            self.store.release((run_id, buffer))
            if self._waiters:
                self._notify(run_id)         # a reader of it checks its handle again (`fetch`)

    def release_owner(self, owner: Hashable) -> int:
        """Drops every result of `owner` (its client closed); returns how many. Wakes every reader waiting here:
        those of the owner's results check their handles again (`fetch`) and raise, the others wait on."""
        with self.lock:
            if self._waiters:
                self._notify_all()
            return self.store.release_owner(owner)

    def failure(self, run_id: int) -> BaseException | None:
        """Returns the error a run failed with here, or None (also once it failed too long ago to remember).
        One dict read, no lock needed."""
        return self._failed.get(run_id)

    def run_done(self, run_id: int, patient: bool = False) -> bool:
        """Returns whether the run's work here is over (dispatched, and its device work finished), as the
        completion tracker sees it (it looks first; at once, `patient` or not). Reads without the lock: a run
        only ever goes from `_runs` to `_in_flight` (which `_finish` adds it to before it leaves `_runs`) to
        neither."""
        if run_id in self._runs:
            return False
        if run_id not in self._in_flight:
            return True
        self.look()
        return run_id not in self._in_flight

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        """Waits until the run's work here is over, or the island closes; TimeoutError after `timeout`
        seconds."""
        began = time.monotonic()
        deadline = None if timeout is None else began + timeout
        with self.lock:
            while run_id in self._runs:
                self._wait(run_id, deadline, f"run {run_id} is still under way on {self.name}")
            tracked = self._in_flight.get(run_id, ())
        for array in tracked:
            if not self._await(array, began, deadline):
                raise TimeoutError(f"the device work of run {run_id} on {self.name} was not over within {timeout} s")
        del tracked
        self.look()                              # retires it as the tracker does, timing it
        with self.lock:
            executing = self._executing
            if executing is None or executing[0].id != run_id:     # (a failed run's instruction may still be)
                self._in_flight.pop(run_id, None)    # its device work is over even if a run before it is not

    def device_seconds(self, run_id: int) -> float | None:
        """Returns (once) the device time a finished run took here: from when the run before it here was over
        (or its own instructions began, if later) until its device work was over (`device_clock.py`), times
        the devices its slices cover here. None until it is over, for a run whose time the island could not
        tell (`DeviceClock.end`), and for a plan's first run here (its time includes one-time work)."""
        return self._seconds.pop(run_id, None)      # one call on an OrderedDict: atomic, no lock needed

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

    def status(self, client: int | None = None) -> dict:
        """Returns the runs under way here, each with what it waits for, the runs whose device work is not
        over yet (at most `LISTED` of each, oldest first, and how many there are), each client's objects and
        bytes, and what the executor is busy with; of a lost island, that it is unreachable. With `client`,
        only that client's runs under way and objects."""
        with self.lock:
            if self.lost is not None:
                return unreachable(self.lost)
            under_way = [run for run in self._runs.values() if client is None or run.client_id == client]
            runs = [{"run": run.id, "client": run.client_id, "program": run.program,
                     "waits_for": waits_for(run)} for run in first_listed(under_way)]
            clients: dict[int, dict[str, int]] = {}
            for owner, array in self.store.owners():
                if client is not None and owner[1] != client:
                    continue
                entry = clients.setdefault(owner[1], {"objects": 0, "bytes": 0})
                entry["objects"] += 1
                entry["bytes"] += int(getattr(array, "nbytes", 0))
            busy = sorted(r for r, tracked in self._in_flight.items() if not all(map(computed, tracked)))
            report = {"runs": runs, "runs_count": len(under_way), "device_work": first_listed(busy),
                      "device_work_count": len(busy), "clients": clients}
            busy = self.busy()
            if busy is not None:
                run, what, seconds = busy
                report["busy"] = {"run": run.id, "program": run.program, "with": what, "seconds": round(seconds, 3)}
            if self.wedged is not None:
                report["wedged"] = str(self.wedged)
            return report

    def close(self) -> None:
        """Fails every run still under way here (a run parked forever cannot hold up closing) and stops the
        executor (waiting at most `CLOSE_JOIN` seconds for one stuck in a computation)."""
        with self.lock:
            self._closed = True
            for run_id in list(self._runs):
                self._fail(run_id, RunFailed(f"{self.name} closed while run {run_id} was under way"))
            self._notify_all()
        self._stop()

    def lose(self) -> None:
        """Fails this island as a dead host would: its runs fail (and their peers), its results are gone,
        and both raise `IslandLost`; it accepts no more work."""
        told = []
        with self.lock:
            self._closed = True
            self.lost = IslandLost(f"island {self.name} was lost")
            for run_id, run in list(self._runs.items()):
                told.append((self._fail(run_id, IslandLost(f"island {self.name} was lost while run {run_id} of "
                                                           f"{run.program} was under way there")), run_id))
            for run_id in ({key[0] for key in self.store.keys()} | set(self._in_flight)) - set(self._failed):
                self._failed[run_id] = IslandLost(f"island {self.name} was lost, with the results of run {run_id} "
                                                  f"that lived there")
            self.store = ObjectStore()
            self._in_flight.clear()
            self._early.clear()
            self._notify_all()
        for peers, run_id in told:
            self._tell(peers, run_id)
        self._stop()

    def restored(self) -> "Island":
        """Returns a fresh island in place of this lost one; the results lost here still raise `IslandLost`, and
        so do those of runs that fail here from now on (a run delivered here before the fresh island takes
        this one's place): the fresh island never sees them, and would take them as over (`_fail`)."""
        fresh = Island(self.name, self.device_map, self._transport, self._peer)
        fresh.tracer, fresh.on_done = self.tracer, self.on_done
        with self.lock:
            fresh._failed.update(self._failed)
            self._successor = fresh
        return fresh

    # -- host work, once per plan --------------------------------------------

    def _layout(self, plan_key: int) -> IslandLayout:
        plan_ref, layout = self._plans[plan_key]
        if layout is None:
            layout = IslandLayout.build(self, plan_ref())
            self._plans[plan_key] = (plan_ref, layout)
        return layout

    def _program(self, plan_key: int, step_ids: tuple[int, ...]) -> tuple[Instruction, ...]:
        """Returns the island program of these steps, building it (and compiling) the first time, with no
        lock held: a compile delays only whoever needs its program."""
        program = self._programs.get((plan_key, step_ids))
        if program is None:
            plan = self.plan(plan_key)
            wanted = set(step_ids)
            steps = tuple(s for s in plan.islands.get(self.name, ()) if s.id in wanted)
            built = compile_steps(self, plan, self._layout(plan_key), steps)
            program = self._programs.setdefault((plan_key, step_ids), built)
        return program

    def prepare(self, plan_key: int, step_ids: tuple[int, ...]) -> None:
        """Builds the island program of these steps now, on the caller's thread (compiling its
        executables), so that the island's executor never compiles them."""
        with without_context_mesh():
            self._program(plan_key, tuple(step_ids))

    def program(self, plan_key: int, step_ids: tuple[int, ...]) -> tuple[Instruction, ...]:
        """Returns the island program of these steps (built now if `prepare` did not)."""
        return self._program(plan_key, tuple(step_ids))

    def mesh(self, plan: ProgramPlan, slice_name: str):
        """Returns the JAX mesh of one of this island's slices (cached)."""
        placement = plan.slices[slice_name]
        key = (placement.devices, placement.shape, placement.axes)
        mesh = self._meshes.get(key)
        if mesh is None:
            devices = [self.device_map.device(self.name, d) for d in placement.device_ids()]
            mesh = self._meshes[key] = make_mesh(devices, placement.shape, placement.axes)
        return mesh

    def trace(self, name: str, kind: str, devices, arrays, flow: tuple[str, int] | None = None) -> None:
        """Records a step in the trace being taken (see `Runtime.start_tracing`)."""
        if self.tracer is not None:
            self.tracer.record(name, kind, self.name, devices, arrays, flow)


def _handed_out(run: IslandRun, buffer: int):
    """The array a reader takes of result `buffer` of `run`, still under way here: the run's own, or, for one the
    run still holds for a later step or as the caller's argument (`IslandLayout.shared_results`), a copy in
    buffers of its own: the caller may delete or donate what it reads, and a later launch of the run then took a
    deleted argument (XLA crashed the process on one of several devices)."""
    array = run.slots[run.layout.slot[buffer]]
    if buffer in run.layout.shared_results:
        return fresh_copy(array, run.layout.shardings[buffer])
    return array
