"""Accelerator, link and host descriptions the simulator times plans with.

A profile is a JSON file (`dialect/profiles/<name>.json`, or any path); the
bundled ones are also the device-rate table placement and admission read
(`dialect/device_time.py`), so there is one set of figures:

    {"name": "tpu-v4", "device_kinds": ["tpu-v4"],
     "accelerator": {"peak_tflops": 275, "memory_gbytes_per_s": 1200,
                     "memory_bytes": 34359738368, "launch_us": 5, "devices_per_host": 4},
     "ici": {"latency_us": 1, "bandwidth_gbps": 400},
     "dcn": {"latency_us": 10, "bandwidth_gbps": 50},
     "pcie": {"latency_us": 5, "bandwidth_gbps": 128},
     "host": {"run_us": 40, "input_us": 10, "message_us": 10, "message_latency_us": 10,
              "per_host_us": 2, "step_us": 10, "sequential_step_us": 60},
     "sources": {"accelerator": "...", ...}}

- accelerator: a launch takes `launch_us` plus, on each device,
  `launch_device_us` (0 by default) and the larger of its flops over the
  peak and its bytes over the memory bandwidth (a roofline); a run is
  admitted against `memory_bytes` per device. `shared_cores` (optional, 0
  by default) says all devices share that many cores, as CPU devices do:
  a launch's per-device work then queues for them, and launches on
  different slices do not overlap. `synchronous` (0 or 1, 0 by default): a
  launch or copy holds the host thread that makes it until it is over, as
  XLA:CPU does with a computation on several devices (measured here: the
  call of a jitted function on 2 CPU devices returns after 97 us, and a
  chain of them takes 97 us a call). `reshard_us` (0 by default): what a
  copy inside an island costs, before its ICI transfer, when the array's
  layout changes (the destination slice has another mesh shape, or the
  buffer another partitioning): JAX's `device_put` then reshards it, where
  a copy to the same layout on other devices moves each shard as it is
  (measured here alone: 132 us from 2 devices to 2 others, 195-227 us from
  2 to 1, 2 to 2x2 and 2x2 to 2; a cond's moves are such copies too).
- ici / dcn / pcie: one-way latency and bandwidth in Gbit/s, per device
  (DCN: a host's NICs shared by its devices; PCIe: host to device, which
  program inputs cross). An all-reduce inside a launch runs on the ICI
  (sim/network.py).
- host: the controller's work per run (`run_us`) and per message
  (`message_us`), a message's flight time (`message_latency_us`), an
  island's fan-out of a run to each of its hosts (`per_host_us`), its work
  per program input it puts on devices (`input_us`; in parallel dispatch,
  `launch_input_us` for an input the launch that reads it places itself,
  `ProgramPlan.launch_placed`), per step (`step_us`)
  and per recv whose data arrived (`recv_us`: the delivery is moved to its
  home sharding on the island's thread), and the controller's work per step
  when dispatch is sequential (`sequential_step_us`), per `pw.cond`
  beside the branch's call (`cond_us`: the predicate read to the host), and
  per run with conds in parallel dispatch (`cond_thread_us`: the thread of
  its own that runs them, half to start it and half as it ends). `inline`
  (0 or 1, 0 by default): as the embedded runtime does, a run admitted at its call has the
  work of each island that is idle then run by the controller's thread
  itself, island after island, until it parks at a recv or is done; the
  controller goes on after that.
  `interpreter_lock` (0 or 1, 0 by default): all host work, the
  controller's and every island thread's, takes one lock, so no two pieces
  of it run at once, as the embedded runtime's Python threads share one
  interpreter lock (the GIL; an XLA call lets go of it while it computes).

Rates (`peak_tflops`, `memory_gbytes_per_s`, `bandwidth_gbps`) are at
least 1e-6, and fixed costs (`*_us`) at most 1e12 us, so that every
simulated time is finite; whole numbers (`memory_bytes`, ...) are below 2^63.

`sources` cites where each figure comes from; a figure that is assumed or
fitted says so there.
"""

from __future__ import annotations

import pathlib
import sys
from dataclasses import MISSING, dataclass, fields
from typing import Any

from pathways_mlir.dialect.device_time import PROFILE_DIR
from pathways_mlir.dialect.input_files import read_json

# The least rates and sizes a profile may give (a rate of 5e-324 made every simulated time infinite), and the
# most microseconds a fixed cost may take: a simulated time stays a finite number of seconds.
_LEAST = {"peak_tflops": 1e-6, "memory_gbytes_per_s": 1e-6, "bandwidth_gbps": 1e-6, "devices_per_host": 1,
          "memory_bytes": 1}
MAX_US = 1e12
MAX_INT = 2 ** 63 - 1      # the most an int field may be: the topology's device memory reaches the IR as an i64


class ProfileError(ValueError):
    """A profile file that is missing, malformed, or cannot describe a plan."""


@dataclass(frozen=True)
class Accelerator:
    """One device: its rates, fixed cost per launch, memory, and devices per host."""

    peak_tflops: float
    memory_gbytes_per_s: float
    memory_bytes: int
    launch_us: float
    devices_per_host: int
    shared_cores: int = 0       # 0: every device computes on its own; k: all devices share k cores (CPU)
    synchronous: int = 0        # 1: a launch or copy holds the thread that makes it until it is over
    launch_device_us: float = 0.0   # a launch's fixed cost on each device, beside `launch_us` once
    reshard_us: float = 0.0     # a copy that changes its array's layout: the reshard, before the ICI transfer

    def launch_seconds(self, flops: float, nbytes: float, devices: int) -> float:
        """Returns a launch's time on `devices` devices, each doing `flops` and `nbytes`.

        The launch costs `launch_us` once, and each device `launch_device_us`
        plus the roofline of its work; devices run side by side, or, with
        shared cores, `shared_cores` at a time. (Measured here: a tiny jitted
        launch on 2, 4 and 8 CPU devices takes about 97, 133 and 149 us: a
        part per launch and a part per device, not 1 : 2 : 4.)
        """
        one = self.launch_device_us * 1e-6 + max(flops / (self.peak_tflops * 1e12),
                                                 nbytes / (self.memory_gbytes_per_s * 1e9))
        if self.shared_cores:
            one *= devices / min(devices, self.shared_cores)
        return self.launch_us * 1e-6 + one


