"""The Ray cluster side: connecting to Ray, starting the island actors where their devices are, and the
islands of a runtime on Ray (`RayIslands`: proxies, start channel, monitor).

On a Ray cluster (`address=`), island `I`'s actor is named `pw-island-I` in
the namespace `pathways` and needs the custom resource `pw-island-I`, which
only the node holding that island's devices offers: each island runs where
its devices are. A one-node Ray that offers none holds every island on its
one machine.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import os
import secrets
import socket
import sys
import threading
import time
import warnings
from typing import Callable

from pathways_mlir.dialect.topology import Topology

from ..cluster import ClusterError
from ..executables import numpy_dtype
from ..island_work import Islands, IslandWork
from ..status import Status, gather, unreachable
from .actor import IslandActor
from .connection import IslandConnection
from .data_plane import Withdraw
from .kept import KeptArguments
from .monitor import IslandMonitor
from .names import NAMESPACE, island_name, wait_until_free
from .proxy import STATUS_TIMEOUT, RayIsland
from .start_channel import START_TIMEOUT, StartChannel

_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray's node address is 127.0.0.1
INLINE_BYTES = 512 * 1024   # a local instance's largest call argument or reply sent inline (Ray's default: 100 KiB)
PROBE_TIMEOUT = 10.0        # seconds a Ray cluster's address has to accept a connection (`_check_answers`)


class RayIslands(Islands):
    """The island proxies of a runtime on Ray (by island name), their start channel, their monitor, and
    what starts, restarts and stops their actors.

    Start messages, fetches, completions and their replies go over the
    driver's TCP connection to each actor (`connection.py`,
    `start_channel.py`); the other messages are Ray actor calls.
    """

    keep_arguments = True          # a handle passed to a later run stays on its island actor
    fast_lanes = False             # a run's work goes to the actors; nothing executes on the caller's thread
    traces = False                 # traces are recorded by the embedded backend only
    in_process = False             # the actors run executables serialised, never this process's own functions

    def __init__(self, topology: Topology, emulate_dcn: bool, one_machine: bool, started_ray: bool,
                 actors: dict, nodes: dict[str, str]):
        super().__init__({name: RayIsland(name, actor, self) for name, actor in actors.items()})
        self.topology = topology
        self.emulate_dcn = emulate_dcn
        self.one_machine = one_machine          # every island on the one node of a Ray without island resources
        self.started_ray = started_ray
        self.nodes = dict(nodes)                # island -> the node its actor runs on
        self._starts = StartChannel(self)
        self._key = secrets.token_bytes(32)     # what the actors' connections prove they hold (`connection.py`)
        self._sending = threading.Lock()        # start messages and releases leave one at a time, in order
        self._flushes = itertools.count(1)      # release-only messages, numbered -1, -2, ... as runs
        self._results: dict[int, dict[str, dict[int, int]]] = {}   # plan key -> island -> its results' bytes
        self.failed_nodes: set[str] = set()     # nodes a restarted actor failed on (dead ones Ray counted alive)
        self.kept = KeptArguments(self)         # handles passed to later runs (`kept.py`)
        self.monitor = IslandMonitor(self)
        for island in self.values():
            self._watch_actor(island)

    def _watch_actor(self, island: RayIsland) -> None:
        """Opens the proxy's connection to its actor (`connection.py`; an actor that died meanwhile is marked
        dead; one the driver cannot reach is a ClusterError) and keeps the actor's `watch` call in flight."""
        import ray

        try:
            island.connection = IslandConnection.open(island._actor, self._key, island._died)
        except ray.exceptions.RayError as error:
            island._died(error)
        except OSError as error:
            raise ClusterError(f"island {island.name}: {error}") from None
        self.monitor.watch_actor(island)

    def on_run_done(self, wake) -> None:
        """Nothing: the driver learns that runs are over from the actors' answers (`RayIsland.run_done`)."""

    def watch(self, lose: Callable[[str], object], restore: Callable[[str], object]) -> None:
        """Starts the monitor (`IslandMonitor.start`): `lose(island)` once an island's actor died,
        `restore(island)` once a node offering a lost island's resource joined."""
        self.monitor.start(lose, restore)

    def unwatch(self) -> None:
        """Stops the monitor (before the islands close: closing is not losing)."""
        self.monitor.stop()

    def peer_reference(self, run, buffer: int, plan, input_buffer: int):
        """A `PeerRef` to a result kept on another island than `input_buffer`'s (see `KeptArguments`)."""
        return self.kept.peer_reference(run, buffer, plan, input_buffer)

    def pin(self, run, keys) -> None:
        """`run` takes the kept results `keys`: their releases leave after its start (`KeptArguments`)."""
        self.kept.pin(run, keys)

    def unpin(self, run) -> None:
        """`run` will never be sent (its submission failed, or it was cancelled while queued): its pins go,
        and the releases they held back leave now, in the start channel. It does not wait for the islands to
        take them: the scheduler may hold its lock (a run cancelled in its queue), and a stalled actor would
        hold every client with it; a question about objects asked next waits on the actor for the messages
        sent before it (`RayIsland._answer`)."""
        if self.kept.sent(run):
            self._send(-next(self._flushes), {}, {})

    def results(self, key: int | None, island: str) -> dict[int, int]:
        """The results a plan's runs leave on `island` (known once one of its runs started): buffer -> bytes."""
        return self._results.get(key, {}).get(island, {})

    def forget_results(self, key: int) -> None:
        """Forgets what `results` knows of a plan the runtime forgot (unloaded from its islands): no run of it
        comes after, and plan keys are never reused."""
        self._results.pop(key, None)

    def start(self, run, works: dict[str, IslandWork], inline: bool = False) -> list:
        """Sends one run's work to its islands as one start message each, with the releases queued; the run
        fails at once on an island whose actor is dead, and everywhere (unsent) if it takes a kept result whose
        island was lost since the call, or if one of its islands lacks its plan (`replaced`). Nothing runs on the
        caller's thread (`inline`)."""
        if run.key not in self._results:
            buffers = run.plan.buffers
            self._results[run.key] = {name: {b: math.prod(buffers[b].shape) * numpy_dtype(buffers[b].dtype).itemsize
                                             for b in run.plan.distinct_outputs if run.island_of(b) == name}
                                      for name in self}
        lost = self.kept.lost(works) or self.replaced(run, works)
        if lost is not None:            # a result it takes is gone with its island (as a fetch of it raises), or
                                        # its plan was loaded onto an island lost and restored since
            for name in works:
                self[name].refuse(run.id, lost)
            self.unpin(run)             # what it held back leaves now
            return []
        dead = [name for name in works if self[name]._dead is not None]
        for name in dead:
            self[name].lose_run(run.id, works[name].plan_key)
        sent = {name: self[name].started(work) for name, work in works.items() if name not in dead}
        if sent:
            self._send(run.id, sent, self.kept.lends(run, sent))
        self.kept.sent(run)
        return []

    def flush_releases(self, wait: bool = False, deadline: float | None = None, island=None) -> None:
        """Sends the releases queued on every island now, through the start channel, so that a release never
        overtakes a start that reads the object; with `wait`, returns once the islands (or `island` alone) took
        them, by `deadline` (a `time.monotonic()`) at the latest: a question's own wait on the actor then keeps
        the order. Without `wait` (a handle dropped, maybe by the garbage collector amid a send) it never waits
        for the channel: if a message is being sent, the releases leave with the next one."""
        marker = -next(self._flushes)
        if self._send(marker, {}, {}, block=wait) and wait:
            self._starts.received(marker, deadline, island)

    def withdraw(self, island: str) -> None:
        """Lost island `island` pulls nothing more: every other live island withdraws what it offered it (a
        `Withdraw`, in the start channel, after the messages that lent it)."""
        withdrawals = {name: [Withdraw(island)] for name, proxy in self.items()
                       if name != island and proxy._dead is None and proxy.transfers}
        if withdrawals:
            self._send(-next(self._flushes), {}, withdrawals)

    def _send(self, run_id: int, works: dict[str, IslandWork], lends: dict[str, list], block: bool = True) -> bool:
        """Sends one message of the start channel: `works`, the `lends` for them (or `Withdraw`s) and every live
        island's queued releases; returns False if there was nothing to send (or, not to `block`, the channel was
        busy)."""
        if not self._sending.acquire(blocking=block):
            return False
        try:
            releases = {name: island.take_releases() for name, island in self.items() if island._dead is None}
            if not works and not lends and not any(releases.values()):
                return False
            self._starts.send(run_id, works, releases, lends)
        finally:
            self._sending.release()
        return True

    def restart(self, island: str, timeout: float = START_TIMEOUT) -> RayIsland:
        """Starts a fresh actor for lost island `island` on a node offering its resource, another than the
        one it was lost on (or one a restart failed on) if there is one; refused at once if no alive node
        offers it; the actor has `timeout` seconds to start. Connects it and the live islands' actors (another
        island lost meanwhile, or whose actor dies meanwhile, meets it when restored) and returns its proxy (the
        runtime puts it in place)."""
        import ray

        offering = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(island_name(island)))
        if not self.one_machine and not offering:
            raise ClusterError(f"no node of the Ray cluster offers the resource of island {island}: start one "
                               f"with ray start --resources='{{\"{island_name(island)}\": 1}}'")
        # A node killed hard counts as alive until Ray's health checks fail, and killing its dead actor
        # frees its resource there: go elsewhere when another node offers it.
        elsewhere = [node for node in offering if node != self.nodes[island] and node not in self.failed_nodes]
        target = elsewhere[0] if elsewhere else None
        ray.kill(self[island]._actor)      # frees the name: Ray keeps a dead actor's name while handles to it live
        deadline = time.monotonic() + timeout
        while True:
            try:
                actor = launch(self.topology, island, self.emulate_dcn, self.one_machine, target)
                break
            except ray.exceptions.ActorAlreadyExistsError:     # the name is not free yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        peers = [proxy for name, proxy in self.items() if name != island and proxy._dead is None]
        try:
            address = ray.get(actor.connect.remote({peer.name: peer._actor for peer in peers}),
                              timeout=max(0.0, deadline - time.monotonic()))
            node = ray.get(actor.node.remote(), timeout=max(0.0, deadline - time.monotonic()))
            for peer, reply in [(peer, peer._actor.reconnect.remote(island, actor)) for peer in peers]:
                try:
                    ray.get(reply, timeout=max(0.0, deadline - time.monotonic()))
                except ray.exceptions.RayActorError as error:    # a peer that died meanwhile is lost, not this
                    peer._died(error)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            self.failed_nodes |= {target} - {None}
            raise TimeoutError(f"island {island} was not restored: its actor did not start within {timeout} s "
                               f"(on a node offering the resource {island_name(island)})") from None
        except ray.exceptions.RayError as error:
            ray.kill(actor)
            self.failed_nodes |= {target} - {None}
            raise ClusterError(f"island {island} was not restored: {type(error).__name__}: "
                               f"{(str(error).splitlines() or [''])[0]}") from None
        proxy = RayIsland(island, actor, self)
        proxy.transfers = address is not None
        try:
            self._watch_actor(proxy)
        except ClusterError:
            ray.kill(actor)
            self.failed_nodes |= {target} - {None}
            raise
        self.nodes[island] = node
        return proxy

    def close(self, timeout: float = 10.0) -> None:
        """Closes the island actors and their connections, waits until their names are free, and stops Ray if
        the runtime started it."""
        import ray

        if not ray.is_initialized():
            return
        super().close()
        if self.started_ray:
            ray.shutdown()
            return
        deadline = time.monotonic() + timeout
        for island in self:
            wait_until_free(island, deadline)


