"""The runtime: every part of Pathways, on JAX devices.

A `Runtime` owns the resource manager, one `Island` per island (its devices,
object-store shard and compile cache), the gang scheduler with its memory
ledger, and the DCN transport. `get_runtime()` returns the
process's default runtime, created on first use from `PW_CLUSTER` (default
two islands of four devices) or from the last `configure(...)` call.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import heapq
import numbers
import os
import queue
import sys
import threading
import time
import weakref
from typing import Any, Callable

from pathways_mlir.dialect.plan import ProgramPlan

from .admission import MemoryLedger, add_range
from .backends import BACKENDS, backend_named
from .cluster import MAX_HOST_DEVICES, DeviceMap, prepare_host_devices
from .dispatch import LoadedPlan
from .executables import ARRAY_TYPE
from .fast_lane import FastLane
from .handles import release_dropped
from .island_work import IslandLost, RunCancelled, client_owner, raised
from .limits import MAX_SECONDS
from .plan_check import check_plan, refuse_kept_functions
from .policies import parse_policy
from .resource_manager import ResourceManager, TopologyChanged
from .run import Run
from .scheduler import GangScheduler
from .status import Status, gather
from .tracing import Tracer


_WATCH_PERIOD = 0.1      # seconds between the watchdog's looks at deadlines and busy islands
COND_JOIN = 10.0         # seconds `close` waits for the threads of host conds (one may be compiling a branch)
_DEADLINES_KEPT = 1024   # deadlines kept before those of runs over are dropped (then twice as many as remain)


class Runtime:
    """A Pathways cluster: islands of JAX devices, in this process or in Ray actors.

    `backend="embedded"` (the default) runs every island in this process on
    its JAX devices; `backend="ray"` runs each island in its own Ray actor
    (`runtime/ray_backend/`), with `islands` x `per_island` CPU devices
    each here. Both run the same plans through the same island messages
    (`runtime/backends.py` starts them; `tests/test_conformance.py` runs one
    suite on both).
    `address` runs the Ray backend on an existing Ray cluster ("auto" or
    "host:port"; none: a local Ray instance), where each island's actor
    goes to the node offering the resource `pw-island-<island>`.
    `device_memory_bytes` overrides each device's memory for admission.
    `policy` ("fifo", "share", "sjf" or "deadline") and `window` (how many
    admitted runs may be on each island's devices under a policy other than
    fifo; default 4 for share, 2 for sjf and deadline) are the gang
    scheduler's (`scheduler.py`, `policies.py`).
    `islands` x `per_island` CPU devices (both, or neither: `PW_CLUSTER`,
    default 2x4) is the cluster's shape; `device_map` (embedded) gives the
    devices instead. `emulate_dcn` makes transfers between islands take the
    modelled DCN time. `wedge_timeout` (seconds; None: never) declares an island wedged
    once it has been busy with one run for longer: its runs fail with
    `IslandWedged` and the other islands go on (see `island.py`).
    On Ray, a monitor takes out an island whose actor dies and brings it
    back when a node offering its resource joins (see `lose_island`).
    """

    def __init__(self, device_map: DeviceMap | None = None, policy: str = "fifo", window: int | None = None,
                 emulate_dcn: bool = False, device_memory_bytes: int | None = None, backend: str = "embedded",
                 islands: int | None = None, per_island: int | None = None, address: str | None = None,
                 wedge_timeout: float | None = None):
        global _runtime_made
        refuse_forked()
        _runtime_made = True
        chosen = backend_named(backend, {"address": address, "wedge_timeout": wedge_timeout})
        policy = parse_policy(policy, window)
        check_shape(islands, per_island)
        check_bounds(device_memory_bytes, wedge_timeout)
        self.backend = backend
        self.tracer: Tracer | None = None
        options = {"address": address} if "address" in chosen.options else {}
        started = chosen.start(device_map, islands, per_island, emulate_dcn, lambda name: self.islands[name],
                               **options)
        device_map, self.islands, self.transport = started.device_map, started.islands, started.transport
        self.resources = ResourceManager(device_map)
        self.scheduler = GangScheduler(self.islands, MemoryLedger(device_map.topology, device_memory_bytes),
                                       policy, window)
        self.islands.on_run_done(self.scheduler.wake)
        self._loaded: dict[int, LoadedPlan] = {}        # plan id -> the plan as loaded
        self._lanes: dict[int, FastLane | None] = {}    # plan id -> its fast lane (runtime/fast_lane.py)
        # (plan id, LoadedPlan) of loaded plans that nothing holds any more, put by their finalizers
        self._unused: queue.SimpleQueue[tuple[int, LoadedPlan]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # plan id -> (a lock held while it loads (compiles), its program, the monotonic time its load began)
        self._loading: dict[int, tuple[threading.Lock, str, float]] = {}
        self._membership = threading.Lock()     # islands are lost and restored one at a time
        self.wedge_timeout = wedge_timeout
        # (deadline, run id, the run weakly): a heap; a run over is not kept till its deadline (`set_deadline`)
        self._deadlines: list[tuple[float, int, weakref.ref]] = []
        self._deadlines_kept = _DEADLINES_KEPT
        self._closed = threading.Event()
        self.cond_threads: set[threading.Thread] = set()   # the threads running runs' host conds (`close` joins)
        self._watchdog = threading.Thread(target=self._watch, name="pw-watchdog", daemon=True)
        self._watchdog.start()
        self.islands.watch(self.lose_island, self.restore_island)

    def load(self, plan: ProgramPlan) -> LoadedPlan:
        """Loads a plan on the islands it uses (once: later calls are a lookup).

        Its executables compile here, on the caller's thread, under a lock of this plan alone: a run
        whose plan is still compiling waits alone, and no island, client or scheduler waits for it.
        """
        refuse_forked()
        loaded = self._loaded_as(plan)
        if loaded is not None:
            return loaded
        with self._lock:
            loading = self._loading.setdefault(id(plan), (threading.Lock(), plan.program, time.monotonic()))[0]
        with loading:
            try:
                return self._load(plan)
            finally:
                with self._lock:
                    self._loading.pop(id(plan), None)

    def is_loaded(self, plan: ProgramPlan) -> bool:
        """Whether `plan` is loaded on its islands (its executables compiled), so `load` is a lookup."""
        return self._loaded_as(plan) is not None

    def _loaded_as(self, plan: ProgramPlan) -> LoadedPlan | None:
        """`plan` as loaded, or None if it is not (a plan loaded under its id before may be gone)."""
        loaded = self._loaded.get(id(plan))
        return loaded if loaded is not None and loaded.plan is plan else None

    def _load(self, plan: ProgramPlan) -> LoadedPlan:
        """Loads a plan once (under its own loading lock). The runtime holds it only while something else
        does (a compiled program, a run, a handle): once nothing does, the next load (or the watchdog)
        forgets it here and on its islands (`_forget_unused`), as JAX drops a jitted function's
        executables with the function."""
        self._forget_unused()
        loaded = self._loaded_as(plan)
        if loaded is not None:
            return loaded
        plan.validate()
        check_plan(plan)         # untrusted executables are refused before anything compiles them
        if not self.islands.in_process:
            refuse_kept_functions(plan, "this runtime's islands are Ray actors")
        self.check_fits(plan)
        loaded = LoadedPlan.build(plan)
        while True:
            with self._lock:
                islands = {name: self.islands[name] for name in loaded.islands}
            lane = self._load_onto(islands, loaded)
            with self._lock:
                current = all(self.islands[name] is island for name, island in islands.items())
                if current:
                    self._lanes[id(plan)] = lane
                    self._loaded[id(plan)] = loaded
            if current:
                break
            self.scheduler.forget_plan(loaded.key, lane)     # an island was restored meanwhile: load again
        weakref.finalize(plan, self._unused.put, (id(plan), loaded))
        return loaded

    def check_fits(self, plan: ProgramPlan) -> None:
        """Raises TopologyChanged in one line if `plan` uses an island or devices this cluster does not have
        now: a plan lowered for another cluster (or before an island was lost), or read from a file or a
        socket. Its islands would fail it halfway (a device index or island name they do not have)."""
        have = {island.name: island.num_devices for island in self.resources.topology.islands}
        shown = ", ".join(f"{name}: {count} devices" for name, count in have.items())
        for island in plan.islands:
            if island not in have:
                raise TopologyChanged(f"plan @{plan.program} has steps on {island[:40]!r}, which the cluster does "
                                      f"not have ({shown}): lower it for this cluster")
        for s in plan.slices.values():
            if s.island not in have or s.devices[1] > have[s.island]:
                raise TopologyChanged(f"plan @{plan.program} places slice {s.name[:40]!r} on devices "
                                      f"[{s.devices[0]}, {s.devices[1]}) of {s.island[:40]!r}, which the cluster "
                                      f"does not have ({shown}): lower it for this cluster")

    def _load_onto(self, islands: dict, loaded: LoadedPlan) -> FastLane | None:
        """Loads a plan onto `islands` (name -> island, read once: an island restored meanwhile is a new
        object, which `_load` sees and loads the plan onto again) and compiles its programs there; returns
        its fast lane."""
        plan = loaded.plan
        for island in islands.values():
            island.load(loaded.key, plan)
        for name, steps in loaded.first.items():
            everything = tuple(s.id for s in plan.islands.get(name, ()))
            for step_ids in {steps, everything} - {()}:    # held steps' executables compile now too
                islands[name].prepare(loaded.key, step_ids)
        return FastLane.build(self.scheduler, islands, loaded) if self.islands.fast_lanes else None

    def _forget_unused(self) -> None:
        """Forgets the loaded plans that nothing holds any more (their finalizers queued them): their fast
        lanes and estimates, and on each island their programs, whose executables go with the last program
        that calls them. Their runs are over: a run holds its plan."""
        while not self._unused.empty():
            key, loaded = self._unused.get()
            with self._lock:
                if self._loaded.get(key) is loaded:     # not a plan loaded since under the same id
                    del self._loaded[key]
                    lane = self._lanes.pop(key, None)
                else:
                    lane = None
            self.scheduler.forget_plan(loaded.key, lane)
            for name in loaded.islands:
                island = self.islands.get(name)
                if island is not None:
                    island.unload(loaded.key)

    def lane(self, plan: ProgramPlan) -> FastLane | None:
        """Returns the fast lane of `plan` (loading it first if it is not loaded), or None if it has none."""
        key = id(plan)
        loaded = self._loaded.get(key)
        if loaded is None or loaded.plan_ref() is not plan:     # (`is_loaded`, without its calls: every run asks)
            self.load(plan)
        return self._lanes.get(key)

    def cancel(self, run: Run, error: BaseException | None = None) -> bool:
        """Cancels a run: a queued one leaves its queue, an admitted one fails on every island (a parked one
        at once, one executing after its current step), and its memory comes back once its device work is
        over. Returns False if the run was already over."""
        error = error or RunCancelled(f"run {run.id} of {run.plan.program} was cancelled")
        if self.scheduler.cancel(run, error):
            return True
        if run.error is not None or self.run_done(run, patient=True):    # (a result over is not lost)
            return False
        self.fail_run(run, error)
        return True

    def abandon(self, run: Run, error: BaseException) -> None:
        """Gives up a run whose start raised `error` (an interrupt, Ctrl-C) once the scheduler had taken it,
        before its caller held its handles: no handle would ever release its results. Queued, it leaves its
        queue; else it fails on each of its islands, where the inline turn the interrupted thread took for it
        ends (`Island.interrupted`), and its results are released (their bytes go back if it was over). Nothing
        for a run the scheduler never took. Called by the thread that started the run."""
        error = RunCancelled(f"run {run.id} of {run.plan.program} was given up: its start raised "
                             f"{type(error).__name__} before its caller held its handles")
        if self.scheduler.cancel(run, error) or not run.admitted:
            return
        if self.islands.in_process:
            for island in run.islands:
                self.islands[island].interrupted(run.id, error)
        self.fail_run(run, error)
        self.release_results(run)

    def set_deadline(self, run: Run, timeout: float) -> None:
        """Cancels `run` if it is not over within `timeout` seconds (its handles then raise `RunCancelled`)."""
        run.deadline = time.monotonic() + timeout       # what the `deadline` policy orders by
        with self._lock:
            if len(self._deadlines) >= self._deadlines_kept:      # a timeout far longer than the runs take
                self._deadlines = [entry for entry in self._deadlines
                                   if (kept := entry[2]()) is not None and not kept.retired]
                heapq.heapify(self._deadlines)
                self._deadlines_kept = max(_DEADLINES_KEPT, 2 * len(self._deadlines))
            heapq.heappush(self._deadlines, (run.deadline, run.id, weakref.ref(run)))

    def _watch(self) -> None:
        """The watchdog: retires the runs that are over and forgets the plans nothing holds, cancels runs past
        their deadline and declares islands wedged (`wedge_timeout`)."""
        while not self._closed.wait(_WATCH_PERIOD):
            if self.islands.in_process:          # (fast lanes are; on Ray a look at a run is a request)
                self.scheduler.retire_over()
            self._forget_unused()
            now = time.monotonic()
            expired = []
            with self._lock:
                while self._deadlines and self._deadlines[0][0] <= now:
                    expired.append(heapq.heappop(self._deadlines)[2]())
            for run in expired:
                if run is not None and run.error is None:       # (`cancel` looks whether it is over)
                    self.cancel(run, RunCancelled(f"run {run.id} of {run.plan.program} did not finish within "
                                                  f"its deadline: cancelled"))
            wedge_timeout = self.wedge_timeout   # (read once: a caller may set it to None meanwhile)
            if wedge_timeout is not None:
                for island in list(self.islands.values()):
                    island.wedge(wedge_timeout)

    def release_results(self, run: Run) -> None:
        """Releases every result of a run (no handle will be made for them), as `Client.release` does a handle's:
        a cond's result its host kept on an island's devices too (`keep_on_devices`)."""
        for buffer in run.plan.distinct_outputs:
            island = run.island_of(buffer)
            if island is not None:
                self.islands[island].release(run.id, buffer)
            self.scheduler.release_result(run, buffer)
            kept = run.on_devices.get(buffer) if run.on_devices and island is None else None
            if kept is not None:
                self.islands[kept[0]].drop_host_value(run.id, buffer)

    def keep_on_devices(self, run: Run, buffer: int, value) -> None:
        """`value` is the array of a `pw.cond`'s result that `run` returns as it is (a host buffer, its cond's
        thread settles it next): where it lies on an island's devices (the embedded backend), that island's
        store keeps it for the run's client, as a result (`client.objects()`, `status()`), and once the run is
        over its bytes are held for its handle (`HeldResults.keep`) until the handle is released or the client
        closes. On Ray the host keeps a NumPy copy, which no device holds."""
        if not self.islands.in_process or type(value) is not ARRAY_TYPE:
            return
        per_device = {shard.device: shard.data.nbytes for shard in value.addressable_shards}
        for island, devices in self.resources.device_map.devices.items():
            if per_device.keys() <= set(devices):
                break
        else:
            return                               # on devices of no one island (a program argument returned)
        ranges: list[tuple[int, int, int]] = []
        for index, device in enumerate(devices):
            nbytes = per_device.get(device)
            if nbytes is not None:
                add_range(ranges, index, index + 1, nbytes)
        if run.on_devices is None:
            run.on_devices = {}
        run.on_devices[buffer] = (island, {island: ranges})   # first: a release from now on drops it there
        self.islands[island].keep_host_value(run, buffer, value)

    def fail_run(self, run: Run, error: BaseException) -> None:
        """Fails a run on every island it uses: whatever reads its buffers (host ones too) raises `error`. A run
        that failed already keeps its first error (a cancel, then its cond's thread failing on that)."""
        if run.error is None:
            run.error = error
        error = run.error
        for island in run.islands:
            self.islands[island].fail_run(run.id, error)
        for buffer, info in run.plan.buffers.items():
            if info.slice is None:
                run.settle_host(buffer, error=raised(error))

    def lose_island(self, name: str) -> int:
        """Fails island `name` as a dead host would; returns the new topology version.

        Runs in flight or queued that use it fail with `IslandLost`, and so do the handles of results that
        lived only there; other runs go on. Its devices leave the topology: programs lower again on their
        next call, onto the remaining islands. On Ray it kills the island's actor; the monitor calls it
        when an actor dies.
        """
        with self._membership:
            if self._island(name).lost is not None:
                raise ValueError(f"island '{name}' is already lost")
            version = self.resources.remove_island(name)

            def lost(run: Run) -> IslandLost:
                return IslandLost(f"island {name} was lost: run {run.id} of {run.plan.program} used it")

            for run in self.scheduler.fail_island(name, lost):
                if not self.run_done(run):
                    self.fail_run(run, lost(run))
            self.islands[name].lose()
            return version

    def await_losses(self, timeout: float) -> None:
        """Waits, at most `timeout` s, until every island whose loss was seen has been taken out of the topology.
        On Ray a run may see an actor dead moments before the monitor takes its island out, and a program
        lowered meanwhile would be placed on it again; an embedded island is out before anything sees it lost."""
        deadline = time.monotonic() + timeout
        while any(island.dying for island in self.islands.values()) and time.monotonic() < deadline:
            time.sleep(0.01)

    def restore_island(self, name: str) -> int:
        """Brings a lost island back, fresh and empty; programs use it from their next lowering.
        Returns the new topology version. On Ray it starts a new actor, waiting (boundedly) for a node
        that offers the island's resource."""
        with self._membership:
            if self._island(name).lost is None:
                raise ValueError(f"island '{name}' is not lost")
            fresh = self.islands[name].restored()
            with self._lock:
                dropped = [(loaded, self._lanes.pop(key, None)) for key, loaded in self._loaded.items()
                           if name in loaded.islands]
                self._loaded = {k: v for k, v in self._loaded.items() if name not in v.islands}
                self.islands[name] = fresh
            for loaded, lane in dropped:         # loaded again onto the fresh island at their next run
                self.scheduler.forget_plan(loaded.key, lane)
            return self.resources.add_island(name)

    def _island(self, name: str):
        if name not in self.islands:
            raise ValueError(f"there is no island '{name}' (islands: {', '.join(self.islands)})")
        return self.islands[name]

    def run_done(self, run: Run, patient: bool = False) -> bool:
        """Returns whether a run's work is over on every island (see the islands' `run_done` for `patient`)."""
        return run.admitted and all(self.islands[island].run_done(run.id, patient) for island in run.islands)

    def wait(self, run: Run, timeout: float | None = None) -> None:
        """Waits until a run's work is over on every island; raises its error if it failed (one that lost
        an island at once)."""
        refuse_forked()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.scheduler.wait_admitted(run, timeout):
            raise TimeoutError(f"run {run.id} of {run.plan.program} was not admitted within {timeout} s")
        if isinstance(run.error, IslandLost):
            raise raised(run.error)  # at once: its work left on other islands is not waited for
        for island in run.islands:
            self.islands[island].wait_run(run.id, None if deadline is None else max(0.0, deadline - time.monotonic()))
        if run.error is not None:
            raise raised(run.error)
        for buffer in run.plan.distinct_outputs:
            if buffer not in run.released and run.island_of(buffer) is not None:
                self.islands[run.island_of(buffer)].produced(run.id, buffer, timeout=0)   # raises, brings nothing

    def usage(self) -> dict:
        """Returns the bytes reserved on every device, by (island, device)."""
        release_dropped()
        return self.scheduler.usage()

    def object_count(self) -> int:
        """Returns how many results the islands hold."""
        release_dropped()
        return sum(island.object_count() for island in self.islands.values())

    def owned_by(self, owner) -> list:
        """Returns the keys of every result `owner` holds, on any island."""
        return [key for island in self.islands.values() for key in island.owned_by(owner)]

    def release_client(self, client_id: int) -> int:
        """Releases every result of a client on every island; returns how many."""
        count = sum(island.release_owner(client_owner(client_id)) for island in self.islands.values())
        self.scheduler.release_client(client_id)
        return count

    def status(self, client: int | None = None) -> Status:
        """Returns what is queued, what every waiting run waits for, each client's objects, the bytes
        reserved on every device, and the plans compiling for their first run; with `client`, that client's
        queued runs, runs under way and objects only (a service's client's view). Runs are listed up to
        `status.LISTED` per list, and counted (`runtime/status.py`)."""
        refuse_forked()
        release_dropped()
        reserved: dict[str, list[int]] = {}
        for (island, _), nbytes in sorted(self.usage().items()):
            reserved.setdefault(island, []).append(nbytes)
        now = time.monotonic()
        compiling = [{"program": program, "seconds": round(now - started, 1)}
                     for _, program, started in list(self._loading.values())]
        return gather(self.scheduler.status(client),
                      {name: island.status(client) for name, island in self.islands.items()}, reserved, compiling)

    def compilations(self) -> int:
        """Returns how many executables the islands have compiled."""
        return sum(island.compilations() for island in self.islands.values())

    def start_tracing(self, tracer: Tracer | None = None) -> Tracer:
        """Starts recording a trace of every step executed from now on (embedded backend), into `tracer` if
        given (one trace may span runtimes: `command_line_options`)."""
        if not self.islands.traces:
            raise RuntimeError("traces are recorded by the embedded backend only")
        self.tracer = tracer or Tracer()
        for island in self.islands.values():
            island.tracer = self.tracer
        return self.tracer

    def stop_tracing(self) -> Tracer | None:
        """Stops recording; returns the trace."""
        tracer, self.tracer = self.tracer, None
        for island in self.islands.values():
            island.tracer = None
        if tracer is not None:
            tracer.flush()
            tracer.close()
        return tracer

    @property
    def closed(self) -> bool:
        """Whether `close` was called (results it held are gone)."""
        return self._closed.is_set()

    def close(self) -> None:
        """Stops the runtime in bounded time: runs still queued or under way fail (an island stuck in a
        computation is left to finish it on its own thread), and the threads of their host conds end. Such a
        thread left running at the interpreter's exit was killed there amid XLA's code, which aborted the
        process ("FATAL: exception not rethrown")."""
        self._closed.set()
        self.islands.unwatch()              # islands closed on purpose are not lost
        self.scheduler.close()
        self.islands.close()
        if self.transport is not None:
            self.transport.close()
        deadline = time.monotonic() + COND_JOIN
        for thread in list(self.cond_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        forget_runtime(self)


FORKED = ("the pathways-mlir runtime does not survive os.fork(): start worker processes with the 'spawn' or "
          "'forkserver' method")
_runtime_made = False    # whether this process made a runtime (whose threads a child os.fork() makes has none of)
_forked = False          # whether this process is a child os.fork() made of a process that had made a runtime


def refuse_forked() -> None:
    """Raises RuntimeError in one line in a child that os.fork() made of a process that had made a runtime: the
    runtime's threads (islands, scheduler, watchdog) are not in the child, and every run, read or close would
    wait for them forever, as would the locks one of them held at the fork."""
    if _forked:
        raise RuntimeError(FORKED)


def in_forked_child() -> bool:
    """Whether this process is a child os.fork() made of a process that had made a runtime (see
    `refuse_forked`)."""
    return _forked


def _after_fork_in_child() -> None:
    """Marks this child of os.fork() as one whose runtimes, if its parent made any, do not work (`refuse_forked`),
    and keeps JAX's MLIR thread pool alive to the end of the process. JAX lowers every computation in MLIR
    contexts that share that pool, whose workers start with the first module of several functions (the plans'
    launches are such modules); the child has none of the parent's workers, and the pool's destructor, which the
    interpreter's exit runs, waits for them forever (it hung at `sys.exit` in `pthread_cond_destroy`, under
    `~StdThreadPool`; plain JAX's child crashed there with SIGSEGV). JAX's backend clients are kept alive too:
    their thread pools' destructors, which the exit's last collection runs, waited for the parent's threads
    forever as well (`~PjRtClient`, in a child of a process connected to `pw-serve`)."""
    global _forked
    _forked = _runtime_made
    jax_mlir = sys.modules.get("jax._src.interpreters.mlir")
    pool = getattr(jax_mlir, "global_thread_pool", None)
    bridge = sys.modules.get("jax._src.xla_bridge")
    for kept in (pool, *getattr(bridge, "_backends", {}).values()):
        if kept is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))   # a reference never dropped: never destroyed


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_default: Runtime | None = None
_default_options: dict = {}
_command_line_options: dict = {}              # (`command_line_options`)
_command_line_tracer: Tracer | None = None
_default_lock = threading.RLock()    # reentrant: closing a connection (pw.connect) forgets it as the default


