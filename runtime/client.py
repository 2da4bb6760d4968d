"""Clients: the single controller's view of the cluster.

A client runs program plans and holds the results as handles. Several clients
(threads of one process) share one runtime; each sees only its own objects,
and closing a client releases everything it owns. A client's weight is its
share when the runtime's scheduler uses the `share` policy.
"""

from __future__ import annotations

import itertools
import threading
from typing import Sequence

from pathways_mlir.dialect.plan import ProgramPlan

from .dispatch import Dispatcher
from .handles import Handle
from .island import client_owner
from .run import Run
from .runtime import Runtime, get_runtime

_client_ids = itertools.count(1)


class Client:
    """One user of the cluster, with its own objects and scheduling weight."""

    def __init__(self, runtime: Runtime | None = None, weight: float = 1.0):
        if weight <= 0:
            raise ValueError(f"a client's weight must be positive, not {weight}")
        self.runtime = runtime or get_runtime()
        self.id = next(_client_ids)
        self.weight = weight
        self._dispatcher = Dispatcher(self.runtime, self.id, weight)
        self._closed = False
        self._active: set[Run] = set()
        self._lock = threading.Lock()

    @property
    def owner(self) -> tuple[str, int]:
        """The owner of this client's results in the object store."""
        return client_owner(self.id)

    def start(self, plan: ProgramPlan, args: Sequence, dispatch: str = "parallel") -> Run:
        """Starts a run of `plan`; returns the run without waiting."""
        if self._closed:
            raise RuntimeError(f"client {self.id} is closed")
        args = [a.result() if isinstance(a, Handle) else a for a in args]
        run = self._dispatcher.start(plan, args, dispatch)
        with self._lock:
            self._active.add(run)
        run.done.add_done_callback(lambda _: self._finished(run))
        return run

    def _finished(self, run: Run) -> None:
        with self._lock:
            self._active.discard(run)

    def run(self, plan: ProgramPlan, args: Sequence, dispatch: str = "parallel") -> list[Handle]:
        """Runs `plan` on `args`; returns one handle per program output."""
        run = self.start(plan, args, dispatch)
        return self.handles(run)

    def handles(self, run: Run) -> list[Handle]:
        """Returns handles to a run's outputs."""
        return [Handle(self.runtime.islands.get(run.island_of(b)), run.id, b, run.plan.buffers[b], run.outputs[b])
                for b in run.plan.outputs]

    def objects(self) -> list:
        """Returns the keys of the objects this client owns."""
        return self.runtime.owned_by(self.owner)

    def close(self) -> None:
        """Waits for the client's runs under way, then releases every object it owns.

        The client can no longer run programs.
        """
        self._closed = True
        with self._lock:
            active = list(self._active)
        for run in active:
            try:
                run.done.result()
            except Exception:  # noqa: BLE001  (a failed run owns nothing more)
                pass
        self.runtime.release_owner(self.owner)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
