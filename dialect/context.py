"""MLIR contexts for pw IR.

The `pw` dialect is defined in IRDL (`pw.irdl.mlir`, beside this file) and
checked by `dialect.structure`, which reads that file: MLIR's own IRDL loader
cannot express a variadic operand list of mixed types (see the structure
module). Contexts therefore allow unregistered dialects, which also lets
compiled functions carry their StableHLO bodies, whose dialect the upstream
bindings do not register.
"""

from __future__ import annotations

import pathlib

from mlir import ir

IRDL_PATH = pathlib.Path(__file__).with_name("pw.irdl.mlir")


def make_context() -> ir.Context:
    """Returns a new context that parses pw IR (structure is checked by `verify_structure`)."""
    context = ir.Context()
    context.allow_unregistered_dialects = True
    return context
