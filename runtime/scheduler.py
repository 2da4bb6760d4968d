"""The gang scheduler: one consistent order of work, and per-run admission, for every island.

Clients submit runs (their work split by island); the scheduler admits each
run once its whole static peak fits in device memory (`admission.py`),
gives it a ticket and starts its work on every island it uses, in ticket
order, under one lock. Starting only enqueues work on each island's
executor, so the lock is held briefly. Every island therefore sees every
client's work in the same relative order (tickets are given at admission),
and no island ever waits for memory.

Admission never holds others back and cannot deadlock:

- A run that could never fit a device, even empty, fails at once with
  `OutOfDeviceMemory`.
- A run that does not fit now waits only for memory that runs in flight
  will give back. If it would not fit even once every run in flight is
  over (what blocks it is held by live handles alone), it fails at once with
  `OutOfDeviceMemory`, naming the device, the bytes it needs and who holds
  what there.
- Each client's runs are admitted in its order, but a run waiting for
  memory never blocks another client's run that fits: the scheduler looks
  at every client's oldest queued run, in the policy's order, and admits
  each that fits, unless admitting it would leave an older waiting run (at
  the head of its client's queue or behind it) never fitting (`_crowds_out`:
  the older run could fit once every run in flight is over, but not once
  the new run is over too, its results held). The new run then waits
  behind it: a waiting run is never failed because of runs admitted after
  it.

No policy starves a run. Every run admitted while an older run of another
client waits at the head of its queue overtakes it; a run overtaken
`OVERTAKES` times holds a reservation (the oldest, if several get there at
once; `waiting_runs.py` keeps the queues and the count): it is looked at
first, before the policy's order, and meanwhile only runs that fit beside
it in memory, and (under a window) leave it a place on each of its
islands, are admitted. So once at the head of its client's queue, a run
waits for at most `OVERTAKES` runs admitted after it, then for the runs in
flight (a place in the window, the memory it needs), and for the older
runs it would leave never fitting: a reserved run that would passes the
reservation to the head of such a run's queue (that run does not fit
beside it, and would wait behind the reservation for good), an older run
each time. So with nothing in flight, the run the reservation ends with,
or the oldest queued run if none holds it, is admitted or fails with
`OutOfDeviceMemory`: queued runs never wait for each other for ever.

Shared objects (`runtime/shared.py`) are counted once, for their owner (`held_results.py`).
From its submission until it is over, a run that reads one is one of the
object's readers; an owner's release of an object still read takes effect
(its bytes go back) when the last reader is over, and a run submitted after
the release is refused.

The rest of a run already admitted (the steps after a host `cond`, or the
steps of a sequential dispatch) is delivered at once with a new ticket: it
needs no more memory. A cond's branch run (`Run.parent`) continues its
admitted parent, which waits for it: it takes its parent's place in a
policy's window, goes ahead of its client's queued runs and of a
reservation, and needs no memory of its own (its parent's need counts its
largest branch's, `admission.run_need`). Had it waited for a place, for
memory, or behind its client's later runs, those would have waited for its
parent, and none would ever have gone on. A branch run whose parent failed
(a cancel) before it was admitted fails with its parent's error instead: its
parent may be retired already, its reservation given back.

Policies (`policies.py`, one object each: fifo, share, sjf, deadline) give
the order in which clients' oldest queued runs are looked at. Every policy
but `fifo` admits at most `window` runs onto each island's devices at a
time: a run needs a place on every island it uses, so runs on one island
never wait for another island's window. What the policy orders is the runs
queued beyond the window, and the order it picks is fixed at admission, by
the tickets, so every island still sees one order. The submitting thread
admits a run itself when its client has nothing queued and it fits (under
a policy with a window, when the window has a place for it too).

A run's device time (what `share` charges and `sjf` orders by) is
estimated by `device_estimates.py`.

`hold()` stops admissions (new work queues up) until `release()`; `cancel`
takes a queued run out or fails an admitted one on every island.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
import weakref
from typing import Any, Callable

from .admission import MemoryLedger, OutOfDeviceMemory
from .device_estimates import DeviceTimeEstimates
from .held_results import HeldResults
from .island_work import ORDER_HISTORY, IslandWork, RunFailed, host_arrays_copied, raised
from .policies import Policy, parse_policy
from .run import Run
from .status import LISTED, first_listed, held_by_handles, shortfall
from .waiting_runs import OVERTAKES, WaitingRun, WaitingRuns

Works = dict[str, tuple[tuple[int, ...], tuple[tuple[int, Any], ...], bool]]   # island -> (steps, inputs, last)
_POLL_AFTER = 32      # every so many submissions, so many of the oldest admitted runs are checked
_UNTIMED = 64         # untimed runs of one plan kept to be charged once a run of it is measured
_WAIT_SLICE = 0.02    # seconds the admission thread waits on one run before looking at the others
_SHARE_POLL = 0.01    # seconds between looks at a run whose result is to be shared (`share`)


class Untimed:
    """What charging a run over that its islands could not time needs (`Policy.retired` reads and sets
    `charged`; the estimate reads `key` and `cost`), with the run held weakly: holding it would keep its plan
    loaded (`Runtime._forget_unused`). A run still alive gets the charge too."""

    __slots__ = ("key", "cost", "client_id", "weight", "charged", "run")

    def __init__(self, run: Run):
        self.key, self.cost, self.client_id, self.weight, self.charged = (run.key, run.cost, run.client_id,
                                                                          run.weight, run.charged)
        self.run = weakref.ref(run)


class GangScheduler:
    """Admits runs from all clients and delivers their work to islands, in ticket order."""

    def __init__(self, islands: dict[str, Any], ledger: MemoryLedger, policy: Policy | str = "fifo",
                 window: int | None = None):
        self.islands = islands
        self.ledger = ledger
        self.policy = parse_policy(policy, window)
        self.window = self.policy.window     # (fifo has none)
        self._tickets = itertools.count()
        self._lock = threading.RLock()
        self._unblocked = threading.Condition(self._lock)   # the admission thread waits on it
        self._admissions = threading.Condition(self._lock)  # continue_run and wait_admitted wait on it
        self._submits = 0
        self._waiting = WaitingRuns()     # the runs queued for admission, per client
        self.estimates = DeviceTimeEstimates()
        self._in_flight: dict[int, Run] = {}           # admitted runs still on the devices, by admission
        self._results = HeldResults(ledger)
        self._lanes: list = []            # the fast lanes of loaded plans (runtime/fast_lane.py)
        self._held = False
        self._blocked = False
        self._pumping = False          # `_pump` is admitting (a look inside it may call `wake`, which pumps)
        self._polling = False          # `_poll` is retiring runs (likewise)
        # Runs over that their islands could not time, of plans with no measured run yet (see `_retire`).
        self._untimed: collections.defaultdict[int, list[Untimed]] = collections.defaultdict(list)
        self._closed = False
        # The latest (ticket, client id) delivered, for share checks; bounded for long runs.
        self.delivered: collections.deque[tuple[int, int]] = collections.deque(maxlen=ORDER_HISTORY)
        self._thread = threading.Thread(target=self._admission_loop, name="pw-admission", daemon=True)
        self._thread.start()

    # -- submissions ---------------------------------------------------------

    def submit(self, run: Run, works: Works, inline: bool = True) -> None:
        """Admits `run` now if it fits and its client has nothing queued, else queues it; raises
        `OutOfDeviceMemory` if it can never fit, or not until handles are released. With `inline`, a run
        admitted here whose islands are idle is executed on this thread, after the lock is let go (see
        `Island.start`)."""
        why = self.ledger.never_fits(run.need)
        if why is not None:
            raise OutOfDeviceMemory(f"program {run.plan.program} {why}")
        with self._lock:
            if self._closed:
                raise RuntimeError("the runtime is closed")
            if self.policy.follows_arrivals:
                self.policy.arrived(run, self._idle(run.client_id), self.device_seconds)
            if run.reads:
                self._results.read(run)
            try:
                jobs = self._admit_now(run, works, inline)
            except BaseException:
                self._results.unread(run)
                raise
            if jobs is None:               # its arguments are placed once it is admitted
                self._waiting.add(run, {island: (steps, host_arrays_copied(inputs), last)
                                        for island, (steps, inputs, last) in works.items()})
                self._pump()
                return
        _run_inline(jobs)

    def _idle(self, client_id: int) -> bool:
        """Whether a client has no run queued and none on the devices. Under the lock."""
        return not self._waiting.has_client(client_id) and \
            all(run.client_id != client_id for run in self._in_flight.values())

    def _admit_now(self, run: Run, works: Works, inline: bool) -> list | None:
        """Admits a run that fits if nothing of its client is queued (returns the work to run inline), or
        returns None: it queues. Under a policy with a window, only while the window has a place for it on
        each of its islands. It queues too behind a reservation it does not fit beside, or behind an older
        waiting run it would leave never fitting (`_crowds_out`). A cond's branch run goes at once, unless
        admission is held: it needs no place and no memory of its own. Raises `OutOfDeviceMemory` if only
        handles hold what a run lacks."""
        self._submits += 1
        branch = run.parent is not None
        if branch and run.parent.error is not None:
            raise raised(run.parent.error)      # its parent's reservation may be given back (module doc)
        if self._held or not branch and (self._waiting.has_client(run.client_id) or self._window_closed(run)):
            return None
        if len(self._in_flight) > _POLL_AFTER and self._submits % _POLL_AFTER == 0:
            self._poll(_POLL_AFTER)
        if not branch and self._behind_reservation(run):
            return None
        if self._fits(run) or (self._poll(len(self._in_flight)) and self._fits(run)) or \
                (self._reclaim() and self._fits(run)):
            if not branch:
                if self._waiting.count and self._crowds_out(run, math.inf) is not None:
                    return None
                self._waiting.overtaken_by_newcomer()
            return self._admit(run, works, inline)
        held = self._held_by_handles(run)
        if held is not None:
            raise OutOfDeviceMemory(held)
        return None

    def continue_run(self, run: Run, works: Works) -> None:
        """Delivers more work of an admitted run (after a cond, or a sequential step) with a new ticket."""
        with self._lock:
            self._admissions.wait_for(lambda: run.admitted)
            if run.error is not None:
                raise raised(run.error)
            self._deliver(run, works)

    def wait_admitted(self, run: Run, timeout: float | None = None) -> bool:
        """Waits until `run` is admitted (or cancelled); returns False on timeout."""
        with self._lock:
            return self._admissions.wait_for(lambda: run.admitted, timeout)

    def cancel(self, run: Run, error: BaseException) -> bool:
        """Takes `run` out of its queue and fails it with `error`; returns False if it was not queued."""
        return self._cancel_queued(lambda r: r is run, lambda r: error) > 0

    def share(self, run: Run, buffer: int, timeout: float | None = None) -> None:
        """Checks that a result can be shared: its run is retired (now, if it is over; a cond's parent run is
        retired only after its branch run, so this waits for that, at most `timeout` seconds) and its bytes are
        held."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while run.id in self._in_flight:
                self._poll(len(self._in_flight))
                left = _SHARE_POLL if deadline is None else min(_SHARE_POLL, deadline - time.monotonic())
                if run.id not in self._in_flight or left <= 0:
                    break
                self._admissions.wait(left)        # (the lock let go meanwhile)
            self._results.check_shareable(run, buffer)

    def release_result(self, run: Run, buffer: int, donated: bool = False) -> None:
        """A result's handle was released: its bytes go back once the run is over (and, for a shared object,
        once the runs reading it are). A `donated` result that is held stays reserved until the run it was
        donated to is admitted (`HeldResults.hand_over`).

        A result of a run not retired yet is only marked released, without the lock: `_retire` marks its run
        retired before it keeps the bytes of the results not released (`HeldResults.keep`), so a release that
        finds the run not retired after marking the result is seen by `keep`, and one that finds it retired
        gives the bytes back under the lock, as for any result of a run that is over."""
        run.released.add(buffer)         # `keep` skips it, and `Runtime.wait` looks for it no more
        if not run.retired:
            return
        with self._lock:
            if self._results.release(run, buffer, donated):
                self._pump()

    def release_client(self, client_id: int) -> None:
        """A client closed: the bytes of every result it held go back."""
        with self._lock:
            self._results.release_client(client_id)
            self.policy.forget(client_id)
            self._forget_gone(client_id)
            self._pump()

    def wake(self) -> None:
        """A run's device work is over somewhere: a run waiting for memory or for the window may be admitted
        now. The thread that saw the run over admits it (an island's completion tracker, or a client that
        asked), saving the admission thread's wake-up. A thread that is admitting or retiring runs already (a
        look inside `_pump` or `_poll` calls this) wakes the admission thread instead."""
        with self._lock:
            if not self._blocked or self._held:
                return
            if self._pumping or self._polling:
                self._unblocked.notify_all()
                return
            self._poll(len(self._in_flight))
            self._pump()

    def record_device_seconds(self, plan_key: int, seconds: float, estimate: float | None = None) -> None:
        """Folds one run's measured device time into its plan's estimate (`DeviceTimeEstimates.record`); tests
        inject durations with it."""
        with self._lock:
            self.estimates.record(plan_key, seconds, estimate)

    def device_seconds(self, run: Run) -> float:
        """Returns the device time of a run, as `share` charges it and `sjf` orders by (measured if known)."""
        return self.estimates.of(run)

    def usage(self) -> dict[tuple[str, int], int]:
        """Returns the bytes reserved on every device, after retiring the runs that are over."""
        with self._lock:
            self._poll(len(self._in_flight))
            self._reclaim()
            return self.ledger.usage()

    def status(self, client: int | None = None) -> dict:
        """Returns the queued runs (of `client` only, if given), each with why it is not admitted yet, and the
        admitted runs still on the devices: at most `LISTED` of each, and how many there are. The queued runs
        listed are every client's oldest, then every client's next, and so on, so that a client with many runs
        queued hides no other client's: its oldest says what the queue waits for."""
        with self._lock:
            queues = [queue for queue in self._waiting.queues()
                      if queue and (client is None or queue[0].run.client_id == client)]
            listed, left = [0] * len(queues), LISTED      # how many of each queue's runs are listed, oldest first
            for position in range(LISTED):
                for index, queue in enumerate(queues):
                    if left and position < len(queue):
                        listed[index] += 1
                        left -= 1
            queued = []
            for queue, count in zip(queues, listed):
                for position, item in enumerate(itertools.islice(queue, count)):
                    run = item.run
                    if position:
                        why = f"run {queue[0].run.id} of its client (a client's runs are admitted in order)"
                    elif self._held:
                        why = "admission, which is held"
                    elif run.parent is None and self._window_closed(run):
                        why = f"a place in the {self.policy.name} window ({self.window} runs on the devices of " \
                              f"{self._full_island(run)})"
                    elif run.parent is None and self._behind_reservation(run, item):
                        why = f"run {self._waiting.reserved.run.id}, which holds a reservation (it was overtaken " \
                              f"{OVERTAKES} times)"
                    elif run.parent is None and self.ledger.fits(run.need) and \
                            (older := self._crowds_out(run, item.arrival)) is not None:
                        why = f"run {older.run.id}, which waits for memory that this run's results would keep"
                    else:
                        why = shortfall(self.ledger, run.need) or "admission (it fits now)"
                    queued.append({"run": run.id, "client": run.client_id, "program": run.plan.program,
                                   "waits_for": why})
            return {"policy": self.policy.name, "queued": queued, "queued_count": sum(map(len, queues)),
                    "admitted": first_listed(self._in_flight), "admitted_count": len(self._in_flight)}

    def fail_island(self, island: str, error: Callable[[Run], BaseException]) -> list[Run]:
        """Fails the queued runs that need a lost island with `error(run)`, and gives back the bytes of the
        results it held (those of runs over and not retired yet too: retired first, later they kept their
        results' bytes on the lost island); returns the admitted runs still on the devices that use it."""
        self._cancel_queued(lambda run: island in run.islands, error)
        with self._lock:
            if self._in_flight:
                self._poll(len(self._in_flight))
            self._results.forget_island(island)
            return [run for run in self._in_flight.values() if island in run.islands]

    def cancel_client(self, client_id: int, error: Callable[[Run], BaseException]) -> int:
        """Fails the queued runs of a client that left with `error(run)`; returns how many. Its admitted runs
        go on."""
        return self._cancel_queued(lambda run: run.client_id == client_id, error)

    def _cancel_queued(self, doomed: Callable[[Run], bool], error: Callable[[Run], BaseException]) -> int:
        """Takes the queued runs that `doomed` picks out of their queues and fails each with `error(run)`."""
        with self._lock:
            taken = self._waiting.remove(doomed)
        for item in taken:
            self._cancel(item.run, error(item.run))
        with self._lock:
            self._pump()
        return len(taken)

    def hold(self) -> None:
        """Stops admitting work until `release()`; submissions queue up meanwhile."""
        with self._lock:
            self._held = True
            self._reclaim()

    def release(self) -> None:
        """Resumes admitting work, in the order the policy gives."""
        with self._lock:
            self._held = False
            self._unblocked.notify_all()      # the admission thread may wait for it (blocked, and held)
            self._pump()

    def close(self) -> None:
        """Fails every queued run and stops the admission thread."""
        with self._lock:
            self._closed = True
            queued = self._waiting.remove(lambda run: True)
            self._unblocked.notify_all()
        for item in queued:
            self._cancel(item.run, RunFailed(f"the runtime closed before run {item.run.id} of "
                                             f"{item.run.plan.program} was admitted"))
        self._thread.join(timeout=2)

    # -- admission -------------------------------------------------------------

    def _pump(self) -> None:
        """Admits queued runs that fit, in the policy's order; fails those that never will. Under the lock; a
        call made while admitting (a look that retires runs calls `wake`) returns at once, the admitting loop
        going on with what that look freed."""
        if self._pumping:
            return
        self._pumping = True
        try:
            self._admit_queued()
        finally:
            self._pumping = False

    def _admit_queued(self) -> None:
        polled = False
        while self._waiting and not self._held and not self._closed:
            progress = False
            for item in self._waiting.heads(self.policy, self.device_seconds):
                run = item.run
                if run.parent is not None and run.parent.error is not None:
                    self._waiting.take(item)
                    self._cancel(run, raised(run.parent.error))     # as in `_admit_now`
                    progress = True
                    break
                if run.parent is None:   # a cond's branch run needs no place, and goes before a reservation
                    if self._window_closed(run) and not polled:
                        polled = True
                        self._poll(len(self._in_flight))
                    if self._window_closed(run) or self._behind_reservation(run, item):
                        continue
                if not self._fits(run) and not polled:
                    polled = True
                    self._poll(len(self._in_flight))
                    self._reclaim()
                if self._fits(run):
                    older = None if run.parent is not None else self._crowds_out(run, item.arrival)
                    if older is not None and item is self._waiting.reserved:
                        # The older run does not fit beside the reservation, so it would wait for it for good:
                        # the reservation goes to the older run's queue (to an older run each time: this ends).
                        self._waiting.reserve_for(older)
                        progress = True
                        break
                    if older is not None:
                        continue         # it waits behind the older run (module doc)
                    self._waiting.take(item)
                    self._admit(run, item.works)
                    progress = True
                    break
                held = self._held_by_handles(run)
                if held is not None:
                    self._waiting.take(item)
                    self._cancel(run, OutOfDeviceMemory(held))
                    progress = True
                    break
            if not progress:
                self._block()
                return
        self._blocked = False

    def _window_closed(self, run: Run) -> bool:
        """Whether the policy's window has no place for `run`: an island it uses has `window` admitted runs on
        its devices. Under the lock."""
        return self.policy.windowed and self._full_island(run) is not None

    def _full_island(self, run: Run) -> str | None:
        """The first island of `run` whose window is full, or None. Under a policy with a window, and the lock."""
        for island in run.islands:
            if self._on_island(island) >= self.window:
                return island
        return None

    def _on_island(self, island: str) -> int:
        """How many admitted runs are on `island`'s devices (a policy's window keeps them few). Under the lock."""
        return sum(island in run.islands for run in self._in_flight.values())

    def _block(self) -> None:
        """Queued runs cannot be admitted now: the admission thread starts waiting for runs in flight to end
        (woken only when it has nothing to wait for yet; while it waits it looks every `_WAIT_SLICE`, and the
        thread that sees a run over admits)."""
        if not self._blocked:
            self._blocked = True
            self._unblocked.notify_all()

    def _behind_reservation(self, run: Run, item=None) -> bool:
        """Whether the reservation holds `run` back: another waiting run holds it (not `item`, `run`'s own place
        in its queue) and `run` does not fit beside it, or (under a window) would take the last place on an
        island it needs: else runs on one of its islands could take each place it needs as another frees."""
        reserved = self._waiting.reserved
        if reserved is None or item is reserved:
            return False
        if not self.ledger.fits_beside(run.need, reserved.run.need):
            return True
        return self.policy.windowed and reserved.run.parent is None and \
            any(self._on_island(island) + 1 >= self.window for island in run.islands
                if island in reserved.run.islands)

    def _crowds_out(self, run: Run, arrival: float) -> WaitingRun | None:
        """Returns a waiting run that arrived before `arrival` (at the head of its client's queue or behind it)
        that admitting `run` would leave never fitting: it could fit once every run in flight is over, but not
        once `run` is over too, `run`'s results held; or None. A run that fits beside all of `run`'s peak now is
        not looked at further, and of a client's runs of one kind (one need, the same donations: they fit or
        not together) only the oldest is looked at, so a check costs what the kinds of runs queued cost, not
        what every queued run would. Under the lock."""
        beside = None
        for older in self._waiting.oldest_of_each_kind(arrival):
            if beside is None:
                beside = self.ledger.copy()
                beside.take(run.need)
            if beside.fits(older.run.need):
                continue
            if self._held_by_handles(older.run, run) is not None and self._held_by_handles(older.run) is None:
                return older
        return None

    def _fits(self, run: Run) -> bool:
        """Whether `run`'s peak fits now, counting the results donated to it as its own bytes."""
        if not run.donations:
            return self.ledger.fits(run.need)
        handed = self._results.donated_needs(run)
        for need in handed:
            self.ledger.give(need)
        fits = self.ledger.fits(run.need)
        for need in handed:
            self.ledger.take(need)
        return fits

    def _held_by_handles(self, run: Run, admitting: Run | None = None) -> str | None:
        """Says why `run` cannot fit even once every run in flight (and `admitting`, if given) is over, or None
        if it could then."""
        return held_by_handles(self.ledger, run, self._in_flight.values(), self._results.held,
                               self._results.gone, self._results.unshared, admitting)

    def add_lane(self, lane) -> None:
        """Keeps a fast lane (`runtime/fast_lane.py`), whose unused credits `_reclaim` takes back."""
        with self._lock:
            self._lanes.append(lane)

    def _reclaim(self) -> bool:
        """Takes every fast lane's unused credits back into the ledger (the scheduler must queue, or reason
        about what is free); returns whether there were any. Under the lock."""
        reclaimed = False
        for lane in self._lanes:
            reclaimed = lane.reclaim() or reclaimed
        return reclaimed

    def _admit(self, run: Run, works: Works, inline: bool = False) -> list:
        """Reserves `run`'s peak, puts it in flight and delivers its work; returns the work its caller runs
        `inline` (`submit`). Under the lock."""
        self._results.hand_over(run)
        reserved_before = self.ledger.rows(run.need)
        try:
            self.ledger.take(run.need)
            self._in_flight[run.id] = run
        except BaseException:
            # An interrupt (Ctrl-C) before the run was in flight: no retirement would give its peak back. The
            # reservations as they were are exact wherever in `take` it landed.
            if run.id not in self._in_flight:
                self.ledger.restore(reserved_before)
            raise
        try:
            self.policy.admitted(run, self.device_seconds, self._waiting.clients())
            return self._deliver(run, works, inline)
        finally:
            # Admitted once in flight, even if an interrupt (Ctrl-C) came first, so that `Runtime.abandon` gives
            # it up: it ends the inline turn its islands may have given this thread, and releases its results
            # (else it stayed under way for good, or was retired as a success, its results held for no handle).
            run.admitted = True
            self._admissions.notify_all()

    def _deliver(self, run: Run, works: Works, inline: bool = False) -> list:
        ticket = next(self._tickets)
        self.delivered.append((ticket, run.client_id))
        return self.islands.start(run, {island: IslandWork(ticket, run.id, run.client_id, run.key, steps, inputs,
                                                           last, run.checks)
                                        for island, (steps, inputs, last) in works.items()}, inline)

    def retire_over(self) -> None:
        """Retires every admitted run whose device work is over (the runtime's watchdog calls it). A fast lane
        retires its runs only when it needs their credits back, so a program called a few times and dropped
        kept its runs in flight, and each run its plan, loaded for good."""
        with self._lock:
            if self._in_flight:
                self._poll(len(self._in_flight))

    def _poll(self, limit: int) -> bool:
        """Retires admitted runs whose device work is over, looking at the oldest `limit`; True if any. A cond's
        parent run is over only once its branch run is retired: the branch computes within the parent's
        reservation (a parent cancelled or failed while its branch computed gave the branch's memory back)."""
        self._polling = True
        islands = self.islands
        done = []
        try:
            for run in itertools.islice(self._in_flight.values(), limit):
                for island in run.islands:       # (a loop, not a generator per run: most runs use one island)
                    if not islands[island].run_done(run.id):
                        break
                else:
                    branch = run.branch
                    if branch is None or not branch.admitted:
                        done.append(run)
            for run in done:
                self._retire(run)
        finally:
            self._polling = False
        return bool(done)

    def _retire(self, run: Run) -> None:
        """Gives back a run's peak, keeping the bytes of the results still held; records its device time and
        tells the policy what the run took (`_charge`)."""
        del self._in_flight[run.id]
        if run.error is None:
            run.error = self._failure(run)       # before `keep`: a run that failed on an island has no results
        run.retired = True                       # before `keep`: see `release_result`
        if run.parent is not None:
            run.leave_parent()                   # (its parent keeps nothing of it)
        if run.reads:
            self._results.unread(run)
        self._results.keep(run)                  # first: a credit comes back only if it fits beside them
        if run.credit is not None:
            run.credit.returned(queued=self._waiting.count > 0)
        else:
            self.ledger.give(run.need)
        seconds = [self.islands[i].device_seconds(run.id) for i in run.islands]    # handed once: taken if it failed too
        if run.error is None:
            self._charge(run, seconds)
        if run.client_id in self._results.gone:
            self._forget_gone(run.client_id)      # after `_charge`, which records the device time of its client

    def _charge(self, run: Run, seconds: list[float | None]) -> None:
        """Records the device time a run took on each island (`seconds`) and tells the policy what the run took (a
        run its islands could not time takes its estimate, once a run of the plan has been timed)."""
        if None not in seconds:
            run.device_seconds = sum(seconds)
            self.policy.retired(run, self.estimates.record(run.key, run.device_seconds, run.cost, run.client_id))
            if run.key in self._untimed:
                self._charge_untimed(run.key)
        elif self.estimates.measured(run.key) is None:
            self._untimed[run.key].append(Untimed(run))    # charged once a run of its plan is timed (a plan's
                                                           # first run)
            if len(self._untimed[run.key]) >= _UNTIMED:
                self._charge_untimed(run.key)
        else:
            self.policy.retired(run, self.estimates.of(run))   # untimed: its estimate as it stands

    def _failure(self, run: Run) -> BaseException | None:
        """The error `run` failed with on one of its islands (a launch that raised there), if any: the islands
        fail a run without the scheduler."""
        islands = self.islands
        for island in run.islands:
            error = islands[island].failure(run.id)
            if error is not None:
                return error
        return None

    def _forget_gone(self, client_id: int) -> None:
        """Forgets a closed client once none of its runs is queued or on the devices (the results of those are
        not kept, `HeldResults.keep`): no run of it comes after. Under the lock."""
        if client_id in self._results.gone and self._idle(client_id):
            self._results.gone.discard(client_id)
            self.estimates.forget_client(client_id)

    def forget_plan(self, plan_key: int, lane=None) -> None:
        """A plan nothing holds any more (`Runtime.load`), or one of a lost island (`Runtime.restore_island`): its
        untimed runs are charged its estimate as it stands, its estimate and its fast lane (after its unused
        credits go back) are forgotten."""
        with self._lock:
            self._charge_untimed(plan_key)
            self.estimates.forget(plan_key)
            if lane is not None and lane in self._lanes:
                lane.reclaim()
                lane.kept = False      # the credits of its runs still in flight go back to the ledger
                self._lanes.remove(lane)

    def _charge_untimed(self, plan_key: int) -> None:
        """Tells the policy that the untimed runs of a plan kept so far took its estimate as it stands."""
        for untimed in self._untimed.pop(plan_key, ()):
            self.policy.retired(untimed, self.estimates.of(untimed))
            run = untimed.run()
            if run is not None:
                run.charged = untimed.charged

    def _cancel(self, run: Run, error: BaseException) -> None:
        run.error = error
        for island in run.islands:
            self.islands[island].fail_run(run.id, error)
        self.islands.unpin(run)               # its start will never be sent
        with self._lock:
            self._results.hand_over(run)
            if run.reads:
                self._results.unread(run)
            run.admitted = True
            run.retired = True                # never in flight: nothing to give back
            run.leave_parent()
            self._forget_gone(run.client_id)
            self._admissions.notify_all()

    def _admission_loop(self) -> None:
        """While a queued run cannot be admitted, waits for admitted runs to finish (an island's `wake`, or
        every `_WAIT_SLICE` seconds for islands that do not tell) and admits again."""
        with self._lock:
            while True:
                self._unblocked.wait_for(lambda: self._closed or (self._blocked and not self._held))
                if self._closed:
                    return
                self._unblocked.wait(_WAIT_SLICE)
                self._poll(len(self._in_flight))
                self._pump()


def _run_inline(jobs: list) -> None:
    """Runs on this thread the work its islands handed back (`Islands.start` with `inline`), in order. Each of
    those islands waits for its caller's turn to end, so an interrupt one of them raises (Ctrl-C while it
    computes on this thread; the run fails everywhere) is raised once every other has had its turn, in which
    it finds the run failed."""
    interrupted = None
    for island, work in jobs:
        try:
            island.run_inline(work)
        except BaseException as error:  # noqa: BLE001  (raised below)
            interrupted = interrupted or error
    if interrupted is not None:
        raise interrupted
