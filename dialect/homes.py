"""Where values live: the one analysis of value placement that passes share.

A value lives on a slice in a sharding (a `Home`), or on the host (None):
program arguments and `pw.cond` results are host values until the runtime
puts them on devices, which after pw-insert-transfers is recorded as
`pw.home` on the argument and `pw.result_homes` on the `pw.cond`.

    operand_homes(op)    where an op uses each operand it reads on devices
    result_homes(op)     where an op puts each result
    program_homes(prog)  where every value of a program lives, from the marks
    misplaced_operands(prog)  operands used somewhere other than where they live
    sharded_on(module)   the tensor shape and sharding of every use and result on each slice
    bytes_per_device(t, home, slices)  size of one device's shard of a value
"""

from __future__ import annotations

from typing import Iterator, Mapping, NamedTuple

from mlir import ir

from . import ops
from .attributes import Symbol
from .sharding import Sharding


class Home(NamedTuple):
    """A value's slice and sharding."""

    slice: str
    sharding: Sharding


def home_attribute(home: Home | None) -> dict:
    """Returns the `pw.home` value of a home: {slice, sharding}, or {} for the host."""
    return {} if home is None else {"slice": Symbol(home.slice), "sharding": home.sharding.to_python()}


def read_home(value: Mapping | None) -> Home | None:
    """Reads a `pw.home` value back ({} or None: the host)."""
    return Home(value["slice"], Sharding.from_python(value["sharding"])) if value else None


def operand_homes(op: ir.Operation) -> list[tuple[int, Home]]:
    """Returns (operand index, home) for each operand an op uses on devices."""
    if op.name == "pw.compute":
        slice_name = ops.attr(op, "slice")
        return [(i, Home(slice_name, s)) for i, s in enumerate(ops.in_shardings(op))]
    if op.name in ops.DATA_MOVEMENT_OPS:
        key = "sharding" if op.name == "pw.transfer" else "src_sharding"
        return [(0, Home(ops.attr(op, "src"), Sharding.from_python(ops.attr(op, key))))]
    return []


def result_homes(op: ir.Operation) -> list[Home | None]:
    """Returns where each result of an op lives (None: a host value not yet put on devices)."""
    if op.name == "pw.compute":
        return [Home(ops.attr(op, "slice"), s) for s in ops.out_shardings(op)]
    if op.name in ops.DATA_MOVEMENT_OPS:
        key = "sharding" if op.name == "pw.transfer" else "dst_sharding"
        return [Home(ops.attr(op, "dst"), Sharding.from_python(ops.attr(op, key)))]
    if op.name == "pw.cond" and ops.RESULT_HOMES in op.attributes:
        return [read_home(h) for h in ops.attr(op, ops.RESULT_HOMES)]
    return [None] * len(op.results)


def argument_homes(program: ir.Operation) -> list[Home | None]:
    """Returns the `pw.home` of each program argument (None: not yet put on devices)."""
    arguments = ops.program_body(program).arguments
    arg_attrs = ops.attr(program, "arg_attrs") or [{}] * len(arguments)
    return [read_home(a.get(ops.HOME)) for a in arg_attrs]


def program_homes(program: ir.Operation) -> dict[ir.Value, Home | None]:
    """Returns where every value of a program lives, as its ops and marks say."""
    body = ops.program_body(program)
    homes = dict(zip(body.arguments, argument_homes(program)))
    for op in body.operations:
        homes.update(zip(op.results, result_homes(op.operation)))
    return homes


def misplaced_operands(program: ir.Operation) -> Iterator[tuple[ir.Operation, int, Home, Home]]:
    """Yields (op, operand index, where the operand lives, where the op uses it) for each operand of a
    program that an op uses on devices somewhere other than where it lives: what pw-insert-transfers moves,
    so the lowered phase has none. A host value (an argument or `pw.cond` result without a home yet) is
    not misplaced: the runtime puts it where it is used."""
    body = ops.program_body(program)
    homes = dict(zip(body.arguments, argument_homes(program)))
    for op in body.operations:   # one walk: a program's ops come after the ops whose values they use
        op = op.operation
        for index, use in operand_homes(op):
            home = homes.get(op.operands[index])
            if home is not None and home != use:
                yield op, index, home, use
        homes.update(zip(op.results, result_homes(op)))


def sharded_on(module: ir.Module | ir.Operation) -> dict[str, list[tuple[tuple[int, ...], Sharding]]]:
    """Returns, per slice, the (tensor shape, sharding) of every operand used and result put on it by the
    module's programs: what a mesh shape of the slice must divide."""
    found: dict[str, list[tuple[tuple[int, ...], Sharding]]] = {}
    for program in ops.programs(module).values():
        for op in ops.program_body(program).operations:
            op = op.operation
            uses = [(op.operands[i].type, home) for i, home in operand_homes(op)]
            uses += [(r.type, home) for r, home in zip(op.results, result_homes(op)) if home is not None]
            for type_, home in uses:
                found.setdefault(home.slice, []).append((ops.tensor_shape(type_), home.sharding))
    return found


def bytes_per_device(type_: ir.Type, home: Home | None, slices: Mapping[str, ops.VirtualSlice]) -> int:
    """Returns the bytes one device holds of a value of `type_` (the whole value on the host)."""
    whole = ops.tensor_bytes(type_)
    return whole if home is None else whole // home.sharding.ways(slices[home.slice].axis_sizes)
