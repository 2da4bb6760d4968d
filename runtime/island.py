"""Islands: each runs its part of every plan on its own devices, behind messages.

An island owns its devices, its shard of the object store, its cache of
compiled executables and one dispatch thread that feeds all of its devices
from one queue, so every device of the island sees the island's computations
in one consistent order. Executing a launch enqueues it through JAX's
asynchronous dispatch and resolves its output futures at once, so later steps
(here or on other islands) can be enqueued before it finishes.

The rest of the runtime talks to an island only through the messages below,
whose arguments are plans, integer ids, work items and arrays, never shared
Python objects; replies are futures. That is what lets an island live in
another process (as a Ray actor, say) without a rewrite:

    load(plan_key, plan)              keep a plan for later messages
    prepare(plan_key, step_ids)       host work up front: compile, shardings
    put(run_id, plan_key, buffer, array, owner)
                                      a host value placed on its home slice
    submit(work) -> Future            queue a run's steps; resolves once enqueued
    deliver(run_id, plan_key, buffer, array), fail(run_id, plan_key, buffer, error)
                                      a peer island's send arriving, or failing
    fetch(run_id, buffer) -> Future   a buffer's array, once produced
    release(run_id, buffer), release_run(run_id, client_id), release_owner(owner)
    usage(), owned_by(owner), object_count(), compilations()
"""

from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Hashable

import jax

from pathways_mlir.dialect.plan import ProgramPlan, Step
from pathways_mlir.dialect.topology import Link

from .cluster import DeviceMap
from .executables import ExecutableCache, make_mesh, named_sharding
from .object_store import DeviceKey, ObjectStore
from .tracing import Tracer
from .transfers import DcnTransport, copy_to


HISTORY = 100_000   # how many executed steps an island remembers


@dataclass(frozen=True)
class IslandWork:
    """Steps of one run for one island, delivered as one message in ticket order."""

    ticket: int
    run_id: int
    client_id: int
    plan_key: int
    step_ids: tuple[int, ...]


def run_owner(client_id: int, run_id: int) -> tuple[str, int, int]:
    """The owner of a run's intermediates in the object store."""
    return ("run", client_id, run_id)


def client_owner(client_id: int) -> tuple[str, int]:
    """The owner of a client's results in the object store."""
    return ("client", client_id)


@dataclass
class _RunState:
    """What an island knows of one run: its buffers' futures, made on first mention."""

    plan: ProgramPlan
    futures: dict[int, Future] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def future(self, buffer: int) -> Future:
        """Returns the buffer's future; the island thread, clients and peers all get the same one."""
        with self.lock:
            found = self.futures.get(buffer)
            if found is None:
                found = self.futures[buffer] = Future()
            return found


@dataclass(frozen=True)
class _Prepared:
    """A step's host work, done once per plan."""

    devices: tuple[DeviceKey, ...]           # where the step's outputs live
    compiled: Callable | None = None         # launch: the compiled executable
    shardings: tuple = ()                    # launch: input shardings; moves: the destination's
    link: Link | None = None                 # send: the DCN link it uses


