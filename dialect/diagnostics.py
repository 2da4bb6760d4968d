"""Diagnostics reported by `pw` passes, with the location of the op at fault.

MLIR's Python bindings can emit errors only, and an error emitted outside a
failing pass aborts the process. Passes therefore report through a
`DiagnosticEngine`: errors, warnings and remarks, each at an op's location.
The driver (`pw-opt`) prints them as `file:line:col: severity: message` or
checks them against `expected-*` annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlir import ir

SEVERITIES = ("error", "warning", "remark", "note")


@dataclass(frozen=True)
class SourceLocation:
    """A position in the input file; line and column count from 1, 0 if unknown."""

    filename: str
    line: int
    column: int

    @staticmethod
    def of(location: ir.Location) -> "SourceLocation":
        """Returns the first file position inside an MLIR location."""
        pending = [location]
        while pending:
            loc = pending.pop(0)
            if loc.is_a_file():
                return SourceLocation(loc.filename, loc.start_line, loc.start_col)
            if loc.is_a_name():
                pending.append(loc.child_loc)
            elif loc.is_a_callsite():
                pending.append(loc.callee)
            elif loc.is_a_fused():
                pending.extend(loc.locations)
        return SourceLocation("", 0, 0)

    def __str__(self) -> str:
        if not self.line:
            return self.filename or "<unknown>"
        return f"{self.filename}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One message at one location."""

    severity: str
    location: SourceLocation
    message: str
    notes: tuple["Diagnostic", ...] = ()

    def format(self, filename: str | None = None) -> str:
        """Returns `file:line:col: severity: message`, with notes on following lines.

        `filename` replaces the buffer name MLIR gives parsed text ("-").
        """
        loc = self.location
        if filename is not None and loc.filename in ("-", ""):
            loc = SourceLocation(filename, loc.line, loc.column)
        where = f"{loc}: " if loc.line or loc.filename else ""
        text = f"{where}{self.severity}: {self.message}"
        return "\n".join([text] + [n.format(filename) for n in self.notes])


@dataclass
class DiagnosticEngine:
    """Collects the diagnostics of one run of a pass pipeline."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def emit(self, severity: str, where: ir.Operation | ir.Location | None, message: str,
             notes: tuple[Diagnostic, ...] = ()) -> Diagnostic:
        """Records a diagnostic at an op (or location) and returns it."""
        if isinstance(where, ir.Location):
            location = SourceLocation.of(where)
        elif where is None:
            location = SourceLocation("", 0, 0)
        else:
            location = SourceLocation.of(where.location)
        # One line, whatever names the message quotes (a symbol or axis of the input may hold a newline).
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        diagnostic = Diagnostic(severity, location, message, notes)
        self.diagnostics.append(diagnostic)
        return diagnostic

    def error(self, where, message: str) -> Diagnostic:
        """Records an error at `where` (an op or a location)."""
        return self.emit("error", where, message)

    def warning(self, where, message: str) -> Diagnostic:
        """Records a warning at `where` (an op or a location)."""
        return self.emit("warning", where, message)

    def remark(self, where, message: str) -> Diagnostic:
        """Records a remark at `where` (an op or a location)."""
        return self.emit("remark", where, message)

    @property
    def error_count(self) -> int:
        """The number of errors recorded so far."""
        if not self.diagnostics:     # the common case; the driver asks before and after every pass
            return 0
        return sum(d.severity == "error" for d in self.diagnostics)

    @property
    def has_errors(self) -> bool:
        return self.error_count > 0


def from_mlir_error(error: ir.MLIRError) -> list[Diagnostic]:
    """Converts the diagnostics that MLIR attached to an exception, one line each: a note is said in its
    error's message, and MLIR's "see current operation" (the op printed in full: hundreds of lines for a
    program) is left out."""
    def convert(info) -> Diagnostic:
        message = info.message
        for note in info.notes:
            if note.message.startswith("see current operation"):
                continue
            at = SourceLocation.of(note.location)
            where = f" at line {at.line}" if at.line else ""
            message += f" ({note.message.splitlines()[0] if note.message else 'note'}{where})"
        return Diagnostic("error", SourceLocation.of(info.location), message)

    diagnostics = [convert(d) for d in error.error_diagnostics]
    if not diagnostics:
        diagnostics = [Diagnostic("error", SourceLocation("", 0, 0), str(error))]
    return diagnostics
