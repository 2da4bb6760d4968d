"""The Ray backend: each island is a long-running Ray actor that owns its devices.

The actor process starts its own JAX with the island's devices (CPU devices
made with `XLA_FLAGS` in the actor's environment here; an accelerator host's
own devices elsewhere) and runs an `Island` inside: the same island programs,
object-store shard and compile cache as the embedded backend. The driver
holds a proxy per island (`RayIsland`) that turns island messages into actor
calls: plans travel as JSON, arrays as NumPy arrays through Ray's object
store, and replies come back as futures. A send between islands goes
straight from one actor to the other (`deliver_many`), never through the
driver.

A run costs one `start` message per island it uses, whatever its number of
steps, sent in the gang scheduler's ticket order: through a Ray Compiled
Graph (`_CompiledStarts`) when every island actor is on the driver's node,
else as numbered actor calls (`_CalledStarts`: Ray runs an actor's calls
concurrently, so the actor takes them in number order). `RayIsland.calls`
counts the messages by kind.

On a Ray cluster (`address=`), island `I`'s actor is named `pw-island-I` in
the namespace `pathways` and needs the custom resource `pw-island-I`, which
only the node holding that island's devices offers: each island runs where
its devices are.

A monitor thread in the driver (`RayIslands.watch`) notices an island whose
actor died (killed, its process gone, or its node removed) from Ray itself:
each actor has one call in flight that only returns when the island closes,
and that Ray fails as soon as it knows the actor is dead; any other call
that Ray fails with `RayActorError` says the same. The monitor then takes
the island out through `Runtime.lose_island`, the path the embedded backend
uses. When a node offering a lost island's resource joins the cluster in
place of the node that died, the monitor brings the island back
(`Runtime.restore_island`: a fresh actor, which every island connects to).
After a loss, start messages go as actor calls (a compiled graph holds the
dead actor).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import sys
import threading
import time
from typing import Callable

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .island import HISTORY, IslandLost, Islands, IslandWork, RunFailed, client_owner
from .status import Status, gather

NAMESPACE = "pathways"
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray's node address is 127.0.0.1
STATUS_TIMEOUT = 10.0   # seconds an island has to answer a status request
START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included), or to take a start
SIBLING_BYTES = 1 << 20  # a fetch brings back the run's other results on the island up to this size each
RELEASE_BATCH = 64      # queued releases sent in a call of their own once this many wait
RUNS_DONE_BATCH = 256   # earlier runs asked about with each `runs_done` call
PENDING = 32            # compiled start executions whose acknowledgement may stay unread
WATCH_PERIOD = 0.2      # seconds: how often the monitor looks at islands a call saw dead
JOIN_PERIOD = 1.0       # seconds: how often the monitor looks for a node offering a lost island's resource

log = logging.getLogger("pathways_mlir.runtime")


class _IslandActor:
    """The body of an island actor (made a Ray actor class by `start_islands`)."""

    def __init__(self, name: str, topology_json: str, emulate_dcn: bool):
        import jax

        from .cluster import DeviceMap
        from .island import Island
        from .transfers import DcnTransport

        topology = Topology.from_json(topology_json)
        count = topology.island(name).num_devices
        devices = jax.devices()
        if len(devices) < count:
            raise RuntimeError(f"island {name} needs {count} devices but its process has {len(devices)}")
        self._name = name
        self._senders: dict[str, _PeerSender] = {}
        # Without emulation a send is handed to the peer's sender at once (it batches and waits for the value).
        self._island = Island(name, DeviceMap(topology, {name: tuple(devices[:count])}),
                              DcnTransport(emulate=emulate_dcn), self._peer)
        self._next = 0
        self._turn = threading.Condition()
        self._closing = threading.Event()

    def connect(self, peers: dict) -> None:
        self._senders = {name: _PeerSender(actor) for name, actor in peers.items() if name != self._name}

    def reconnect(self, name: str, actor) -> None:
        """Island `name` has a new actor (it was lost and restored): sends go there from now on."""
        self._senders[name] = _PeerSender(actor)

    def watch(self) -> None:
        """Returns when the island closes: the driver's monitor keeps one call in flight, which Ray fails
        as soon as it knows this actor is dead."""
        self._closing.wait()

    def _peer(self, name: str) -> "_PeerSender":
        return self._senders[name]

    def load(self, key: int, plan_json: str) -> None:
        self._island.load(key, ProgramPlan.from_json(plan_json))

    def prepare(self, key: int, step_ids) -> None:
        self._island.prepare(key, tuple(step_ids))

    def start(self, seq: int, work: IslandWork, releases) -> None:
        """One run's work (after the releases made since the last message), in the order `seq` numbers."""
        with self._turn:
            self._turn.wait_for(lambda: self._next == seq)
            try:
                self._release(releases)
                self._island.start(work)
            finally:
                self._next += 1
                self._turn.notify_all()

    def start_compiled(self, message: dict) -> None:
        """One execution of the compiled start graph: this island's releases, then its work of the run (if any).
        Executions arrive in the order the driver made them."""
        self._release(message["releases"].get(self._name, ()))
        work = message["works"].get(self._name)
        if work is not None:
            self._island.start(work)

    def deliver_many(self, items) -> None:
        """A peer's sends and failures, in the order it made them."""
        for item in items:
            if len(item) == 4:
                self._island.deliver(*item)
            else:
                self._island.fail_run(item[0], RunFailed(item[1]))

    def fail_run(self, run_id: int, message: str, lost: bool = False) -> None:
        self._island.fail_run(run_id, (IslandLost if lost else RunFailed)(message))

    def fetch(self, run_id: int, buffer: int, timeout: float | None, siblings):
        """Returns a buffer's value, and those of the `siblings` (other results of its run) already produced
        that are at most `SIBLING_BYTES` each."""
        value = np.asarray(self._island.fetch(run_id, buffer, timeout))
        ready = {}
        for other in siblings:
            try:
                array = self._island.fetch(run_id, other, timeout=0)
            except Exception:  # noqa: BLE001  (not produced yet, released or failed: fetched on its own)
                continue
            if array.nbytes <= SIBLING_BYTES:
                ready[other] = np.asarray(array)
        return value, ready

    def release_many(self, pairs) -> None:
        self._release(pairs)

    def _release(self, pairs) -> None:
        for run_id, buffer in pairs:
            self._island.release(run_id, buffer)

    def release_owner(self, owner) -> int:
        return self._island.release_owner(owner)

    def runs_done(self, run_ids) -> list:
        return [r for r in run_ids if self._island.run_done(r)]

    def wait_run(self, run_id: int, timeout: float | None) -> None:
        self._island.wait_run(run_id, timeout)

    def owned_by(self, owner) -> list:
        return self._island.owned_by(owner)

    def object_count(self) -> int:
        return self._island.object_count()

    def compilations(self) -> int:
        return self._island.compilations()

    def status(self) -> dict:
        return {**self._island.status(), "node": self.node()}

    def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self._island.close()
        self._closing.set()


