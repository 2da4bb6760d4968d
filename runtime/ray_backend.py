"""The Ray backend: each island is a long-running Ray actor that owns its devices.

The actor process starts its own JAX with the island's devices (CPU devices
made with `XLA_FLAGS` in the actor's environment here; an accelerator host's
own devices elsewhere) and runs an `Island` inside: the same island programs,
object-store shard and compile cache as the embedded backend. The driver
holds a proxy per island that turns each island message into an actor call:
plans travel as JSON, arrays as NumPy arrays through Ray's object store, and
replies come back as futures. A send between islands goes straight from one
actor to the other (`deliver`), never through the driver.

Ray runs actor calls concurrently (the actors are threaded), so the proxy
numbers the work items it submits and the actor admits them to its island in
that order: the gang scheduler's consistent order survives the hop.

On a Ray cluster (`address=`), island `I`'s actor is named `pw-island-I` in
the namespace `pathways` and needs the custom resource `pw-island-I`, which
only the node holding that island's devices offers: each island runs where
its devices are. A run costs one `start` call per island it uses, whatever
its number of steps (`RayIsland.calls` counts the calls by message).

A monitor thread in the driver (`RayIslands.watch`) notices an island whose
actor died (killed, its process gone, or its node removed) from Ray itself:
each actor has one call in flight that only returns when the island closes,
and that Ray fails as soon as it knows the actor is dead; any other call
that Ray fails with `RayActorError` says the same. The monitor then takes
the island out through `Runtime.lose_island`, the path the embedded backend
uses. When a node offering a lost island's resource joins the cluster in
place of the node that died, the monitor brings the island back
(`Runtime.restore_island`: a fresh actor, which every island connects to).
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

from .island import HISTORY, IslandLost, IslandWork, RunFailed
from .status import Status, gather

NAMESPACE = "pathways"
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray's node address is 127.0.0.1
STATUS_TIMEOUT = 10.0   # seconds an island has to answer a status request
START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included)
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
        self._peers: dict[str, object] = {}
        # Sends always go through the transport: a peer is another process.
        self._island = Island(name, DeviceMap(topology, {name: tuple(devices[:count])}),
                              DcnTransport(emulate=emulate_dcn, always=True), self._peer)
        self._next = 0
        self._turn = threading.Condition()
        self._closing = threading.Event()

    def connect(self, peers: dict) -> str:
        """Takes the actors of every island (this one's peers); returns the node this actor runs on."""
        import ray

        self._peers = dict(peers)
        return ray.get_runtime_context().get_node_id()

    def watch(self) -> None:
        """Returns when the island closes: the driver's monitor keeps one call in flight, which Ray fails
        as soon as it knows this actor is dead."""
        self._closing.wait()

    def _peer(self, name: str) -> "_PeerSender":
        return _PeerSender(self._peers[name])

    def load(self, key: int, plan_json: str) -> None:
        self._island.load(key, ProgramPlan.from_json(plan_json))

    def prepare(self, key: int, step_ids) -> None:
        self._island.prepare(key, tuple(step_ids))

    def start(self, seq: int, work: IslandWork) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._next == seq)
            try:
                self._island.start(work)
            finally:
                self._next += 1
                self._turn.notify_all()

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._island.deliver(run_id, key, buffer, array)

    def fail_run(self, run_id: int, message: str, lost: bool = False) -> None:
        self._island.fail_run(run_id, (IslandLost if lost else RunFailed)(message))

    def fetch(self, run_id: int, buffer: int, timeout: float | None):
        return np.asarray(self._island.fetch(run_id, buffer, timeout))

    def release(self, run_id: int, buffer: int) -> None:
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
        import ray

        return {**self._island.status(), "node": ray.get_runtime_context().get_node_id()}

    def close(self) -> None:
        self._island.close()
        self._closing.set()


