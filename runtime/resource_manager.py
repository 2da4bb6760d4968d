"""The resource manager: the cluster's topology as devices come and go.

It builds the topology from the real devices (`cluster.embedded_device_map`),
marks devices unavailable when they are removed and available again when
they are added back, takes a lost island out whole and puts it back when it
returns, and bumps a version number on every change. Clients keep
their programs device-agnostic and lower them again whenever the version they
lowered against is stale, so affected programs re-place onto the remaining
devices and continue.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from pathways_mlir.dialect.topology import Island, Topology

from .cluster import DeviceMap


class TopologyChanged(RuntimeError):
    """A plan was lowered for an older version of the topology than the cluster's; lower it again."""


class ResourceManager:
    """The current topology of the cluster, with a version number."""

    def __init__(self, device_map: DeviceMap):
        self.device_map = device_map
        self._topology = device_map.topology
        self._version = 0
        self._removed: dict[str, Island] = {}     # islands taken out whole, as they were
        self._lock = threading.Lock()

    @property
    def topology(self) -> Topology:
        with self._lock:
            return self._topology

    @property
    def version(self) -> int:
        """The topology's version (read without the lock, as every call of a program reads it: one attribute
        read is atomic; `snapshot` reads it together with the topology)."""
        return self._version

    def snapshot(self) -> tuple[int, Topology]:
        """Returns (version, topology) read together."""
        with self._lock:
            return self._version, self._topology

    def remove_device(self, island: str, device: int) -> int:
        """Takes a device out of service; returns the new version."""
        with self._lock:
            self._check(island, device)
            self._topology = self._topology.without_device(island, device)
            self._version += 1
            return self._version

    def add_device(self, island: str, device: int) -> int:
        """Puts a removed device back in service; returns the new version."""
        with self._lock:
            self._check(island, device)
            islands = tuple(
                Island(i.name, i.device_kind, i.hosts, i.devices_per_host, i.device_memory_bytes, i.ici,
                       tuple(d for d in i.unavailable if d != device)) if i.name == island else i
                for i in self._topology.islands)
            self._topology = Topology(islands, self._topology.dcn, self._topology.metadata)
            self._version += 1
            return self._version

    def remove_island(self, island: str) -> int:
        """Takes a whole island out of the topology (its host was lost); returns the new version."""
        with self._lock:
            self._removed[island] = self._topology.island(island)
            self._topology = replace(self._topology, islands=tuple(i for i in self._topology.islands
                                                                   if i.name != island))
            self._version += 1
            return self._version

    def add_island(self, island: str) -> int:
        """Puts an island taken out by `remove_island` back, in its place; returns the new version."""
        with self._lock:
            if island not in self._removed:
                raise ValueError(f"island '{island}' was not removed")
            order = [i.name for i in self.device_map.topology.islands]
            islands = sorted((*self._topology.islands, self._removed.pop(island)), key=lambda i: order.index(i.name))
            self._topology = replace(self._topology, islands=tuple(islands))
            self._version += 1
            return self._version

    def _check(self, island: str, device: int) -> None:
        found = self._topology.island(island)
        if not 0 <= device < found.num_devices:
            raise ValueError(f"{island} has devices 0..{found.num_devices - 1}, not {device}")
