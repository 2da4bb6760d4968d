"""The data plane between island actors: arrays move over JAX's transfer server, with no Python on the way.

Every island actor runs a `jax.experimental.transfer` server. A DCN move of
buffer `B` of run `R` is a pull keyed by `transfer_id(R, B)`:

- the receiving island asks for it as soon as the run's work arrives there
  (`DataPlane.expect`), before the sender has computed it; the pull returns
  at once, and its arrays fill when the bytes arrive;
- the sending island offers it when its `Send` step runs (`DataPlane.offer`),
  as arrays that may not be computed yet; the server sends them once they are;
- a thread of the receiver per peer waits (without the interpreter lock) for
  the oldest pull from that peer and hands each pulled array to its island
  (`Island.deliver`) once it is there, so an island program never runs on a
  value still in flight; a poller with growing pauses catches the pulls that
  arrive out of order.

A handle passed to a run whose input lives on another island travels the
same way (`PeerRef` in the run's work, `runtime/island_work.py`): the
receiving island pulls it (`pull_arguments`, keyed by the receiving run and
input buffer, which no move of the plan is keyed by: an input is never a
recv's destination) and a thread waiting for that pull alone hands it to its
run as an awaited argument (`Island.argument`); the island that keeps it is told in the same start
message stream (`lend`, before any later release) and offers it once its run
has produced it (`Island.lend`), or an error in its place. The receiver
tells the keeper once its pull is over (`Pulled`, in a batched actor call), so the
keeper knows what it has lent out: a run there that donates the result
waits for that (`Island.returned`), and when the receiver is lost the
driver has the keeper withdraw what it still offers it (`Withdraw`): each
offer is replaced by one that expires at once, which lets the array go.

No actor call, Ray object or driver is on that path. What travels is the
buffer's distinct shards (`TransferLayout`): a replicated mesh axis sends
one copy, and the receiver takes them onto the first devices of its own slice
and moves them to their home sharding there (an ICI copy). Where the
distinct shards outnumber the receiving slice's devices, the sender first
gathers them into fewer, larger shards (its last sharded mesh axes shrunk,
an ICI copy on the sender), so every move fits the receiver.

Where the transfer server is missing from this JAX (`jax.experimental.transfer`)
or turned off (`PW_DATA_PLANE=off`), moves go by actor call instead
(`PeerSender`); `status()` counts both paths per peer.

Failures: a run that fails on the sender before offering a buffer its peer
pulls gets an error array offered in its place (`make_error_array`), so the
pull ends and the receiver's run fails naming it; a run that fails on the
receiver drops its pulls. A pull from a sender whose process dies ends
with an error (its connection closes), and the run fails with `IslandLost`
naming the sender, as the driver's monitor says once it notices. The
transfer API's timeouts do not bound a pull that a live sender never
offers (measured: such a pull waits forever); the error offers above are
what ends those.
"""

from __future__ import annotations

import datetime
import functools
import math
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_steps import Recv, Send
from pathways_mlir.dialect.sharding import zero_size

from ..executables import make_mesh, named_sharding, numpy_dtype
from ..island_work import IslandLost, PeerRef, RunFailed
from ..transfers import assemble_in_place, copy_to, shards_in_place

ID_SPACE = 1 << 32          # transfer ids: run id * ID_SPACE + the receiving buffer
_PAUSE_MIN = 1e-4           # the poller's shortest and longest pause between looks at the pulls under way
_PAUSE_MAX = 2e-3


def transfer_id(run_id: int, buffer: int) -> int:
    """The key of one move: the run and the buffer it becomes on the receiver (unique in a plan)."""
    return run_id * ID_SPACE + buffer


@dataclass(frozen=True)
class TransferLayout:
    """What travels for a sent buffer: its shards, as a mesh of the sharded axes alone (each at most its
    size on the source slice: a smaller one gathers shards along it)."""

    mesh_shape: tuple[int, ...]
    axes: tuple[str, ...]
    kept: tuple[int, ...]              # the source mesh's dimensions that remain (the others are replicated)


