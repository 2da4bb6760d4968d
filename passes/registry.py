"""The registry of `pw` passes and named pipelines.

Python passes cannot be named in MLIR's textual pass pipelines, so `pw-opt`
keeps its own registry. A pass is a `@dataclass` subclass of `Pass`
registered with `@register`; its options are its typed fields, declared with
`option(default, help)` (as xDSL's `ModulePass` fields), and read as
attributes (`self.strategy`). A pipeline is a function registered with
`@register_pipeline` that expands its options into a list of pass instances.
Option texts from a pipeline string (`pw-place{strategy=pack}`) are parsed
by the field's type (bool, int, float, str, or a string enum) into the typed
value, with a one-line error naming the pass and the option.
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
        """Returns the option's value from its text in a pipeline string (errors name the declaring pass, else
        `owner`)."""
        owner = self.declared_by or owner
        if issubclass(self.type, enum.Enum):
            try:
                return self.type(text)
            except ValueError:
                values = [m.value for m in self.type]
                raise OptionError(f"option '{self.name}' of '{owner}' takes {', '.join(values[:-1])} or "
                                  f"{values[-1]}, not '{text}'") from None
        if self.type is bool:
            if text.lower() in ("", "true", "1"):
                return True
            if text.lower() in ("false", "0"):
                return False
            raise OptionError(f"option '{self.name}' of '{owner}' takes true or false, not '{text}'")
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise OptionError(f"option '{self.name}' of '{owner}' takes an integer, not '{text}'") from None
        if self.type is float:
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):      # nan and inf parse, and every comparison of the cost model is off
                raise OptionError(f"option '{self.name}' of '{owner}' takes a finite number, not '{text}'")
            return value
        return text


def parse_options(owner: str, options: tuple[Option, ...], given: dict[str, str]) -> dict[str, Any]:
    """Returns every option's value: the given text parsed, else the default."""
    known = {o.name: o for o in options}
    for name in given:
        if name not in known:
            choices = ", ".join(known) or "none"
            raise OptionError(f"'{owner}' has no option '{name}' (options: {choices})")
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
        """Parses an enum option given by its name (`PlacePass(strategy="pack")`), as a pipeline string's."""
        for o in self.options:
            value = getattr(self, o.name)
            if issubclass(o.type, enum.Enum) and not isinstance(value, o.type):
                setattr(self, o.name, o.parse(self.name, value))

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
    summary: str
    options: tuple[Option, ...]
    expand: Callable[..., list[Pass]]

    def from_text(self, given: dict[str, str]) -> list[Pass]:
        """Returns the pass instances for the pipeline's option texts."""
        return self.expand(**parse_options(self.name, self.options, given))

    def description(self) -> str:
        return inspect.cleandoc(self.expand.__doc__ or self.summary)


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


def register_pipeline(name: str, summary: str, options: tuple[Option, ...] = ()):
    """Function decorator: adds a named pipeline built by the function."""
    def wrap(expand: Callable[..., list[Pass]]) -> Callable[..., list[Pass]]:
        if name in PASSES or name in PIPELINES:
            raise ValueError(f"a pass or pipeline named {name!r} is already registered")
        PIPELINES[name] = Pipeline(name, summary, options, expand)
        return expand
    return wrap