@dataclass(frozen=True)
class LinkSpec:
    """A link's one-way latency and bandwidth (Gbit/s)."""

    latency_us: float
    bandwidth_gbps: float

    def serialise_seconds(self, nbytes: float) -> float:
        """Returns the time `nbytes` occupy the link (latency excluded)."""
        return nbytes * 8 / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class Host:
    """Host-side dispatch costs, in microseconds (see the module docstring)."""

    run_us: float
    input_us: float
    message_us: float
    message_latency_us: float
    per_host_us: float
    step_us: float
    sequential_step_us: float
    recv_us: float = 0.0        # an island's work to take in a peer's send (the runtime's `deliver`)
    cond_us: float = 0.0        # the controller's work per `pw.cond`: the predicate read to the host
    cond_thread_us: float = 0.0  # per run with conds, parallel dispatch: starting and ending its cond thread
    inline: int = 0             # 1: the caller runs an idle island's work itself (the embedded runtime)
    interpreter_lock: int = 0   # 1: all host threads' work takes one lock (CPython's GIL), one piece at a time
    launch_input_us: float = 0.0  # parallel dispatch: a launch's work to place a host input it reads itself


@dataclass(frozen=True)
class Profile:
    """A simulated machine: device kinds it describes, accelerator, links, host."""

    name: str
    device_kinds: tuple[str, ...]
    accelerator: Accelerator
    ici: LinkSpec
    dcn: LinkSpec
    pcie: LinkSpec
    host: Host
    sources: dict[str, str]

    def to_python(self) -> dict[str, Any]:
        """Returns the profile's JSON-ready form."""
        return {"name": self.name, "device_kinds": list(self.device_kinds),
                "accelerator": _values(self.accelerator), "ici": _values(self.ici), "dcn": _values(self.dcn),
                "pcie": _values(self.pcie),
                "host": _values(self.host), "sources": dict(self.sources)}

    @staticmethod
    def from_python(value: Any, where: str) -> "Profile":
        """Builds a profile from its JSON form; ProfileError names the field at fault."""
        if not isinstance(value, dict):
            raise ProfileError(f"{where}: expected a JSON object")
        kinds = value.get("device_kinds")
        if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
            raise ProfileError(f"{where}: 'device_kinds' must be a non-empty list of strings")
        sources = value.get("sources", {})
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise ProfileError(f"{where}: 'sources' must map names to citations")
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{where}: 'name' must be a non-empty string")
        return Profile(name, tuple(kinds), _record(Accelerator, value, "accelerator", where),
                       _record(LinkSpec, value, "ici", where), _record(LinkSpec, value, "dcn", where),
                       _record(LinkSpec, value, "pcie", where),
                       _record(Host, value, "host", where), dict(sources))


def load_profile(name_or_path: str) -> Profile:
    """Reads a profile by name (`tpu-v4`, `cpu-here`, ...) or from a JSON file path."""
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ProfileError(f"no profile named '{name_or_path}' (profiles: {', '.join(profile_names())})")
    return Profile.from_python(read_json(path, ProfileError, "profile"), str(path))


def profile_of_kind(device_kind: str) -> Profile:
    """Returns the bundled profile that describes `device_kind` (at most one does: dialect/device_time.py
    refuses a kind two profiles list)."""
    for name in profile_names():
        profile = load_profile(name)
        if device_kind in profile.device_kinds:
            return profile
    raise ProfileError(f"no bundled profile describes device kind '{device_kind}' (profiles: "
                       f"{', '.join(profile_names())})")


def profile_names() -> list[str]:
    """Returns the names of the bundled profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def _values(record) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _record(cls, value: dict, key: str, where: str):
    raw = value.get(key)
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: missing object '{key}'")
    kwargs = {}
    for f in fields(cls):
        v = raw.get(f.name, f.default if f.default is not MISSING else None)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= sys.float_info.max:
            raise ProfileError(f"{where}: {key}.{f.name} must be a finite non-negative number, not {v!r:.40}")
        kwargs[f.name] = int(v) if f.type == "int" else float(v)
    for f in fields(cls):
        least = _LEAST.get(f.name)
        if least is not None and kwargs[f.name] < least:
            raise ProfileError(f"{where}: {key}.{f.name} must be at least {least:g}, not {kwargs[f.name]:g}")
        if f.type == "int" and kwargs[f.name] > MAX_INT:
            raise ProfileError(f"{where}: {key}.{f.name} must be below 2^63 (an i64), not {kwargs[f.name]:g}")
        if f.name.endswith("_us") and kwargs[f.name] > MAX_US:
            raise ProfileError(f"{where}: {key}.{f.name} must be at most {MAX_US:g} us, not {kwargs[f.name]:g}")
    unknown = set(raw) - {f.name for f in fields(cls)}
    if unknown:
        raise ProfileError(f"{where}: {key} has no field '{sorted(unknown)[0]}'")
    return cls(**kwargs)
