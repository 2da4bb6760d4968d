"""The fast lane: a pre-built path for the runs of a plan that need none of the general path's work.

Most calls of an op-by-op loop are the simplest case the runtime has: a plan
whose steps all run on one island, under the `fifo` policy, with nothing
queued and the island idle. For each loaded plan of that kind the runtime
builds, once, a `FastLane`: the island, the island program of all the plan's
steps (built when the plan was loaded, frees folded into the launches),
where each argument goes and what a run needs. A run through the lane:

- takes a **credit** instead of being admitted: the lane reserves its plan's
  peak in the scheduler's ledger one run more each time it has no credit
  free and another fits (from `CREDITS` runs in use on, or when none fits, it
  first retires the runs that are over), and a run that is over gives its
  credit back to the lane, not to the ledger. Whenever the scheduler must
  queue a run, or reason about what runs in flight will free, it takes the
  lanes' unused credits back first (`GangScheduler._reclaim`), and while
  anything is queued a credit that comes back goes to the ledger;
- takes its ticket and is registered on its island under the scheduler's lock,
  as the general path does, so every island sees one order;
- executes on the caller's thread (`Island.run_lane`) if the island is idle,
  as the general path does; if the island is busy (other clients' runs, or
  this client's runs still executing), its program and arguments are queued
  for the island's executor, behind what is there, with no more work than
  that: clients that share an island keep to the lane.

`start` falls back to the general path (returns None) whenever one of its
conditions fails: a run queued, admission held or a reservation standing,
the scheduler closed, the island wedged or closed, no credit and none
fits, an argument that is neither a JAX or NumPy array of its input's shape
and dtype nor a handle of the run's client whose result the lane's island
already keeps (read from its store, with no fetch and no wait; a result of a
run with a timeout is not; another client's handle is refused by the general
path), or a deleted array (a caller's, or a handle's kept one deleted outside
the runtime: the general path refuses both). A NumPy array is placed as the
general path places it (`IslandExecutor._place`). Plans
on several islands, with host conds, host inputs or donated inputs never
get a lane, nor do runtimes under another policy than `fifo` or on Ray;
calls with a timeout, sequential dispatch or shared objects never take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .executables import ARRAY_TYPE
from .handles import Handle
from .island_executor import runs_collective
from .run import Run

if TYPE_CHECKING:
    from .dispatch import LoadedPlan
    from .island import Island
    from .scheduler import GangScheduler

CREDITS = 32          # runs in use from which a lane retires the runs that are over before it reserves more


class FastLane:
    """The pre-built path of one loaded plan; see the module."""

    __slots__ = ("scheduler", "island", "loaded", "buffers", "shapes", "dtypes", "count", "name", "layout", "program",
                 "collective", "free", "in_use", "runs", "kept")

    def __init__(self, scheduler: "GangScheduler", island: "Island", loaded: "LoadedPlan"):
        self.scheduler = scheduler
        self.island = island
        self.loaded = loaded
        self.buffers = tuple(buffer for buffer, _, _, _ in loaded.inputs)
        self.shapes = tuple(shape for _, _, shape, _ in loaded.inputs)
        self.dtypes = tuple(dtype for _, _, _, dtype in loaded.inputs)
        self.count = len(loaded.inputs)
        self.name = loaded.plan.program
        self.layout = island._layout(loaded.key)
        self.program = island.program(loaded.key, loaded.first[island.name])   # built when the plan loaded
        self.collective = runs_collective(self.program)   # whether its runs are held for those in flight
        self.free = 0         # credits reserved in the ledger and not used by a run
        self.in_use = 0       # credits held by runs not retired yet
        self.runs = 0         # runs that took the lane
        self.kept = True      # the scheduler keeps the lane (False once its plan is forgotten)

    @staticmethod
    def build(scheduler: "GangScheduler", islands: dict, loaded: "LoadedPlan") -> "FastLane | None":
        """Returns the lane of `loaded`, or None if its runs can never take one (see the module)."""
        plan = loaded.plan
        if scheduler.policy.windowed or len(loaded.islands) != 1 or plan.host_steps or plan.donated:
            return None
        if any(island is None for _, island, _, _ in loaded.inputs):
            return None
        lane = FastLane(scheduler, islands[loaded.islands[0]], loaded)
        scheduler.add_lane(lane)
        return lane

    def start(self, client_id: int, weight: float, args: Sequence, inline: bool = True) -> Run | None:
        """Starts a run on `args` through the lane and executes it on this thread (with `inline`, if the island
        is idle; else it is queued for the island's executor); returns None, having changed nothing, when the
        general path must take it. An argument is a JAX or NumPy array of its input's shape and dtype, or a
        handle of client `client_id` whose result is kept on the lane's island (its array is read from the
        island's store, as `fetch` reads it, without waiting); anything else takes the general path (which
        refuses another dtype or another client's handle, or takes one JAX takes as it)."""
        if len(args) != self.count:
            return None
        island = self.island
        kept = island.store.get          # a dict read: no lock needed
        values = []                      # (no (buffer, value) pair per argument: a pytree has hundreds)
        for value, shape, dtype in zip(args, self.shapes, self.dtypes):
            kind = type(value)
            if kind is Handle:
                run = value._run
                # Another client's handle takes the general path, which refuses it (its own client is open: the
                # caller checked, under the client's lock).
                if value._deleted or run.deadline is not None or value._client.id != client_id:
                    return None
                value = kept((run.id, value._buffer))
                if value is None:
                    return None          # not produced yet, released or failed, or on another island
            elif kind is not ARRAY_TYPE and kind is not np.ndarray:
                return None
            if type(value) is ARRAY_TYPE:
                # The general path refuses a deleted array in one line, where the executable would fail on it: a
                # caller's, or a handle's kept array, which a `jax.jit` it was donated to, or `result().delete()`,
                # deleted behind the handle (`Handle._value`).
                if value.is_deleted():
                    return None
                aval = value.aval            # (what its `shape` and `dtype` properties read: no call)
                if aval.shape != shape or aval.dtype != dtype:
                    return None
            elif value.shape != shape or value.dtype != dtype:
                return None
            values.append(value)
        inputs = zip(self.buffers, values)       # iterated once: by the island's queue, or by `run_lane`
        scheduler, loaded = self.scheduler, self.loaded
        # Once the island registered the run, an interrupt (Ctrl-C) gives it up (`interrupted`): else the island
        # would keep this thread's turn for good, and no handle would ever release the run's results. The
        # bookkeeping after the registration calls nothing an interrupt could land in before the run is in flight.
        run = None
        try:
            with scheduler._lock:
                if scheduler._waiting.count or scheduler._held or scheduler._closed or not self.kept:
                    return None
                if not self.free and not self._credit():
                    return None
                run = Run(loaded.plan_ref(), loaded.key, client_id, loaded.islands, loaded.need, weight, loaded.cost)
                ticket = next(scheduler._tickets)
                island_run = island.start_lane(ticket, run.id, client_id, loaded.key, self.name, self.layout,
                                               self.program, self.collective, inputs, inline)
                if island_run is None:
                    return None          # the island is closed or wedged (the ticket is left unused)
                self.free -= 1
                self.in_use += 1
                self.runs += 1
                run.credit = self
                run.admitted = True
                scheduler._in_flight[run.id] = run
                scheduler.delivered.append((ticket, client_id))
            if not island_run.queued:
                island.run_lane(island_run, self.program, self.collective, inputs)
        except BaseException as error:  # noqa: BLE001  (raised again)
            if run is not None:
                self.interrupted(run, error)
            raise
        return run

    def interrupted(self, run: Run, error: BaseException) -> None:
        """The thread starting `run` through the lane was interrupted (Ctrl-C), or its start failed, before the
        run was returned: the run fails on the lane's island, its results with it, and the island's turn ends if
        this thread still holds it (`Island.interrupted`); the bytes of its results go back if it was retired
        already. Its caller never gets its handles."""
        self.island.interrupted(run.id, error)
        for buffer in run.plan.distinct_outputs:
            self.scheduler.release_result(run, buffer)

    def _credit(self) -> bool:
        """Makes a credit free; returns whether one is. From `CREDITS` runs in use on, the lane first retires
        the runs that are over (their credits come back); if none is over (its runs still queued or
        computing, as when several clients' bursts share the island) or it holds fewer, it reserves one more
        run's peak if that fits; if it does not, it retires the runs that are over. Under the scheduler's
        lock."""
        scheduler = self.scheduler
        polled = self.in_use >= CREDITS
        if polled:
            scheduler._poll(len(scheduler._in_flight))
            if self.free:
                return True
        ledger, need = scheduler.ledger, self.loaded.need
        if ledger.fits(need):
            reserved_before = ledger.rows(need)       # (once per credit, not per run)
            try:
                ledger.take(need)
                self.free += 1
            except BaseException:
                # An interrupt (Ctrl-C) before the lane counted the credit: nothing would give its peak back. The
                # reservations as they were are exact wherever in `take` it landed.
                if not self.free:
                    ledger.restore(reserved_before)
                raise
            return True
        if self.in_use and not polled:
            scheduler._poll(len(scheduler._in_flight))
        return self.free > 0

    def returned(self, queued: bool) -> None:
        """A run's credit comes back (its run is over): to the lane, or to the ledger if runs are `queued`, the
        lane is no longer kept (`GangScheduler.forget_plan`), or its run's peak no longer fits beside what is
        reserved without it (the results that live handles hold are: the next run then takes the general
        path, which says so). Under the scheduler's lock."""
        self.in_use -= 1
        if not queued and self.kept and self.scheduler.ledger.within(self.loaded.need):
            self.free += 1       # its reservation stays, the lane's now
        else:
            self.scheduler.ledger.give(self.loaded.need)

    def reclaim(self) -> bool:
        """Gives the lane's unused credits back to the ledger; returns whether there were any. Under the
        scheduler's lock."""
        if not self.free:
            return False
        for _ in range(self.free):
            self.scheduler.ledger.give(self.loaded.need)
        self.free = 0
        return True
