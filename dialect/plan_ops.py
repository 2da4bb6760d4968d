"""Typed builders of the plan ops (inside `builtin.module {pw.island_plan}` / `{pw.host_plan}`).

One builder per op, as `dialect/ops.py` has for the program ops: `pw.buffer`, `pw.launch`, `pw.copy`,
`pw.send`, `pw.recv`, `pw.free` and `pw.branch`. `passes/emit_plans.py` and `passes/plan_memory.py`
write plans with them; `dialect/plan_reader.py` reads them back.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mlir import ir

from .attributes import Symbol
from .ops import create


def build_buffer(*, id: int, type: ir.Type, home: Mapping[str, Any], bytes_per_device: int,
                 loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.buffer`: buffer `id` of `type`, its home ({slice, sharding} or {}) and size per device."""
    return create("pw.buffer", attributes={"id": id, "type": type, "home": dict(home),
                                           "bytes_per_device": bytes_per_device}, loc=loc)


def build_launch(*, step: int, after: Sequence[int], executable: str, slice: str, devices: Sequence[int],
                 inputs: Sequence[int], outputs: Sequence[int], output_bytes: Sequence[int], subgraph: int,
                 label: str, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.launch` of `executable` on `slice`'s `devices`, from buffers `inputs` to `outputs`."""
    return create("pw.launch", attributes={
        "step": step, "after": _ids(after), "executable": Symbol(executable), "slice": Symbol(slice),
        "devices": _ids(devices), "inputs": _ids(inputs), "outputs": _ids(outputs),
        "output_bytes": _ids(output_bytes), "subgraph": subgraph, "label": label}, loc=loc)


def build_copy(*, step: int, after: Sequence[int], src_buffer: int, dst_buffer: int, bytes: int, link: str,
               subgraph: int, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.copy` of `bytes` per device from `src_buffer` to `dst_buffer` inside one island."""
    return create("pw.copy", attributes={
        "step": step, "after": _ids(after), "src_buffer": src_buffer, "dst_buffer": dst_buffer,
        "bytes": bytes, "link": link, "subgraph": subgraph}, loc=loc)


def build_send(*, step: int, after: Sequence[int], buffer: int, peer_buffer: int, peer: str, bytes: int,
               link: str, devices: Sequence[int], subgraph: int, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.send` of `buffer` to island `peer`, where it is received as `peer_buffer`."""
    return _exchange("pw.send", step, after, buffer, peer_buffer, peer, bytes, link, devices, subgraph, loc)


def build_recv(*, step: int, after: Sequence[int], buffer: int, peer_buffer: int, peer: str, bytes: int,
               link: str, devices: Sequence[int], subgraph: int, loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.recv` into `buffer` of what island `peer` sends from its `peer_buffer`."""
    return _exchange("pw.recv", step, after, buffer, peer_buffer, peer, bytes, link, devices, subgraph, loc)


def _exchange(name: str, step: int, after: Sequence[int], buffer: int, peer_buffer: int, peer: str, nbytes: int,
              link: str, devices: Sequence[int], subgraph: int, loc: ir.Location | None) -> ir.Operation:
    return create(name, attributes={
        "step": step, "after": _ids(after), "buffer": buffer, "peer_buffer": peer_buffer, "peer": peer,
        "bytes": nbytes, "link": link, "devices": _ids(devices), "subgraph": subgraph}, loc=loc)


def build_free(*, step: int, after: Sequence[int], buffers: Sequence[int], subgraph: int,
               loc: ir.Location | None = None) -> ir.Operation:
    """Creates a `pw.free` of `buffers` once the steps in `after` (their last readers) have run."""
    return create("pw.free", attributes={"step": step, "after": _ids(after), "buffers": _ids(buffers),
                                         "subgraph": subgraph}, loc=loc)


def build_branch(*, step: int, after: Sequence[int], pred: int, inputs: Sequence[int], outputs: Sequence[int],
                 then_program: str, else_program: str, subgraph: int, label: str,
                 loc: ir.Location | None = None) -> ir.Operation:
    """Creates a host `pw.branch`: reads buffer `pred`, runs the plans of one of two programs."""
    return create("pw.branch", attributes={
        "step": step, "after": _ids(after), "pred": pred, "inputs": _ids(inputs), "outputs": _ids(outputs),
        "then_program": Symbol(then_program), "else_program": Symbol(else_program),
        "subgraph": subgraph, "label": label}, loc=loc)


def _ids(values: Sequence[int]) -> tuple[int, ...]:
    """Integers as a tuple, which `to_attribute` makes a `DenseI64ArrayAttr` (also when empty)."""
    return tuple(int(v) for v in values)
