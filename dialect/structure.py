"""The structural verifier of the `pw` dialect, driven by its IRDL definition.

`pw.irdl.mlir` declares every `pw` op: its operands and results (single or
variadic) and its attributes with their builtin kinds. MLIR's own IRDL
loader cannot be used to check them: IRDL binds a constraint variable to the
first value it meets, so a variadic operand list must be all of one type
(see `ConstraintVerifier::verify` in LLVM's IRDLVerifiers.cpp), and a
`pw.compute` taking a matrix and a vector would be rejected. This module
reads the same IRDL file and checks each operand, result and attribute on
its own, which is what the `pw` dialect means.

The check runs after parsing and after every pass (`pw-opt` does both), as
MLIR's verifier does for registered dialects: unknown `pw` ops, wrong operand
or result counts, missing attributes and attributes of the wrong kind are
reported at the op. So is, on any op, an attribute the MLIR Python bindings
cannot read (a dense array of an element type they have no class for, such
as `array<i65536: 4>`), before a pass would fail reading it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from mlir import ir

from .context import IRDL_PATH
from .diagnostics import Diagnostic, SourceLocation
from .ops import walk

DIALECT = "pw"

# IRDL base names -> a check of the builtin attribute or type kind.
_BASES: dict[str, Callable[[object], bool]] = {
    "#builtin.string": lambda a: isinstance(a, ir.StringAttr),
    "#builtin.symbol_ref": lambda a: isinstance(a, (ir.SymbolRefAttr, ir.FlatSymbolRefAttr)),
    "#builtin.array": lambda a: isinstance(a, ir.ArrayAttr),
    # Every dense array of a pw op holds i64 (shapes, ids, device ranges, sizes).
    "#builtin.dense_array": lambda a: isinstance(a, ir.DenseI64ArrayAttr),
    "#builtin.dictionary": lambda a: isinstance(a, ir.DictAttr),
    "#builtin.integer": lambda a: isinstance(a, ir.IntegerAttr) and not isinstance(a, ir.BoolAttr),
    "#builtin.float": lambda a: isinstance(a, ir.FloatAttr),
    "#builtin.unit": lambda a: isinstance(a, ir.UnitAttr),
    "#builtin.type": lambda a: isinstance(a, ir.TypeAttr),
    "!builtin.tensor": lambda t: isinstance(t, ir.RankedTensorType),
}


@dataclass(frozen=True)
class Constraint:
    """What one operand, result or attribute may be."""

    describe: str
    check: Callable[[object], bool]


@dataclass(frozen=True)
class ValueGroup:
    """A named operand or result: one value, or any number of them."""

    name: str
    variadic: bool
    constraint: Constraint


@dataclass(frozen=True)
class OpDefinition:
    """The structure IRDL declares for one `pw` op."""

    name: str
    operands: tuple[ValueGroup, ...]
    results: tuple[ValueGroup, ...]
    attributes: dict[str, Constraint]


def _constraint(op: ir.Operation) -> Constraint:
    if op.name == "irdl.any":
        return Constraint("anything", lambda _: True)
    if op.name == "irdl.base":
        base = ir.StringAttr(op.attributes["base_name"]).value
        if base not in _BASES:
            raise ValueError(f"pw.irdl.mlir: the structural verifier does not know base {base}")
        return Constraint("#builtin.dense_array of i64" if base == "#builtin.dense_array" else base, _BASES[base])
    if op.name == "irdl.any_of":
        options = [_constraint(v.owner) for v in op.operands]
        return Constraint(" or ".join(o.describe for o in options),
                          lambda x: any(o.check(x) for o in options))
    raise ValueError(f"pw.irdl.mlir: the structural verifier does not support {op.name}")


def _groups(op: ir.Operation) -> tuple[ValueGroup, ...]:
    names = [ir.StringAttr(n).value for n in ir.ArrayAttr(op.attributes["names"])]
    variadicity = str(op.attributes["variadicity"])
    kinds = variadicity[variadicity.index("[") + 1:variadicity.rindex("]")].replace(" ", "").split(",")
    if "optional" in kinds or kinds.count("variadic") > 1:
        raise ValueError("pw.irdl.mlir: the structural verifier supports single operands and at most "
                         "one variadic group per op")
    return tuple(ValueGroup(n, k == "variadic", _constraint(v.owner))
                 for n, k, v in zip(names, kinds, op.operands))


@functools.cache
def definitions() -> dict[str, OpDefinition]:
    """Returns the IRDL definitions of the `pw` ops, read from `pw.irdl.mlir`."""
    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(IRDL_PATH.read_text())
        found = {}
        for dialect in module.body.operations:
            for op in dialect.regions[0].blocks[0].operations:
                if op.name != "irdl.operation":
                    continue
                name = f"{DIALECT}.{ir.StringAttr(op.attributes['sym_name']).value}"
                operands: tuple[ValueGroup, ...] = ()
                results: tuple[ValueGroup, ...] = ()
                attributes: dict[str, Constraint] = {}
                for part in op.regions[0].blocks[0].operations:
                    if part.name == "irdl.operands":
                        operands = _groups(part)
                    elif part.name == "irdl.results":
                        results = _groups(part)
                    elif part.name == "irdl.attributes":
                        names = [ir.StringAttr(n).value for n in ir.ArrayAttr(part.attributes["attributeValueNames"])]
                        attributes = {n: _constraint(v.owner) for n, v in zip(names, part.operands)}
                found[name] = OpDefinition(name, operands, results, attributes)
        return found


def _check_values(op: ir.Operation, what: str, groups: tuple[ValueGroup, ...], types: list) -> list[str]:
    singles = sum(not g.variadic for g in groups)
    if not any(g.variadic for g in groups) and len(types) != singles:
        return [f"'{op.name}' op expects exactly {singles} {what}s, but got {len(types)}"]
    if len(types) < singles:
        return [f"'{op.name}' op expects at least {singles} {what}s, but got {len(types)}"]
    problems, index = [], 0
    for group in groups:
        for _ in range(len(types) - singles if group.variadic else 1):
            if not group.constraint.check(types[index]):
                problems.append(f"'{op.name}' op {what} #{index} ({group.name}) must be "
                                f"{group.constraint.describe}, not {types[index]}")
            index += 1
    return problems


def _unreadable(op: ir.Operation) -> list[str]:
    """Returns a problem for each attribute of `op` (at any depth) that the bindings cannot read: a
    TypeError when it is looked up, or an integer outside the i64 range that pw reads (reading one of more
    than 64 bits aborts the process, and a ui64 from 2**63 on is read as negative). Only names are listed
    and entries looked up: a `NamedAttribute`'s `.attr` of such an attribute aborts the process instead."""
    def look(attr: ir.Attribute) -> None:
        if isinstance(attr, ir.IntegerAttr):
            type_ = attr.type
            if isinstance(type_, ir.IntegerType) and type_.width > 64:
                raise TypeError(f"it is an integer of {type_.width} bits, and pw reads integers "
                                f"of at most 64 bits")
            if isinstance(type_, ir.IntegerType) and type_.is_unsigned and attr.value < 0:
                raise TypeError(f"they read {attr.value + (1 << 64)} : {type_} as {attr.value}, and pw reads "
                                f"integers of the i64 range")
        elif isinstance(attr, ir.DictAttr):
            for name in [attr[i].name for i in range(len(attr))]:
                look(attr[name])
        elif isinstance(attr, ir.ArrayAttr):
            for i in range(len(attr)):
                look(attr[i])

    problems = []
    attributes = op.attributes
    for name in attributes.keys():
        try:
            look(attributes[name])
        except TypeError as e:
            problems.append(f"'{op.name}' op attribute '{name}' cannot be read by the MLIR Python bindings: {e}")
    return problems


