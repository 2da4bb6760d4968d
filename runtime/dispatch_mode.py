"""Dispatch modes: how a run's steps go out to its islands (runtime/dispatch.py; simulated by sim/engine.py).

- `parallel` (the default, the paper's section 4.5): the host work of a static subgraph is done once, at
  load; a run is one message per island.
- `sequential` (the fallback, and the baseline the paper measures against): one step at a time, in
  dependency order, each once the buffers it reads exist.

Kept apart from `dispatch.py` (which imports JAX through the islands) so that the simulator and the CLI
parse a mode without starting anything. User-facing strings (`dispatch="sequential"`, `--dispatch`) are
parsed once, at the boundary, by `DispatchMode.parse`.
"""

from __future__ import annotations

import enum


class DispatchMode(enum.StrEnum):
    """A dispatch mode; its value is the name users write."""

    PARALLEL = "parallel"
    SEQUENTIAL = "sequential"

    @classmethod
    def parse(cls, value: "str | DispatchMode") -> "DispatchMode":
        """Returns the mode named `value`; raises ValueError in one line naming it and the choices."""
        if type(value) is cls:
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown dispatch mode '{value}' (choose from {', '.join(cls)})") from None
