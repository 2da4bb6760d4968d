"""Execution plans: what each island's executors do for one lowered program.

`pw-emit-plans` writes one `builtin.module {pw.island_plan}` per island into
the IR (readable in lit tests); this module is the same content as plain
Python data, serialised to compact JSON for a runtime in another process.

A `ProgramPlan` is self-contained: the topology, every slice's placement,
every buffer's shape, dtype, sharding and home, every compiled function's
`jax.export` serialisation, and per island the steps in the island's
consistent order. Steps name buffers by integer id and have ids unique in
the program, so `after` can name a step of another island (a `recv` waits
for its `send`).

Step kinds:
    launch  run an executable on a slice's devices: inputs -> outputs
    copy    move/reshard a buffer between two slices of the same island (ICI)
    send    hand a buffer to another island over DCN (pairs with a recv)
    recv    receive a buffer from another island (pairs with a send)
    cond    host step: read a tensor<i1> buffer, run `then` or `else` plan
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .topology import Topology

StepKind = Literal["launch", "copy", "send", "recv", "cond"]


@dataclass(frozen=True)
class SlicePlacement:
    """Where a virtual slice lives: island and island-local device ranges."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    island: str
    devices: tuple[int, ...]   # half-open ranges [b0, e0, b1, e1, ...] in mesh order

    def device_ids(self) -> list[int]:
        """Returns the island-local device ids in mesh order (O(size): runtime use only)."""
        return [d for b, e in zip(self.devices[::2], self.devices[1::2]) for d in range(b, e)]


@dataclass(frozen=True)
class BufferInfo:
    """A logical sharded buffer: one id however many shards it has."""

    id: int
    shape: tuple[int, ...]
    dtype: str                        # MLIR element type: "f32", "bf16", "i32", "i1", ...
    slice: str | None                 # None: a host value (program input before placement)
    sharding: tuple[tuple[str, ...], ...]
    bytes_per_device: int             # the size of one shard, for memory accounting


@dataclass(frozen=True)
class Step:
    """One entry of an island's plan, in the island's consistent order."""

    id: int
    kind: StepKind
    after: tuple[int, ...] = ()
    subgraph: int = 0
    label: str = ""
    # launch
    executable: str = ""
    slice: str = ""
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    # copy / send / recv
    src_buffer: int = -1
    dst_buffer: int = -1
    link: str = ""
    peer: str = ""                    # the other island of a send or recv
    bytes: int = 0
    # cond
    pred_buffer: int = -1
    then_plan: "ProgramPlan | None" = None
    else_plan: "ProgramPlan | None" = None


@dataclass(frozen=True)
class Subgraph:
    """A set of steps dispatched as one unit; static if resources are known up front."""

    id: int
    static: bool
    islands: tuple[str, ...]


@dataclass(frozen=True)
class ProgramPlan:
    """Everything a runtime needs to run one lowered program."""

    program: str
    topology: Topology
    slices: dict[str, SlicePlacement]
    buffers: dict[int, BufferInfo]
    executables: dict[str, str]       # name -> base64 jax.export serialisation ("" if none)
    inputs: tuple[int, ...]           # buffers the caller provides, in argument order
    outputs: tuple[int, ...]          # buffers returned, in result order
    islands: dict[str, tuple[Step, ...]]
    subgraphs: tuple[Subgraph, ...] = ()
    host_steps: tuple[Step, ...] = ()  # cond steps, run by the client between subgraphs

    # -- serialisation ----------------------------------------------------

    def to_python(self) -> dict[str, Any]:
        """Returns a JSON-ready dict (compact: default-valued step fields are left out)."""
        return {
            "program": self.program,
            "topology": _jsonable(self.topology.to_python()),
            "slices": {k: _jsonable(asdict(v)) for k, v in self.slices.items()},
            "buffers": [_jsonable(asdict(b)) for b in self.buffers.values()],
            "executables": dict(self.executables),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "islands": {k: [_step_to_python(s) for s in v] for k, v in self.islands.items()},
            "subgraphs": [_jsonable(asdict(s)) for s in self.subgraphs],
            "host_steps": [_step_to_python(s) for s in self.host_steps],
        }

    def to_json(self) -> str:
        """Returns the plan as compact JSON."""
        return json.dumps(self.to_python(), separators=(",", ":"))

    @staticmethod
    def from_python(value: dict[str, Any]) -> "ProgramPlan":
        """Rebuilds a plan from `to_python` output."""
        return ProgramPlan(
            program=value["program"],
            topology=Topology.from_python(value["topology"]),
            slices={k: SlicePlacement(v["name"], tuple(v["shape"]), tuple(v["axes"]), v["island"],
                                      tuple(v["devices"])) for k, v in value["slices"].items()},
            buffers={b["id"]: BufferInfo(b["id"], tuple(b["shape"]), b["dtype"], b["slice"],
                                         tuple(tuple(a) for a in b["sharding"]), b["bytes_per_device"])
                     for b in value["buffers"]},
            executables=dict(value["executables"]),
            inputs=tuple(value["inputs"]),
            outputs=tuple(value["outputs"]),
            islands={k: tuple(_step_from_python(s) for s in v) for k, v in value["islands"].items()},
            subgraphs=tuple(Subgraph(s["id"], s["static"], tuple(s["islands"])) for s in value["subgraphs"]),
            host_steps=tuple(_step_from_python(s) for s in value["host_steps"]),
        )

    @staticmethod
    def from_json(text: str) -> "ProgramPlan":
        """Parses `to_json` output."""
        return ProgramPlan.from_python(json.loads(text))




def _step_to_python(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, f in Step.__dataclass_fields__.items():
        value = getattr(step, name)
        if name in ("then_plan", "else_plan"):
            if value is not None:
                out[name] = value.to_python()
        elif name in ("id", "kind") or value != f.default:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _step_from_python(value: dict[str, Any]) -> Step:
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()
              if k not in ("then_plan", "else_plan")}
    for key in ("then_plan", "else_plan"):
        if key in value:
            kwargs[key] = ProgramPlan.from_python(value[key])
    return Step(**kwargs)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
