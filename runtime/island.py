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

XLA's CPU client computes on the thread that launches a computation, so
the executor thread is where an island's computations run: a long one
delays only the work of its own island, and nothing else in the process
(the scheduler, other islands, clients, status reports) waits for it. The
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
    prepare(plan_key, step_ids)               build (compile) an island program now
    start(work)                               place inputs, run the steps (see IslandWork)
    start_lane(...), run_lane(...)            the same for a fast lane's run, executed by its caller
    deliver(run_id, plan_key, buffer, array)  a peer island's send arriving
    fail_run(run_id, error)                   the run failed elsewhere (or was cancelled)
    lose(), restored()                        fail as a dead host would; a fresh island in its place
    fetch(run_id, buffer, timeout) -> array   a result or intermediate, once produced
    release(run_id, buffer), release_owner(owner)
    run_done(run_id), wait_run(run_id, timeout)  whether the run's device work is over
    device_seconds(run_id)                    the device time a finished run took here (once)
    object_count(), owned_by(owner), compilations(), status(), close()
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Hashable, NamedTuple

from pathways_mlir.dialect.plan import ProgramPlan

from .cluster import DeviceMap
from .device_clock import DeviceClock
from .executables import ExecutableCache, make_mesh
from .island_program import Instruction, IslandLayout, RecvInstruction, compile_steps
from .object_store import ObjectStore
from .tracing import Tracer
from .transfers import DcnTransport, copy_to

HISTORY = 100_000        # how many work items (and, on Ray, runs) an island remembers
FAILED_HISTORY = 10_000  # how many failed runs' errors an island keeps
CLOSE_JOIN = 1.0         # seconds close() waits for the executor (a wedged one is left behind)
_AWAIT_PAUSE = 0.002     # the longest pause of the completion tracker between looks at a computation
_AWAIT_PAUSE_MIN = 2e-4  # and the shortest
_LANE_PAUSE = 0.02       # its pause while fast lane runs start on the island (see `_track`)


class RunFailed(RuntimeError):
    """A run failed; raised by whatever reads its buffers."""


class IslandLost(RunFailed):
    """An island was lost (its host died): raised for its runs in flight and the results that lived there."""


class RunCancelled(RunFailed):
    """A run was cancelled by its client, or passed its deadline (`timeout=`)."""


class IslandWedged(RunFailed):
    """An island's executor has been stuck in one instruction for longer than the runtime's `wedge_timeout`."""


class StoreRef(NamedTuple):
    """An argument that is a result kept on the receiving island: buffer `buffer` of run `run_id`.

    The island takes the array from its own object store (or, not produced
    yet, when its run produces it), so the value never leaves the island.
    """

    run_id: int
    buffer: int


class IslandWork(NamedTuple):
    """One run's steps for one island, delivered as one message in ticket order.

    `inputs` are (buffer, array) pairs placed on their home sharding first:
    program arguments (a `StoreRef` for a result this island keeps), or
    values a host branch produced. `last` says no more work of this run will
    come to this island.
    """

    ticket: int
    run_id: int
    client_id: int
    plan_key: int
    step_ids: tuple[int, ...]
    inputs: tuple[tuple[int, Any], ...] = ()
    last: bool = True


class Islands(dict):
    """A runtime's islands by name, and how a run's work reaches them.

    What its islands can do (`runtime/backends.py`): `keep_arguments`,
    whether a handle passed to a later run goes to its island as a
    `StoreRef` instead of its array (embedded islands share this process, so
    the array is the cheaper; remote ones keep it: Ray); `fast_lanes`,
    whether a single-island plan's runs may execute on the caller's thread
    (`runtime/fast_lane.py`); `traces`, whether the islands record traces;
    `reads_shared_in_place`, whether a run reads a shared object's array
    itself (else it travels, and counts in the run's need).
    """

    keep_arguments = False
    fast_lanes = True
    traces = True
    reads_shared_in_place = True

    def on_run_done(self, wake) -> None:
        """Calls `wake()` whenever an island sees a run's device work over (its completion tracker)."""
        for island in self.values():
            island.on_done = wake

    def watch(self, lose, restore) -> None:
        """Calls `lose(island)` when an island dies on its own (embedded islands do not: nothing to watch)."""

    def unwatch(self) -> None:
        """Stops watching (before the islands close: closing is not losing)."""

    def start(self, run, works: dict[str, IslandWork], inline: bool = False) -> list[tuple["Island", IslandWork]]:
        """Delivers one run's work to its islands: one `start` message each, in ticket order. With `inline`,
        returns the (island, work) pairs the caller runs itself, with `run_inline`, once it holds no lock."""
        jobs = []
        for name, work in works.items():
            if self[name].start(work, inline):
                jobs.append((self[name], work))
        return jobs

    def close(self) -> None:
        """Closes every island (runs still under way there fail)."""
        for island in self.values():
            island.close()


