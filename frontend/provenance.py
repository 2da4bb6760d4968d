"""Where Python code calls into the front end: names errors and IR locations."""

from __future__ import annotations

import functools
import inspect
import os
import re
from dataclasses import dataclass
from types import FrameType
from typing import Callable

from mlir import ir

_FRONTEND = os.path.dirname(os.path.abspath(__file__)) + os.sep


@dataclass(frozen=True)
class Site:
    """A named position in Python source: a call of a placed function, or a definition."""

    name: str
    file: str
    line: int
    column: int

    @staticmethod
    def of_call(name: str, frame: FrameType) -> "Site":
        """Returns the site of the call that `frame`, or the first user frame above it, is executing.

        Front-end frames are skipped, so a placed function that `cond` calls
        as a branch is named at the user's `cond` call.
        """
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_FRONTEND):
            frame = frame.f_back
        positions = inspect.getframeinfo(frame, context=0).positions
        column = positions.col_offset + 1 if positions and positions.col_offset is not None else 1
        return Site(name, frame.f_code.co_filename, frame.f_lineno, column)

    @staticmethod
    def of_definition(fn: Callable) -> "Site":
        """Returns where the Python function `fn` is defined."""
        code = getattr(_unwrap(fn), "__code__", None)
        if code is None:
            return Site(name_of(fn), "<unknown>", 0, 0)
        return Site(name_of(fn), code.co_filename, code.co_firstlineno, 1)

    def location(self) -> ir.Location:
        """Returns `loc("name"("file":line:col))` (needs an active context)."""
        return ir.Location.name(self.name, ir.Location.file(self.file, self.line, self.column))

    def __str__(self) -> str:
        return f"{self.name} at {self.file}:{self.line}"


def name_of(fn: Callable) -> str:
    """Returns a symbol-friendly name for a Python callable (`<lambda>` becomes `lambda`)."""
    fn = _unwrap(fn)
    name = getattr(fn, "__name__", type(fn).__name__)
    return re.sub(r"\W", "", name) or "fn"


def _unwrap(fn: Callable) -> Callable:
    """Looks through `functools.partial` and decorators that set `__wrapped__`."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn
