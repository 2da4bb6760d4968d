"""The registry of `pw` passes and named pipelines.

Python passes cannot be named in MLIR's textual pass pipelines, so `pw-opt`
keeps its own registry. A pass is a `@dataclass` subclass of `Pass`
registered with `@register`; its options are its typed fields, declared with
`option(default, help)` (as xDSL's `ModulePass` fields), and read as
attributes (`self.strategy`). A pipeline is a function registered with
`@register_pipeline` that expands its options into a list of pass instances.
Option texts from a pipeline string (`pw-place{strategy=pack}`) are parsed
by the field's type (bool, int, float, str, or a string enum) into the typed
value, with a one-line error naming the pass and the option; values given
from Python (`PlacePass(explain=False)`) are checked alike, a string parsed
as its text is.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from mlir import ir

from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase


class OptionError(ValueError):
    """A pass or pipeline option is unknown or has a bad value."""


@dataclass(frozen=True)
class Option:
    """One option of a pass: `name=value` in a pipeline string."""

    name: str
    type: type
    default: Any
    help: str
    declared_by: str | None = None   # the pass whose field it is (a pipeline's errors name that pass)

    def parse(self, owner: str, text: str) -> Any:
        """Returns the option's value from its text in a pipeline string; errors name the option's pass, and
        `owner` where it passes the option on (a pipeline)."""
        refused = OptionError(self._message(owner, f"takes {self._takes()}, not '{text}'"))
        if issubclass(self.type, enum.Enum):
            try:
                return self.type(text)
            except ValueError:
                raise refused from None
        if self.type is bool:
            if text.lower() in ("", "true", "1"):
                return True
            if text.lower() in ("false", "0"):
                return False
            raise refused
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise refused from None
        if self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise refused from None
            if not math.isfinite(value):      # nan and inf parse, and every comparison of the cost model is off
                raise refused
            return value
        return text

    def check(self, owner: str, value: Any) -> Any:
        """Returns the option's value given from Python: a string is parsed as in a pipeline string; any other
        value must have the option's type (an int does for a float), and a float be finite."""
        if isinstance(value, str) and self.type is not str:
            return self.parse(owner, value)
        given = value
        if self.type is float and type(value) is int:
            try:
                value = float(value)
            except OverflowError:        # an int past the floats' range is no finite number either
                value = math.inf
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise TypeError(self._message(owner, f"takes {self._takes()}, not {given!r:.60} of type "
                                                 f"{type(given).__name__}"))
        if self.type is float and not math.isfinite(value):
            raise OptionError(self._message(owner, f"takes {self._takes()}, not {given!r:.60}"))
        return value

    def _takes(self) -> str:
        """Says what values the option takes."""
        if issubclass(self.type, enum.Enum):
            values = [m.value for m in self.type]
            return f"{', '.join(values[:-1])} or {values[-1]}"
        return {bool: "true or false", int: "an integer", float: "a finite number"}.get(self.type, "a string")

    def _message(self, owner: str, problem: str) -> str:
        """Returns `option 'x' of 'pass' <problem>`, naming `owner` too where it is a pipeline that passes the
        option on to its pass."""
        declared_by = self.declared_by or owner
        within = f" (in '{owner}')" if declared_by != owner else ""
        return f"option '{self.name}' of '{declared_by}' {problem}{within}"


def parse_options(owner: str, options: tuple[Option, ...], given: dict[str, str]) -> dict[str, Any]:
    """Returns every option's value: the given text parsed, else the default."""
    known = {o.name: o for o in options}
    for name in given:
        if name not in known:
            choices = ", ".join(known) or "none"
            raise OptionError(f"'{owner}' has no option '{name}' (options: {choices})")
    for name, text in given.items():   # `a=1,b=2`: `a` would be `1,b=2` (pin's `x=island0,y=island1` is a list)
        joined = None if "=" in text.split(",", 1)[0] else next((o for o in known if f",{o}=" in text), None)
        if joined is not None:
            raise OptionError(known[name]._message(owner, f"is given '{text}', which holds ',{joined}=': options "
                                                          f"are separated by spaces ({name}=... {joined}=...)"))
    return {o.name: o.parse(owner, given[o.name]) if o.name in given else o.default for o in options}