def check_shape(islands, per_island) -> None:
    """Raises ValueError in one line unless (`islands`, `per_island`) is a cluster shape: both None, or both
    positive integers."""
    if (islands is None) != (per_island is None):
        raise ValueError(f"islands= and per_island= go together (got islands={islands}, per_island={per_island})")
    for name, value in (("islands", islands), ("per_island", per_island)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}= must be a positive integer, not {value!r}")
    if islands is not None and islands * per_island > MAX_HOST_DEVICES:
        raise ValueError(f"islands={islands} x per_island={per_island} is {islands * per_island} devices; an "
                         f"embedded cluster has at most {MAX_HOST_DEVICES}")


def check_bounds(device_memory_bytes, wedge_timeout) -> None:
    """Raises ValueError in one line unless `device_memory_bytes` is None or a positive integer, and
    `wedge_timeout` None or a positive number of seconds (at most `MAX_SECONDS`)."""
    if device_memory_bytes is not None and (isinstance(device_memory_bytes, bool) or
                                            not isinstance(device_memory_bytes, numbers.Integral) or
                                            device_memory_bytes < 1):
        raise ValueError(f"device_memory_bytes= must be a positive integer (bytes per device), not "
                         f"{device_memory_bytes!r:.40}")
    if wedge_timeout is not None and (isinstance(wedge_timeout, bool) or not isinstance(wedge_timeout, numbers.Real)
                                      or not 0 < wedge_timeout <= MAX_SECONDS):
        raise ValueError(f"wedge_timeout= must be a positive number of seconds, at most {MAX_SECONDS:g} (None: "
                         f"never), not {wedge_timeout!r:.40}")


