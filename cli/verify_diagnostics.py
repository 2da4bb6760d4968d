"""`--verify-diagnostics`: check diagnostics against `expected-*` annotations.

Follows `mlir-opt`: a comment `// expected-error {{text}}` expects an error
whose message contains `text` on the same line; `@+N` / `@-N` shift the line;
`@below` means the next line that carries no annotation, `@above` the
previous one; `@unknown` means no line: an unknown location, or the module
the parser wraps around the input, which has no line of its own.
`expected-warning`, `expected-remark` and `expected-note` work alike. A
diagnostic located in another file (`loc("model.py":10:1)`) meets no
expectation. Every diagnostic must be expected and every expectation met.
Notes are checked only where the input expects at least one note. Spaces
may stand before `@` and before `{{` (`expected-error @+1 {{text}}`), as
mlir-opt reads them. An `expected-*` that does not parse in full
(`expected-error @+1` with no `{{text}}`, `expected-error@+x`, an
unterminated `{{`) is an error, not an annotation silently skipped; so is
`expected-error-re`, whose regular expressions are not supported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pathways_mlir.dialect.diagnostics import Diagnostic, SourceLocation

# Spaces may stand before `@` and before `{{`, as in mlir-opt's pattern
# (`expected-(error|...)(-re)? *(@([+-][0-9]+|above|below|unknown))? *{{(.*)}}$`).
_ANNOTATION = re.compile(
    r"expected-(?P<severity>error|warning|remark|note)"
    r"(?:\s*@(?P<offset>above|below|unknown|[+-]\d+))?"
    r"\s*\{\{(?P<text>.*?)\}\}")
# Where an annotation starts: each must parse as `_ANNOTATION` from there.
_ANNOTATION_START = re.compile(r"(?<![\w-])(?P<kind>expected-(?:error|warning|remark|note))(?P<regex>-re)?")


@dataclass
class Expectation:
    """One `expected-*` annotation."""

    severity: str
    line: int        # line the diagnostic is expected on; 0 for `@unknown`
    text: str
    annotation_line: int
    column: int
    matched: bool = False


class AnnotationError(ValueError):
    """An annotation that cannot be read or resolved to a line."""


def parse_expectations(text: str, first_line: int = 1) -> list[Expectation]:
    """Returns the expectations written in `text`, whose first line is `first_line`."""
    lines = text.split("\n")
    annotated = {i for i, line in enumerate(lines) if _ANNOTATION_START.search(line)}
    expectations = []
    for i, line in enumerate(lines):
        end = 0  # where the last annotation on the line ends: its text may name another
        for start in _ANNOTATION_START.finditer(line):
            if start.start() < end:
                continue
            where = f"{first_line + i}:{start.start() + 1}: error:"
            form = f"{start.group('kind')}[@+N|@-N|@above|@below|@unknown] {{{{text}}}}"
            if start.group("regex"):
                raise AnnotationError(f"{where} '{start.group()}' is not supported (no regular expressions): "
                                      f"write {form} with part of the message")
            match = _ANNOTATION.match(line, start.start())
            if match is None:
                raise AnnotationError(f"{where} cannot read annotation '{line[start.start():].strip()}': "
                                      f"write {form}")
            end = match.end()
            offset = match.group("offset")
            if offset == "unknown":
                expectations.append(Expectation(match.group("severity"), 0, match.group("text"), first_line + i,
                                                match.start() + 1))
                continue
            if offset is None:
                target = i
            elif offset == "below":
                target = next((j for j in range(i + 1, len(lines)) if j not in annotated), None)
            elif offset == "above":
                target = next((j for j in range(i - 1, -1, -1) if j not in annotated), None)
            else:
                target = i + int(offset)
            if target is None or not 0 <= target < len(lines):
                raise AnnotationError(f"{where} '{match.group(0)}' points outside the input")
            expectations.append(Expectation(match.group("severity"), first_line + target,
                                            match.group("text"), first_line + i, match.start() + 1))
    return expectations


def _flatten(diagnostics: list[Diagnostic], with_notes: bool) -> list[Diagnostic]:
    out = []
    for d in diagnostics:
        out.append(d)
        if with_notes:
            out.extend(_flatten(list(d.notes), with_notes))
    return out


def _expected_line(location: SourceLocation, filename: str) -> int | None:
    """Returns the line of the input a diagnostic at `location` may be expected on, 0 for none (`@unknown`),
    None for a location in another file. The input's file is the buffer MLIR parsed ("-"), no file (a check
    before parsing, or no location), or `filename`, the file as named on the command line ("<stdin>" for
    standard input), which is what a `loc(...)` of the input's own file says."""
    return location.line if location.filename in ("-", "", filename) else None


def verify(diagnostics: list[Diagnostic], expectations: list[Expectation], filename: str) -> list[str]:
    """Matches diagnostics to expectations; returns one error line per mismatch."""
    with_notes = any(e.severity == "note" for e in expectations)
    problems = []
    for d in _flatten(diagnostics, with_notes):
        line = _expected_line(d.location, filename)
        match = next((e for e in expectations if not e.matched and e.severity == d.severity
                      and e.line == line and e.text in d.message), None)
        if match is None:
            problems.append(Diagnostic("error", d.location, f"unexpected {d.severity}: {d.message}")
                            .format(filename))
        else:
            match.matched = True
    for e in expectations:
        if not e.matched:
            problems.append(f"{filename}:{e.annotation_line}:{e.column}: error: expected {e.severity} "
                            f"\"{e.text}\" was not produced")
    return problems