def _computed(array) -> bool:
    """Whether the computation writing `array` is over as far as the island can tell: the array is ready,
    its computation failed (its reader raises), or it was donated to a later launch, which XLA runs
    after it (a deleted array has no readiness to ask)."""
    try:
        return array.is_deleted() or array.is_ready()
    except Exception:  # noqa: BLE001
        return True


def client_owner(client_id: int) -> tuple[str, int]:
    """The owner of a client's results in the object store."""
    return ("client", client_id)


def without_traceback(error: BaseException) -> BaseException:
    """Returns `error` with its traceback (and its causes' tracebacks) dropped: frames hold arrays."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return error


def raised(error: BaseException) -> BaseException:
    """Returns a copy of a kept error to raise: raising the kept one would attach a traceback to it, whose
    frames would keep a failed run's arrays alive as long as the error is kept."""
    copy = type(error)(*error.args)
    copy.__cause__ = error.__cause__
    return copy


class IslandRun:
    """What an island holds of one run under way: slots, queued programs, where it stopped."""

    __slots__ = ("id", "client_id", "plan_key", "program", "layout", "slots", "queue", "pc", "tracked", "last",
                 "executing", "began", "referenced", "awaiting", "parked")

    def __init__(self, run_id: int, client_id: int, plan_key: int, program: str, layout: IslandLayout):
        self.id, self.client_id, self.plan_key, self.program, self.layout = run_id, client_id, plan_key, program, layout
        self.slots: list = [None] * len(layout.slot)
        self.queue: collections.deque[tuple[Instruction, ...]] = collections.deque()
        self.pc = 0
        self.tracked: list = []          # arrays whose readiness means the run's device work is done
        self.last = False
        self.executing = False
        self.began: float | None = None  # when the executor first ran its instructions (monotonic)
        self.referenced: dict[int, Any] = {}   # buffer -> the kept array a StoreRef argument names
        self.awaiting = 0                # StoreRef arguments whose run has not produced them yet
        self.parked = False              # its work waits for those arguments (resumed by `_resume`)


def _waits_for(run: IslandRun) -> str:
    """Says what a run under way on an island waits for."""
    if run.executing:
        return "nothing: its steps are executing"
    if run.queue:
        instruction = run.queue[0][run.pc]
        if isinstance(instruction, RecvInstruction) and run.slots[instruction.dst] is None:
            return f"recv of {instruction.what}"
        return "its turn on the island's executor"
    if run.awaiting:
        return f"{run.awaiting} argument(s) kept here that their runs have not produced yet"
    if not run.last:
        return "more work of this run from the scheduler (after a host cond, or the next sequential step)"
    return "its turn on the island's executor"