def configure(**options) -> None:
    """Sets the options of the default runtime (see `Runtime` for each); replaces one already made. An
    unknown option, policy or backend, an option of another backend, a bad window, an impossible cluster
    shape, device memory or wedge timeout is one ValueError line, raised here. Before JAX's first use, an
    embedded cluster's `islands` x `per_island` CPU devices are asked of XLA here. Options a command line
    gave (`command_line_options`) stay, unless `options` name them too."""
    import inspect

    refuse_forked()          # (closing the parent's default runtime would wait for its threads)
    options = {**_command_line_options, **options}
    parameters = inspect.signature(Runtime).parameters
    known = set(parameters) - {"device_map"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} of pw.configure "
                         f"(options: {', '.join(sorted(known))})")
    check_shape(options.get("islands"), options.get("per_island"))
    check_bounds(options.get("device_memory_bytes"), options.get("wedge_timeout"))
    parse_policy(options.get("policy", "fifo"), options.get("window"))
    settings = {**{name: parameters[name].default for name in known}, **options}
    backend_named(settings["backend"], {o: settings[o] for b in BACKENDS.values() for o in b.options})
    if settings["backend"] == "embedded" and settings["islands"] and settings["per_island"]:
        prepare_host_devices(settings["islands"] * settings["per_island"])
    global _default, _default_options
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
        _default_options = options


