"""Island executors: run plan steps on an island's devices in the order given.

Each island has one executor with one dispatch thread that takes work items
(a run's steps for this island) from its queue in the order the gang scheduler
delivered them, and executes each step in plan order. Executing a launch
enqueues it on the devices through JAX's asynchronous dispatch and resolves
its output futures at once, so later steps, on this island or others, can be
enqueued before it finishes. Because one thread feeds all of an island's
devices from one queue, every device sees the island's computations in one
consistent order.

An executor talks to the rest of the runtime only through work items (plan
steps and buffer ids), the object store and the DCN transport, so an island
can live in another process (see the Ray backend) without a rewrite.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

import jax

from pathways_mlir.dialect.plan import ProgramPlan, Step
from pathways_mlir.dialect.topology import Link

from .cluster import DeviceMap
from .executables import ExecutableCache, make_mesh, named_sharding
from .object_store import DeviceKey, ObjectStore
from .run import Run
from .tracing import Tracer
from .transfers import DcnTransport, copy_to


@dataclass
class IslandWork:
    """Steps of one run for one island, delivered as one message."""

    ticket: int
    run: Run
    steps: tuple[Step, ...]
    on_executed: Callable[[], None] = field(default=lambda: None)


class IslandExecutor:
    """Executes work items for one island on its JAX devices."""

    def __init__(self, island: str, device_map: DeviceMap, store: ObjectStore, transport: DcnTransport,
                 cache: ExecutableCache, tracer_ref: Callable[[], Tracer | None] = lambda: None):
        self.island = island
        self.device_map = device_map
        self.store = store
        self.transport = transport
        self.cache = cache
        self._tracer = tracer_ref
        self._queue: queue.Queue[IslandWork | None] = queue.Queue()
        self._meshes: dict[tuple, object] = {}
        self._prepared: dict[tuple[int, int], _Prepared] = {}
        self.executed: list[tuple[int, int, int]] = []   # (ticket, run id, step id), for order checks
        self._thread = threading.Thread(target=self._loop, name=f"pw-{island}", daemon=True)
        self._thread.start()

    def submit(self, work: IslandWork) -> None:
        """Queues a work item behind everything already delivered to this island."""
        self._queue.put(work)

    def close(self) -> None:
        """Stops the dispatch thread after the work already queued."""
        self._queue.put(None)
        self._thread.join()

    # -- dispatch thread -----------------------------------------------------

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            for step in work.steps:
                try:
                    self._execute(work.run, step)
                    self.executed.append((work.ticket, work.run.id, step.id))
                except BaseException as error:  # noqa: BLE001  (reported through the run)
                    work.run.fail(error, [b for b in _produced(step)])
            work.on_executed()

    def prepare(self, plan: ProgramPlan, step: Step) -> "_Prepared":
        """Does a step's host work once per plan: compile, build shardings, list devices (cached)."""
        key = (id(plan), step.id)
        prepared = self._prepared.get(key)
        if prepared is not None and prepared.plan is plan:
            return prepared
        if step.kind == "launch":
            mesh = self.mesh(plan, step.slice)
            inputs = [plan.buffers[b] for b in step.inputs]
            outputs = [plan.buffers[b] for b in step.outputs]
            compiled = self.cache.get(step.executable, plan.executables.get(step.executable, ""), mesh,
                                      inputs, outputs)
            prepared = _Prepared(plan, self._devices(plan, step.slice), compiled,
                                 tuple(named_sharding(mesh, b.sharding) for b in inputs))
        elif step.kind in ("copy", "send", "recv"):
            dst = plan.buffers[step.dst_buffer]
            sharding = named_sharding(self.mesh(plan, dst.slice), dst.sharding)
            prepared = _Prepared(plan, self._devices(plan, dst.slice), None, (sharding,),
                                 plan.topology.link(self.island, step.peer)[1] if step.kind == "send" else None)
        else:
            raise ValueError(f"island {self.island} cannot execute a '{step.kind}' step")
        self._prepared[key] = prepared
        return prepared

    def _execute(self, run: Run, step: Step) -> None:
        prepared = self.prepare(run.plan, step)
        if step.kind == "launch":
            args = [v if isinstance(v, jax.Array) else copy_to(v, sharding)
                    for v, sharding in zip((run.value(b) for b in step.inputs), prepared.shardings)]
            for b in step.outputs:
                self._allocate(run, b, prepared.devices)
            results = prepared.compiled(*args)
            for b, array in zip(step.outputs, results):
                run.resolve(b, array)
            self._trace(step.label or step.executable, "launch", prepared.devices, results)
        elif step.kind == "copy":
            self._allocate(run, step.dst_buffer, prepared.devices)
            moved = copy_to(run.value(step.src_buffer), prepared.shardings[0])
            run.resolve(step.dst_buffer, moved)
            self._trace(step.label or "copy", "copy", prepared.devices, [moved])
        elif step.kind == "send":
            self.transport.send(run.futures[step.src_buffer], prepared.shardings[0], step.bytes, prepared.link,
                                run.futures[step.dst_buffer])
        else:  # recv: the buffer's memory is taken here; the send resolves it on arrival
            self._allocate(run, step.dst_buffer, prepared.devices)

    def _allocate(self, run: Run, buffer: int, devices: tuple[DeviceKey, ...]) -> None:
        self.store.add(run.key(buffer), run.owner_of(buffer), devices,
                       run.plan.buffers[buffer].bytes_per_device, run.futures[buffer])

    def _devices(self, plan: ProgramPlan, slice_name: str) -> tuple[DeviceKey, ...]:
        placement = plan.slices[slice_name]
        return tuple((placement.island, d) for d in placement.device_ids())

    def mesh(self, plan, slice_name: str):
        """Returns the JAX mesh of a slice of `plan` (cached)."""
        placement = plan.slices[slice_name]
        key = (placement.island, placement.devices, placement.shape, placement.axes)
        mesh = self._meshes.get(key)
        if mesh is None:
            devices = [self.device_map.device(placement.island, d) for d in placement.device_ids()]
            mesh = self._meshes[key] = make_mesh(devices, placement.shape, placement.axes)
        return mesh

    def _trace(self, name: str, kind: str, devices: tuple[DeviceKey, ...], arrays) -> None:
        tracer = self._tracer()
        if tracer is not None:
            tracer.record(name, kind, self.island, [d for _, d in devices], arrays)


@dataclass(frozen=True)
class _Prepared:
    """A step's host work, done once per plan (the plan is kept so that its id stays unique)."""

    plan: ProgramPlan
    devices: tuple[DeviceKey, ...]           # where the step's outputs live
    compiled: Callable | None = None         # launch: the compiled executable
    shardings: tuple = ()                    # launch: input shardings; moves: the destination's
    link: Link | None = None                 # send: the DCN link it uses


def _produced(step: Step) -> tuple[int, ...]:
    if step.kind == "launch":
        return step.outputs
    if step.kind in ("copy", "send", "recv"):
        return (step.dst_buffer,)
    return ()
