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

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from ..authentication import ServerHandshake
from ..island_work import IslandWork, PeerRef, failure, failure_kind
from ..wire import FrameReader, ProtocolError, check_dims, send_message, too_many_dims
from .connection import CONNECT_TIMEOUT, LIMITS, Request, decode_request, decode_start, error_reply
from .data_plane import Pulled

if TYPE_CHECKING:
    from .data_plane import DataPlane

PEER_TIMEOUT = 60.0      # seconds to learn a peer actor's transfer address
ACK_DELAY = 0.02         # seconds a lender's `Pulled` waits for sends to the same peer to go with
SETTLE_TIMEOUT = 5.0     # seconds a question waits for the starts sent before it (`asked`), under STATUS_TIMEOUT
FETCHERS = 64            # requests of the driver's connection that may wait at once (as Ray's actor calls)
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection to the driver's listener has to prove it holds the key
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
        self._next = 0                      # start messages taken from the driver's connection (`_take_start`)
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

        address = ray.get(actor.transfer_address.remote(), timeout=PEER_TIMEOUT)
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

    def open_connection(self, key_hex: str) -> tuple[str, int]:
        """Listens on this node's address for the driver's connection (`connection.py`); returns where. The
        first connection that proves it holds `key_hex` within `CONNECT_TIMEOUT` seconds is the driver's
        (others are closed); a thread then takes its start messages in the order they come and hands its
        requests that may wait (a value, a run's end) to `FETCHERS` threads, each answering when it can."""
        import ray

        host = ray.util.get_node_ip_address()
        listener = socket.create_server((host, 0))
        listener.settimeout(CONNECT_TIMEOUT)
        threading.Thread(target=self._serve, args=(listener, bytes.fromhex(key_hex)),
                         name="pw-driver-connection", daemon=True).start()
        return host, listener.getsockname()[1]

    def _serve(self, listener: socket.socket, key: bytes) -> None:
        """The connection's thread: the handshake, then each frame taken, until the driver closes the
        connection or sends a malformed frame (the connection is dropped)."""
        with listener:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return                      # nobody came in time
                try:
                    connection.settimeout(HANDSHAKE_TIMEOUT)
                    deadline = time.monotonic() + HANDSHAKE_TIMEOUT
                    handshake = ServerHandshake(connection, key)
                    handshake.start()
                    while not handshake.advance():
                        if time.monotonic() > deadline:      # a peer that sends a byte now and then
                            raise TimeoutError("the handshake took too long")
                    break
                except (OSError, EOFError):     # (AuthenticationError is a ConnectionError)
                    connection.close()
        reader = FrameReader(connection)
        replying = threading.Lock()
        fetchers = ThreadPoolExecutor(FETCHERS, thread_name_prefix="pw-fetch")
        with connection:
            connection.settimeout(None)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                while True:
                    header, arrays = reader.recv(LIMITS)
                    if "request" in header:
                        request = decode_request(header)
                        if request.kind == "runs_done":          # answered at once: nothing to wait for
                            self._answer(connection, replying, request)
                        else:
                            fetchers.submit(self._answer, connection, replying, request)
                        continue
                    number = self._take_start(*decode_start(header, arrays))
                    with replying:
                        send_message(connection, {"taken": number}, (), LIMITS)
            except (OSError, EOFError, ProtocolError):
                return
            finally:
                fetchers.shutdown(wait=False, cancel_futures=True)

    def _answer(self, connection: socket.socket, replying: threading.Lock, request: Request) -> None:
        """Answers one request of the driver's connection once it can (a value exists, a run is over), or with
        the error its wait raised."""
        header, arrays = {"reply": request.request}, []
        try:
            if request.kind == "fetch" and request.value:
                array, ready = self.fetch(request.run, request.buffer, request.timeout, request.siblings)
                header["siblings"], arrays = [list(sibling) for sibling in ready], [array, *ready.values()]
            elif request.kind == "fetch":
                self._island.produced(request.run, request.buffer, request.timeout)
            elif request.kind == "wait_run":
                self._island.wait_run(request.run, request.timeout)
                header["failed"] = self._failed(request.run)
            else:
                header["done"] = self.runs_done(request.runs)
        except Exception as error:  # noqa: BLE001  (the driver raises it)
            header, arrays = error_reply(request.request, error), []
        try:
            with replying:
                try:
                    send_message(connection, header, arrays, LIMITS)
                except ValueError as error:     # a value no frame carries (checked before a byte is sent)
                    send_message(connection, error_reply(request.request, error), (), LIMITS)
        except OSError:
            pass                                # the driver is gone

    def _take_start(self, number: int, work: IslandWork | None, releases, lends) -> int:
        """One start message: the releases made since the last one, the results kept here that the run takes
        on peer islands, then this island's work of the run (if any). A start that fails here fails its run.
        Returns its number."""
        try:
            self._release(releases)
            if lends:
                self._plane.lend(lends)
            if work is not None:
                self._begin(work)
        except Exception as error:  # noqa: BLE001  (the run fails, not the channel)
            if work is not None:
                self._island.fail_run(work.run_id, failure("failed", f"run {work.run_id} could not start on "
                                                                     f"{self._name}: {type(error).__name__}: {error}"))
        finally:
            with self._turn:
                self._next += 1
                self._turn.notify_all()
        return number

    def asked(self, started: int, message: str, *args):
        """Answers the question `message` (`object_count`, `status`, ...) once this actor took the first
        `started` start messages of its connection, and with them the releases they carried: Ray runs a
        question beside the connection's thread, so it could overtake them. After `SETTLE_TIMEOUT` seconds it
        answers all the same."""
        if message not in QUESTIONS:
            raise ValueError(f"{message!r} is not a question an island answers")
        with self._turn:
            self._turn.wait_for(lambda: self._next >= started, SETTLE_TIMEOUT)
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
        """Returns a buffer's value, and those of the `siblings` ((run, buffer) pairs the driver chose) already
        computed: {(run, buffer): array}. A sibling still computing is left out (its reader waits for it alone,
        not this value's), and one of a rank no frame carries (its own fetch says so)."""
        value = self._island.fetch(run_id, buffer, timeout)
        check_dims(value, f"result buffer {buffer} of run {run_id}")     # (an error reply, not a lost island)
        value = np.asarray(value)
        ready = {}
        for sibling in siblings:
            try:
                array = self._island.fetch(*sibling, timeout=0)
            except Exception:  # noqa: BLE001  (not produced yet, released or failed: fetched on its own)
                continue
            if too_many_dims(array) is None and (not hasattr(array, "is_ready") or array.is_ready()):
                ready[sibling] = np.asarray(array)
        return value, ready

    def _release(self, pairs) -> None:
        for run_id, buffer in pairs:
            self._island.release(run_id, buffer)

    def release_owner(self, owner) -> int:
        return self._island.release_owner(owner)

    def runs_done(self, run_ids) -> list:
        """(run, device seconds or None, what it failed with or None: `_failed`) for each of `run_ids` whose
        work here is over."""
        return [(r, self._island.device_seconds(r), self._failed(r)) for r in run_ids if self._island.run_done(r)]

    def _failed(self, run_id: int) -> tuple[str, str] | None:
        """The kind and message of the error a run failed with here (a launch that raised, a peer's failure),
        else None: the driver learns of it with the run's end, not only once it reads a result."""
        error = self._island.failure(run_id)
        return None if error is None else (failure_kind(error), str(error))

    def owned_by(self, owner) -> list:
        return self._island.owned_by(owner)

    def object_count(self) -> int:
        return self._island.object_count()

    def compilations(self) -> int:
        return self._island.compilations()

    def status(self, client: int | None = None) -> dict:
        """The island's status (of `client` only, if given), its Ray node, and per peer island the path its
        moves take (`transfers`)."""
        moves = {name: {"path": "actor call", "by_actor_call": sender.sent}
                 for name, sender in sorted(self._senders.items())}
        if self._plane is not None:
            moves.update({name: {**counts, "by_actor_call": moves.get(name, {}).get("by_actor_call", 0)}
                          for name, counts in self._plane.status().items()})
        return {**self._island.status(client), "node": self.node(), "transfers": moves}

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

    @staticmethod
    def copied(key: int, buffer: int, array):
        """An array about to be sent, copied on its devices now (this island's executor): this island's later runs
        may donate the original before the sender thread reads it (`IslandExecutor.send`); host data as it is."""
        import jax

        return jax.device_put(array, may_alias=False) if isinstance(array, jax.Array) else array

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