@contextlib.contextmanager
def command_line_options(tracer: Tracer | None = None, **options):
    """In the block, the default runtime takes the options a command line gave (`pw-run --backend ray`), also
    once a script's own `configure` replaces it (unless it names them: a script setting its cluster's shape
    still runs on the backend the command asked for), and records its steps into `tracer`, if given. The
    default runtime is made when first used, so a script's `configure` still asks XLA for its devices."""
    global _command_line_options, _command_line_tracer
    configure(**options)
    _command_line_options, _command_line_tracer = dict(options), tracer
    try:
        yield
    finally:
        _command_line_options, _command_line_tracer = {}, None


_runtime_forgetters: list[Callable[[Any], None]] = []    # see `on_close`


def on_close(forget: Callable[[Any], None]) -> None:
    """Has `forget(runtime)` called whenever a runtime or a service's connection closes (`forget_runtime`): what
    keeps state per runtime (default clients, stage caches) holds the runtime in it, so only dropping it at the
    close lets a closed runtime, its islands and its plans go (each `pw.configure` or `pw.connect` kept one)."""
    _runtime_forgetters.append(forget)


def forget_runtime(runtime) -> None:
    """Drops what this process keeps for `runtime`, which closed (see `on_close`)."""
    for forget in _runtime_forgetters:
        forget(runtime)


