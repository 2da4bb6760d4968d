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
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .island import HISTORY, IslandWork, RunFailed
from .status import Status, gather

NAMESPACE = "pathways"
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray's node address is 127.0.0.1
STATUS_TIMEOUT = 10.0   # seconds an island has to answer a status request
START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included)


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

    def connect(self, peers: dict) -> None:
        self._peers = dict(peers)

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

    def fail_run(self, run_id: int, message: str) -> None:
        self._island.fail_run(run_id, RunFailed(message))

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


class _PeerSender:
    """Inside an actor: sends a buffer (or a run's failure) to a peer island's actor."""

    def __init__(self, actor):
        self._actor = actor

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._actor.deliver.remote(run_id, key, buffer, np.asarray(array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        self._actor.fail_run.remote(run_id, str(error))


class RayIsland:
    """The driver's proxy for an island actor: the island messages, as actor calls."""

    def __init__(self, name: str, actor):
        self.name = name
        self._actor = actor
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._started: dict[int, object] = {}   # run -> its latest start call, so later calls follow it
        self.calls: collections.Counter[str] = collections.Counter()   # actor calls made, by message
        self._done: collections.OrderedDict[int, None] = collections.OrderedDict()   # runs known to be over

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

    def start(self, work: IslandWork) -> None:
        inputs = tuple((b, np.asarray(v)) for b, v in work.inputs)
        with self._lock:   # the gang scheduler calls in ticket order; number the calls in that order
            ref = self._call("start", next(self._seq), work._replace(inputs=inputs))
            self._started[work.run_id] = ref

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        self._call("deliver", run_id, key, buffer, np.asarray(array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        if self._live():
            self._call("fail_run", run_id, str(error))

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None):
        try:          # no wait for the start call first: the island's fetch waits for the value itself
            return self._call("fetch", run_id, buffer, timeout).future().result(timeout)
        except Exception as error:  # noqa: BLE001  (Ray wraps the island's error)
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, BaseException) else error) from None

    def release(self, run_id: int, buffer: int) -> None:
        if self._live():       # handles dropped at exit, after the actors are gone, release nothing
            self._call("release", run_id, buffer)

    def _live(self) -> bool:
        import ray

        return not self._closed and ray.is_initialized()

    def _after_start(self, run_id: int) -> None:
        with self._lock:
            ref = self._started.get(run_id)
        if ref is not None:
            _get(ref)

    def release_owner(self, owner) -> int:
        return 0 if self._closed else _get(self._call("release_owner", owner))

    def run_done(self, run_id: int) -> bool:
        """Returns whether the run's work here is over. One actor call also asks about every other run
        whose start call has been taken, and the answers are kept: the scheduler and the clients poll
        runs in order, so the next questions are answered here."""
        import ray

        if run_id in self._done:
            return True
        self._after_start(run_id)
        with self._lock:
            others = {ref: r for r, ref in self._started.items() if r != run_id}
        taken, _ = ray.wait(list(others), num_returns=len(others), timeout=0) if others else ([], [])
        self._over(_get(self._call("runs_done", [run_id] + [others[ref] for ref in taken])))
        return run_id in self._done

    def _over(self, run_ids) -> None:
        """Remembers runs whose work here is over (the latest `HISTORY` of them)."""
        with self._lock:
            for run_id in run_ids:
                self._started.pop(run_id, None)
                self._done[run_id] = None
            while len(self._done) > HISTORY:
                self._done.popitem(last=False)

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        self._after_start(run_id)
        _get(self._call("wait_run", run_id, timeout))
        self._over([run_id])

    def owned_by(self, owner) -> list:
        return [] if self._closed else _get(self._call("owned_by", owner))

    def object_count(self) -> int:
        return 0 if self._closed else _get(self._call("object_count"))

    def compilations(self) -> int:
        return _get(self._call("compilations"))

    def status(self) -> dict:
        """Returns the island's status (see `Island.status`) and its node, or why it did not answer."""
        try:
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




def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"


class RayIslands(dict):
    """The island proxies of a runtime on Ray (by island name), and what stops them."""

    def __init__(self, islands: dict[str, RayIsland], started_ray: bool):
        super().__init__(islands)
        self.started_ray = started_ray

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
    except BaseException:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()
        raise
    return RayIslands({name: RayIsland(name, actor) for name, actor in actors.items()}, started)
