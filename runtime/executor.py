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

from pathways_mlir.dialect.plan import Step

from .cluster import DeviceMap
from .executables import ExecutableCache, make_mesh, named_sharding
from .object_store import ObjectStore
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

    def _execute(self, run: Run, step: Step) -> None:
        plan = run.plan
        if step.kind == "launch":
            placement = plan.slices[step.slice]
            mesh = self.mesh(run.plan, step.slice)
            inputs = [plan.buffers[b] for b in step.inputs]
            outputs = [plan.buffers[b] for b in step.outputs]
            compiled = self.cache.get(step.executable, plan.executables.get(step.executable, ""), mesh,
                                      inputs, outputs)
            args = [copy_to(run.value(b.id), named_sharding(mesh, b.sharding)) for b in inputs]
            for b in outputs:
                self._allocate(run, b.id, placement.device_ids())
            results = compiled(*args)
            for b, array in zip(outputs, results):
                run.resolve(b.id, array)
            self._trace(step.label or step.executable, "launch", placement.device_ids(), results)
        elif step.kind == "copy":
            dst = plan.buffers[step.dst_buffer]
            placement = plan.slices[dst.slice]
            self._allocate(run, dst.id, placement.device_ids())
            moved = copy_to(run.value(step.src_buffer), named_sharding(self.mesh(run.plan, dst.slice), dst.sharding))
            run.resolve(dst.id, moved)
            self._trace(step.label or "copy", "copy", placement.device_ids(), [moved])
        elif step.kind == "send":
            dst = plan.buffers[step.dst_buffer]
            sharding = named_sharding(self.mesh(run.plan, dst.slice), dst.sharding)
            kind, link = plan.topology.link(self.island, step.peer)
            self.transport.send(run.futures[step.src_buffer], sharding, step.bytes, link,
                                run.futures[step.dst_buffer])
        elif step.kind == "recv":
            dst = plan.buffers[step.dst_buffer]
            self._allocate(run, dst.id, plan.slices[dst.slice].device_ids())
        else:
            raise ValueError(f"island {self.island} cannot execute a '{step.kind}' step")

    def _allocate(self, run: Run, buffer: int, local_devices) -> None:
        info = run.plan.buffers[buffer]
        self.store.add(run.key(buffer), run.owner_of(buffer), [(self.island, d) for d in local_devices],
                       info.bytes_per_device, run.futures[buffer])

    def mesh(self, plan, slice_name: str):
        """Returns the JAX mesh of a slice of `plan` (cached)."""
        placement = plan.slices[slice_name]
        key = (placement.island, placement.devices, placement.shape, placement.axes)
        mesh = self._meshes.get(key)
        if mesh is None:
            devices = [self.device_map.device(placement.island, d) for d in placement.device_ids()]
            mesh = self._meshes[key] = make_mesh(devices, placement.shape, placement.axes)
        return mesh

    def _trace(self, name: str, kind: str, devices, arrays) -> None:
        tracer = self._tracer()
        if tracer is not None:
            tracer.record(name, kind, self.island, devices, arrays)


def _produced(step: Step) -> tuple[int, ...]:
    if step.kind == "launch":
        return step.outputs
    if step.kind in ("copy", "send", "recv"):
        return (step.dst_buffer,)
    return ()