_closes_at_exit = False     # whether `_close_default` is registered with atexit (`_close_default_at_exit`)


def _close_default_at_exit() -> None:
    """Registers `_close_default` with atexit, once (each default runtime registered it again, for good; with JAX
    imported before, it runs before JAX's own handlers). Called under `_default_lock`."""
    global _closes_at_exit
    if not _closes_at_exit:
        atexit.register(_close_default)
        _closes_at_exit = True


def connect_default(runtime) -> None:
    """Makes `runtime` (a service's connection, see `runtime/service.py`) the process's default runtime,
    closing the one there."""
    global _default
    refuse_forked()
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = runtime
        _close_default_at_exit()


def release_default(runtime) -> None:
    """Forgets `runtime` as the default runtime if it is (it closed); the next use makes a new one."""
    global _default
    with _default_lock:
        if _default is runtime:
            _default = None


def get_runtime() -> Runtime:
    """Returns the process's default runtime, creating it on first use."""
    global _default
    refuse_forked()          # (before the lock, which a thread of the parent may have held at the fork)
    with _default_lock:
        if _default is None:
            _default = Runtime(**_default_options)
            _close_default_at_exit()
            if _command_line_tracer is not None:
                _default.start_tracing(_command_line_tracer)
        return _default


def status() -> Status:
    """Returns the default runtime's status (see `Runtime.status`); prints as a report."""
    return get_runtime().status()


def _close_default() -> None:
    """Stops the default runtime's threads before the interpreter (and JAX) shut down; nothing in a child of
    os.fork(), where they are not."""
    global _default
    if _forked:
        return
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
