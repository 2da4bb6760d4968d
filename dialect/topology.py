"""The physical cluster: islands of devices joined by links.

An island is a group of identical devices joined by a fast interconnect (ICI);
islands are joined by the datacenter network (DCN). Devices are numbered
inside their island (0 .. hosts * devices_per_host - 1, host-major), so the
description stays O(islands) in size however many devices there are.

The same structure is read from a JSON file (`pw-opt --pass-pipeline=
'builtin.module(pw-place{topology=cluster.json})'`), carried in IR as the
`pw.topology` attribute of the top module, and built by the runtime's
resource manager from real devices.

    {"islands": [{"name": "island0", "device_kind": "cpu", "hosts": 1,
                  "devices_per_host": 4, "device_memory_bytes": 1073741824,
                  "ici": {"latency_us": 1.0, "bandwidth_gbps": 100.0},
                  "unavailable": [3]}],
     "dcn": {"latency_us": 100.0, "bandwidth_gbps": 25.0},
     "dcn_pairs": [["island0", "island1"]]}

`dcn_pairs` is optional: without it the DCN joins every pair of islands; with
it, only the listed pairs (in either direction) can exchange data.

A pass option names a topology either by a JSON file path or, for tests, as
`<islands>x<devices>` (`2x4`: two CPU islands of four devices each).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .input_files import parse_json, read_text


# The islands a topology may have: it holds one object per island, and a count far beyond any cluster's
# (`99999999999999999999x4`) took without bound.
MAX_ISLANDS = 1 << 12
MAX_DEVICES = (1 << 63) - 1     # devices of an island: the IR's i64


class TopologyError(ValueError):
    """A topology description that is malformed or inconsistent."""


@dataclass(frozen=True)
class Link:
    """A network link's one-way latency and bandwidth."""

    latency_us: float
    bandwidth_gbps: float

    def transfer_seconds(self, nbytes: int) -> float:
        """Returns the modelled time to move `nbytes` over this link."""
        return self.latency_us * 1e-6 + nbytes * 8 / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class Island:
    """Identical devices on one or more hosts, joined by ICI."""

    name: str
    device_kind: str
    hosts: int
    devices_per_host: int
    device_memory_bytes: int
    ici: Link
    unavailable: tuple[int, ...] = ()

    @property
    def num_devices(self) -> int:
        """Returns the number of devices, available or not."""
        return self.hosts * self.devices_per_host

    def host_of(self, device: int) -> int:
        """Returns the host that holds island-local device `device`."""
        return device // self.devices_per_host