class _PeerSender:
    """Inside an actor: sends buffers (and run failures) to one peer island's actor, from one thread.

    Sends made while the previous batch is on its way queue up and leave
    together as one `deliver_many` call, in the order they were made: a
    burst of sends (a pipeline's micro-batches) costs one actor call, and a
    lone send leaves at once. The thread waits for each array's value, so
    the island that sent it never blocks.
    """

    def __init__(self, actor):
        self._actor = actor
        self._queue: list = []
        self._ready = threading.Condition()
        threading.Thread(target=self._send_batches, name="pw-peer-sender", daemon=True).start()

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._put((run_id, key, buffer, array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        self._put((run_id, str(error)))

    def _put(self, item: tuple) -> None:
        with self._ready:
            self._queue.append(item)
            self._ready.notify()

    def _send_batches(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue)
                batch, self._queue = self._queue, []
            items = []
            for item in batch:
                if len(item) == 4:
                    try:
                        item = (*item[:3], np.asarray(item[3]))
                    except Exception as error:  # noqa: BLE001  (computing the value failed: the run fails)
                        item = (item[0], f"run {item[0]} failed computing a sent buffer: {error}")
                items.append(item)
            self._actor.deliver_many.remote(items)


class RayIsland:
    """The driver's proxy for an island actor: the island messages, as actor calls.

    `start` goes through the runtime's start channel (`RayIslands.start`).
    Releases are queued and travel with the island's next start message (or
    in one call once `RELEASE_BATCH` have queued, or before any question
    about objects), so dropping a result costs no call of its own; the ledger
    of device memory is the driver's and frees the bytes at once. A fetch
    brings back the run's other small results on the island that were read
    of an earlier run of the same plan, so reading a run's outputs one by one
    costs one call, while results never read (a training state kept on the
    devices) never travel.

    Once its actor is dead (the monitor saw it, or Ray failed a call with
    `RayActorError`), the proxy answers for it as a lost island would: work
    started here fails with `IslandLost` (and so does the run on its peers),
    results that lived here raise it, and nothing waits for the actor.
    """

    def __init__(self, name: str, actor, group: "RayIslands"):
        self.name = name
        self._actor = actor
        self._group = group
        self._lock = threading.Lock()
        self._closed = False
        self.received: Callable[[int], None] = lambda run_id: None   # set by `RayIslands`: a start was taken
        self.calls: collections.Counter[str] = collections.Counter()   # messages sent, by kind
        self._done: collections.OrderedDict[int, None] = collections.OrderedDict()   # runs known to be over
        self._fetched: dict[tuple[int, int], np.ndarray] = {}   # results brought back with a sibling, not read yet
        self._read: dict[int | None, set[int]] = {}   # plan key -> the results here ever read of its runs
        self._releases: list[tuple[int, int]] = []
        # Runs started here -> (plan key, client id), the latest `HISTORY` of them.
        self._runs: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._plans: dict[int, ProgramPlan] = {}   # plans loaded, by key: a run failing here names its program
        self._dead: IslandLost | None = None       # set once the actor is known to be dead
        self.lost: IslandLost | None = None        # set once the runtime took the island out (`lose`)
        # Runs failed here since the actor died, and (after `lose`) every run whose results lived here.
        self._failed: collections.OrderedDict[int, BaseException] = collections.OrderedDict()

    def _call(self, message: str, *args):
        """Calls the actor's `message` method; returns the reply's object reference.

        After `close` it raises instead: a Ray call would start a new Ray session.
        """
        if self._closed:
            raise RunFailed(f"{self.name} is closed")
        self.calls[message] += 1
        return getattr(self._actor, message).remote(*args)

    def _get(self, ref, timeout: float | None = None):
        """Waits for a reply; raises `IslandLost` if Ray says the actor died (see `_died`)."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as error:
            raise self._died(error) from None

    def _died(self, error: BaseException) -> IslandLost:
        """Marks the actor dead (Ray said so with `error`): the runs under way here fail, and the monitor
        takes the island out. Returns the `IslandLost` that stands for it."""
        if self._dead is None:
            self._dead = IslandLost(f"island {self.name} was lost ({type(error).__name__}: "
                                    f"{(str(error).splitlines() or [''])[0]})")
            self._fail_under_way()
            self._group.report(self.name)
        return self._dead

    def _fail_under_way(self) -> None:
        """Fails every run started here and not known to be over, as a lost embedded island does."""
        with self._lock:
            runs = [(run_id, key) for run_id, (key, _) in self._runs.items() if run_id not in self._done]
        for run_id, key in runs:
            self.lose_run(run_id, key)

    def lose_run(self, run_id: int, key: int) -> None:
        """Fails a run with `IslandLost` here and on its peers (a peer parked on a recv from here included)."""
        plan = self._plans[key]
        error = IslandLost(f"island {self.name} was lost: run {run_id} of {plan.program} used it")
        self._failed_here(run_id, error)
        for island in plan.islands:
            if island != self.name:
                self._group[island].fail_run(run_id, error)

    def _failed_here(self, run_id: int, error: BaseException) -> None:
        """Remembers that a run failed (the latest `HISTORY` of them)."""
        with self._lock:
            self._failed.setdefault(run_id, error)
            while len(self._failed) > HISTORY:
                self._failed.popitem(last=False)

    def load(self, key: int, plan: ProgramPlan) -> None:
        if self._dead is not None:
            raise self._dead
        self._get(self._call("load", key, plan.to_json()))
        self._plans[key] = plan

    def prepare(self, key: int, step_ids) -> None:
        if self._dead is not None:
            raise self._dead
        self._get(self._call("prepare", key, list(step_ids)))

    def started(self, work: IslandWork) -> IslandWork:
        """Notes a run's start here; returns the work as it travels."""
        with self._lock:
            self._runs[work.run_id] = (work.plan_key, work.client_id)
            while len(self._runs) > HISTORY:
                self._runs.popitem(last=False)
        return work._replace(inputs=tuple((b, np.asarray(v)) for b, v in work.inputs))

    def take_releases(self) -> list[tuple[int, int]]:
        """Returns (and forgets) the releases queued since the last message."""
        with self._lock:
            releases, self._releases = self._releases, []
        return releases

    def fail_run(self, run_id: int, error: BaseException) -> None:
        if self._dead is not None:
            self._failed_here(run_id, error)
        elif self._live():
            self._call("fail_run", run_id, str(error), isinstance(error, IslandLost))

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        if self._dead is not None or run_id in self._failed:
            raise self._failed.get(run_id) or IslandLost(f"island {self.name} was lost, with the results of run "
                                                         f"{run_id} that lived there")
        with self._lock:
            value = self._fetched.pop((run_id, buffer), None)
            key = self._runs.get(run_id, (None, None))[0]
            read = self._read.setdefault(key, set())
            read.add(buffer)
            siblings = [b for b in self._group.results(key, self.name)
                        if b != buffer and b in read and (run_id, b) not in self._fetched]
        if value is not None:
            return value
        try:          # no wait for the start first: the island's fetch waits for the value itself
            reply = self._call("fetch", run_id, buffer, timeout, siblings).future()   # the island waits `timeout`,
            value, ready = reply.result(None if timeout is None else timeout + STATUS_TIMEOUT)   # the reply travels
        except Exception as error:  # noqa: BLE001  (Ray wraps the island's error)
            import ray

            if isinstance(error, ray.exceptions.RayActorError):
                self._died(error)
                return self.fetch(run_id, buffer, timeout)
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, BaseException) else error) from None
        with self._lock:
            released = set(self._releases)
            self._fetched.update(((run_id, b), v) for b, v in ready.items() if (run_id, b) not in released)
        return value

    def release(self, run_id: int, buffer: int) -> None:
        if not self._live() or self._dead is not None or run_id in self._failed:
            return       # handles dropped at exit, after the actors are gone, or of results gone: nothing to do
        with self._lock:
            self._fetched.pop((run_id, buffer), None)
            self._releases.append((run_id, buffer))
            full = len(self._releases) >= RELEASE_BATCH
        if full:
            self.flush_releases()

    def flush_releases(self, wait: bool = False) -> None:
        """Sends the queued releases now; with `wait`, returns once the island took them (before a question
        about objects: the actor runs calls concurrently)."""
        releases = self.take_releases()
        if releases and self._live() and self._dead is None:
            ref = self._call("release_many", releases)
            if wait:
                self._get(ref)

    def _live(self) -> bool:
        import ray

        return not self._closed and ray.is_initialized()

    def _ask(self, message: str, *args, otherwise=None):
        """Calls the actor (after the queued releases) and returns its reply; `otherwise` once the island is
        closed or its actor dead."""
        if self._closed or self._dead is not None:
            return otherwise
        try:
            self.flush_releases(wait=True)
            return self._get(self._call(message, *args))
        except IslandLost:
            return otherwise

    def release_owner(self, owner) -> int:
        if self._closed or self._dead is not None:
            return 0
        with self._lock:        # the owner's results brought back with a sibling and not read go too
            self._fetched = {k: v for k, v in self._fetched.items()
                             if client_owner(self._runs.get(k[0], (None, None))[1]) != owner}
        return self._ask("release_owner", owner, otherwise=0)

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over. One actor call also asks about every run started
        earlier that is not known to be over, and the answers are kept: the scheduler and the clients poll
        runs in order, so the next questions are answered here. Once the actor is dead, a run is over
        here if it was known to be, or failed, or the island was taken out."""
        if run_id in self._done:
            return True
        if self._dead is None:
            try:
                self.received(run_id)
                with self._lock:
                    others = [r for r in self._runs if r != run_id and r not in self._done][:RUNS_DONE_BATCH]
                self._over(self._get(self._call("runs_done", [run_id] + others)))
                return run_id in self._done
            except IslandLost:
                pass
        return run_id in self._failed or self.lost is not None

    def _over(self, run_ids) -> None:
        """Remembers runs whose work here is over (the latest `HISTORY` of them)."""
        with self._lock:
            for run_id in run_ids:
                self._done[run_id] = None
            while len(self._done) > HISTORY:
                self._done.popitem(last=False)

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        if self._dead is not None:
            return              # its work here ended with the actor
        try:
            self.received(run_id)
            self._get(self._call("wait_run", run_id, timeout))
        except IslandLost:
            return
        self._over([run_id])

    def device_seconds(self, run_id: int) -> None:
        """The actor does not report measured device time: on Ray, `share` charges plans' estimates."""
        return None

    def owned_by(self, owner) -> list:
        return self._ask("owned_by", owner, otherwise=[])

    def object_count(self) -> int:
        return self._ask("object_count", otherwise=0)

    def compilations(self) -> int:
        return self._ask("compilations", otherwise=0)

    def status(self) -> dict:
        """Returns the island's status (see `Island.status`) and its node, or why it did not answer."""
        if self._dead is not None:
            return _unreachable(self._dead)
        try:
            self.flush_releases(wait=True)
            return self._get(self._call("status"), STATUS_TIMEOUT)
        except Exception as error:  # noqa: BLE001  (a dead or stuck island is part of the report)
            return _unreachable(error)

    def lose(self) -> None:
        """Takes the island out as a dead host (`Runtime.lose_island`): kills the actor if it still runs;
        results of every run it had raise `IslandLost` from now on, also once the island is restored."""
        import ray

        if self._dead is None:
            self._dead = IslandLost(f"island {self.name} was lost")
            self._fail_under_way()
        with self._lock:
            runs = list(self._done)
        for run_id in runs:
            self._failed_here(run_id, IslandLost(f"island {self.name} was lost, with the results of run {run_id} "
                                                 f"that lived there"))
        self.lost = self._dead
        ray.kill(self._actor)

    def restored(self) -> "RayIsland":
        """Returns the proxy of a fresh actor in place of this lost island's (see `RayIslands.restart`); the
        results lost here still raise `IslandLost`."""
        fresh = self._group.restart(self.name)
        with self._lock:
            fresh._failed.update(self._failed)
        return fresh

    def close(self) -> None:
        import ray

        if self._closed:
            return
        if ray.is_initialized():
            if self._dead is None:
                try:
                    self._get(self._call("close"), STATUS_TIMEOUT)
                except Exception:  # noqa: BLE001  (a dead or stuck island is killed all the same)
                    pass
            ray.kill(self._actor)
        self._closed = True


