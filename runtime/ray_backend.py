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
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
from typing import Callable

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .island import HISTORY, Islands, IslandWork, RunFailed
from .status import Status, gather

NAMESPACE = "pathways"
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray's node address is 127.0.0.1
STATUS_TIMEOUT = 10.0   # seconds an island has to answer a status request
START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included), or to take a start
SIBLING_BYTES = 1 << 20  # a fetch brings back the run's other results on the island up to this size each
RELEASE_BATCH = 64      # queued releases sent in a call of their own once this many wait
RUNS_DONE_BATCH = 256   # earlier runs asked about with each `runs_done` call
PENDING = 32            # compiled start executions whose acknowledgement may stay unread


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

    def connect(self, peers: dict) -> None:
        self._senders = {name: _PeerSender(actor) for name, actor in peers.items() if name != self._name}

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

    def fail_run(self, run_id: int, message: str) -> None:
        self._island.fail_run(run_id, RunFailed(message))

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
    brings back the run's other small results on the island too, so reading
    a run's outputs one by one costs one call.
    """

    def __init__(self, name: str, actor):
        self.name = name
        self._actor = actor
        self._lock = threading.Lock()
        self._closed = False
        self.received: Callable[[int], None] = lambda run_id: None   # set by `RayIslands`: a start was taken
        self.calls: collections.Counter[str] = collections.Counter()   # messages sent, by kind
        self._done: collections.OrderedDict[int, None] = collections.OrderedDict()   # runs known to be over
        self._outputs: collections.OrderedDict[int, tuple[int, ...]] = collections.OrderedDict()  # run -> results here
        self._fetched: dict[tuple[int, int], np.ndarray] = {}   # results brought back with a sibling, not read yet
        self._releases: list[tuple[int, int]] = []

    def _call(self, message: str, *args):
        """Calls the actor's `message` method; returns the reply's object reference.

        After `close` it raises instead: a Ray call would start a new Ray session.
        """
        if self._closed:
            raise RunFailed(f"{self.name} is closed")
        self.calls[message] += 1
        return getattr(self._actor, message).remote(*args)

    def load(self, key: int, plan: ProgramPlan) -> None:
        _get(self._call("load", key, plan.to_json()))

    def prepare(self, key: int, step_ids) -> None:
        _get(self._call("prepare", key, list(step_ids)))

    def started(self, work: IslandWork, outputs: tuple[int, ...]) -> IslandWork:
        """Notes a run's start here (its results on this island); returns the work as it travels."""
        with self._lock:
            self._outputs[work.run_id] = outputs
            while len(self._outputs) > HISTORY:
                self._outputs.popitem(last=False)
        return work._replace(inputs=tuple((b, np.asarray(v)) for b, v in work.inputs))

    def take_releases(self) -> list[tuple[int, int]]:
        """Returns (and forgets) the releases queued since the last message."""
        with self._lock:
            releases, self._releases = self._releases, []
        return releases

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._call("deliver_many", [(run_id, key, buffer, np.asarray(array))])

    def fail_run(self, run_id: int, error: BaseException) -> None:
        if self._live():
            self._call("fail_run", run_id, str(error))

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        with self._lock:
            value = self._fetched.pop((run_id, buffer), None)
            siblings = [b for b in self._outputs.get(run_id, ()) if b != buffer and (run_id, b) not in self._fetched]
        if value is not None:
            return value
        try:          # no wait for the start first: the island's fetch waits for the value itself
            value, ready = self._call("fetch", run_id, buffer, timeout, siblings).future().result(timeout)
        except Exception as error:  # noqa: BLE001  (Ray wraps the island's error)
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, BaseException) else error) from None
        with self._lock:
            released = set(self._releases)
            self._fetched.update(((run_id, b), v) for b, v in ready.items() if (run_id, b) not in released)
        return value

    def release(self, run_id: int, buffer: int) -> None:
        if not self._live():       # handles dropped at exit, after the actors are gone, release nothing
            return
        with self._lock:
            self._fetched.pop((run_id, buffer), None)
            self._releases.append((run_id, buffer))
            full = len(self._releases) >= RELEASE_BATCH
        if full:
            self.flush_releases()

    def flush_releases(self) -> None:
        """Sends the queued releases now."""
        releases = self.take_releases()
        if releases and self._live():
            self._call("release_many", releases)

    def _live(self) -> bool:
        import ray

        return not self._closed and ray.is_initialized()

    def release_owner(self, owner) -> int:
        if self._closed:
            return 0
        self.flush_releases()
        with self._lock:
            self._fetched = {k: v for k, v in self._fetched.items() if k not in set(self._releases)}
        return _get(self._call("release_owner", owner))

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over. One actor call also asks about every run started
        earlier that is not known to be over, and the answers are kept: the scheduler and the clients poll
        runs in order, so the next questions are answered here."""
        if run_id in self._done:
            return True
        self.received(run_id)
        with self._lock:
            others = [r for r in self._outputs if r != run_id and r not in self._done][:RUNS_DONE_BATCH]
        self._over(_get(self._call("runs_done", [run_id] + others)))
        return run_id in self._done

    def _over(self, run_ids) -> None:
        """Remembers runs whose work here is over (the latest `HISTORY` of them)."""
        with self._lock:
            for run_id in run_ids:
                self._done[run_id] = None
            while len(self._done) > HISTORY:
                self._done.popitem(last=False)

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        self.received(run_id)
        _get(self._call("wait_run", run_id, timeout))
        self._over([run_id])

    def owned_by(self, owner) -> list:
        if self._closed:
            return []
        self.flush_releases()
        return _get(self._call("owned_by", owner))

    def object_count(self) -> int:
        if self._closed:
            return 0
        self.flush_releases()
        return _get(self._call("object_count"))

    def compilations(self) -> int:
        return _get(self._call("compilations"))

    def status(self) -> dict:
        """Returns the island's status (see `Island.status`) and its node, or why it did not answer."""
        try:
            self.flush_releases()
            return _get(self._call("status"), STATUS_TIMEOUT)
        except Exception as error:  # noqa: BLE001  (a dead or stuck island is part of the report)
            return _unreachable(error)

    def close(self) -> None:
        import ray

        if self._closed:
            return
        if ray.is_initialized():
            try:
                _get(self._call("close"), STATUS_TIMEOUT)
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
        self._pending: collections.deque[tuple[int, list]] = collections.deque()   # (run, acknowledgements)
        self._lock = threading.Lock()

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list]) -> None:
        """Sends one run's work (and the queued releases) to every island; called in ticket order."""
        refs = self._graph.execute({"works": works, "releases": releases})
        for name in works:
            self._islands[name].calls["start"] += 1
        with self._lock:
            self._pending.append((run_id, refs))
            while len(self._pending) > PENDING:
                _get(self._pending.popleft()[1], START_TIMEOUT)

    def received(self, run_id: int) -> None:
        """Returns once every island has taken the execution carrying `run_id`'s work (if it is pending)."""
        with self._lock:
            if not any(r == run_id for r, _ in self._pending):
                return
            while self._pending:
                taken, refs = self._pending.popleft()
                _get(refs, START_TIMEOUT)
                if taken == run_id:
                    return

    def close(self) -> None:
        """Reads the acknowledgements still pending and tears the graph down (the actors stay)."""
        with self._lock:
            try:
                while self._pending:
                    _get(self._pending.popleft()[1], STATUS_TIMEOUT)
            except Exception:  # noqa: BLE001  (a dead or stuck island: tear down all the same)
                pass
            self._graph.teardown()