@dataclass(frozen=True)
class Topology:
    """Islands and the DCN that joins them."""

    islands: tuple[Island, ...]
    dcn: Link
    metadata: Mapping[str, Any] = field(default_factory=dict)
    dcn_pairs: tuple[tuple[str, str], ...] | None = None  # None: DCN joins every pair

    def island(self, name: str) -> Island:
        """Returns the island called `name`."""
        for island in self.islands:
            if island.name == name:
                return island
        raise TopologyError(f"no island named '{name}' (islands: {', '.join(i.name for i in self.islands)})")

    def connected(self, src_island: str, dst_island: str) -> bool:
        """True if data can move directly between two islands (always inside one)."""
        if src_island == dst_island or self.dcn_pairs is None:
            return True
        return (src_island, dst_island) in self.dcn_pairs or (dst_island, src_island) in self.dcn_pairs

    def link(self, src_island: str, dst_island: str) -> tuple[str, Link]:
        """Returns the kind ("ici" or "dcn") and the link between two islands."""
        if src_island == dst_island:
            return "ici", self.island(src_island).ici
        if not self.connected(src_island, dst_island):
            raise TopologyError(f"no DCN link joins {src_island} and {dst_island}")
        return "dcn", self.dcn

    def without_device(self, island: str, device: int) -> "Topology":
        """Returns this topology with one device marked unavailable."""
        islands = tuple(replace(i, unavailable=tuple(sorted(set(i.unavailable) | {device})))
                        if i.name == island else i for i in self.islands)
        return replace(self, islands=islands)

    # -- conversion ---------------------------------------------------------

    def to_python(self) -> dict[str, Any]:
        """Returns the JSON-ready form (also the value of the `pw.topology` attribute)."""
        return {
            "islands": [{
                "name": i.name, "device_kind": i.device_kind, "hosts": i.hosts,
                "devices_per_host": i.devices_per_host, "device_memory_bytes": i.device_memory_bytes,
                "ici": {"latency_us": float(i.ici.latency_us), "bandwidth_gbps": float(i.ici.bandwidth_gbps)},
                **({"unavailable": tuple(i.unavailable)} if i.unavailable else {}),
            } for i in self.islands],
            "dcn": {"latency_us": float(self.dcn.latency_us), "bandwidth_gbps": float(self.dcn.bandwidth_gbps)},
            **({"dcn_pairs": [list(p) for p in self.dcn_pairs]} if self.dcn_pairs is not None else {}),
        }

    def to_json(self) -> str:
        """Returns the topology as JSON text."""
        value = self.to_python()
        for island in value["islands"]:
            if "unavailable" in island:
                island["unavailable"] = list(island["unavailable"])
        return json.dumps(value, indent=2)

    @staticmethod
    def from_python(value: Any, where: str = "topology") -> "Topology":
        """Builds a topology from its JSON-ready form, naming what is wrong if malformed."""
        if not isinstance(value, Mapping):
            raise TopologyError(f"{where}: expected an object with 'islands' and 'dcn'")
        islands_raw = _field(value, "islands", list, where)
        if not islands_raw:
            raise TopologyError(f"{where}: 'islands' is empty")
        if len(islands_raw) > MAX_ISLANDS:
            raise TopologyError(f"{where}: 'islands' has {len(islands_raw)} entries, more than the {MAX_ISLANDS} "
                                f"a topology may have")
        islands = []
        for n, raw in enumerate(islands_raw):
            at = f"{where}: islands[{n}]"
            if not isinstance(raw, Mapping):
                raise TopologyError(f"{at}: expected an object")
            island = Island(
                name=_name(raw, "name", at),
                device_kind=_name(raw, "device_kind", at),
                hosts=_positive(raw, "hosts", at),
                devices_per_host=_positive(raw, "devices_per_host", at),
                device_memory_bytes=_positive(raw, "device_memory_bytes", at),
                ici=_link(_field(raw, "ici", Mapping, at), f"{at}.ici"),
                unavailable=tuple(sorted(set(_device_list(raw.get("unavailable", ()), at)))),
            )
            if island.num_devices > MAX_DEVICES:
                raise TopologyError(f"{at}: {island.hosts} hosts of {island.devices_per_host} devices are more "
                                    f"devices than a 64-bit integer holds (the IR's i64)")
            bad = [d for d in island.unavailable if not 0 <= d < island.num_devices]
            if bad:
                raise TopologyError(f"{at}: unavailable device {bad[0]} is not in 0..{island.num_devices - 1}")
            islands.append(island)
        names = [i.name for i in islands]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise TopologyError(f"{where}: island name '{name}' is used twice")
            seen.add(name)
        dcn_pairs = None
        if "dcn_pairs" in value:
            dcn_pairs = _island_pairs(value["dcn_pairs"], names, where)
        return Topology(tuple(islands), _link(_field(value, "dcn", Mapping, where), f"{where}: dcn"),
                        dcn_pairs=dcn_pairs)

    @staticmethod
    def from_json(text: str, where: str = "topology") -> "Topology":
        """Parses JSON text (see the module docstring for the format)."""
        return Topology.from_python(parse_json(text, where, TopologyError), where)

    @staticmethod
    def load(path: str) -> "Topology":
        """Reads a topology JSON file."""
        return Topology.from_json(read_text(path, TopologyError, "topology"), path)

    @staticmethod
    def from_option(text: str) -> "Topology":
        """Reads a pass option: `<islands>x<devices>` for uniform CPU islands, else a JSON path."""
        counts = uniform_counts(text)
        if counts is not None and min(counts) > 0:
            return Topology.uniform(*counts)
        if re.fullmatch(r"[-+]?\d*x[-+]?\d*", text) and not os.path.exists(text):
            raise TopologyError(f"topology '{text}': expected ISLANDSxDEVICES, two positive integers such as 2x4, "
                                "or a topology JSON file")
        return Topology.load(text)

    @staticmethod
    def uniform(islands: int, devices_per_island: int, device_kind: str = "cpu",
                device_memory_bytes: int = 1 << 30, hosts_per_island: int = 1,
                ici: Link = Link(1.0, 100.0), dcn: Link = Link(100.0, 25.0)) -> "Topology":
        """Returns `islands` identical islands named island0, island1, ..."""
        if devices_per_island % hosts_per_island:
            raise TopologyError("devices_per_island must divide evenly over hosts_per_island")
        return Topology(tuple(
            Island(f"island{i}", device_kind, hosts_per_island, devices_per_island // hosts_per_island,
                   device_memory_bytes, ici) for i in range(islands)), dcn)