def launch(topology: Topology, island: str, emulate_dcn: bool, one_machine: bool, node: str | None = None):
    """Starts island `island`'s actor on a node offering its resource (on `node`, if given; on the one node
    with `one_machine`); returns its handle."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    flags = f"--xla_force_host_platform_device_count={topology.island(island).num_devices}"
    return ray.remote(IslandActor).options(
        name=island_name(island), namespace=NAMESPACE,
        resources={} if one_machine else {island_name(island): 1},
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT",
        num_cpus=0, max_concurrency=64,
        runtime_env={"env_vars": {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PW_CLUSTER": "",
                                  "PW_DATA_PLANE": os.environ.get("PW_DATA_PLANE", "")}},
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
    up in this process, and is used as it is).

    At a loopback address (127.0.0.N) this process joins the node at that
    address: Ray would otherwise take the machine's outward address as this
    node's and find no node there. Nodes at 127.0.0.1 need `use_loopback`.

    A new local instance starts no idle workers for this driver (Ray starts
    `num_cpus` of them by default): an island actor needs a worker of its
    own environment (`launch`), so they would idle beside the islands, a
    Python process each. It sends call arguments and replies of up to
    `INLINE_BYTES` inline, in the call's message: Ray puts larger ones in its
    shared-memory object store, which for a 128 KiB argument cost the driver,
    the raylet and the actor 2.8 ms of CPU per call against 1.1 ms inline (at
    1 MB the two cost the same; measured on the start calls before start
    messages moved to the driver's connections, and kept for the calls left:
    plans, and moves between actors that the transfer server does not carry).
    """
    import ray

    if ray.is_initialized():
        return False
    named = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address or ""
    if named.startswith("ray://"):
        raise ClusterError(f"{named} is a Ray Client address, which pw does not use: its driver talks to every "
                           f"island actor over TCP, from a node of the cluster; pass the cluster's address "
                           f"(host:port, as `ray start --head` prints it)")
    host = "127.0.0.1" if address is None else named.rsplit(":", 1)[0]
    host = "127.0.0.1" if host == "localhost" else host
    if host == "127.0.0.1":
        use_loopback()
    options = dict(namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
    with warnings.catch_warnings():
        # Ray starts its processes with subprocess (a fork that execs at once), which JAX's fork hook warns
        # about once JAX has started its threads.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        if address is None:
            config = {"prestart_worker_first_driver": False, "max_direct_call_object_size": INLINE_BYTES}
            ray.init(address="local", num_cpus=num_cpus, _node_ip_address=host, resources=resources,
                     include_dashboard=False, _system_config=config, **options)
        else:
            _check_answers(named)
            ray.init(address=address, **({"_node_ip_address": host} if is_loopback(host) else {}), **options)
    return True


def _check_answers(address: str) -> None:
    """Raises ClusterError unless something accepts connections at a Ray cluster's `host:port` within
    `PROBE_TIMEOUT` seconds: `ray.init` retries an address where nothing answers for many minutes, and
    `pw-serve` waits for it before it takes signals. (An empty or portless address is Ray's to resolve.)"""
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit()):
        return
    host = host.removeprefix("[").removesuffix("]")      # an IPv6 address, as [::1]:6379 writes it
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT).close()
    except (OSError, OverflowError) as error:
        reason = "timed out" if isinstance(error, TimeoutError) else getattr(error, "strerror", None) or error
        raise ClusterError(f"no Ray cluster answers at {address}: {reason}") from None