def transfer_layout(plan: ProgramPlan, buffer: int, devices: int | None = None) -> TransferLayout:
    """The distinct shards of `buffer` on its slice (the mesh axes its sharding uses), as they travel to a
    slice of `devices` devices: while they outnumber those devices, the last axes shrink, each to its
    largest divisor that fits (down to 1: gathered along it). None: as they are on the source.

    For example, a buffer sharded over a (2, 2) mesh as ("data", "model") travels to a 2-device slice
    as a (2, 1) mesh (gathered along "model"), and to a 1-device slice as (1, 1).
    """
    info = plan.buffers[buffer]
    placement = plan.slices[info.slice]
    used = {axis for dim in info.sharding for axis in dim}
    kept = tuple(i for i, axis in enumerate(placement.axes) if axis in used)
    shape = [placement.shape[i] for i in kept]
    for j in reversed(range(len(shape))):
        if devices is None or math.prod(shape) <= devices:
            break
        others = math.prod(shape) // shape[j]
        shape[j] = max(d for d in range(1, shape[j] + 1) if shape[j] % d == 0 and (others * d <= devices or d == 1))
    return TransferLayout(tuple(shape), tuple(placement.axes[i] for i in kept), kept)


def slice_devices(plan: ProgramPlan, buffer: int) -> int:
    """The number of devices of `buffer`'s slice."""
    return math.prod(plan.slices[plan.buffers[buffer].slice].shape)


class Lend(NamedTuple):
    """What the island keeping a result is told when a run on `peer` takes it as an argument: buffer
    `buffer` of run `run_id` (plan `plan_key`) is offered for the receiving run `reader`'s input
    `reader_buffer`, its shards as a mesh of `mesh_shape` (`TransferLayout`)."""

    run_id: int
    buffer: int
    plan_key: int
    reader: int
    reader_buffer: int
    peer: str
    mesh_shape: tuple[int, ...]

    @property
    def transfer_id(self) -> int:
        """The key of its offer."""
        return transfer_id(self.reader, self.reader_buffer)


class Withdraw(NamedTuple):
    """What the other islands are told when island `peer` was lost: the offers to it go (it pulls nothing
    more)."""

    peer: str


class Pulled(NamedTuple):
    """What a receiver tells the island that lent it an argument once its pull of `transfer_id` is over."""

    transfer_id: int


def carries(shape: tuple[int, ...]) -> bool:
    """Whether the transfer server carries an array of `shape`: not one of zero elements (JAX 0.10.2's pull of
    one never completes); such a move goes by actor call, and such an argument through the driver."""
    return not zero_size(shape)


