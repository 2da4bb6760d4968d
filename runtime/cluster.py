"""The embedded cluster: JAX devices grouped into islands.

On a machine without accelerators the embedded backend uses JAX CPU devices,
made with `XLA_FLAGS=--xla_force_host_platform_device_count=N` before JAX
starts, split evenly into islands. The shape comes from `PW_CLUSTER`
("ISLANDSxDEVICES", default "2x4") or `pathways_mlir.configure(...)`. On
accelerators every device of the default backend is used, grouped into
islands by `slice_index` where the platform reports one, else one island.
"""

from __future__ import annotations

import importlib.abc
import os
import re
import sys
from dataclasses import dataclass

from pathways_mlir.dialect.topology import Island, Link, Topology

CLUSTER_ENV = "PW_CLUSTER"
DEFAULT_SHAPE = (2, 4)
_FLAG = "--xla_force_host_platform_device_count"
_asked: int | None = None     # the CPU device count asked for in XLA_FLAGS here (None: none, or the user's flag)
# The modelled links of the embedded cluster. DCN emulation (off unless asked
# for) sleeps for the DCN link's modelled time on every cross-island move.
EMBEDDED_ICI = Link(latency_us=1.0, bandwidth_gbps=100.0)
EMBEDDED_DCN = Link(latency_us=100.0, bandwidth_gbps=25.0)
EMBEDDED_DEVICE_MEMORY = 1 << 30
# The most CPU devices an embedded cluster asks XLA for (XLA reads its device-count flag as a 32-bit int and
# aborts on a larger one, printing every flag it has).
MAX_HOST_DEVICES = 4096


class ClusterError(RuntimeError):
    """The requested cluster cannot be made: from the devices JAX has, or (Ray backend) from the Ray cluster's
    nodes, or an island's actor cannot be reached or restored."""


def requested_shape() -> tuple[int, int]:
    """Returns (islands, devices per island) from `PW_CLUSTER`, or the default."""
    text = os.environ.get(CLUSTER_ENV, "")
    if not text:
        return DEFAULT_SHAPE
    return parse_shape(text, f"{CLUSTER_ENV}={text!r}")


def parse_shape(text: str, source: str) -> tuple[int, int]:
    """Returns (islands, devices per island) from `text`, "ISLANDSxDEVICES"; raises ClusterError naming
    `source`, where the text came from (`PW_CLUSTER='2x'`, or a command line's option)."""
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ClusterError(f"{source}: expected ISLANDSxDEVICES, e.g. 2x4")
    islands, per_island = int(match.group(1)), int(match.group(2))
    if islands * per_island > MAX_HOST_DEVICES:
        raise ClusterError(f"{source}: {islands * per_island} CPU devices; an embedded cluster has at most "
                           f"{MAX_HOST_DEVICES}")
    return islands, per_island


def prepare_host_devices(count: int | None = None) -> None:
    """Asks XLA for `count` CPU devices (default: what `PW_CLUSTER` needs).

    Takes effect only before JAX creates its CPU backend; a device-count
    flag the user put in `XLA_FLAGS` is kept, and one asked for here before
    is raised to `count` (`pw.configure` asks for its cluster's devices).
    """
    global _asked
    if count is None:
        islands, per_island = requested_shape()
        count = islands * per_island
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={count}".strip()
        _asked = count
    elif _asked is not None and count > _asked:
        os.environ["XLA_FLAGS"] = re.sub(rf"{_FLAG}=\d+", f"{_FLAG}={count}", flags)
        _asked = count


class _BeforeJax(importlib.abc.MetaPathFinder):
    """Prepares the host devices when `jax` is first imported; finds nothing itself."""

    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "jax" and not self.done:
            self.done = True
            _prepare_if_valid()
        return None


def prepare_host_devices_before_jax() -> None:
    """Asks XLA for `PW_CLUSTER`'s CPU devices before JAX starts; never raises.

    Runs now if JAX is already imported, else when it first is, so that a
    process that never uses JAX (`pw-opt`) never reads `PW_CLUSTER`. A
    malformed `PW_CLUSTER` is left alone here: it is an error where the
    cluster is made.
    """
    if "jax" in sys.modules:
        _prepare_if_valid()
    elif not any(isinstance(f, _BeforeJax) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeJax())


def _prepare_if_valid() -> None:
    try:
        prepare_host_devices()
    except ClusterError:
        pass  # reported by requested_shape() where the cluster is made


@dataclass(frozen=True)
class DeviceMap:
    """The topology of a set of JAX devices and where each island-local id lives."""

    topology: Topology
    devices: dict[str, tuple]   # island name -> JAX devices by island-local id

    def device(self, island: str, local_id: int):
        """Returns the JAX device of island-local device `local_id`."""
        return self.devices[island][local_id]


def embedded_topology(islands: int, per_island: int,
                      device_memory_bytes: int = EMBEDDED_DEVICE_MEMORY) -> Topology:
    """Returns the topology of `islands` islands of `per_island` CPU devices each."""
    return Topology(tuple(Island(f"island{i}", "cpu", 1, per_island, device_memory_bytes, EMBEDDED_ICI)
                          for i in range(islands)), EMBEDDED_DCN)


def embedded_device_map(islands: int | None = None, per_island: int | None = None,
                        device_memory_bytes: int = EMBEDDED_DEVICE_MEMORY) -> DeviceMap:
    """Groups the default backend's JAX devices into islands.

    CPU: `islands` x `per_island` devices (default from `PW_CLUSTER`).
    Accelerators: islands by `slice_index` (one island if absent).
    """
    import jax

    devices = jax.devices()
    if devices[0].platform == "cpu":
        if islands is None or per_island is None:
            islands, per_island = requested_shape()
        if len(devices) < islands * per_island:
            raise ClusterError(
                f"the embedded cluster needs {islands * per_island} CPU devices but JAX has {len(devices)}: "
                f"import pathways_mlir (or call pathways_mlir.configure) before JAX is first used, or set "
                f"XLA_FLAGS={_FLAG}={islands * per_island}")
        topology = embedded_topology(islands, per_island, device_memory_bytes)
        return DeviceMap(topology, {island.name: tuple(devices[i * per_island:(i + 1) * per_island])
                                    for i, island in enumerate(topology.islands)})
    by_slice: dict[int, list] = {}
    for d in devices:
        by_slice.setdefault(getattr(d, "slice_index", 0) or 0, []).append(d)
    groups = [by_slice[k] for k in sorted(by_slice)]
    island_list, mapping = [], {}
    for i, group in enumerate(groups):
        name = f"island{i}"
        memory = _device_memory(group[0], device_memory_bytes)
        island_list.append(Island(name, group[0].device_kind.lower().replace(" ", "_"), 1, len(group),
                                  memory, EMBEDDED_ICI))
        mapping[name] = tuple(group)
    return DeviceMap(Topology(tuple(island_list), EMBEDDED_DCN), mapping)


def _device_memory(device, default: int) -> int:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return default
