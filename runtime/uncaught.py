"""How a script that never catches one of pathways_mlir's own errors ends: in one line.

Every exception class defined in this package (`ServiceError`, `PlanError`,
`PlacementError`, `OutOfDeviceMemory`, `RunCancelled`, ...) carries a message
written to be read on its own: what is wrong, where and what to do. When a
script leaves one uncaught, Python would print a traceback through the
package's internals above that message. The hook installed here prints
instead one line naming the script's own call that raised it:

    train.py:12: ServiceError: no service file at ~/.cache/pathways-mlir/service.json: is pw-serve running?

and the script exits with status 1, as Python's default hook does. Errors of
other classes (a `TypeError` from a bug, the user's own exceptions) keep their
traceback, and so does everything when `PW_TRACEBACK=1` is set. The hook
wraps whatever hook was installed before it; it never changes caught
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


def _is_own_error(error: BaseException) -> bool:
    return type(error).__module__.split(".")[0] == _PACKAGE


def _callers_line(trace: TracebackType | None) -> str:
    """The innermost frame of `trace` outside this package, as `file:line`."""
    where = ""
    for frame, line in traceback.walk_tb(trace):
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            where = f"{frame.f_code.co_filename}:{line}: "
    return where


def install() -> None:
    """Report this package's uncaught errors in one line (see the module's docstring)."""
    previous = sys.excepthook
    if getattr(previous, "_pathways_one_line", False):
        return

    def report(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if _is_own_error(error) and os.environ.get("PW_TRACEBACK", "") in ("", "0"):
            print(f"{_callers_line(trace)}{kind.__name__}: {error}", file=sys.stderr)
            return
        previous(kind, error, trace)

    report._pathways_one_line = True
    sys.excepthook = report
