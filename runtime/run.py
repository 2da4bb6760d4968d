"""One run of a program plan, as the client and the gang scheduler see it.

The islands keep the run's buffers; the run keeps its id, its plan (with
frees and peaks), what it needs of device memory, the islands it uses, the
values of host buffers (program arguments the plan keeps on the host) and,
once something went wrong, its error.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from pathways_mlir.dialect.plan import ProgramPlan

_run_ids = itertools.count()


@dataclass(eq=False)
class Run:
    """A program run started by one client."""

    plan: ProgramPlan
    key: int                          # the plan's key on the islands
    client_id: int
    islands: tuple[str, ...]          # every island the run has work or buffers on
    need: dict                        # admission.Need: its static peak per island
    weight: float = 1.0
    cost: float = 1.0
    id: int = field(default_factory=lambda: next(_run_ids))
    admitted: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    released: set[int] = field(default_factory=set)     # results released before the run was over
    host: dict[int, Any] = field(default_factory=dict)  # host buffers' values

    def island_of(self, buffer: int) -> str | None:
        """Returns the island a buffer lives on (None for a host buffer)."""
        return self.plan.island_of(buffer)