def option(default: Any, help: str) -> Any:
    """Declares a pass option: a dataclass field with its default and help text; its type is the field's."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass
class Pass:
    """Base class of `pw` passes.

    A subclass sets `name`, `summary`, `needs_verified_input` and `requires_phase`, declares its options as
    `option(...)` fields (the subclass is a `@dataclass`), documents what it requires and shows before/after IR
    in its docstring, and implements `run`, which changes the module in place and reports problems through
    `diagnostics`.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    options: ClassVar[tuple[Option, ...]] = ()     # the option fields, as `@register` lists them
    # True for a pass that reads pw IR as pw-verify defines it: the driver
    # runs pw-verify's checks first and runs the pass only on IR that passes.
    needs_verified_input: ClassVar[bool] = False
    # The phase of lowering the pass reads (`dialect/phases.py`): the driver runs pw-verify's and
    # pw-verify-phase's checks first and runs the pass only on IR in that phase.
    requires_phase: ClassVar[Phase | None] = None
    # False for a pass that only checks the module: the driver does not run the
    # structural verifier or MLIR's again after it once an earlier pass's result passed.
    changes_ir: ClassVar[bool] = True
    # True for a check that pipelines place at phase boundaries so that a bug is caught at the pass that
    # made it (pw-verify, pw-verify-phase): with `verify_each=False` the driver runs such a check only
    # before the first pass that changes IR and after the last.
    boundary_check: ClassVar[bool] = False

    def __post_init__(self):
        """Checks every option given from Python as a pipeline string's: a string is parsed by the option's type
        (`PlacePass(strategy="pack")`, `PlacePass(explain="false")`), any other value must have that type."""
        for o in self.options:
            setattr(self, o.name, o.check(self.name, getattr(self, o.name)))

    @classmethod
    def from_text(cls, given: dict[str, str]) -> "Pass":
        """Builds the pass from option texts, as written in a pipeline string."""
        return cls(**parse_options(cls.name, cls.options, given))

    @classmethod
    def description(cls) -> str:
        """Returns the pass's docstring, dedented."""
        return inspect.cleandoc(cls.__doc__ or cls.summary)

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Pipeline:
    """A named sequence of passes whose options come from the pipeline's own."""

    name: str
    purpose: str
    options: tuple[Option, ...]
    expand: Callable[..., list[Pass]]

    @property
    def summary(self) -> str:
        """The pipeline's purpose and the passes it runs with its default options, read from its pass list so
        that the summary names every pass the pipeline has."""
        passes = self.expand(**{o.name: o.default for o in self.options})
        runs = ", ".join(dict.fromkeys(p.name for p in passes if p.changes_ir))
        checks = ", ".join(dict.fromkeys(p.name for p in passes if not p.changes_ir))
        return f"{self.purpose}: {runs}" + (f"; checked by {checks}" if checks else "")

    def from_text(self, given: dict[str, str]) -> list[Pass]:
        """Returns the pass instances for the pipeline's option texts."""
        values = parse_options(self.name, self.options, given)
        try:
            return self.expand(**values)
        except OptionError as e:      # a pass's own check of an option passed on (pw-place's topology file, pins)
            raise OptionError(str(e) if ": error: " in str(e) else f"{e} (in '{self.name}')") from None

    def description(self) -> str:
        return inspect.cleandoc(self.expand.__doc__ or self.purpose)


PASSES: dict[str, type[Pass]] = {}
PIPELINES: dict[str, Pipeline] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: adds a pass to the registry under its `name`, and lists its option fields."""
    if cls.name in PASSES or cls.name in PIPELINES:
        raise ValueError(f"a pass or pipeline named {cls.name!r} is already registered")
    types = typing.get_type_hints(cls)
    cls.options = tuple(Option(f.name, types[f.name], f.default, f.metadata["help"], cls.name)
                        for f in dataclasses.fields(cls))
    PASSES[cls.name] = cls
    return cls


def register_pipeline(name: str, purpose: str, options: tuple[Option, ...] = ()):
    """Function decorator: adds a named pipeline built by the function; its summary is `purpose` followed by the
    passes the function returns (`Pipeline.summary`)."""
    def wrap(expand: Callable[..., list[Pass]]) -> Callable[..., list[Pass]]:
        if name in PASSES or name in PIPELINES:
            raise ValueError(f"a pass or pipeline named {name!r} is already registered")
        PIPELINES[name] = Pipeline(name, purpose, options, expand)
        return expand
    return wrap
