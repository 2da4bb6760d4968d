"""Conversion between builtin MLIR attributes and plain Python values.

Every `pw` attribute is a builtin attribute, so that passes written in Python
can read it. These two functions are the only place that knows how; passes
work on the Python values they return.

    StringAttr "x"            <-> "x"
    IntegerAttr 3 : i64       <-> 3
    BoolAttr true             <-> True
    FloatAttr 1.5             <-> 1.5
    UnitAttr                  <-> None (as a value of a dictionary entry)
    DenseI64ArrayAttr         <-> tuple of ints
    other dense arrays         -> tuple of their values (read only)
    any other attribute        -> the attribute itself (read only)
    ArrayAttr [...]           <-> list
    DictAttr {...}            <-> dict
    SymbolRefAttr @a          <-> Symbol("a")
    TypeAttr                  <-> ir.Type (unchanged)
"""

from __future__ import annotations

from typing import Any

from mlir import ir


class Symbol(str):
    """A symbol name, read from or written as a `SymbolRefAttr`."""

    def __repr__(self) -> str:
        return f"@{str(self)}"


_OTHER_DENSE_ARRAYS = (ir.DenseI32ArrayAttr, ir.DenseI16ArrayAttr, ir.DenseI8ArrayAttr, ir.DenseBoolArrayAttr,
                       ir.DenseF32ArrayAttr, ir.DenseF64ArrayAttr)


def _elements(attr) -> tuple:
    # Indexing: iterating these attributes costs a few microseconds more each time.
    return tuple([attr[i] for i in range(len(attr))])


def _dictionary(attr: ir.DictAttr) -> dict[str, Any]:
    # By name: an entry's `.attr` costs several times a lookup by name.
    names = [attr[i].name for i in range(len(attr))]
    return {name: to_python(attr[name]) for name in names}


# How to read each attribute class, tried in this order; the first match is
# remembered per class in _READER (a dictionary lookup instead of a dozen
# isinstance tests: passes read thousands of attributes per lowering).
_READERS = (
    (ir.StringAttr, lambda a: a.value),
    (ir.BoolAttr, lambda a: bool(a.value)),
    (ir.IntegerAttr, lambda a: int(a.value)),
    (ir.FloatAttr, lambda a: float(a.value)),
    (ir.UnitAttr, lambda a: None),
    (ir.DenseI64ArrayAttr, lambda a: tuple([int(x) for x in _elements(a)])),
    (_OTHER_DENSE_ARRAYS, _elements),  # read, so that a checker can say it is not array<i64: ...>
    (ir.ArrayAttr, lambda a: [to_python(a[i]) for i in range(len(a))]),
    (ir.DictAttr, _dictionary),
    (ir.FlatSymbolRefAttr, lambda a: Symbol(a.value)),
    (ir.SymbolRefAttr, lambda a: Symbol(str(a)[1:])),
    (ir.TypeAttr, lambda a: a.value),
)
_READER: dict[type, Any] = {}


def _left_as_is(attr: ir.Attribute) -> ir.Attribute:
    return attr  # not one pw writes: left as it is, for a checker to reject


def to_python(attr: ir.Attribute) -> Any:
    """Returns the Python value of a builtin attribute (see module docstring)."""
    reader = _READER.get(type(attr))
    if reader is None:
        if type(attr) is ir.Attribute:
            attr = attr.maybe_downcast()
        kind = type(attr)
        reader = _READER.get(kind)
        if reader is None:
            reader = next((read for classes, read in _READERS if isinstance(attr, classes)), _left_as_is)
            if kind is not ir.Attribute:
                _READER[kind] = reader
    return reader(attr)


def to_attribute(value: Any) -> ir.Attribute:
    """Returns the builtin attribute for a Python value (see module docstring).

    Needs an active `ir.Context`. Integers become i64; tuples of integers
    become `DenseI64ArrayAttr`; `None` becomes `UnitAttr`.
    """
    if isinstance(value, ir.Attribute):
        return value
    if isinstance(value, Symbol):
        return ir.FlatSymbolRefAttr.get(str(value))
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return ir.FloatAttr.get_f64(value)
    if value is None:
        return ir.UnitAttr.get()
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return ir.DenseI64ArrayAttr.get(list(value))
    if isinstance(value, (list, tuple)):
        return ir.ArrayAttr.get([to_attribute(v) for v in value])
    if isinstance(value, dict):
        return ir.DictAttr.get({str(k): to_attribute(v) for k, v in value.items()})
    if isinstance(value, ir.Type):
        return ir.TypeAttr.get(value)
    raise TypeError(f"cannot make a builtin attribute of {type(value).__name__} {value!r}")
