"""The runtime: every part of Pathways, on JAX devices.

A `Runtime` owns the resource manager, one `Island` per island (its devices,
object-store shard, compile cache and dispatch thread), the gang scheduler
and the DCN transport. `get_runtime()` returns the
process's default runtime, created on first use from `PW_CLUSTER` (default
two islands of four devices) or from the last `configure(...)` call.
"""

from __future__ import annotations

import atexit
import threading

from pathways_mlir.dialect.plan import ProgramPlan

from .cluster import DeviceMap, embedded_device_map, embedded_topology, requested_shape

from .island import Island
from .resource_manager import ResourceManager
from .scheduler import GangScheduler
from .tracing import Tracer
from .transfers import DcnTransport
from .workers import Workers


BACKENDS = ("embedded", "ray")


class Runtime:
    """A Pathways cluster: islands of JAX devices, in this process or in Ray actors.

    `backend="embedded"` (the default) runs every island in this process on
    its JAX devices; `backend="ray"` runs each island in its own Ray actor
    (`runtime/ray_backend.py`), with `islands` x `per_island` CPU devices
    each here. Both run the same plans through the same island messages.
    """

    def __init__(self, device_map: DeviceMap | None = None, policy: str = "fifo", window: int = 4,
                 emulate_dcn: bool = False, device_memory_bytes: int | None = None, backend: str = "embedded",
                 islands: int | None = None, per_island: int | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend '{backend}' (choose from {', '.join(BACKENDS)})")
        self.backend = backend
        self.tracer: Tracer | None = None
        self.transport: DcnTransport | None = None
        if backend == "ray":
            from .ray_backend import start_islands

            topology = embedded_topology(*(requested_shape() if islands is None else (islands, per_island)))
            device_map = DeviceMap(topology, {})
            self.islands = start_islands(topology, emulate_dcn, device_memory_bytes)
        else:
            device_map = device_map or embedded_device_map(islands, per_island)
            self.transport = DcnTransport(emulate=emulate_dcn)
            self.islands = {
                island.name: Island(island.name, device_map, self.transport, lambda name: self.islands[name],
                                    device_memory_bytes, lambda: self.tracer)
                for island in device_map.topology.islands}
        self.resources = ResourceManager(device_map)
        self.scheduler = GangScheduler(self.islands, policy, window)
        self.watchers = Workers(4, "pw-watch")
        self._loaded: dict[int, ProgramPlan] = {}
        self._lock = threading.Lock()

    def load(self, plan: ProgramPlan) -> int:
        """Sends a plan to the islands it uses (once); returns its key for later messages."""
        key = id(plan)
        with self._lock:
            if self._loaded.get(key) is plan:
                return key
            self._loaded[key] = plan      # kept, so that the key stays unique
        for island in {*plan.islands, *(p.island for p in plan.slices.values())}:
            if island in self.islands:
                self.islands[island].load(key, plan)
        return key

    def usage(self) -> dict:
        """Returns the bytes in use on every device, by (island, device)."""
        return {d: n for island in self.islands.values() for d, n in island.usage().items()}

    def object_count(self) -> int:
        """Returns how many buffers the islands hold."""
        return sum(island.object_count() for island in self.islands.values())

    def owned_by(self, owner) -> list:
        """Returns the keys of every buffer `owner` holds, on any island."""
        return [key for island in self.islands.values() for key in island.owned_by(owner)]

    def release_owner(self, owner) -> int:
        """Releases every buffer of `owner` on every island; returns how many."""
        return sum(island.release_owner(owner) for island in self.islands.values())

    def compilations(self) -> int:
        """Returns how many executables the islands have compiled."""
        return sum(island.compilations() for island in self.islands.values())

    def start_tracing(self) -> Tracer:
        """Starts recording a trace of every step executed from now on (embedded backend)."""
        if self.backend != "embedded":
            raise RuntimeError("traces are recorded by the embedded backend only")
        self.tracer = Tracer()
        return self.tracer

    def stop_tracing(self) -> Tracer | None:
        """Stops recording; returns the trace."""
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            tracer.flush()
            tracer.close()
        return tracer

    def close(self) -> None:
        """Stops the runtime's threads after the work already queued."""
        for island in self.islands.values():
            island.close()
        self.scheduler.close()
        self.watchers.close()
        if self.transport is not None:
            self.transport.close()


_default: Runtime | None = None
_default_options: dict = {}
_default_lock = threading.Lock()


def configure(**options) -> None:
    """Sets the options of the default runtime (see `Runtime`); replaces one already made."""
    global _default, _default_options
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
        _default_options = dict(options)


def get_runtime() -> Runtime:
    """Returns the process's default runtime, creating it on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime(**_default_options)
            atexit.register(_close_default)
        return _default


def _close_default() -> None:
    """Stops the default runtime's threads before the interpreter (and JAX) shut down."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
