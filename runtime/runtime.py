"""The embedded runtime: every part of Pathways in one process on JAX devices.

A `Runtime` owns the resource manager, the object store, one executor per
island, the gang scheduler and the DCN transport. `get_runtime()` returns the
process's default runtime, created on first use from `PW_CLUSTER` (default
two islands of four devices) or from the last `configure(...)` call.
"""

from __future__ import annotations

import atexit
import threading

from .cluster import DeviceMap, embedded_device_map
from .executables import ExecutableCache
from .executor import IslandExecutor
from .object_store import ObjectStore
from .resource_manager import ResourceManager
from .scheduler import GangScheduler
from .tracing import Tracer
from .transfers import DcnTransport
from .workers import Workers


class Runtime:
    """An embedded Pathways cluster: islands of JAX devices in this process."""

    def __init__(self, device_map: DeviceMap | None = None, policy: str = "fifo", window: int = 4,
                 emulate_dcn: bool = False, device_memory_bytes: int | None = None):
        device_map = device_map or embedded_device_map()
        self.resources = ResourceManager(device_map)
        topology = device_map.topology
        self.store = ObjectStore({
            (island.name, d): device_memory_bytes or island.device_memory_bytes
            for island in topology.islands for d in range(island.num_devices)})
        self.transport = DcnTransport(emulate=emulate_dcn)
        self.cache = ExecutableCache()
        self.tracer: Tracer | None = None
        self.executors = {
            island.name: IslandExecutor(island.name, device_map, self.store, self.transport, self.cache,
                                        lambda: self.tracer)
            for island in topology.islands}
        self.scheduler = GangScheduler(self.executors, policy, window)
        self.watchers = Workers(4, "pw-watch")

    def start_tracing(self) -> Tracer:
        """Starts recording a trace of every step executed from now on."""
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
        for executor in self.executors.values():
            executor.close()
        self.scheduler.close()
        self.watchers.close()
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
