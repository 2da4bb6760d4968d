"""MLIR contexts for pw IR, and parsing pw IR text safely.

The `pw` dialect is defined in IRDL (`pw.irdl.mlir`, beside this file) and
checked by `dialect.structure`, which reads that file: MLIR's own IRDL loader
cannot express a variadic operand list of mixed types (see the structure
module). Contexts therefore allow unregistered dialects, which also lets
compiled functions carry their StableHLO bodies, whose dialect the upstream
bindings do not register.

Two things about MLIR abort the process instead of raising, and both are
guarded here:

- Diagnostics emitted from MLIR's worker threads (parallel verification of
  sibling modules and functions) reach the bindings' Python diagnostic
  handlers without the GIL, and nanobind aborts. Contexts are therefore
  single-threaded.
- MLIR's parser recurses once per level of nesting and overflows the stack
  (SIGSEGV) a few thousand levels deep. `parse_module` refuses text nested
  deeper than `MAX_NESTING` before MLIR sees it.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import types

from mlir import ir

from .diagnostics import Diagnostic, SourceLocation, from_mlir_error

IRDL_PATH = pathlib.Path(__file__).with_name("pw.irdl.mlir")

# Real pw IR nests a few tens of levels; MLIR's parser overflows its stack a
# few thousand deep, and attribute readers recurse once per level too.
MAX_NESTING = 256
_OPENERS = "{([<"
_CLOSERS = "})]>"


class ParseError(ValueError):
    """IR text that does not parse; `diagnostics` says where and why."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.format() for d in diagnostics))


# Dialects in pw IR without a Python module in these bindings. The bindings try
# to import `mlir.dialects.<namespace>` each time they wrap an op of such a
# dialect and do not remember a failed import: about 150 failed imports per
# small lowering, a third of its time.
_UNBOUND_DIALECTS = ("pw", "stablehlo", "sdy", "chlo", "mhlo")


def _end_dialect_module_searches() -> None:
    """Puts an empty placeholder module where the bindings look for each unbound dialect's module (never
    over a real one), so that their lookup succeeds at once and the ops stay generic."""
    for namespace in _UNBOUND_DIALECTS:
        name = f"mlir.dialects.{namespace}"
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name, "placeholder: this dialect has no Python bindings here")


_end_dialect_module_searches()


# The registered dialects whose ops pw code creates by name (`ops.create`, the
# `func` bindings).
CREATED_DIALECTS = ("builtin", "func")


def make_context() -> ir.Context:
    """Returns a new single-threaded context that parses pw IR (structure is checked by `verify_structure`).

    Only the dialects whose ops pw code creates by name are loaded up front
    (an op created before its dialect is loaded stays unregistered); the
    others load when the parser first meets them. Loading every dialect the
    bindings register took about 11 ms a context, a third of a small
    lowering."""
    context = ir.Context(load_on_create_dialects=CREATED_DIALECTS)
    context.allow_unregistered_dialects = True
    context.enable_multithreading(False)
    return context


# What the nesting count reads: a string literal (to its closing quote, or the end of its line), a `//`
# comment, `->`, or a bracket. The scan jumps from one to the next: IR text is mostly other characters,
# and a Python step per character cost about 0.2 ms per kilobyte.
_NESTING_TOKENS = re.compile(r'"(?:[^"\\\n]|\\[\s\S])*"?|//[^\n]*|->|[{(\[<})\]>]')


def nesting_error(text: str, limit: int = MAX_NESTING) -> Diagnostic | None:
    """Returns an error at the first bracket nested deeper than `limit`, or None.

    Counts `{ ( [ <` against their closers, skipping string literals, `//`
    comments and the `>` of `->`. Unbalanced text is left for the parser.
    """
    if sum(text.count(c) for c in _OPENERS) <= limit:
        return None  # too few brackets to nest that deep
    depth = 0
    for match in _NESTING_TOKENS.finditer(text):
        token = match.group()
        if token in _OPENERS:
            depth += 1
            if depth > limit:
                at = match.start()
                line_start = text.rfind("\n", 0, at) + 1
                return Diagnostic("error", SourceLocation("", text.count("\n", 0, at) + 1, at - line_start + 1),
                                  f"'{token}' nests deeper than {limit} levels")
        elif token in _CLOSERS and depth:
            depth -= 1
    return None


def parse_module(text: str, context: ir.Context) -> ir.Module:
    """Parses IR text in `context`; raises `ParseError` (deep nesting or MLIR's diagnostics)."""
    too_deep = nesting_error(text)
    if too_deep is not None:
        raise ParseError([too_deep])
    try:
        return ir.Module.parse(text, context)
    except ir.MLIRError as error:
        raise ParseError(from_mlir_error(error)) from None