class _PeerSender:
    """Inside an actor: sends a buffer (or a run's failure) to a peer island's actor."""

    def __init__(self, actor):
        self._actor = actor

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._actor.deliver.remote(run_id, key, buffer, np.asarray(array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        self._actor.fail_run.remote(run_id, str(error), isinstance(error, IslandLost))


class RayIsland:
    """The driver's proxy for an island actor: the island messages, as actor calls.

    Once its actor is dead (the monitor saw it, or Ray failed a call with
    `RayActorError`), the proxy answers for it as a lost island would: work
    started here fails with `IslandLost` (and so does the run on its peers),
    results that lived here raise it, and nothing waits for the actor.
    """

    def __init__(self, name: str, actor, group: "RayIslands"):
        self.name = name
        self._actor = actor
        self._group = group
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._started: dict[int, object] = {}   # run -> its latest start call, so later calls follow it
        self._keys: dict[int, int] = {}          # run -> its plan's key, while not known to be over
        self.calls: collections.Counter[str] = collections.Counter()   # actor calls made, by message
        self._done: collections.OrderedDict[int, None] = collections.OrderedDict()   # runs known to be over
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
            runs = list(self._keys.items())
        for run_id, key in runs:
            self._lose_run(run_id, key)

    def _lose_run(self, run_id: int, key: int) -> None:
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

    def start(self, work: IslandWork) -> None:
        if self._dead is not None:
            return self._lose_run(work.run_id, work.plan_key)
        inputs = tuple((b, np.asarray(v)) for b, v in work.inputs)
        with self._lock:   # the gang scheduler calls in ticket order; number the calls in that order
            ref = self._call("start", next(self._seq), work._replace(inputs=inputs))
            self._started[work.run_id] = ref
            self._keys[work.run_id] = work.plan_key

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._call("deliver", run_id, key, buffer, np.asarray(array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        if self._dead is not None:
            self._failed_here(run_id, error)
        elif self._live():
            self._call("fail_run", run_id, str(error), isinstance(error, IslandLost))

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        if self._dead is None and run_id not in self._failed:
            try:      # no wait for the start call first: the island's fetch waits for the value itself
                reply = self._call("fetch", run_id, buffer, timeout).future()   # the island waits `timeout`,
                return reply.result(None if timeout is None else timeout + STATUS_TIMEOUT)   # the reply travels
            except Exception as error:  # noqa: BLE001  (Ray wraps the island's error)
                import ray

                if not isinstance(error, ray.exceptions.RayActorError):
                    cause = getattr(error, "cause", None)
                    raise (cause if isinstance(cause, BaseException) else error) from None
                self._died(error)
        raise self._failed.get(run_id) or IslandLost(f"island {self.name} was lost, with the results of run "
                                                     f"{run_id} that lived there")

    def release(self, run_id: int, buffer: int) -> None:
        if self._live() and self._dead is None and run_id not in self._failed:
            self._call("release", run_id, buffer)   # handles dropped at exit, after the actors are gone, do nothing

    def _live(self) -> bool:
        import ray

        return not self._closed and ray.is_initialized()

    def _after_start(self, run_id: int) -> None:
        with self._lock:
            ref = self._started.get(run_id)
        if ref is not None:
            self._get(ref)

    def _ask(self, message: str, *args, otherwise=None):
        """Calls the actor and returns its reply; `otherwise` once the island is closed or its actor dead."""
        if self._closed or self._dead is not None:
            return otherwise
        try:
            return self._get(self._call(message, *args))
        except IslandLost:
            return otherwise

    def release_owner(self, owner) -> int:
        return self._ask("release_owner", owner, otherwise=0)

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over. One actor call also asks about every other run
        whose start call has been taken, and the answers are kept: the scheduler and the clients poll
        runs in order, so the next questions are answered here. Once the actor is dead, a run is over
        here if it was known to be, or failed, or the island was taken out."""
        import ray

        if run_id in self._done:
            return True
        if self._dead is None:
            try:
                self._after_start(run_id)
                with self._lock:
                    others = {ref: r for r, ref in self._started.items() if r != run_id}
                taken, _ = ray.wait(list(others), num_returns=len(others), timeout=0) if others else ([], [])
                self._over(self._get(self._call("runs_done", [run_id] + [others[ref] for ref in taken])))
                return run_id in self._done
            except IslandLost:
                pass
        return run_id in self._failed or self.lost is not None

    def _over(self, run_ids) -> None:
        """Remembers runs whose work here is over (the latest `HISTORY` of them)."""
        with self._lock:
            for run_id in run_ids:
                self._started.pop(run_id, None)
                self._keys.pop(run_id, None)
                self._done[run_id] = None
            while len(self._done) > HISTORY:
                self._done.popitem(last=False)

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        if self._dead is not None:
            return              # its work here ended with the actor
        try:
            self._after_start(run_id)
            self._get(self._call("wait_run", run_id, timeout))
        except IslandLost:
            return
        self._over([run_id])

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


def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"


class RayIslands(dict):
    """The island proxies of a runtime on Ray (by island name); what starts, watches and stops their actors."""

    def __init__(self, topology: Topology, emulate_dcn: bool, one_machine: bool, started_ray: bool):
        super().__init__()
        self.topology = topology
        self.emulate_dcn = emulate_dcn
        self.one_machine = one_machine          # every island on the one node of a Ray without island resources
        self.started_ray = started_ray
        self.nodes: dict[str, str] = {}         # island -> the node its actor runs on
        self._watches: dict = {}                # each actor's `watch` call -> its proxy
        self._reported: set[str] = set()        # islands whose actor a call saw dead
        self._failed_nodes: set[str] = set()    # nodes a restarted actor failed on (dead ones Ray counted alive)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None

    def launch(self, island: str, node: str | None = None):
        """Starts island `island`'s actor on a node offering its resource (on `node`, if given); returns its
        handle."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        flags = f"--xla_force_host_platform_device_count={self.topology.island(island).num_devices}"
        return ray.remote(_IslandActor).options(
            name=island_name(island), namespace=NAMESPACE,
            resources={} if self.one_machine else {island_name(island): 1},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT",
            num_cpus=0, max_concurrency=64,
            runtime_env={"env_vars": {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PW_CLUSTER": ""}},
        ).remote(island, self.topology.to_json(), self.emulate_dcn)

    def add(self, island: str, actor, node: str) -> RayIsland:
        """Makes the proxy of a started and connected actor, and watches the actor; returns the proxy."""
        proxy = RayIsland(island, actor, self)
        self.nodes[island] = node
        with self._lock:
            self._watches[actor.watch.remote()] = proxy
        return proxy

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
        ray.kill(self[island]._actor)      # frees the name: Ray keeps a dead actor's name while handles to it live
        deadline = time.monotonic() + timeout
        while True:
            try:
                actor = self.launch(island, target)
                break
            except ray.exceptions.ActorAlreadyExistsError:     # the name is not free yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        actors = {**{name: proxy._actor for name, proxy in self.items()}, island: actor}
        try:
            node = ray.get(actor.connect.remote(actors), timeout=max(0.0, deadline - time.monotonic()))
            ray.get([actors[name].connect.remote(actors) for name, proxy in self.items()
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
        return self.add(island, actor, node)

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

    def shutdown(self, timeout: float = 10.0) -> None:
        """Waits until the island actors' names are free; stops Ray if the runtime started it."""
        import ray

        if not ray.is_initialized():
            return
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


def start_islands(topology: Topology, emulate_dcn: bool = False, address: str | None = None) -> RayIslands:
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
        islands = RayIslands(topology, emulate_dcn, one_machine, started)
        for island in topology.islands:
            actors[island.name] = islands.launch(island.name)
        nodes = ray.get([a.connect.remote(actors) for a in actors.values()], timeout=START_TIMEOUT)
    except BaseException:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()
        raise
    for (name, actor), node in zip(actors.items(), nodes):
        islands[name] = islands.add(name, actor, node)
    return islands