class _CalledStarts:
    """Start messages as actor calls: one `start` call per island per run, numbered in ticket order
    (Ray runs an actor's calls concurrently, so each actor takes them in number order)."""

    def __init__(self, islands: dict[str, RayIsland]):
        self._islands = islands
        self._seq = {name: itertools.count() for name in islands}
        self._refs: collections.OrderedDict[int, list] = collections.OrderedDict()   # run -> its start calls
        self._lock = threading.Lock()

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list]) -> None:
        """Calls `start` on every island of the run; called in ticket order."""
        refs = [self._islands[name]._call("start", next(self._seq[name]), work, releases.pop(name, []))
                for name, work in works.items()]
        with self._lock:
            self._refs[run_id] = refs
            while len(self._refs) > HISTORY:
                self._refs.popitem(last=False)
        for name, pairs in releases.items():
            if pairs:
                self._islands[name]._call("release_many", pairs)

    def received(self, run_id: int) -> None:
        """Returns once the run's start calls were taken."""
        with self._lock:
            refs = self._refs.pop(run_id, None)
        if refs:
            _get(refs, START_TIMEOUT)

    def close(self) -> None:
        """Nothing to tear down."""


def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"


class RayIslands(Islands):
    """The island proxies of a runtime on Ray (by island name), their start channel, and what stops them.

    `compiled_graph=True` sends start messages through a Ray Compiled Graph
    (`_CompiledStarts`), else as actor calls (`_CalledStarts`). The graph is
    used only when every island actor runs on the driver's node: across
    nodes, Ray's compiled-graph channels (Ray 2.60) stopped delivering
    executions after the first few in our tests on a `Cluster` of 2 nodes,
    so a cluster of several nodes gets actor calls.
    """

    def __init__(self, islands: dict[str, RayIsland], started_ray: bool, compiled_graph: bool):
        super().__init__(islands)
        self.started_ray = started_ray
        self.compiled_graph = compiled_graph
        self._starts = (_CompiledStarts if compiled_graph else _CalledStarts)(islands)
        self._outputs: dict[int, dict[str, tuple[int, ...]]] = {}   # plan key -> results by island
        for island in islands.values():
            island.received = self._starts.received

    def start(self, run, works: dict[str, IslandWork]) -> None:
        """Sends one run's work to its islands as one start message each, with the releases queued."""
        outputs = self._outputs.get(run.key)
        if outputs is None:
            outputs = self._outputs[run.key] = {name: tuple(b for b in run.plan.outputs if run.island_of(b) == name)
                                                for name in self}
        sent = {name: self[name].started(work, outputs[name]) for name, work in works.items()}
        self._starts.send(run.id, sent, {name: island.take_releases() for name, island in self.items()})

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
        actor_class = ray.remote(_IslandActor)
        for island in topology.islands:
            flags = f"--xla_force_host_platform_device_count={island.num_devices}"
            actors[island.name] = actor_class.options(
                name=island_name(island.name), namespace=NAMESPACE,
                resources={} if one_machine else {island_name(island.name): 1},
                num_cpus=0, max_concurrency=64,
                runtime_env={"env_vars": {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PW_CLUSTER": ""}},
            ).remote(island.name, topology.to_json(), emulate_dcn)
        ray.get([a.connect.remote(actors) for a in actors.values()], timeout=START_TIMEOUT)
        nodes = set(ray.get([a.node.remote() for a in actors.values()], timeout=START_TIMEOUT))
        islands = RayIslands({name: RayIsland(name, actor) for name, actor in actors.items()}, started,
                             compiled_graph and nodes == {ray.get_runtime_context().get_node_id()})
    except BaseException:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()
        raise
    return islands
