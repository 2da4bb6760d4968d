"""One run of a program plan, as the client and the gang scheduler see it.

The islands keep the run's buffers; the run keeps its id, its plan (with
frees and peaks), what it needs of device memory, the islands it uses, the
values of host buffers (program arguments the plan keeps on the host), the
shared objects it reads (`runtime/shared.py`), its deadline if it has one,
the fast lane whose credit it holds if it took one, once something
went wrong its error, and once it is over its measured device time.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future, InvalidStateError
from typing import Any, NamedTuple

from pathways_mlir.dialect.plan import ProgramPlan

from .island_work import UNCHECKED

_run_ids = itertools.count()


class Stored(NamedTuple):
    """A host buffer's value once the run's host steps are over and an island's store keeps the array for its
    handle (`Run.on_devices`): read from there, and where it lies."""

    island: str
    sharding: Any


class Run:
    """A program run started by one client (a plain class: one is made per call, so it is cheap)."""

    __slots__ = ("plan", "key", "client_id", "islands", "need", "weight", "cost", "id", "admitted", "error",
                 "released", "host", "parent", "donations", "deadline", "reads", "credit", "charged", "device_seconds",
                 "retired", "branch", "checks", "on_devices", "__weakref__")

    def __init__(self, plan: ProgramPlan, key: int, client_id: int, islands: tuple[str, ...], need: dict,
                 weight: float = 1.0, cost: float = 1.0, parent: "Run | None" = None):
        self.plan = plan                  # with frees and peaks
        self.key = key                    # the plan's key on the islands
        self.client_id = client_id
        self.islands = islands            # every island the run has work or buffers on
        self.need = need                  # admission.Need: its static peak per island
        self.weight = weight
        self.cost = cost
        self.id = next(_run_ids)
        self.admitted = False             # set by the gang scheduler, under its lock
        self.error: BaseException | None = None
        self.released: set[int] = set()   # results whose handles were released
        self.host: dict[int, Any] = {}    # host buffers' values (futures)
        self.parent = parent              # the run whose host cond started this branch run, if any
        self.branch: "Run | None" = None  # the latest branch run its host cond started, if any
        self.donations: tuple[tuple[int, int], ...] = ()   # (run id, buffer) of the results donated to it
        # When its `timeout=` ends (monotonic seconds), if it has one; a branch run has its parent's.
        self.deadline: float | None = None if parent is None else parent.deadline
        self.reads: tuple[tuple[int, int], ...] = ()   # the keys of the shared objects it reads
        self.credit = None                # the fast lane whose credit holds its need (runtime/fast_lane.py), if any
        self.charged = 0.0                # the device seconds `share` charged it (estimated, then as measured)
        self.device_seconds: float | None = None   # measured once it is over, if its islands could tell
        self.retired = False              # the gang scheduler is done with it: over, its memory given back (or
                                          # cancelled while queued)
        # The JAX debug checks its launches make: those of the call that started it, or its parent's.
        self.checks = UNCHECKED if parent is None else parent.checks
        # Host buffers whose arrays lie on an island's devices, where its store keeps them for their handles (a
        # pw.cond's result the program returns as it is: `Runtime.keep_on_devices`): buffer -> (island, need).
        self.on_devices: dict[int, tuple[str, dict]] | None = None

    def host_value(self, buffer: int) -> Future:
        """Returns the future of a host buffer's value (made the first time it is asked for)."""
        return self.host.setdefault(buffer, Future())

    def settle_host(self, buffer: int, value: Any = None, error: BaseException | None = None) -> None:
        """Sets a host buffer's value, or with `error` its failure; the first outcome stays (a cancel and the
        thread of the run's cond may both settle it)."""
        future = self.host_value(buffer)
        try:
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        except InvalidStateError:
            pass

    def host_steps_over(self) -> None:
        """Its host steps (its conds) are over: the values an island's store keeps for its handles
        (`on_devices`) are read from there from now on, and the host lets go of them, so that releasing a
        handle (or closing its client) frees their devices."""
        for buffer, (island, _) in (self.on_devices or {}).items():
            future = self.host.get(buffer)
            if future is not None and future.done() and future.exception() is None:
                stored: Future = Future()
                stored.set_result(Stored(island, future.result().sharding))
                self.host[buffer] = stored

    def leave_parent(self) -> None:
        """This branch run is over (retired, or cancelled before it was admitted): its parent, which is over only
        once its branch is (`GangScheduler._poll`), no longer waits for it. Under the scheduler's lock."""
        if self.parent is not None and self.parent.branch is self:
            self.parent.branch = None

    def island_of(self, buffer: int) -> str | None:
        """Returns the island a buffer lives on (None for a host buffer)."""
        return self.plan.island_of(buffer)
