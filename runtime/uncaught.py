"""How a script that never catches one of pathways_mlir's own errors ends: in one line.

Every exception class defined in this package (`ServiceError`, `PlanError`,
`PlacementError`, `OutOfDeviceMemory`, `RunCancelled`, ...) carries a message
written to be read on its own: what is wrong, where and what to do. When a
script leaves one uncaught, Python would print a traceback through the
package's internals above that message. The hook installed here prints
instead one line naming the script's own call that raised it:

    train.py:12: ServiceError: no service file at ~/.cache/pathways-mlir/service.json: is pw-serve running?

and the script exits with status 1, as Python's default hook does. Errors of
other classes (a `TypeError` from a shape bug in a placed function, the user's
own exceptions) keep their traceback, less the package's own frames (its code
folders: a call's way through tracing, lowering and the runtime), as JAX
removes its own; a note says so. `PW_TRACEBACK=1` shows everything as it is.
The hook wraps whatever hook was installed before it; it never changes caught
exceptions, and interactive shells that report errors themselves (IPython,
Jupyter) do not call it.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

_PACKAGE = __name__.split(".")[0]
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The package's code (not the examples, tests and benchmarks beside it in a checkout).
_CODE = (os.path.join(_PACKAGE_DIR, "__init__.py"),
         *(os.path.join(_PACKAGE_DIR, folder) + os.sep for folder in ("cli", "dialect", "frontend", "passes",
                                                                       "runtime", "sim")))
_REMOVED_NOTE = "(pathways_mlir removed its own frames from this traceback; PW_TRACEBACK=1 shows them)"


def _is_own_error(error: BaseException) -> bool:
    return type(error).__module__.split(".")[0] == _PACKAGE


def _is_own_frame(frame) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(_CODE)


def _callers_line(trace: TracebackType | None) -> str:
    """The innermost frame of `trace` outside this package's code, as `file:line`."""
    where = ""
    for frame, line in traceback.walk_tb(trace):
        if not _is_own_frame(frame):
            where = f"{frame.f_code.co_filename}:{line}: "
    return where


def _without_own_frames(error: BaseException) -> bool:
    """Drops this package's frames from the traceback of `error` and of the errors it was raised from (none
    where every frame is the package's: a bug of ours shows where it is); returns whether it dropped any."""
    seen: set[int] = set()
    removed = False
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        steps, step = [], error.__traceback__
        while step is not None:
            steps.append(step)
            step = step.tb_next
        kept = [step for step in steps if not _is_own_frame(step.tb_frame)]
        if kept and len(kept) < len(steps):
            trace = None
            for step in reversed(kept):
                trace = TracebackType(trace, step.tb_frame, step.tb_lasti, step.tb_lineno)
            error.__traceback__ = trace
            removed = True
        error = error.__cause__ or error.__context__
    return removed


def install() -> None:
    """Report this package's uncaught errors in one line (see the module's docstring)."""
    previous = sys.excepthook
    if getattr(previous, "_pathways_one_line", False):
        return

    def report(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if os.environ.get("PW_TRACEBACK", "") in ("", "0"):
            if _is_own_error(error):
                print(f"{_callers_line(trace)}{kind.__name__}: {error}", file=sys.stderr)
                return
            if _without_own_frames(error):
                error.add_note(_REMOVED_NOTE)
                trace = error.__traceback__
        previous(kind, error, trace)

    report._pathways_one_line = True
    sys.excepthook = report
