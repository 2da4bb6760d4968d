"""One run of a program plan, as its client sees it.

The islands keep the run's buffers; the client keeps the run's id, its plan,
the futures of its outputs (fetched from the islands when the run starts) and
the values of host buffers (program arguments the plan keeps on the host).
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from dataclasses import dataclass, field

from pathways_mlir.dialect.plan import ProgramPlan

_run_ids = itertools.count()


@dataclass(eq=False)
class Run:
    """A program run started by one client."""

    plan: ProgramPlan
    client_id: int
    id: int = field(default_factory=lambda: next(_run_ids))
    done: Future = field(default_factory=Future)
    outputs: dict[int, Future] = field(default_factory=dict)
    host: dict[int, Future] = field(default_factory=dict)

    def island_of(self, buffer: int) -> str | None:
        """Returns the island a buffer lives on (None for a host buffer)."""
        info = self.plan.buffers[buffer]
        return None if info.slice is None else self.plan.slices[info.slice].island

    def islands(self) -> set[str]:
        """Returns the islands this run has work or buffers on."""
        return {i for i, steps in self.plan.islands.items() if steps} | {
            self.island_of(b) for b in self.plan.inputs if self.island_of(b) is not None}

    def fail(self, error: BaseException) -> None:
        """Marks the run failed (its outputs' waiters see `error`)."""
        for future in [*self.outputs.values(), self.done]:
            if not future.done():
                future.set_exception(error)