def _unreachable(error: BaseException) -> dict:
    """An island's report when it did not answer."""
    return {"unreachable": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}


def _get(ref, timeout: float | None = None):
    import ray

    return ray.get(ref, timeout=timeout)


class GraphBroken(RuntimeError):
    """The compiled start graph lost an actor before the monitor saw it die; nothing of the execution was
    sent."""


class _CompiledStarts:
    """Start messages through a Ray Compiled Graph: one execution per run, whatever the program.

    The graph is the same for every program and client: one node per island
    actor (`start_compiled`), all reading the driver's message (each run's
    work by island, and the releases queued for each). An execution writes
    to shared-memory channels instead of submitting actor tasks (about
    50-200 us against about 1 ms a call here), and executions reach every
    actor in the order they were made, which is the gang scheduler's ticket
    order. Each execution's acknowledgement is read later, in order: before
    asking an island about a run (`received`), or when `PENDING` are unread.
    """

    def __init__(self, islands: dict[str, RayIsland]):
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as message:
            graph = MultiOutputNode([island._actor.start_compiled.bind(message) for island in islands.values()])
        self._graph = graph.experimental_compile(_max_inflight_executions=2 * PENDING)
        self._islands = islands
        self._pending: collections.deque[tuple[int, tuple, list]] = collections.deque()   # (run, islands, acks)
        self._lock = threading.Lock()
        self.broken = False     # an island actor died: the graph delivers nothing more (see `_take`)
        self._unread: list = []  # the acknowledgements of executions that will never be read

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list]) -> None:
        """Sends one run's work (and the queued releases) to every island; called in ticket order."""
        import ray

        try:
            refs = self._graph.execute({"works": works, "releases": releases})
        except (ray.exceptions.RayChannelError, ray.exceptions.RayActorError):
            self.broken = True          # an island actor died before the monitor saw it: nothing was sent
            raise GraphBroken("an island actor of the compiled start graph died") from None
        for name in works:
            self._islands[name].calls["start"] += 1
        with self._lock:
            self._pending.append((run_id, tuple(works), refs))
            while len(self._pending) > PENDING:
                self._take(*self._pending.popleft())

    def received(self, run_id: int) -> None:
        """Returns once every island has taken the execution carrying `run_id`'s work (if it is pending)."""
        with self._lock:
            if not any(r == run_id for r, _, _ in self._pending):
                return
            while self._pending:
                taken, names, refs = self._pending.popleft()
                self._take(taken, names, refs)
                if taken == run_id:
                    return

    def _take(self, run_id: int, names: tuple, refs) -> None:
        """Reads one execution's acknowledgements. Once an island actor died, every acknowledgement fails and
        which islands took the run's start is unknown: the run fails on all its islands (the monitor finds
        the dead actor). Nothing is read once an actor is known dead (see `close`)."""
        import ray

        self.broken = self.broken or any(island._dead is not None for island in self._islands.values())
        try:
            if not self.broken:
                _get(refs, START_TIMEOUT)
                return
        except (ray.exceptions.RayActorError, ray.exceptions.RayChannelError):
            self.broken = True
        self._unread.append(refs)   # until the teardown is over: a dropped unread ref reads its channel
        for name in names:
            self._islands[name].fail_run(run_id, IslandLost(f"an island actor died while the start of run "
                                                            f"{run_id} was on its way"))

    def close(self) -> None:
        """Reads the acknowledgements still pending and tears the graph down (the actors stay).

        Once an island actor is dead, nothing is read from the graph's channels: Ray's own monitor
        tears the graph down on the death, and a read racing with that teardown can abort this
        process inside Ray (a failed check registering a channel that is gone). That includes the
        read a Compiled Graph reference makes when it is dropped unread, so unread references are
        kept until the teardown is over. The runs whose acknowledgement was pending fail, as when
        an acknowledgement fails."""
        with self._lock:
            try:
                while self._pending:
                    self._take(*self._pending.popleft())
            except Exception:  # noqa: BLE001  (a stuck island: tear down all the same)
                pass
            self._graph.teardown()
            self._unread.clear()