class Island:
    """One island of devices and the work it is given."""

    def __init__(self, name: str, device_map: DeviceMap, transport: DcnTransport,
                 peer: Callable[[str], "Island"], device_memory_bytes: int | None = None,
                 tracer_ref: Callable[[], Tracer | None] = lambda: None):
        self.name = name
        self.device_map = device_map
        island = device_map.topology.island(name)
        self.store = ObjectStore({(name, d): device_memory_bytes or island.device_memory_bytes
                                  for d in range(island.num_devices)})
        self.cache = ExecutableCache()
        self._transport = transport
        self._peer = peer
        self._tracer = tracer_ref
        self._plans: dict[int, ProgramPlan] = {}
        self._steps: dict[int, dict[int, Step]] = {}
        self._prepared: dict[tuple[int, int], _Prepared] = {}
        self._meshes: dict[tuple, object] = {}
        self._runs: dict[int, _RunState] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[IslandWork, Future] | None] = queue.Queue()
        # The latest (ticket, run id, step id) executed, for order checks; bounded for long runs.
        self.executed: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=HISTORY)
        self._thread = threading.Thread(target=self._loop, name=f"pw-{name}", daemon=True)
        self._thread.start()

    # -- messages ------------------------------------------------------------

    def load(self, plan_key: int, plan: ProgramPlan) -> None:
        """Keeps `plan` under `plan_key` for later messages."""
        with self._lock:
            if plan_key not in self._plans:
                self._plans[plan_key] = plan
                self._steps[plan_key] = {s.id: s for s in plan.islands.get(self.name, ())}

    def prepare(self, plan_key: int, step_ids) -> None:
        """Does the host work of the given steps now: compile, build shardings (cached)."""
        for step_id in step_ids:
            self._prepare(plan_key, self._steps[plan_key][step_id])

    def put(self, run_id: int, plan_key: int, buffer: int, array, owner: Hashable) -> None:
        """Places a host value (a program argument, a branch's result) on its home slice."""
        plan = self._plans[plan_key]
        info = plan.buffers[buffer]
        future = self._run(run_id, plan).future(buffer)
        self.store.add((run_id, buffer), owner, self._devices(plan, info.slice), info.bytes_per_device, future)
        future.set_result(copy_to(array, named_sharding(self.mesh(plan, info.slice), info.sharding)))

    def submit(self, work: IslandWork) -> Future:
        """Queues a run's steps behind everything already delivered; the reply resolves once enqueued."""
        executed: Future = Future()
        self._queue.put((work, executed))
        return executed

    def deliver(self, run_id: int, plan_key: int, buffer: int, array) -> None:
        """Receives a buffer sent by a peer island, placing it on its home sharding."""
        plan = self._plans[plan_key]
        info = plan.buffers[buffer]
        moved = copy_to(array, named_sharding(self.mesh(plan, info.slice), info.sharding))
        future = self._run(run_id, plan).future(buffer)
        if not future.done():
            future.set_result(moved)

    def fail(self, run_id: int, plan_key: int, buffer: int, error: BaseException) -> None:
        """Receives the failure of a peer's send: whatever waits on the buffer raises `error`."""
        future = self._run(run_id, self._plans[plan_key]).future(buffer)
        if not future.done():
            future.set_exception(error)

    def fetch(self, run_id: int, plan_key: int, buffer: int) -> Future:
        """Returns the future of a buffer's array, resolved once its producer is enqueued."""
        return self._run(run_id, self._plans[plan_key]).future(buffer)

    def release(self, run_id: int, buffer: int) -> None:
        """Drops one buffer (a handle was deleted)."""
        self.store.release((run_id, buffer))

    def release_run(self, run_id: int, client_id: int) -> None:
        """Drops a finished run's intermediates and its bookkeeping."""
        self.store.release_owner(run_owner(client_id, run_id))
        with self._lock:
            self._runs.pop(run_id, None)

    def release_owner(self, owner: Hashable) -> int:
        """Drops every buffer of `owner`; returns how many."""
        return self.store.release_owner(owner)

    def usage(self) -> dict[DeviceKey, int]:
        """Returns the bytes in use on each of the island's devices."""
        return self.store.usage()

    def owned_by(self, owner: Hashable) -> list:
        """Returns the keys of the buffers `owner` holds here."""
        return self.store.owned_by(owner)

    def object_count(self) -> int:
        """Returns how many buffers the island holds."""
        return len(self.store)

    def compilations(self) -> int:
        """Returns how many executables the island has compiled."""
        return self.cache.compilations

    def close(self) -> None:
        """Stops the dispatch thread after the work already queued."""
        self._queue.put(None)
        self._thread.join()

    # -- dispatch thread -----------------------------------------------------

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, executed = item
            state = self._run(work.run_id, self._plans[work.plan_key])
            steps = self._steps[work.plan_key]
            for step_id in work.step_ids:
                step = steps[step_id]
                try:
                    self._execute(work, state, step)
                    self.executed.append((work.ticket, work.run_id, step.id))
                except BaseException as error:  # noqa: BLE001  (reported through the buffers' futures)
                    for b in _produced(step):
                        f = state.future(b)
                        if not f.done():
                            f.set_exception(error)
            executed.set_result(None)

    def _execute(self, work: IslandWork, state: _RunState, step: Step) -> None:
        prepared = self._prepare(work.plan_key, step)
        if step.kind == "launch":
            args = [v if isinstance(v, jax.Array) else copy_to(v, sharding)
                    for v, sharding in zip((state.future(b).result() for b in step.inputs), prepared.shardings)]
            for b in step.outputs:
                self._allocate(work, state, b, prepared.devices)
            results = prepared.compiled(*args)
            for b, array in zip(step.outputs, results):
                state.future(b).set_result(array)
            self._trace(step.label or step.executable, "launch", prepared.devices, results)
        elif step.kind == "copy":
            self._allocate(work, state, step.dst_buffer, prepared.devices)
            moved = copy_to(state.future(step.src_buffer).result(), prepared.shardings[0])
            state.future(step.dst_buffer).set_result(moved)
            self._trace(step.label or "copy", "copy", prepared.devices, [moved])
        elif step.kind == "send":
            peer = self._peer(step.peer)
            self._transport.send(
                state.future(step.src_buffer), step.bytes, prepared.link,
                lambda array: peer.deliver(work.run_id, work.plan_key, step.dst_buffer, array),
                lambda error: peer.fail(work.run_id, work.plan_key, step.dst_buffer, error))
        else:  # recv: the buffer's memory is taken here; the peer's send resolves it on arrival
            self._allocate(work, state, step.dst_buffer, prepared.devices)

    def _allocate(self, work: IslandWork, state: _RunState, buffer: int, devices: tuple[DeviceKey, ...]) -> None:
        owner = client_owner(work.client_id) if buffer in state.plan.outputs else run_owner(work.client_id,
                                                                                          work.run_id)
        self.store.add((work.run_id, buffer), owner, devices, state.plan.buffers[buffer].bytes_per_device,
                       state.future(buffer))

    def _prepare(self, plan_key: int, step: Step) -> _Prepared:
        key = (plan_key, step.id)
        prepared = self._prepared.get(key)
        if prepared is not None:
            return prepared
        plan = self._plans[plan_key]
        if step.kind == "launch":
            mesh = self.mesh(plan, step.slice)
            inputs = [plan.buffers[b] for b in step.inputs]
            outputs = [plan.buffers[b] for b in step.outputs]
            compiled = self.cache.get(step.executable, plan.executables.get(step.executable, ""), mesh,
                                      inputs, outputs)
            prepared = _Prepared(self._devices(plan, step.slice), compiled,
                                 tuple(named_sharding(mesh, b.sharding) for b in inputs))
        elif step.kind in ("copy", "recv"):
            dst = plan.buffers[step.dst_buffer]
            prepared = _Prepared(self._devices(plan, dst.slice), None,
                                 (named_sharding(self.mesh(plan, dst.slice), dst.sharding),))
        elif step.kind == "send":
            prepared = _Prepared((), link=plan.topology.link(self.name, step.peer)[1])
        else:
            raise ValueError(f"island {self.name} cannot execute a '{step.kind}' step")
        self._prepared[key] = prepared
        return prepared

    def _run(self, run_id: int, plan: ProgramPlan) -> _RunState:
        with self._lock:
            state = self._runs.get(run_id)
            if state is None:
                state = self._runs[run_id] = _RunState(plan)
            return state

    def _devices(self, plan: ProgramPlan, slice_name: str) -> tuple[DeviceKey, ...]:
        placement = plan.slices[slice_name]
        return tuple((placement.island, d) for d in placement.device_ids())

    def mesh(self, plan: ProgramPlan, slice_name: str):
        """Returns the JAX mesh of one of this island's slices (cached)."""
        placement = plan.slices[slice_name]
        key = (placement.devices, placement.shape, placement.axes)
        mesh = self._meshes.get(key)
        if mesh is None:
            devices = [self.device_map.device(self.name, d) for d in placement.device_ids()]
            mesh = self._meshes[key] = make_mesh(devices, placement.shape, placement.axes)
        return mesh

    def _trace(self, name: str, kind: str, devices: tuple[DeviceKey, ...], arrays) -> None:
        tracer = self._tracer()
        if tracer is not None:
            tracer.record(name, kind, self.name, [d for _, d in devices], arrays)


def _produced(step: Step) -> tuple[int, ...]:
    if step.kind == "launch":
        return step.outputs
    if step.kind in ("copy", "recv"):
        return (step.dst_buffer,)
    return ()
