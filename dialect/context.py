"""MLIR contexts for pw IR, and parsing pw IR text safely.

The `pw` dialect is defined in IRDL (`pw.irdl.mlir`, beside this file) and
checked by `dialect.structure`, which reads that file: MLIR's own IRDL loader
cannot express a variadic operand list of mixed types (see the structure
module). Contexts therefore allow unregistered dialects, which also lets
compiled functions carry their StableHLO bodies, whose dialect the upstream
bindings do not register.

Some things about MLIR abort the process instead of raising, and are
guarded here:

- Diagnostics emitted from MLIR's worker threads (parallel verification of
  sibling modules and functions) reach the bindings' Python diagnostic
  handlers without the GIL, and nanobind aborts. Contexts are therefore
  single-threaded.
- MLIR's parser recurses once per level of nesting and overflows the stack
  (SIGSEGV) a few thousand levels deep. `parse_module` refuses text nested
  deeper than `MAX_NESTING` before MLIR sees it.
- MLIR's parser asserts on a dense array of `index` (`array<index: 1>`), and
  the bindings abort (or raise a RuntimeError that names no place) on a name
  or string whose escapes make bytes that are not UTF-8 (`"\\ff"`).
  `parse_module` refuses both before MLIR sees them (`literal_error`).
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
                return _diagnostic_at(text, match.start(), f"'{token}' nests deeper than {limit} levels")
        elif token in _CLOSERS and depth:
            depth -= 1
    return None


def _diagnostic_at(text: str, at: int, message: str) -> Diagnostic:
    """An error at offset `at` of `text`, located by line and column."""
    line_start = text.rfind("\n", 0, at) + 1
    return Diagnostic("error", SourceLocation("", text.count("\n", 0, at) + 1, at - line_start + 1), message)


# What the literal checks read: a string literal (to its closing quote, or the end of its line), a `//`
# comment, the element type of a dense array (`array<index`, `array<!alias`, comments allowed between), or
# a type alias naming `index` or another alias (`!i = index`). A dialect type or attribute named array
# (`!x.array<index>`) is not a dense array, nor is what an unregistered dialect's `#x<...>` or `!x.t<...>` keeps
# opaque, hence no `.`, `!`, `#` or `<` right before `array`. A comment inside
# `array<` runs to its newline, so that the scan never backtracks into it.
_LITERAL_TOKENS = re.compile(
    r'"(?:[^"\\\n]|\\[\s\S])*"?|//[^\n]*'
    r'|(?<![\w$.!#<])array(?:\s|//[^\n]*\n)*<(?:\s|//[^\n]*\n)*(?P<element>index\b|![\w$.]+)'
    r'|^[ \t]*!(?P<alias>[\w$.]+)[ \t]*=[ \t]*(?P<aliased>index\b|![\w$.]+)', re.MULTILINE)
# A string literal's escapes (MLIR's lexer): two hex digits are a byte, `\\` `\"` `\n` `\t` a character.
_STRING_ESCAPE = re.compile(r"\\([0-9a-fA-F]{2}|[\s\S])")


def _string_is_utf8(literal: str) -> bool:
    """True if the body of a string literal (no quotes) is UTF-8 once its escapes are decoded."""
    data, pos = bytearray(), 0
    for escape in _STRING_ESCAPE.finditer(literal):
        data += literal[pos:escape.start()].encode("utf-8", "surrogatepass")
        code = escape.group(1)
        # The other escapes decode to ASCII characters (or are errors MLIR's lexer reports).
        data += bytes([int(code, 16)]) if len(code) == 2 else b"_"
        pos = escape.end()
    data += literal[pos:].encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def literal_error(text: str) -> Diagnostic | None:
    """Returns an error at the first literal that MLIR or its bindings abort on, or None: a dense array of
    `index` (directly or through type aliases), or a string literal whose escapes make bytes that are not
    UTF-8. String literals and `//` comments are skipped otherwise."""
    if "array" not in text and "\\" not in text:
        return None  # neither can occur
    index_aliases: set[str] = set()
    for match in _LITERAL_TOKENS.finditer(text):
        token = match.group()
        if token.startswith('"'):
            if "\\" in token and not _string_is_utf8(token[1:-1] if token.endswith('"') else token[1:]):
                return _diagnostic_at(text, match.start(), "string literal is not UTF-8 once its escapes are "
                                                           "decoded: escape only the bytes of UTF-8 text")
        elif match.group("alias") is not None:
            aliased = match.group("aliased")
            if aliased == "index" or aliased[1:] in index_aliases:
                index_aliases.add(match.group("alias"))
        elif match.group("element") is not None:
            element = match.group("element")
            if element == "index" or element[1:] in index_aliases:
                via = "" if element == "index" else f" ({element} is index)"
                return _diagnostic_at(text, match.start("element"), f"array<{element} ...> is not supported"
                                                                    f"{via}: write array<i64: ...>")
    return None


def parse_module(text: str, context: ir.Context) -> ir.Module:
    """Parses IR text in `context`; raises `ParseError` (deep nesting, a literal MLIR aborts on, or MLIR's
    diagnostics)."""
    refused = nesting_error(text) or literal_error(text)
    if refused is not None:
        raise ParseError([refused])
    try:
        return ir.Module.parse(text, context)
    except ir.MLIRError as error:
        raise ParseError(from_mlir_error(error)) from None