class _CalledStarts:
    """Start messages as actor calls: one `start` call per island per run, numbered in ticket order
    (Ray runs an actor's calls concurrently, so each actor takes them in number order)."""

    def __init__(self, islands: dict[str, RayIsland]):
        self._islands = islands
        self._seq = {name: itertools.count() for name in islands}
        self._refs: collections.OrderedDict[int, list] = collections.OrderedDict()   # run -> (proxy, start call)s
        self._lock = threading.Lock()

    def restart(self, name: str) -> None:
        """Island `name` has a fresh actor: its start calls are numbered from 0 again."""
        self._seq[name] = itertools.count()

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list]) -> None:
        """Calls `start` on every island of the run; called in ticket order."""
        refs = [(self._islands[name], self._islands[name]._call("start", next(self._seq[name]), work,
                                                                 releases.pop(name, [])))
                for name, work in works.items()]
        with self._lock:
            self._refs[run_id] = refs
            while len(self._refs) > HISTORY:
                self._refs.popitem(last=False)
        for name, pairs in releases.items():
            if pairs:
                self._islands[name]._call("release_many", pairs)

    def received(self, run_id: int) -> None:
        """Returns once the run's start calls were taken (or their actors died)."""
        import ray

        with self._lock:
            refs = self._refs.pop(run_id, None)
        for island, ref in refs or ():
            try:
                _get(ref, START_TIMEOUT)
            except ray.exceptions.RayActorError as error:
                island._died(error)

    def close(self) -> None:
        """Nothing to tear down."""


