"""The island actor: a Ray actor that owns an island's devices and runs an `Island` inside.

The actor process starts its own JAX with the island's devices (CPU devices
made with `XLA_FLAGS` in the actor's environment here; an accelerator host's
own devices elsewhere) and runs the same island programs, object-store
shard and compile cache as the embedded backend. A send to a peer island
goes straight from this actor to the peer's, never through the driver: over
JAX's transfer server (`data_plane.py`), or, where that cannot carry it, as
NumPy arrays in a `deliver_many` actor call (`PeerSender`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from ..island_work import IslandWork, PeerRef, failure, failure_kind
from .data_plane import Pulled

if TYPE_CHECKING:
    from .data_plane import DataPlane

SIBLING_BYTES = 1 << 20  # a fetch brings back the run's other results on the island up to this size each
CONNECT_TIMEOUT = 60.0   # seconds to learn a peer actor's transfer address
ACK_DELAY = 0.02         # seconds a lender's `Pulled` waits for sends to the same peer to go with
SETTLE_TIMEOUT = 5.0     # seconds a question waits for the starts sent before it (`asked`), under STATUS_TIMEOUT
QUESTIONS = ("object_count", "owned_by", "compilations", "release_owner", "status")   # what `asked` answers


def _data_plane(island, acknowledge) -> "DataPlane | None":
    """The island's end of the data plane, on this node's address (`acknowledge(peer, transfer id)` tells a
    peer that lent an argument that its pull is over); None where this JAX has no transfer server (every move
    then goes by actor call)."""
    import os

    import ray

    if os.environ.get("PW_DATA_PLANE") == "off":
        return None
    try:
        from .data_plane import DataPlane

        return DataPlane(island, ray.util.get_node_ip_address(), acknowledge)
    except (ImportError, AttributeError):
        return None


def _copied_out(work: IslandWork) -> IslandWork:
    """`work` with its host arrays copied. Read from a compiled graph's channel, they are views of its
    shared-memory buffer, which the driver cannot write the next executions into while they live: a run
    queued behind a long computation would hold its buffer, and the driver would spin in Ray's write,
    taking a core from the computation (on 2 cores, 13.5 ms of the driver's CPU per 15 ms training step)."""
    if not any(isinstance(value, np.ndarray) for _, value in work.inputs):
        return work
    return work._replace(inputs=tuple((buffer, np.array(value) if isinstance(value, np.ndarray) else value)
                                      for buffer, value in work.inputs))


class IslandActor:
    """The body of an island actor (made a Ray actor class by `cluster.launch`)."""

    def __init__(self, name: str, topology_json: str, emulate_dcn: bool):
        import jax

        from ..cluster import DeviceMap
        from ..executables import keep_64_bit_values
        from ..island import Island
        from ..transfers import DcnTransport

        keep_64_bit_values()
        topology = Topology.from_json(topology_json)
        count = topology.island(name).num_devices
        devices = jax.devices()
        if len(devices) < count:
            raise RuntimeError(f"island {name} needs {count} devices but its process has {len(devices)}")
        self._name = name
        self._plans: dict[int, ProgramPlan] = {}    # the plans loaded here, until the driver unloads them
        self._senders: dict[str, PeerSender] = {}
        # Without emulation a send is handed to the peer's sender at once (it batches and waits for the value).
        self._island = Island(name, DeviceMap(topology, {name: tuple(devices[:count])}),
                              DcnTransport(emulate=emulate_dcn), self._peer)
        self._plane = _data_plane(self._island, lambda peer, transfer: self._senders[peer].pulled(transfer))
        self._next = 0                      # start calls taken (`start`)
        self._executions = 0                # compiled start executions taken (`start_compiled`)
        self._turn = threading.Condition()
        self._closing = threading.Event()

    def transfer_address(self) -> str | None:
        """Where peers reach this island's transfer server (None: moves here go by actor call)."""
        return self._plane.address if self._plane is not None else None

    def connect(self, peers: dict) -> str | None:
        """Meets the peer islands' actors: their senders, and their transfer servers; a peer whose actor died
        is left out (the driver loses it, and connects its fresh actor here once it is restored). Returns this
        island's transfer address (None: no transfer server here)."""
        import ray

        for name, actor in peers.items():
            if name != self._name:
                try:
                    self.reconnect(name, actor)
                except ray.exceptions.RayActorError:
                    pass
        return self.transfer_address()

    def reconnect(self, name: str, actor) -> None:
        """Island `name` has a new actor (it was lost and restored): sends go there from now on."""
        import ray

        address = ray.get(actor.transfer_address.remote(), timeout=CONNECT_TIMEOUT)
        if self._plane is not None and address is not None:
            self._plane.connect(name, address)
        self._senders[name] = PeerSender(actor, name, self._plane if address is not None else None)

    def watch(self) -> None:
        """Returns when the island closes: the driver's monitor keeps one call in flight, which Ray fails
        as soon as it knows this actor is dead."""
        self._closing.wait()

    def _peer(self, name: str) -> "PeerSender":
        return self._senders[name]

    def load(self, key: int, plan_json: str) -> None:
        plan = self._plans[key] = ProgramPlan.from_json(plan_json)   # the island keeps it weakly
        self._island.load(key, plan)

    def prepare(self, key: int, step_ids) -> None:
        self._island.prepare(key, tuple(step_ids))

    def unload(self, key: int) -> None:
        self._island.unload(key)
        self._plans.pop(key, None)

    def start(self, seq: int, work: IslandWork | None, releases, lends) -> None:
        """One run's work (after the releases made since the last message, and the results kept here that
        the run takes on peer islands; no work: those alone), in the order `seq` numbers."""
        with self._turn:
            self._turn.wait_for(lambda: self._next == seq)
            try:
                self._release(releases)
                if lends:
                    self._plane.lend(lends)
                if work is not None:
                    self._begin(work)
            finally:
                self._next += 1
                self._turn.notify_all()

    def start_compiled(self, message: dict) -> None:
        """One execution of the compiled start graph: this island's releases, the results kept here that the
        run takes on peer islands, then its work of the run (if any). Executions arrive in the order the
        driver made them. The work's host arrays are copied out of the graph's channel first (`_copied_out`)."""
        try:
            self._release(message["releases"].get(self._name, ()))
            lends = message["lends"].get(self._name)
            if lends:
                self._plane.lend(lends)
            work = message["works"].get(self._name)
            if work is not None:
                self._begin(_copied_out(work))
        finally:
            with self._turn:
                self._executions += 1
                self._turn.notify_all()

    def asked(self, executions: int, calls: int, message: str, *args):
        """Answers the question `message` (`object_count`, `status`, ...) once this actor took the first
        `executions` compiled start executions and `calls` start calls, and with them the releases they
        carried: Ray runs a question beside the graph's thread and the start calls, so it could overtake
        them. After `SETTLE_TIMEOUT` seconds it answers all the same."""
        if message not in QUESTIONS:
            raise ValueError(f"{message!r} is not a question an island answers")
        with self._turn:
            self._turn.wait_for(lambda: self._executions >= executions and self._next >= calls, SETTLE_TIMEOUT)
        return getattr(self, message)(*args)

    def _begin(self, work: IslandWork) -> None:
        """Starts a run's work here, its pulls over the data plane first (those of the arguments kept on peer
        islands once the island has the run: it awaits them)."""
        if self._plane is not None:
            self._plane.expect(work)
        self._island.start(work)
        if self._plane is not None and any(isinstance(value, PeerRef) for _, value in work.inputs):
            self._plane.pull_arguments(work)

    def deliver_many(self, items) -> None:
        """A peer's sends, failures and pulls of what this island lent it (`Pulled`), in the order it made
        them."""
        for item in items:
            if isinstance(item, Pulled):
                self._plane.pulled(item.transfer_id)
            elif len(item) == 4:
                self._island.deliver(*item)
            else:
                self._island.fail_run(item[0], failure(item[2], item[1]))

    def fail_run(self, run_id: int, message: str, kind: str = "failed") -> None:
        self._island.fail_run(run_id, failure(kind, message))

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

    def produced(self, run_id: int, buffer: int, timeout: float | None) -> None:
        """Returns once a buffer of a run exists here (nothing travels back)."""
        self._island.produced(run_id, buffer, timeout)

    def _release(self, pairs) -> None:
        for run_id, buffer in pairs:
            self._island.release(run_id, buffer)

    def release_owner(self, owner) -> int:
        return self._island.release_owner(owner)

    def runs_done(self, run_ids) -> list:
        """(run, device seconds or None) for each of `run_ids` whose work here is over."""
        return [(r, self._island.device_seconds(r)) for r in run_ids if self._island.run_done(r)]

    def wait_run(self, run_id: int, timeout: float | None) -> None:
        self._island.wait_run(run_id, timeout)

    def owned_by(self, owner) -> list:
        return self._island.owned_by(owner)

    def object_count(self) -> int:
        return self._island.object_count()

    def compilations(self) -> int:
        return self._island.compilations()

    def status(self) -> dict:
        """The island's status, its Ray node, and per peer island the path its moves take (`transfers`)."""
        moves = {name: {"path": "actor call", "by_actor_call": sender.sent}
                 for name, sender in sorted(self._senders.items())}
        if self._plane is not None:
            moves.update({name: {**counts, "by_actor_call": moves.get(name, {}).get("by_actor_call", 0)}
                          for name, counts in self._plane.status().items()})
        return {**self._island.status(), "node": self.node(), "transfers": moves}

    def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self._island.close()
        if self._plane is not None:
            self._plane.close()
        self._closing.set()


class PeerSender:
    """Inside an actor: sends buffers (and run failures) to one peer island's actor, from one thread.

    Sends made while the previous batch is on its way queue up and leave
    together as one `deliver_many` call, in the order they were made: a
    burst of sends (a pipeline's micro-batches) costs one actor call, and a
    lone send leaves at once. The thread waits for each array's value, so
    the island that sent it never blocks.
    """

    def __init__(self, actor, name: str, plane: "DataPlane | None"):
        self._actor, self._name, self._plane = actor, name, plane
        self.sent = 0                      # moves that went by actor call
        self._queue: list = []
        self._acks: list[Pulled] = []      # pulls of what the peer lent, to tell it of (`pulled`)
        self._ready = threading.Condition()
        threading.Thread(target=self._send_batches, name="pw-peer-sender", daemon=True).start()

    def deliver(self, run_id: int, key: int, buffer: int, array) -> None:
        """Hands a sent buffer to the peer: offered on the data plane where it travels there, else queued
        for the next `deliver_many` call."""
        if self._plane is not None and self._plane.offer(run_id, key, self._name, buffer, array):
            return
        self.sent += 1
        self._put((run_id, key, buffer, array))

    def fail_run(self, run_id: int, error: BaseException) -> None:
        self._put((run_id, str(error), failure_kind(error)))

    def pulled(self, transfer_id: int) -> None:
        """Tells the peer that this island's pull of what it lent (`transfer_id`) is over: with the next batch
        of sends, or on its own `ACK_DELAY` after it if none comes (one actor call per pull cost a chain of
        cross-island handles a fifth of its speed; the lender needs to know only for a run there that donates
        the result, which waits that much longer at most, and for its status)."""
        with self._ready:
            self._acks.append(Pulled(transfer_id))
            self._ready.notify()

    def _put(self, item: tuple) -> None:
        with self._ready:
            self._queue.append(item)
            self._ready.notify()

    def _send_batches(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue or self._acks)
                if not self._queue:
                    self._ready.wait_for(lambda: self._queue, ACK_DELAY)
                batch, self._queue = self._queue, []
                items, self._acks = self._acks, []
            for item in batch:
                if len(item) == 4:
                    try:
                        item = (*item[:3], np.asarray(item[3]))
                    except Exception as error:  # noqa: BLE001  (computing the value failed: the run fails)
                        item = (item[0], f"run {item[0]} failed computing a sent buffer: {error}", "failed")
                items.append(item)
            self._actor.deliver_many.remote(items)