class Island:
    """One island of devices, its executor thread and the work it is given."""

    def __init__(self, name: str, device_map: DeviceMap, transport: DcnTransport | None,
                 peer: Callable[[str], "Island"]):
        self.name = name
        self.device_map = device_map
        self.cache = ExecutableCache()
        self.store = ObjectStore()
        self.lock = threading.Lock()
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
        self._awaited_results: dict[tuple[int, int], list[tuple[IslandRun, int]]] = {}   # result -> (run, buffer)s
        self._seconds: collections.OrderedDict[int, float] = collections.OrderedDict()  # finished run -> s
        self._clock = DeviceClock()
        self._closed = False
        self.lost: IslandLost | None = None     # set once the island was lost
        self._executing: tuple[IslandRun, float] | None = None   # the run whose instructions run, since when
        self._awaited: tuple[IslandRun, float] | None = None     # the run whose device work is awaited, since
        self.wedged: IslandWedged | None = None  # set while the island is stuck (see `wedge`)
        self.on_done: Callable[[], None] | None = None   # told whenever a run's device work is over
        # The latest (ticket, run id, step count) started, for order checks; bounded for long runs.
        self.executed: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=HISTORY)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0                # work items queued or executing (on the executor or inline)
        self._inline = False             # a caller runs work inline now (see `start`)
        self._turn = threading.Condition(self.lock)
        self._turn_waits = 0             # the executor waits for its turn (see `_serve`)
        # Runs whose dispatch is over, for the tracker; appended without waking it (see `_track`).
        self._completions: collections.deque[IslandRun] = collections.deque()
        self._looking = threading.Lock()         # held by whoever looks for completions (`look`)
        self._lane_started = 0.0                 # when a fast lane's run last started here (monotonic)
        self._previous_end = 0.0                 # when the latest run retired here was seen over
        self._thread = threading.Thread(target=self._serve, name=f"pw-{name}", daemon=True)
        self._thread.start()
        self._tracker = threading.Thread(target=self._track, name=f"pw-{name}-done", daemon=True)
        self._tracker.start()

    # -- messages ------------------------------------------------------------

    def load(self, plan_key: int, plan: ProgramPlan) -> None:
        """Keeps `plan` (with its frees and peaks, from pw-plan-memory) under `plan_key`."""
        with self.lock:
            self._plans.setdefault(plan_key, (plan, None))

    def plan(self, plan_key: int) -> ProgramPlan:
        """Returns the plan kept under `plan_key`."""
        return self._plans[plan_key][0]

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
                        plan = self._plans[work.plan_key][0]
                        run = self._runs[work.run_id] = IslandRun(work.run_id, work.client_id, work.plan_key,
                                                                  plan.program, self._layout(work.plan_key))
                        for buffer, array in self._early.pop(work.run_id, {}).items():
                            run.slots[run.layout.slot[buffer]] = array
                    run = self._runs[work.run_id]
                    for buffer, value in work.inputs:
                        if isinstance(value, StoreRef):
                            self._reference(run, buffer, value)
                    self._pending += 1
                    if inline and self._pending == 1:
                        self._inline = True
                        return True
                    self._inbox.put((self._started, work))
                    return False
                except BaseException as error:  # noqa: BLE001  (the run fails alone)
                    peers = self._fail(work.run_id, error, plan_key=work.plan_key)
        self._tell(peers, work.run_id)
        return False

    def _reference(self, run: IslandRun, buffer: int, ref: StoreRef) -> None:
        """Takes the kept array `ref` names for `run`'s input `buffer` now, so that no later release can take
        it away; one its run has not produced yet is awaited (`_produced`). Under the lock."""
        key = (ref.run_id, ref.buffer)
        if ref.run_id in self._failed:
            raise RunFailed(f"run {run.id} takes a result of run {ref.run_id}, which failed: "
                            f"{self._failed[ref.run_id]}")
        array = self.store.get(key)
        producer = self._runs.get(ref.run_id)
        if array is None and producer is not None and ref.buffer in producer.layout.slot:
            array = producer.slots[producer.layout.slot[ref.buffer]]
            if array is None:
                self._awaited_results.setdefault(key, []).append((run, buffer))
                run.awaiting += 1
                return
        if array is None:
            raise ValueError(f"buffer {ref.buffer} of run {ref.run_id} is not kept on {self.name}: it was released")
        run.referenced[buffer] = array

    def _produced(self, run: IslandRun) -> None:
        """`run`'s results exist: the runs awaiting them as arguments get them, and resume once they have
        every argument. Under the lock."""
        for buffer, slot in run.layout.outputs:
            for reader, input_buffer in self._awaited_results.pop((run.id, buffer), ()):
                reader.referenced[input_buffer] = run.slots[slot]
                reader.awaiting -= 1
                if reader.awaiting == 0 and reader.parked and self._runs.get(reader.id) is reader:
                    self._pending += 1
                    self._inbox.put((self._resume, reader))

    def _resume(self, run: IslandRun) -> None:
        """A run parked for arguments it references has them all: places them and executes its work."""
        run.parked = False
        try:
            self._place_referenced(run)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            return
        self._advance(run)

    @staticmethod
    def _place_referenced(run: IslandRun) -> None:
        for buffer, array in run.referenced.items():
            run.slots[run.layout.slot[buffer]] = copy_to(array, run.layout.shardings[buffer])
        run.referenced = {}

    def run_inline(self, work: IslandWork) -> None:
        """Runs work that `start` handed back to the caller, on the caller's thread (holding no lock); the
        executor takes what came after it once it is done."""
        try:
            self._started(work)
        finally:
            self._inline_over()

    def _inline_over(self) -> None:
        with self.lock:
            self._inline = False
            self._pending -= 1
            if self._turn_waits:
                self._turn.notify_all()

    def start_lane(self, ticket: int, run_id: int, client_id: int, plan_key: int,
                   program: tuple[Instruction, ...]) -> IslandRun | None:
        """Registers a fast lane's run (`runtime/fast_lane.py`), all of whose steps are `program`, to be
        executed by the caller (`run_lane`), if the island is idle, open and not wedged; otherwise takes
        nothing and returns None."""
        with self.lock:
            if self._pending or self._closed or self.wedged is not None:
                return None
            self._lane_started = time.monotonic()
            run = self._runs[run_id] = IslandRun(run_id, client_id, plan_key, self._plans[plan_key][0].program,
                                                 self._layout(plan_key))
            self.executed.append((ticket, run_id, len(program)))
            self._pending = 1
            self._inline = True
            return run

    def run_lane(self, run: IslandRun, program: tuple[Instruction, ...], inputs: tuple[tuple[int, Any], ...]):
        """Executes a fast lane's run that `start_lane` registered, on the caller's thread (holding no lock):
        places its arguments (`inputs`: (buffer, array) pairs) and runs its program."""
        try:
            try:
                self._place(run, inputs)
            except BaseException as error:  # noqa: BLE001  (the run fails alone)
                self._fail_and_tell(run.id, error)
                return
            run.queue.append(program)
            run.last = True
            self._advance(run)
        finally:
            self._inline_over()

    @staticmethod
    def _place(run: IslandRun, inputs: tuple[tuple[int, Any], ...]) -> None:
        """Puts a run's arguments (not `StoreRef`s) on their home shardings."""
        layout = run.layout
        for buffer, value in inputs:
            if not isinstance(value, StoreRef):
                run.slots[layout.slot[buffer]] = copy_to(value, layout.shardings[buffer])

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

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        """Returns the array of a run's buffer, waiting until it is produced; raises if the run failed."""
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
                self._wait(deadline, f"buffer {buffer} of run {run_id} was not produced within {timeout} s")

    def release(self, run_id: int, buffer: int) -> None:
        """Drops a result (its handle was deleted); one not produced yet is dropped when it is."""
        with self.lock:
            if not self.store.release((run_id, buffer)) and run_id not in self._failed and \
                    run_id not in self._in_flight:
                self._dropped.add((run_id, buffer))

    def release_owner(self, owner: Hashable) -> int:
        """Drops every result of `owner`; returns how many."""
        with self.lock:
            return self.store.release_owner(owner)

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over (dispatched, and its device work finished), as the
        completion tracker sees it (it looks first)."""
        with self.lock:
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
                self._wait(deadline, f"run {run_id} is still under way on {self.name}")
            tracked = self._in_flight.get(run_id, ())
        for array in tracked:
            if not self._await(array, began, deadline):
                raise TimeoutError(f"the device work of run {run_id} on {self.name} was not over within {timeout} s")
        with self.lock:
            self._in_flight.pop(run_id, None)

    def device_seconds(self, run_id: int) -> float | None:
        """Returns (once) the device time a finished run took here: from when the run before it here was over
        (or its own instructions began, if later) until its device work was over (`device_clock.py`), times
        the devices its slices cover here. None until it is over."""
        with self.lock:
            return self._seconds.pop(run_id, None)

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

    def busy(self) -> tuple[IslandRun, str, float] | None:
        """Returns (run, what, seconds) for the oldest thing the island is busy with: the run whose
        instructions the executor runs now, or else the run whose device work is awaited; None if idle."""
        for current, what in ((self._executing, "executing its steps"), (self._awaited, "its device work")):
            if current is not None:
                run, since = current
                return run, what, time.monotonic() - since
        return None

    def status(self) -> dict:
        """Returns each run under way here with what it waits for, the runs whose device work is not
        over yet, each client's objects and bytes, and what the executor is busy with."""
        with self.lock:
            runs = [{"run": run.id, "client": run.client_id, "program": run.program,
                     "waits_for": _waits_for(run)} for run in self._runs.values()]
            clients: dict[int, dict[str, int]] = {}
            for owner, array in self.store.owners():
                entry = clients.setdefault(owner[1], {"objects": 0, "bytes": 0})
                entry["objects"] += 1
                entry["bytes"] += int(getattr(array, "nbytes", 0))
            busy = sorted(r for r, tracked in self._in_flight.items() if not all(map(_computed, tracked)))
            report = {"runs": runs, "device_work": busy, "clients": clients}
            busy = self.busy()
            if busy is not None:
                run, what, seconds = busy
                report["busy"] = {"run": run.id, "program": run.program, "with": what, "seconds": round(seconds, 3)}
            if self.wedged is not None:
                report["wedged"] = str(self.wedged)
            return report

    def wedge(self, timeout: float) -> bool:
        """Declares the island wedged if it has been busy with one run (executing its steps, or waiting for
        its device work) for more than `timeout` seconds: that run and the runs under way here fail (and on
        their other islands), and so does new work until the stuck run's work is over. Returns whether it is
        wedged now."""
        busy = self.busy()
        if busy is None or busy[2] <= timeout:
            return self.wedged is not None
        stuck, what, seconds = busy
        told = []
        with self.lock:
            if self.wedged is None:
                since = time.strftime("%H:%M:%S", time.localtime(time.time() - seconds))
                self.wedged = IslandWedged(f"island {self.name} is wedged since {since}: run {stuck.id} of "
                                           f"{stuck.program} has been busy with {what} for more than {timeout:g} s")
                for other in [stuck, *(r for r in self._runs.values() if r is not stuck)]:
                    error = IslandWedged(f"{self.wedged}; run {other.id} of {other.program} failed with it")
                    told.append((self._fail(other.id, error, other.plan_key), other.id))
        for peers, failed in told:
            self._tell(peers, failed)
        return True

    def close(self) -> None:
        """Fails every run still under way here (a run parked forever cannot hold up closing) and stops the
        executor (waiting at most `CLOSE_JOIN` seconds for one stuck in a computation)."""
        with self.lock:
            self._closed = True
            for run_id in list(self._runs):
                self._fail(run_id, RunFailed(f"{self.name} closed while run {run_id} was under way"))
            self._changed.notify_all()
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
            self._changed.notify_all()
        for peers, run_id in told:
            self._tell(peers, run_id)
        self._stop()

    def restored(self) -> "Island":
        """Returns a fresh island in place of this lost one; the results lost here still raise `IslandLost`."""
        fresh = Island(self.name, self.device_map, self._transport, self._peer)
        fresh.tracer, fresh.on_done = self.tracer, self.on_done
        with self.lock:
            fresh._failed.update(self._failed)
        return fresh

    # -- the executor --------------------------------------------------------

    def _serve(self) -> None:
        """The executor: takes work and deliveries off the queue, in order, until the island stops."""
        while True:
            item = self._inbox.get()
            if item is None:
                return
            handle, message = item
            del item
            with self.lock:
                while self._inline:              # work run inline on a caller's thread goes first
                    self._turn_waits += 1
                    try:
                        self._turn.wait()
                    finally:
                        self._turn_waits -= 1
            try:
                handle(message)
            finally:
                with self.lock:
                    self._pending -= 1
            del handle, message          # a waiting executor keeps no arrays of the last message alive

    def _await(self, array, since: float, deadline: float | None = None) -> bool:
        """Waits until `array` is computed, the island closes or `deadline` passes (then returns False),
        polling: a thread blocked inside XLA when the interpreter exits would abort the process, and one
        blocked there cannot give up. Each pause is a twentieth of the time waited since `since` (between
        `_AWAIT_PAUSE_MIN` and `_AWAIT_PAUSE`): the end of a computation is seen within about 5% of its
        duration, and the tracker seldom takes the GIL from the threads that dispatch."""
        while not self._closed:
            if _computed(array):
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            time.sleep(min(max((now - since) / 20, _AWAIT_PAUSE_MIN), _AWAIT_PAUSE))
        return True

    def _stop(self) -> None:
        self._inbox.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_JOIN)
            self._tracker.join(CLOSE_JOIN)

    def _track(self) -> None:
        """The completion tracker's thread: looks (`look`) for the end of the runs whose dispatch is over. It
        is polled, never woken per run: on these machines waking a waiting thread for every run cost the
        dispatching thread a GIL handoff of hundreds of microseconds. While a run is awaited it looks after a
        twentieth of the time waited (between `_AWAIT_PAUSE_MIN` and `_AWAIT_PAUSE`), so the end of a computation
        is seen within about 5% of its duration; it pauses `_AWAIT_PAUSE` when nothing is awaited, and
        `_LANE_PAUSE` while a fast lane's caller dispatches here: each look takes the GIL from that thread, at
        the cost of a handoff, which on a loaded machine is a wait for the scheduler (the lane looks itself
        when it needs its credits back)."""
        while True:
            if not self._completions and self._closed:
                return
            self.look()
            now = time.monotonic()
            awaited = self._awaited
            if now - self._lane_started < _LANE_PAUSE:
                time.sleep(_LANE_PAUSE)
            elif awaited is None:
                time.sleep(_AWAIT_PAUSE)
            else:
                time.sleep(min(max((now - awaited[1]) / 20, _AWAIT_PAUSE_MIN), _AWAIT_PAUSE))
            del awaited

    def look(self) -> bool:
        """The completion tracker: retires, in the order their dispatch ended, the runs whose device work is
        over (all, once the island is closed): records each one's device time (`device_clock.py`), forgets its
        arrays and tells `on_done`. Returns whether any was retired. The tracker's thread calls it, and so does
        whoever asks whether a run is over (`run_done`: the scheduler, a client, a fast lane that needs its
        credits back), so each completion is found once, by whoever looks first. Lookers take turns (a look
        never waits for a computation, so a turn is short)."""
        retired = False
        with self._looking:
            while self._completions:
                run = self._completions[0]
                if not self._closed and not all(map(_computed, run.tracked)):
                    if self._awaited is None or self._awaited[0] is not run:
                        self._awaited = (run, max(run.began or 0.0, self._previous_end))
                    break
                self._completions.popleft()
                self._previous_end = end = time.monotonic()
                seconds = self._clock.end(run.id, end)
                self._awaited = None
                with self.lock:
                    if self.wedged is not None and self._executing is None:
                        self.wedged = None           # what was stuck is over: the island serves again
                    self._seconds[run.id] = seconds * run.layout.devices
                    while len(self._seconds) > HISTORY:
                        self._seconds.popitem(last=False)
                    if self._in_flight.get(run.id) is run.tracked:
                        del self._in_flight[run.id]  # nothing of the run needs to stay alive now
                    self._notify()
                retired = True
            run = None                           # a looking thread keeps no arrays alive
        if retired and self.on_done is not None:
            self.on_done()
        return retired

    def _started(self, work: IslandWork) -> None:
        """A run's work: its inputs placed, its steps queued and executed (parking at a Recv not arrived)."""
        with self.lock:
            run = self._runs.get(work.run_id)
        if run is None:
            return                              # it failed (or was cancelled) meanwhile
        try:
            self._place(run, work.inputs)
            if work.step_ids:
                run.queue.append(self._program(work.plan_key, work.step_ids))
            run.last = work.last
            with self.lock:
                run.parked = run.awaiting > 0
            if run.parked:
                return                           # `_produced` resumes it
            self._place_referenced(run)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            return
        self._advance(run)

    def _delivered(self, message) -> None:
        """A peer's send: moved to its home sharding here; the run resumes if it was parked on it."""
        run_id, plan_key, buffer, array = message
        with self.lock:
            if run_id in self._failed or self._closed:
                return
        try:
            moved = copy_to(array, self._layout(plan_key).shardings[buffer])
        except BaseException as error:  # noqa: BLE001
            self._fail_and_tell(run_id, error, plan_key)
            return
        with self.lock:
            if run_id in self._failed:
                return
            run = self._runs.get(run_id)
            if run is None:
                self._early.setdefault(run_id, {})[buffer] = moved
                self._notify()
                return
            run.slots[run.layout.slot[buffer]] = moved
            self._notify()
        if self.tracer is not None:
            self.trace("recv over DCN", "dcn", _devices_of(moved, self), [moved], ("in", _flow_id(run_id, buffer)))
        self._advance(run)

    def _advance(self, run: IslandRun) -> None:
        """Executes the run's queued programs from where it stopped, until done or parked (no lock held)."""
        if run.parked:
            return                               # a delivery came first; its arguments are still awaited
        run.executing = True
        now = time.monotonic()
        if run.began is None:
            run.began = now
            self._clock.begin(run.id, now)
        self._executing = (run, now)
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
                if self._waiting:
                    with self.lock:
                        self._changed.notify_all()      # a fetch may wait for what this program made
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
        finally:
            self._executing = None
            run.executing = False
            with self.lock:
                if self.wedged is not None and self._awaited is None:
                    self.wedged = None           # the stuck instruction returned: the island serves again
                if self._runs.get(run.id) is run and run.last and not run.queue:
                    self._finish(run)
                self._notify()

    def _finish(self, run: IslandRun) -> None:
        """The run's work here is dispatched: keep its results, remember what marks it done. Under the lock."""
        del self._runs[run.id]
        if self._awaited_results:
            self._produced(run)
        owner = client_owner(run.client_id)
        for buffer, slot in run.layout.outputs:
            key = (run.id, buffer)
            if key in self._dropped:
                self._dropped.discard(key)
            else:
                self.store.add(key, owner, run.slots[slot])
        self._in_flight[run.id] = run.tracked
        run.slots = []                       # what is kept lives in the store now
        self._completions.append(run)

    def _fail(self, run_id: int, error: BaseException, plan_key: int | None = None) -> tuple[str, ...]:
        """Fails a run here (under the lock); returns the other islands of its plan, to be told."""
        run = self._runs.pop(run_id, None)
        plan_key = run.plan_key if run is not None else plan_key
        self._early.pop(run_id, None)
        for key in [k for k in self._awaited_results if k[0] == run_id]:
            for reader, _ in self._awaited_results.pop(key):      # their argument will never exist
                self._pending += 1
                self._inbox.put((self._argument_failed, (reader.id, run_id, error)))
        self._clock.drop(run_id)
        if run is None:
            self.store.release_run(run_id)   # its results raise from now on (a run cancelled after dispatch)
        if self._dropped:
            self._dropped = {k for k in self._dropped if k[0] != run_id}
        if not isinstance(error, RunFailed):
            failed = RunFailed(f"run {run_id} failed on {self.name}: {type(error).__name__}: {error}")
            failed.__cause__ = without_traceback(error)
            error = failed
        self._failed[run_id] = without_traceback(error)
        while len(self._failed) > FAILED_HISTORY:
            self._failed.popitem(last=False)
        self._notify()
        if plan_key is None or plan_key not in self._plans:
            return ()
        return tuple(island for island in self._plans[plan_key][0].islands if island != self.name)

    def _argument_failed(self, message) -> None:
        reader, producer, error = message
        self._fail_and_tell(reader, RunFailed(f"run {reader} takes a result of run {producer}, which failed: "
                                              f"{error}"))

    def _fail_and_tell(self, run_id: int, error: BaseException, plan_key: int | None = None) -> None:
        """Fails a run here and on the other islands of its plan (called with no lock held)."""
        with self.lock:
            if run_id in self._failed:
                return
            peers = self._fail(run_id, error, plan_key)
        self._tell(peers, run_id)

    def _tell(self, peers: tuple[str, ...], run_id: int) -> None:
        """Tells the peer islands that a run failed here (no lock held: peers take their own)."""
        error = self._failed.get(run_id)
        for island in peers:
            self._peer(island).fail_run(run_id, error)

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
        if self.tracer is not None:
            self.trace(f"send to {peer}", "dcn", _devices_of(array, self), [array], ("out", _flow_id(run.id, peer_buffer)))
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
        """Returns the island program of these steps, building it (and compiling) the first time, with no
        lock held: a compile delays only whoever needs its program."""
        program = self._programs.get((plan_key, step_ids))
        if program is None:
            plan = self._plans[plan_key][0]
            wanted = set(step_ids)
            steps = tuple(s for s in plan.islands.get(self.name, ()) if s.id in wanted)
            built = compile_steps(self, plan, self._layout(plan_key), steps)
            program = self._programs.setdefault((plan_key, step_ids), built)
        return program

    def prepare(self, plan_key: int, step_ids: tuple[int, ...]) -> None:
        """Builds the island program of these steps now, on the caller's thread (compiling its
        executables), so that the island's executor never compiles them."""
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


def _flow_id(run_id: int, buffer: int) -> int:
    """The id joining the two ends of one DCN transfer in a trace: the run and the receiving buffer."""
    return run_id * 1_000_003 + buffer


def _devices_of(array, island: Island) -> tuple[int, ...]:
    """The island-local ids of the devices an array lives on."""
    local = {d.id: i for i, d in enumerate(island.device_map.devices[island.name])}
    return tuple(sorted(local[d.id] for d in array.sharding.device_set if d.id in local))