def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"


class RayIslands(Islands):
    """The island proxies of a runtime on Ray (by island name), their start channel, and what starts,
    watches and stops their actors.

    `compiled_graph=True` sends start messages through a Ray Compiled Graph
    (`_CompiledStarts`), else as actor calls (`_CalledStarts`). The graph is
    used only when every island actor runs on the driver's node: across
    nodes, Ray's compiled-graph channels (Ray 2.60) stopped delivering
    executions after the first few in our tests on a `Cluster` of 2 nodes,
    so a cluster of several nodes gets actor calls. Once an actor dies, the
    graph gives way to actor calls for good.
    """

    def __init__(self, topology: Topology, emulate_dcn: bool, one_machine: bool, started_ray: bool,
                 actors: dict, nodes: dict[str, str], compiled_graph: bool):
        super().__init__({name: RayIsland(name, actor, self) for name, actor in actors.items()})
        self.topology = topology
        self.emulate_dcn = emulate_dcn
        self.one_machine = one_machine          # every island on the one node of a Ray without island resources
        self.started_ray = started_ray
        self.compiled_graph = compiled_graph
        self.nodes = dict(nodes)                # island -> the node its actor runs on
        self._starts = (_CompiledStarts if compiled_graph else _CalledStarts)(self)
        self._results: dict[int, dict[str, tuple[int, ...]]] = {}   # plan key -> the results on each island
        self._watches: dict = {}                # each actor's `watch` call -> its proxy
        self._reported: set[str] = set()        # islands whose actor a call saw dead
        self._failed_nodes: set[str] = set()    # nodes a restarted actor failed on (dead ones Ray counted alive)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        for island in self.values():
            self._watch_actor(island)

    def _watch_actor(self, island: RayIsland) -> None:
        """Hands the proxy its start channel and keeps the actor's `watch` call in flight."""
        island.received = self._starts.received
        with self._lock:
            self._watches[island._actor.watch.remote()] = island

    def results(self, key: int | None, island: str) -> tuple[int, ...]:
        """The results a plan's runs leave on `island` (known once one of its runs started)."""
        return self._results.get(key, {}).get(island, ())

    def start(self, run, works: dict[str, IslandWork]) -> None:
        """Sends one run's work to its islands as one start message each, with the releases queued; the run
        fails at once on an island whose actor is dead."""
        if run.key not in self._results:
            self._results[run.key] = {name: tuple(b for b in run.plan.outputs if run.island_of(b) == name)
                                      for name in self}
        if self.compiled_graph and (self._starts.broken or any(p._dead is not None for p in self.values())):
            self._use_calls()
        dead = [name for name in works if self[name]._dead is not None]
        for name in dead:
            self[name].lose_run(run.id, works[name].plan_key)
        sent = {name: self[name].started(work) for name, work in works.items() if name not in dead}
        if sent:
            releases = {name: island.take_releases() for name, island in self.items()}
            try:
                self._starts.send(run.id, sent, releases)
            except GraphBroken:
                self._use_calls()
                self._starts.send(run.id, sent, releases)

    def _use_calls(self) -> None:
        """Replaces the compiled graph (it holds a dead actor) with actor calls."""
        graph, self._starts = self._starts, _CalledStarts(self)
        self.compiled_graph = False
        for island in self.values():
            island.received = self._starts.received
        graph.close()

    def restart(self, island: str, timeout: float = START_TIMEOUT) -> RayIsland:
        """Starts a fresh actor for lost island `island` on a node offering its resource, another than the
        one it was lost on (or one a restart failed on) if there is one; refused at once if no alive node
        offers it; the actor has `timeout` seconds to start. Connects every island's actor to it and returns
        its proxy (the runtime puts it in place)."""
        import ray

        offering = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(island_name(island)))
        if not self.one_machine and not offering:
            raise RuntimeError(f"no node of the Ray cluster offers the resource of island {island}: start one "
                               f"with ray start --resources='{{\"{island_name(island)}\": 1}}'")
        # A node killed hard counts as alive until Ray's health checks fail, and killing its dead actor
        # frees its resource there: go elsewhere when another node offers it.
        elsewhere = [node for node in offering if node != self.nodes[island] and node not in self._failed_nodes]
        target = elsewhere[0] if elsewhere else None
        if self.compiled_graph:
            self._use_calls()
        ray.kill(self[island]._actor)      # frees the name: Ray keeps a dead actor's name while handles to it live
        deadline = time.monotonic() + timeout
        while True:
            try:
                actor = _launch(self.topology, island, self.emulate_dcn, self.one_machine, target)
                break
            except ray.exceptions.ActorAlreadyExistsError:     # the name is not free yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        actors = {**{name: proxy._actor for name, proxy in self.items()}, island: actor}
        try:
            ray.get(actor.connect.remote(actors), timeout=max(0.0, deadline - time.monotonic()))
            node = ray.get(actor.node.remote(), timeout=max(0.0, deadline - time.monotonic()))
            ray.get([proxy._actor.reconnect.remote(island, actor) for name, proxy in self.items()
                     if name != island and proxy._dead is None], timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            self._failed_nodes |= {target} - {None}
            raise TimeoutError(f"island {island} was not restored: its actor did not start within {timeout} s "
                               f"(on a node offering the resource {island_name(island)})") from None
        except ray.exceptions.RayError as error:
            ray.kill(actor)
            self._failed_nodes |= {target} - {None}
            raise RuntimeError(f"island {island} was not restored: {type(error).__name__}: "
                               f"{(str(error).splitlines() or [''])[0]}") from None
        proxy = RayIsland(island, actor, self)
        self.nodes[island] = node
        self._starts.restart(island)
        self._watch_actor(proxy)
        return proxy

    def report(self, island: str) -> None:
        """A call saw island `island`'s actor dead: the monitor takes the island out."""
        with self._lock:
            self._reported.add(island)

    def watch(self, lose: Callable[[str], object], restore: Callable[[str], object]) -> None:
        """Starts the monitor thread: it calls `lose(island)` for an island whose actor died, within
        `WATCH_PERIOD` of Ray knowing it, and `restore(island)` for a lost island once a node other than the
        one it was lost on (or one a restart failed on) offers its resource (checked every `JOIN_PERIOD`
        while an island is lost)."""
        self._monitor = threading.Thread(target=self._watch, args=(lose, restore), name="pw-ray-monitor",
                                         daemon=True)
        self._monitor.start()

    def unwatch(self) -> None:
        """Stops the monitor (before the islands close: closing is not losing)."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10 * WATCH_PERIOD)

    def _watch(self, lose, restore) -> None:
        import ray

        next_join = 0.0
        while not self._stop.is_set():
            try:
                with self._lock:
                    watches = dict(self._watches)
                if watches:
                    ready, _ = ray.wait(list(watches), num_returns=1, timeout=WATCH_PERIOD)
                else:
                    ready = []
                    self._stop.wait(WATCH_PERIOD)
                for ref in ready:
                    with self._lock:
                        proxy = self._watches.pop(ref)
                    try:
                        ray.get(ref)               # returned: the island closed
                    except ray.exceptions.RayActorError as error:
                        proxy._died(error)
                with self._lock:
                    reported, self._reported = self._reported, set()
                for island in reported:
                    proxy = self[island]
                    if proxy._dead is not None and proxy.lost is None and not proxy._closed:
                        log.warning("%s: its runs fail with IslandLost and programs lower again without it",
                                    proxy._dead)
                        lose(island)
                if time.monotonic() >= next_join and any(p.lost is not None for p in self.values()):
                    next_join = time.monotonic() + JOIN_PERIOD
                    for island in self._joinable():
                        restore(island)
                        log.warning("island %s is back (node %s): programs use it from their next lowering",
                                    island, self.nodes[island])
            except Exception as error:  # noqa: BLE001  (the monitor outlives any one failure)
                if self._stop.is_set() or not ray.is_initialized():
                    return
                log.warning("the island monitor: %s: %s", type(error).__name__, error)
                self._stop.wait(WATCH_PERIOD)

    def _joinable(self) -> list[str]:
        """The lost islands whose resource an alive node offers, other than the node each was lost on and
        the nodes a restart failed on."""
        import ray

        if self.one_machine:
            return []
        alive = [node for node in ray.nodes() if node["Alive"]]
        return [island for island, proxy in self.items() if proxy.lost is not None and not proxy._closed and
                {n["NodeID"] for n in alive if n["Resources"].get(island_name(island))} - {self.nodes[island]} -
                self._failed_nodes]

    def close(self, timeout: float = 10.0) -> None:
        """Tears the start channel down, closes the island actors, waits until their names are free, and
        stops Ray if the runtime started it."""
        import ray

        if not ray.is_initialized():
            return
        self._starts.close()
        super().close()
        if self.started_ray:
            ray.shutdown()
            return
        deadline = time.monotonic() + timeout
        for island in self:
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(island_name(island), namespace=NAMESPACE)
                except ValueError:
                    break
                time.sleep(0.05)


def _launch(topology: Topology, island: str, emulate_dcn: bool, one_machine: bool, node: str | None = None):
    """Starts island `island`'s actor on a node offering its resource (on `node`, if given; on the one node
    with `one_machine`); returns its handle."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    flags = f"--xla_force_host_platform_device_count={topology.island(island).num_devices}"
    return ray.remote(_IslandActor).options(
        name=island_name(island), namespace=NAMESPACE,
        resources={} if one_machine else {island_name(island): 1},
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT",
        num_cpus=0, max_concurrency=64,
        runtime_env={"env_vars": {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PW_CLUSTER": ""}},
    ).remote(island, topology.to_json(), emulate_dcn)


def use_loopback() -> None:
    """Makes Ray in this process, and the processes it starts, take 127.0.0.1 as this node's address.

    Ray otherwise replaces a loopback address (in `ray.init(address=...)`
    and `_node_ip_address`) with the machine's outward address, so a local
    instance would listen there and a cluster bound to 127.0.0.1 could not
    be reached.
    """
    os.environ[_LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def connect(address: str | None, num_cpus: int = 2, resources: dict | None = None) -> bool:
    """Connects this process to Ray in the namespace `pathways`: to the cluster at `address` ("auto":
    `RAY_ADDRESS`, else the latest cluster started on this machine), or to a new local instance on
    127.0.0.1 with `num_cpus` and `resources`. Returns whether it connected (False: Ray was already
    up in this process, and is used as it is)."""
    import ray

    if ray.is_initialized():
        return False
    named = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address or ""
    loopback = address is None or named.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
    if loopback:
        use_loopback()
    options = dict(namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", resources=resources,
                 include_dashboard=False, **options)
    else:
        ray.init(address=address, **({"_node_ip_address": "127.0.0.1"} if loopback else {}), **options)
    return True


def cluster_status(address: str) -> Status:
    """Returns the report of every island actor on the Ray cluster at `address`, found by name, from
    any process (the scheduler's queue stays with the process that owns the islands)."""
    import ray

    started = connect(address)
    try:
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["namespace"] == NAMESPACE and a["name"].startswith(island_name("")))
        islands = {}
        for name in names:
            try:
                islands[name.removeprefix(island_name(""))] = ray.get(
                    ray.get_actor(name, namespace=NAMESPACE).status.remote(), timeout=STATUS_TIMEOUT)
            except Exception as error:  # noqa: BLE001  (a dead or stuck island is part of the report)
                islands[name.removeprefix(island_name(""))] = _unreachable(error)
        return gather(None, islands)
    finally:
        if started:
            ray.shutdown()


def start_islands(topology: Topology, emulate_dcn: bool = False, address: str | None = None,
                  compiled_graph: bool = True) -> RayIslands:
    """Starts one actor per island of `topology`, each on the node that offers its island's resource.

    `address` is an existing Ray cluster ("auto" or "host:port"); without
    it, a Ray instance already running in this process is used, else a local
    one is started on 127.0.0.1 with every island's resource. On a cluster of
    several nodes, the node holding island `I`'s devices must offer the
    custom resource `pw-island-I` (`ray start --resources='{"pw-island-I": 1}'`);
    a one-node Ray that offers none holds every island on its one machine.
    """
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray backend needs Ray: pip install 'pathways-mlir[ray]'") from None
    started = connect(address, num_cpus=max(2, len(topology.islands)),
                      resources={island_name(i.name): 1 for i in topology.islands})
    actors: dict = {}
    try:
        offered = ray.cluster_resources()
        missing = [i.name for i in topology.islands if island_name(i.name) not in offered]
        one_machine = len(missing) == len(topology.islands) and len([n for n in ray.nodes() if n["Alive"]]) == 1
        if missing and not one_machine:
            raise RuntimeError("no node of the Ray cluster offers the resource of island(s) " +
                               ", ".join(missing) + ": start the node holding island I's devices with "
                               "ray start --resources='{\"pw-island-I\": 1}'")
        for island in topology.islands:
            actors[island.name] = _launch(topology, island.name, emulate_dcn, one_machine)
        ray.get([a.connect.remote(actors) for a in actors.values()], timeout=START_TIMEOUT)
        nodes = dict(zip(actors, ray.get([a.node.remote() for a in actors.values()], timeout=START_TIMEOUT)))
        islands = RayIslands(topology, emulate_dcn, one_machine, started, actors, nodes,
                             compiled_graph and set(nodes.values()) == {ray.get_runtime_context().get_node_id()})
    except BaseException:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()
        raise
    return islands