def uniform_counts(text: str) -> tuple[int, int] | None:
    """Reads `<islands>x<devices>`: the two counts, or None for other text. Raises TopologyError for more than
    `MAX_ISLANDS` islands or `MAX_DEVICES` devices an island, as the JSON form does."""
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if match is None:
        return None
    # By their digits first: int() refuses a string of more than 4300.
    if len(match[1].lstrip("0")) > 6 or int(match[1]) > MAX_ISLANDS:
        raise TopologyError(f"topology '{text:.60}': more than the {MAX_ISLANDS} islands a topology may have")
    if len(match[2].lstrip("0")) > 19 or int(match[2]) > MAX_DEVICES:
        raise TopologyError(f"topology '{text:.60}': more devices an island than a 64-bit integer holds "
                            f"(the IR's i64)")
    return int(match[1]), int(match[2])


def _field(raw: Mapping, key: str, kind, where: str):
    if key not in raw:
        raise TopologyError(f"{where}: missing '{key}'")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        kind_name = getattr(kind, "__name__", str(kind))
        raise TopologyError(f"{where}: '{key}' must be {kind_name}, not {type(value).__name__}")
    return value


def _name(raw: Mapping, key: str, where: str) -> str:
    """A name that every message quotes: non-empty and printable (a newline in it would break each one line)."""
    value = _field(raw, key, str, where)
    if not value or not value.isprintable():
        raise TopologyError(f"{where}: '{key}' must be a non-empty printable name, not {value[:40]!r}")
    return value


def _positive(raw: Mapping, key: str, where: str) -> int:
    value = _field(raw, key, int, where)
    if value <= 0:
        raise TopologyError(f"{where}: '{key}' must be positive, not {value}")
    if value >= 1 << 63:
        raise TopologyError(f"{where}: '{key}' is {value}, more than a 64-bit integer holds (the IR's i64)")
    return value


def _number(raw: Mapping, key: str, where: str, positive: bool) -> float:
    if key not in raw:
        raise TopologyError(f"{where}: missing '{key}'")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= sys.float_info.max:
        raise TopologyError(f"{where}: '{key}' must be a finite number, not {value!r:.40}")
    if value < 0 or (positive and value == 0):
        raise TopologyError(f"{where}: '{key}' must be {'positive' if positive else 'non-negative'}")
    return float(value)


def _link(raw: Mapping, where: str) -> Link:
    return Link(_number(raw, "latency_us", where, positive=False),
                _number(raw, "bandwidth_gbps", where, positive=True))


def _island_pairs(raw, names: list[str], where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in raw):
        raise TopologyError(f"{where}: 'dcn_pairs' must be a list of [island, island] pairs")
    for pair in raw:
        for name in pair:
            if name not in names:
                raise TopologyError(f"{where}: 'dcn_pairs' names unknown island '{name}'")
    return tuple((a, b) for a, b in raw)


def _device_list(raw, where: str) -> list[int]:
    if not isinstance(raw, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise TopologyError(f"{where}: 'unavailable' must be a list of device ids")
    return list(raw)