class DataPlane:
    """One island actor's end of the data plane (see the module's docstring)."""

    def __init__(self, island, host: str, acknowledge: Callable[[str, int], None]):
        from jax.experimental import transfer

        self._transfer = transfer
        self._island = island
        self._acknowledge = acknowledge             # (peer, transfer id): tells a lender its offer was pulled
        client = island.device_map.devices[island.name][0].client
        self._server = transfer.start_transfer_server(client, f"{host}:0", [f"{host}:0"])
        self._peers: dict = {}                      # peer island -> TransferConnection
        self._routes: dict = {}                     # (plan key, step ids) -> (pulls, sends)
        self._offers: dict = {}                     # (plan key, receiving buffer) -> the sent sharding
        self._shardings: dict = {}                  # (plan key, sent buffer, mesh) -> the sharding it travels with
        self._lock = threading.Condition()
        self._heads = threading.Condition(self._lock)   # wakes the followers (`_follow`) of the peers' pulls
        self._pending: list = []                    # (array, run id, plan key, buffer, peer) pulled, not there yet
        self._followed: set[str] = set()            # the peers whose pulls a follower thread waits for
        self._owed: dict[int, dict] = {}            # run id -> {receiving buffer: (plan key, peer)} not offered
        self._arguments: dict[str, int] = {}        # peer -> arguments pulled from it, not there yet
        self._lent_out: dict[int, tuple] = {}       # transfer id -> (peer, lent result or None: an error) not pulled
        self.counts: dict[str, dict[str, int]] = {}
        self._closed = False
        threading.Thread(target=self._wait_for_pulls, name="pw-data-plane", daemon=True).start()

    @property
    def address(self) -> str:
        """Where peers connect to this island's transfer server."""
        return self._server.address()

    def connect(self, peer: str, address: str) -> None:
        """Connects to island `peer`'s transfer server (again, when its actor was restored); `status` reports
        the peer's path from now on, before its first move too."""
        self._peers[peer] = self._server.connect(address)
        with self._lock:
            self._counts_of(peer)

    def _count(self, peer: str, what: str) -> None:
        self._counts_of(peer)[what] += 1

    def _counts_of(self, peer: str) -> dict[str, int]:
        return self.counts.setdefault(peer, {"pulled": 0, "offered": 0, "by_actor_call": 0, "arguments_pulled": 0,
                                             "arguments_offered": 0, "offers_withdrawn": 0})

    # -- the receiver ---------------------------------------------------------

    def expect(self, work) -> None:
        """A run's work arrived: pulls every buffer it receives over the data plane, and notes the buffers it
        sends there (offered as errors if the run fails before sending them)."""
        key = (work.plan_key, work.step_ids)
        routes = self._routes.get(key)
        if routes is None:
            routes = self._routes[key] = self._routes_of(work.plan_key, set(work.step_ids))
        pulls, sends = routes
        with self._lock:
            if sends:
                self._owed.setdefault(work.run_id, {}).update(sends)
            for peer, buffer, spec in pulls:
                arrays = self._peers[peer].pull(transfer_id(work.run_id, buffer), [spec])
                self._pending.append((arrays[0], work.run_id, work.plan_key, buffer, peer))
                self._count(peer, "pulled")
                if peer not in self._followed:
                    self._followed.add(peer)
                    threading.Thread(target=self._follow, args=(peer,), name="pw-data-plane-follower",
                                     daemon=True).start()
            if pulls:
                self._heads.notify_all()
            if pulls or sends:
                self._lock.notify()

    def _routes_of(self, plan_key: int, step_ids: set) -> tuple[tuple, dict]:
        """This island's pulls (peer, buffer, what to pull) and sends {buffer: (plan key, peer)} among the
        steps, for the moves that travel over the data plane."""
        island = self._island
        plan = island.plan(plan_key)
        pulls, sends = [], {}
        for step in plan.islands.get(island.name, ()):
            if step.id not in step_ids or not isinstance(step, (Send, Recv)) or \
                    not carries(plan.buffers[step.dst_buffer].shape):
                continue
            if isinstance(step, Recv):
                pulls.append((step.peer, step.dst_buffer, self._landing(plan, step.src_buffer, step.dst_buffer)))
            else:
                sends[step.dst_buffer] = (plan_key, step.peer)
        return tuple(pulls), sends

    def _landing(self, plan: ProgramPlan, src_buffer: int, dst_buffer: int):
        """What a pull asks for: the sent shards, on the first devices of the receiving slice."""
        layout = transfer_layout(plan, src_buffer, slice_devices(plan, dst_buffer))
        return self._landing_of(plan, dst_buffer, layout.mesh_shape, layout.axes, plan.buffers[src_buffer].sharding,
                                plan.buffers[dst_buffer].dtype)

    def _landing_of(self, plan: ProgramPlan, dst_buffer: int, mesh_shape: tuple, axes: tuple, sharding: tuple,
                    dtype: str):
        """A pull's spec: shards of `mesh_shape` over `axes`, sharded as `sharding`, on the first devices of
        `dst_buffer`'s slice."""
        import jax

        info = plan.buffers[dst_buffer]
        devices = list(self._island.mesh(plan, info.slice).devices.flat)[:math.prod(mesh_shape)]
        mesh = make_mesh(devices, mesh_shape, axes)
        return jax.ShapeDtypeStruct(info.shape, numpy_dtype(dtype), sharding=named_sharding(mesh, sharding))

    def pull_arguments(self, work) -> None:
        """Pulls each `PeerRef` argument of a run's work (registered on the island already) from the island
        that keeps it; a thread of its own hands it to the island's run once it is there (`Island.argument`):
        a run waits for it with nothing else to do, so it is not left to the poller's pauses."""
        plan = self._island.plan(work.plan_key)
        for buffer, ref in work.inputs:
            if isinstance(ref, PeerRef):
                spec = self._landing_of(plan, buffer, ref.mesh_shape, ref.axes, ref.sharding, ref.dtype)
                array = self._peers[ref.island].pull(transfer_id(work.run_id, buffer), [spec])[0]
                with self._lock:
                    self._count(ref.island, "arguments_pulled")
                    self._arguments[ref.island] = self._arguments.get(ref.island, 0) + 1
                threading.Thread(target=self._await_argument, name="pw-argument", daemon=True,
                                 args=(array, work.run_id, work.plan_key, buffer, ref.island)).start()

    def _await_argument(self, array, run_id: int, plan_key: int, buffer: int, peer: str) -> None:
        """Waits (without the interpreter lock) until a pulled argument is there, hands it to the island, and
        tells the peer that lent it that its offer is gone (`pulled`)."""
        try:
            array.block_until_ready()
        except Exception as error:  # noqa: BLE001  (an error offered, or the peer's process is gone)
            self._island.fail_run(run_id, self._pull_failed(run_id, plan_key, peer, error))
        else:
            self._island.argument(run_id, buffer, array)
        finally:
            with self._lock:
                self._arguments[peer] -= 1
            self._acknowledge(peer, transfer_id(run_id, buffer))

    def _wait_for_pulls(self) -> None:
        """The poller: hands each pulled array to the island once it is there (those that arrive out of
        order: a follower hands over the others as they come); offers errors for what failed runs owe."""
        pause = _PAUSE_MIN
        while True:
            with self._lock:
                while not self._pending and not self._owed and not self._closed:
                    self._lock.wait()
                    pause = _PAUSE_MIN
                if self._closed:
                    return
            arrived = self._hand_over()
            self._settle_failed()
            pause = _PAUSE_MIN if arrived else min(pause * 2, _PAUSE_MAX)
            with self._lock:
                self._lock.wait(pause)

    def _follow(self, peer: str) -> None:
        """A follower: waits, without the interpreter lock, for the oldest pull under way from `peer`, and hands
        over what arrived as soon as it is there. Polling alone saw an arrival up to a pause (2 ms) late, and
        a shorter pause took the CPU the islands compute on. A pull dropped before it ends (its run failed
        here) holds its follower until its sender offers the error that ends it; the poller hands over the
        others meanwhile."""
        while True:
            with self._lock:
                head = None
                while not self._closed and head is None:
                    head = next((pull[0] for pull in self._pending if pull[4] == peer), None)
                    if head is None:
                        self._heads.wait()
                if self._closed:
                    return
            try:
                head.block_until_ready()
            except Exception:  # noqa: BLE001  (`_hand_over` reports it)
                pass
            del head
            self._hand_over()

    def _hand_over(self) -> bool:
        """Hands the pulled arrays that are there to the island (a failed pull fails its run); returns whether
        any was."""
        with self._lock:
            arrived, waiting = [], []
            for pull in self._pending:
                (arrived if pull[0].is_ready() else waiting).append(pull)
            self._pending = waiting
        for array, run_id, plan_key, buffer, peer in arrived:
            try:
                array.block_until_ready()
            except Exception as error:  # noqa: BLE001  (an error offered, or the peer's process is gone)
                self._island.fail_run(run_id, self._pull_failed(run_id, plan_key, peer, error))
                continue
            self._island.deliver(run_id, plan_key, buffer, array)
        return bool(arrived)

    def _pull_failed(self, run_id: int, plan_key: int, peer: str, error: BaseException) -> RunFailed:
        """Why a pull ended without its arrays: the sender offered an error in their place (its run failed
        there), or the connection broke, which is the sender's process gone (`IslandLost`, as the monitor
        says once it notices)."""
        message = str(error).removeprefix("INTERNAL: ").removeprefix("Error while transferring: ")
        if message.startswith(f"run {run_id} failed on "):
            return RunFailed(message)
        return IslandLost(f"island {peer} was lost: run {run_id} of {self._island.plan(plan_key).program} used "
                          f"it (its transfer server: {message})")

    def _settle_failed(self) -> None:
        """Offers an error array for each buffer a failed run here still owes a peer, and drops the pulls of
        runs that failed here."""
        import jax

        island = self._island
        with self._lock:
            runs = set(self._owed) | {p[1] for p in self._pending}
        failed = island.failures(runs) if runs else {}         # no lock of ours held: the island takes its own
        if not failed:
            return
        with self._lock:
            owed = {r: self._owed.pop(r) for r in failed if r in self._owed}
            self._pending = [p for p in self._pending if p[1] not in failed]
        for run_id, buffers in owed.items():
            for buffer, (plan_key, _) in buffers.items():
                info = island.plan(plan_key).buffers[buffer]
                spec = jax.ShapeDtypeStruct(info.shape, numpy_dtype(info.dtype),
                                            sharding=self._sent_sharding(plan_key, buffer))
                error = self._transfer.make_error_array(spec, f"run {run_id} failed on {island.name}: "
                                                              f"{failed[run_id]}")
                self._server.await_pull(transfer_id(run_id, buffer), [error])

    # -- the sender -----------------------------------------------------------

    def offer(self, run_id: int, plan_key: int, peer: str, buffer: int, array) -> bool:
        """Offers `array` to `peer`, which pulls it as its `buffer` of the run; returns whether the move is
        taken care of. One the run no longer owes because it failed here (`_settle_failed` offered an error
        in its place) is: nothing is sent (a failed run's late send once went by actor call, counted as a
        move of a later run). Any other the run does not owe is not: the caller sends it by actor call."""
        with self._lock:
            owed = self._owed.get(run_id)
            taken = owed is not None and owed.pop(buffer, None) is not None
            if taken:
                if not owed:
                    del self._owed[run_id]
                self._count(peer, "offered")
        if not taken:
            return bool(self._island.failures((run_id,)))      # (the island's lock, not ours)
        self._server.await_pull(transfer_id(run_id, buffer), [_on(array, self._sent_sharding(plan_key, buffer))])
        return True

    def lend(self, lends) -> None:
        """Offers kept results that runs on peer islands take as arguments (`Lend`s), each once its run has
        produced it (a result that failed or is not kept is offered as an error, which fails the reader), and
        withdraws the offers to lost peers (`Withdraw`)."""
        for lend in lends:
            if isinstance(lend, Withdraw):
                self._withdraw(lend.peer)
                continue
            with self._lock:          # lent out before the island may hand it over (`_lent`)
                self._lent_out[lend.transfer_id] = (lend.peer, (lend.run_id, lend.buffer))
            try:
                array = self._island.lend(lend.run_id, lend.buffer, f"run {lend.reader}",
                                          functools.partial(self._produced_for, lend))
            except (RunFailed, ValueError) as error:
                with self._lock:
                    self._lent_out[lend.transfer_id] = (lend.peer, None)    # the island does not count it
                self._lent(lend, None, error)
                continue
            if array is not None:
                self._lent(lend, array, None)

    def pulled(self, transfer_id: int) -> None:
        """A peer's pull of what this island lent it is over (`Pulled`): the island has it back."""
        with self._lock:
            _, result = self._lent_out.pop(transfer_id, (None, None))
        if result is not None:
            self._island.returned(*result)

    def _withdraw(self, peer: str) -> None:
        """Peer `peer` was lost: each offer to it is replaced by one that expires at once (the transfer server
        lets the array go), and results not produced yet will not be offered (`_lent`)."""
        expired = []
        with self._lock:
            for key in [k for k, (p, _) in self._lent_out.items() if p == peer]:
                expired.append(self._lent_out.pop(key)[1])
                self._server.await_pull(key, [self._withdrawn()], timeout=datetime.datetime.now())
                self._count(peer, "offers_withdrawn")
        for result in expired:
            if result is not None:
                self._island.returned(*result)

    def _withdrawn(self):
        """What replaces a withdrawn offer: an error array of one element (never pulled)."""
        import jax

        device = self._island.device_map.devices[self._island.name][0]
        spec = jax.ShapeDtypeStruct((), np.float32, sharding=jax.sharding.SingleDeviceSharding(device))
        return self._transfer.make_error_array(spec, "withdrawn: the peer was lost")

    def _produced_for(self, lend: Lend, array, error: BaseException | None) -> None:
        """A lent result's run produced it after it was lent (or failed: the reader fails with that)."""
        if error is not None:
            error = RunFailed(f"run {lend.reader} takes a result of run {lend.run_id}, which failed: {error}")
        self._lent(lend, array, error)

    def _lent(self, lend: Lend, array, error: BaseException | None) -> None:
        """Offers a kept result (or `error` in its place) for the peer's pull. Maybe under the island's lock."""
        sharding = self._sharding_of(lend.plan_key, lend.buffer, lend.mesh_shape)
        if error is not None:
            import jax

            info = self._island.plan(lend.plan_key).buffers[lend.buffer]
            spec = jax.ShapeDtypeStruct(info.shape, numpy_dtype(info.dtype), sharding=sharding)
            array = self._transfer.make_error_array(spec, f"run {lend.reader} failed on {self._island.name}: {error}")
        else:
            array = _on(array, sharding)
        with self._lock:
            if lend.transfer_id not in self._lent_out:
                return                          # withdrawn: its reader was lost meanwhile
            self._server.await_pull(lend.transfer_id, [array])
            self._count(lend.peer, "arguments_offered")

    def _sent_sharding(self, plan_key: int, dst_buffer: int):
        """The sharding a sent buffer travels with (`_sharding_of` its source buffer)."""
        key = (plan_key, dst_buffer)
        sharding = self._offers.get(key)
        if sharding is None:
            plan = self._island.plan(plan_key)
            src_buffer = next(s.src_buffer for s in plan.islands[self._island.name]
                              if isinstance(s, Send) and s.dst_buffer == dst_buffer)
            layout = transfer_layout(plan, src_buffer, slice_devices(plan, dst_buffer))
            sharding = self._offers[key] = self._sharding_of(plan_key, src_buffer, layout.mesh_shape)
        return sharding

    def _sharding_of(self, plan_key: int, buffer: int, mesh_shape: tuple[int, ...]):
        """The sharding `buffer` of a plan travels with as a mesh of `mesh_shape` (`TransferLayout`): on the
        first devices of its slice along each of its sharded mesh axes, index 0 along the replicated ones."""
        key = (plan_key, buffer, mesh_shape)
        sharding = self._shardings.get(key)
        if sharding is None:
            plan = self._island.plan(plan_key)
            layout, info = transfer_layout(plan, buffer), plan.buffers[buffer]
            devices = self._island.mesh(plan, info.slice).devices
            size = dict(zip(layout.kept, mesh_shape))
            picked = devices[tuple(slice(size[i]) if i in size else 0 for i in range(devices.ndim))]
            mesh = make_mesh(list(np.asarray(picked, dtype=object).flat), mesh_shape, layout.axes)
            sharding = self._shardings[key] = named_sharding(mesh, info.sharding)
        return sharding

    def status(self) -> dict:
        """Per peer island: the path its moves take and how many went each way."""
        with self._lock:
            waiting: dict[str, dict[str, int]] = {}
            for peer, _ in (p for owed in self._owed.values() for p in owed.values()):
                waiting.setdefault(peer, {"pulls": 0, "offers": 0})["offers"] += 1
            for *_, peer in self._pending:
                waiting.setdefault(peer, {"pulls": 0, "offers": 0})["pulls"] += 1
            for peer, count in self._arguments.items():
                waiting.setdefault(peer, {"pulls": 0, "offers": 0})["pulls"] += count
            for peer, _ in self._lent_out.values():
                waiting.setdefault(peer, {"pulls": 0, "offers": 0})["offers"] += 1
            return {peer: {"path": "transfer server", **counts,
                           "under_way": waiting.get(peer) or {"pulls": 0, "offers": 0}}
                    for peer, counts in sorted(self.counts.items())}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
            self._heads.notify_all()


def _on(array, sharding):
    """`array` as it travels: its own shards on the devices of `sharding` where they are the ones it travels
    as (one copy of each distinct shard), else gathered into the larger shards of `sharding` (an ICI copy)."""
    if array.sharding == sharding:
        return array
    if shards_in_place(array.sharding, sharding, array.shape):
        return assemble_in_place(array, sharding)
    return copy_to(array, sharding)