def is_loopback(host: str) -> bool:
    """Whether `host` is an IP address of this machine's loopback interface (127.0.0.0/8)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cluster_status(address: str, deadline: float | None = None) -> Status:
    """Returns the report of every island actor on the Ray cluster at `address`, found by name, from
    any process (the scheduler's queue stays with the process that owns the islands). The islands are asked
    at once, and one that has not answered within `STATUS_TIMEOUT` seconds, or by `deadline` (`time.time()`
    seconds) if sooner, is reported unreachable."""
    import ray

    started = connect(address)
    try:
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["namespace"] == NAMESPACE and a["name"].startswith(island_name("")))
        asked = {}
        for name in names:
            try:
                asked[name] = ray.get_actor(name, namespace=NAMESPACE).status.remote()
            except Exception as error:  # noqa: BLE001  (a dead island is part of the report)
                asked[name] = error
        wait = STATUS_TIMEOUT if deadline is None else max(0.0, min(STATUS_TIMEOUT, deadline - time.time()))
        # (what is left of a deadline, spent partly on reaching the cluster, would read "within 0 s")
        late = "the island actor did not answer " + (f"within {wait:g} s" if wait == STATUS_TIMEOUT
                                                     else "before the report's deadline")
        pending = [ref for ref in asked.values() if not isinstance(ref, Exception)]
        answered, _ = ray.wait(pending, num_returns=len(pending), timeout=wait) if pending else ([], [])
        islands = {}
        for name, ref in asked.items():
            island = name.removeprefix(island_name(""))
            if isinstance(ref, Exception):
                islands[island] = unreachable(ref)
            elif ref not in answered:
                islands[island] = unreachable(TimeoutError(late))
            else:
                try:
                    islands[island] = ray.get(ref)
                except Exception as error:  # noqa: BLE001  (a dead island is part of the report)
                    islands[island] = unreachable(error)
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
        raise ClusterError("the Ray backend needs Ray: pip install 'pathways-mlir[ray]'") from None
    started = connect(address, num_cpus=max(2, len(topology.islands)),
                      resources={island_name(i.name): 1 for i in topology.islands})
    actors: dict = {}
    try:
        offered = ray.cluster_resources()
        missing = [i.name for i in topology.islands if island_name(i.name) not in offered]
        one_machine = len(missing) == len(topology.islands) and len([n for n in ray.nodes() if n["Alive"]]) == 1
        if missing and not one_machine:
            raise ClusterError("no node of the Ray cluster offers the resource of island(s) " +
                               ", ".join(missing) + ": start the node holding island I's devices with "
                               "ray start --resources='{\"pw-island-I\": 1}'")
        for island in topology.islands:
            try:
                ray.get_actor(island_name(island.name), namespace=NAMESPACE)
            except ValueError:
                pass                                 # no actor of that name: the island is free
            else:
                raise ValueError(f"the Ray cluster already has the actor of island {island.name} "
                                 f"({island_name(island.name)}): another process (a pw-serve, or a driver with "
                                 f"backend='ray') owns its islands; stop it, or connect to its service with "
                                 f"pw.connect()")
            actors[island.name] = launch(topology, island.name, emulate_dcn, one_machine)
        addresses = ray.get([a.connect.remote(actors) for a in actors.values()], timeout=START_TIMEOUT)
        nodes = dict(zip(actors, ray.get([a.node.remote() for a in actors.values()], timeout=START_TIMEOUT)))
        islands = RayIslands(topology, emulate_dcn, one_machine, started, actors, nodes)
        for name, address in zip(actors, addresses):
            islands[name].transfers = address is not None
    except BaseException:
        for actor in actors.values():
            ray.kill(actor)
        if started:
            ray.shutdown()
        raise
    return islands