def check_op(op: ir.Operation) -> list[str]:
    """Returns the structural problems of one op: its unreadable attributes, and for a `pw` op what its
    IRDL definition does not allow."""
    unreadable = _unreadable(op)
    if unreadable or not op.name.startswith(DIALECT + "."):
        return unreadable
    definition = definitions().get(op.name)
    if definition is None:
        return [f"unregistered operation '{op.name}' found in dialect ('{DIALECT}') that does not "
                f"allow unknown operations"]
    problems = _check_values(op, "operand", definition.operands, [v.type for v in op.operands])
    problems += _check_values(op, "result", definition.results, [r.type for r in op.results])
    attributes = op.attributes
    for name, constraint in definition.attributes.items():
        value = attributes.get(name)
        if value is None:
            problems.append(f"'{op.name}' op attribute '{name}' is expected but not provided")
        elif not constraint.check(value):
            problems.append(f"'{op.name}' op attribute '{name}' must be a {constraint.describe}, not {value}")
    if op.regions and any(len(r.blocks) for r in op.regions):
        problems.append(f"'{op.name}' op has regions, but pw ops have none")
    return problems


def verify_structure(module: ir.Module | ir.Operation) -> list[Diagnostic]:
    """Checks every `pw` op in `module` against the IRDL definition; returns the errors."""
    diagnostics: list[Diagnostic] = []

    def visit(op):
        op = op.operation
        for problem in check_op(op):
            diagnostics.append(Diagnostic("error", SourceLocation.of(op.location), problem))
        return ir.WalkResult.ADVANCE

    walk(module.operation, visit)
    return diagnostics
