"""Backends: where a runtime's islands run, and the options only that place has.

A backend starts a runtime's islands (an `Islands` group, which says what
its islands can do: `fast_lanes`, `traces`, `keep_arguments`, and watches
them where they can die on their own) and names the options of `Runtime` that only it takes. `Runtime(backend=name)`
looks it up here; nothing else in the runtime asks which backend it runs on.

- `embedded` (the default): every island in this process, on its JAX
  devices; option `wedge_timeout`.
- `ray`: each island in its own Ray actor (`runtime/ray_backend/`); option
  `address`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .cluster import DeviceMap, embedded_device_map, embedded_topology, requested_shape
from .island import Island
from .island_work import Islands
from .transfers import DcnTransport


@dataclass(frozen=True)
class Started:
    """What a backend starts: the device map the resource manager reads, the islands, the DCN transport
    (embedded islands move arrays between them in this process)."""

    device_map: DeviceMap
    islands: Islands
    transport: DcnTransport | None


@dataclass(frozen=True)
class Backend:
    """A place islands run: its name, its own options of `Runtime` with their defaults, and how it starts."""

    name: str
    options: dict[str, Any]
    start: Callable[..., Started]


def _start_embedded(device_map: DeviceMap | None, islands: int | None, per_island: int | None,
                    emulate_dcn: bool, peer: Callable[[str], Island]) -> Started:
    device_map = device_map or embedded_device_map(islands, per_island)
    transport = DcnTransport(emulate=emulate_dcn)
    return Started(device_map, Islands({island.name: Island(island.name, device_map, transport, peer)
                                        for island in device_map.topology.islands}), transport)


def _start_ray(device_map: DeviceMap | None, islands: int | None, per_island: int | None, emulate_dcn: bool,
               peer: Callable[[str], Island], address: str | None) -> Started:
    from .ray_backend import start_islands

    if device_map is not None:
        raise ValueError("device_map= gives this process's devices to the embedded backend; on Ray each island "
                         "actor has its own: give islands= and per_island=")
    topology = embedded_topology(*(requested_shape() if islands is None else (islands, per_island)))
    return Started(DeviceMap(topology, {}), start_islands(topology, emulate_dcn, address), None)


BACKENDS = {
    "embedded": Backend("embedded", {"wedge_timeout": None}, _start_embedded),
    "ray": Backend("ray", {"address": None}, _start_ray),
}


def backend_named(name: str, options: dict[str, Any]) -> Backend:
    """Returns backend `name`, checking that every option in `options` not at its default is one of its own;
    raises ValueError in one line naming the option and the backend it belongs to."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise ValueError(f"unknown backend '{name}' (choose from {', '.join(BACKENDS)})")
    for option, value in options.items():
        owner = next(b for b in BACKENDS.values() if option in b.options)
        if owner is not backend and value != owner.options[option]:
            raise ValueError(f"{option}= is an option of the {owner.name} backend: it needs backend='{owner.name}'")
    return backend
