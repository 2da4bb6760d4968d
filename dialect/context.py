"""MLIR contexts with the `pw` dialect loaded.

The dialect is defined in IRDL (`pw.irdl.mlir`, beside this file) and loaded
into each new context, so the upstream MLIR Python bindings parse, verify and
print `pw` ops without any compiled extension.
"""

from __future__ import annotations

import pathlib

from mlir import ir
from mlir.dialects import irdl

IRDL_PATH = pathlib.Path(__file__).with_name("pw.irdl.mlir")
_IRDL_SOURCE = IRDL_PATH.read_text()


def make_context() -> ir.Context:
    """Returns a new context with the `pw` dialect loaded.

    Unregistered dialects are allowed because compiled functions carry their
    StableHLO bodies, whose dialect the upstream bindings do not register. The
    `pw` dialect itself is registered, so a misspelt `pw` op is still an error.
    """
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context, ir.Location.unknown():
        irdl.load_dialects(ir.Module.parse(_IRDL_SOURCE))
    return context
