"""The gang scheduler: one consistent order of work, and per-run admission, for every island.

Clients submit runs (their work split by island); the scheduler admits each
run once its whole static peak fits in device memory (`admission.py`),
gives it a ticket and starts its work on every island it uses, in ticket
order, under one lock. Every island therefore sees every client's work in
the same relative order, and no island ever waits for memory.

A run that can never fit fails at once with `OutOfDeviceMemory`. One that
does not fit now waits in the scheduler's queue (back-pressure), and so does
everything submitted after it (admission is in ticket order: no run
overtakes another); the admission thread waits for the oldest run still on
the devices to finish, gives its memory back and admits what then fits.
The rest of a run already admitted (the steps after a host `cond`, or the
steps of a sequential dispatch) is delivered at once with a new ticket: it
needs no more memory.

Policies:
- `fifo`: runs in arrival order; the submitting thread starts a run itself
  when nothing is queued and it fits.
- `share`: proportional share across clients by weight. Runs wait in
  per-client queues; while fewer than `window` admitted runs are still on the
  devices, the admission thread admits the run with the smallest virtual
  start time (start-time fair queueing: each client's virtual time advances
  by cost / weight per run).

`hold()` stops admissions (new work queues up) until `release()`.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any, Callable

from .admission import MemoryLedger, OutOfDeviceMemory, result_need
from .island import IslandWork, RunFailed
from .run import Run
from .status import shortfall

POLICIES = ("fifo", "share")
Works = dict[str, tuple[tuple[int, ...], tuple[tuple[int, Any], ...], bool]]   # island -> (steps, inputs, last)
_POLL_AFTER = 32     # every so many submissions, so many of the oldest admitted runs are checked


class GangScheduler:
    """Admits runs from all clients in ticket order and delivers their work to islands."""

    def __init__(self, islands: dict[str, Any], ledger: MemoryLedger, policy: str = "fifo", window: int = 4):
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy '{policy}' (choose from {', '.join(POLICIES)})")
        self.islands = islands
        self.ledger = ledger
        self.policy = policy
        self.window = window
        self._tickets = itertools.count()
        self._lock = threading.RLock()
        self._unblocked = threading.Condition(self._lock)   # the admission thread waits on it
        self._admissions = threading.Condition(self._lock)  # continue_run and wait_admitted wait on it
        self._submits = 0
        self._fifo: collections.deque[tuple[Run, Works]] = collections.deque()
        self._queues: dict[int, collections.deque[tuple[Run, Works]]] = {}
        self._virtual: dict[int, float] = {}
        self._in_flight: collections.deque[Run] = collections.deque()
        self._held_results: dict[tuple[int, int], tuple[int, dict]] = {}
        self._gone: set[int] = set()      # closed clients: results of their runs are not kept
        self._held = False
        self._blocked = False
        self._closed = False
        # The latest (ticket, client id) delivered, for share checks; bounded for long runs.
        self.delivered: collections.deque[tuple[int, int]] = collections.deque(maxlen=100_000)
        self._thread = threading.Thread(target=self._admission_loop, name="pw-admission", daemon=True)
        self._thread.start()

    # -- submissions ---------------------------------------------------------

    def submit(self, run: Run, works: Works) -> None:
        """Admits `run` now if it fits and nothing is queued, else queues it; raises if it never fits."""
        why = self.ledger.never_fits(run.need)
        if why is not None:
            raise OutOfDeviceMemory(f"program {run.plan.program} {why}")
        with self._lock:
            if self._closed:
                raise RuntimeError("the runtime is closed")
            self._submits += 1
            if self.policy == "fifo" and not self._fifo and not self._held:
                if len(self._in_flight) > _POLL_AFTER and self._submits % _POLL_AFTER == 0:
                    self._poll(_POLL_AFTER)
                if self.ledger.fits(run.need) or (self._poll(len(self._in_flight)) and self.ledger.fits(run.need)):
                    self._admit(run, works)
                    return
            self._queue(run).append((run, works))
            self._pump()

    def continue_run(self, run: Run, works: Works) -> None:
        """Delivers more work of an admitted run (after a cond, or a sequential step) with a new ticket."""
        with self._lock:
            self._admissions.wait_for(lambda: run.admitted)
            if run.error is not None:
                raise run.error
            self._deliver(run, works)

    def wait_admitted(self, run: Run, timeout: float | None = None) -> bool:
        """Waits until `run` is admitted (or cancelled); returns False on timeout."""
        with self._lock:
            return self._admissions.wait_for(lambda: run.admitted, timeout)

    def release_result(self, run: Run, buffer: int) -> None:
        """A result's handle was released: its bytes go back once the run is over."""
        with self._lock:
            held = self._held_results.pop((run.id, buffer), None)
            if held is None:
                run.released.add(buffer)
                return
            self.ledger.give(held[1])
            self._pump()

    def release_client(self, client_id: int) -> None:
        """A client closed: the bytes of every result it held go back."""
        with self._lock:
            self._gone.add(client_id)
            for key in [k for k, (c, _) in self._held_results.items() if c == client_id]:
                self.ledger.give(self._held_results.pop(key)[1])
            self._pump()

    def usage(self) -> dict[tuple[str, int], int]:
        """Returns the bytes reserved on every device, after retiring the runs that are over."""
        with self._lock:
            self._poll(len(self._in_flight))
            return self.ledger.usage()

    def status(self) -> dict:
        """Returns the queued runs, each with why it is not admitted yet, and the admitted runs still on
        the devices."""
        with self._lock:
            head = self._next()
            queued = []
            for queue in ([self._fifo] if self.policy == "fifo" else list(self._queues.values())):
                for position, (run, _) in enumerate(queue):
                    if position:
                        why = f"run {queue[0][0].id} (admission is in ticket order)"
                    elif queue is not head:
                        why = f"client {run.client_id}'s turn (proportional share)"
                    elif self._held:
                        why = "admission, which is held"
                    elif self.policy == "share" and len(self._in_flight) >= self.window:
                        why = f"a place in the share window ({self.window} runs on the devices)"
                    else:
                        why = shortfall(self.ledger, run.need) or "admission (it fits now)"
                    queued.append({"run": run.id, "client": run.client_id, "program": run.plan.program,
                                   "waits_for": why})
            return {"policy": self.policy, "queued": queued, "admitted": [r.id for r in self._in_flight]}

    def fail_island(self, island: str, error: Callable[[Run], BaseException]) -> list[Run]:
        """Fails the queued runs that need a lost island with `error(run)`; returns the admitted runs still
        on the devices that use it."""
        self._cancel_queued(lambda run: island in run.islands, error)
        with self._lock:
            return [run for run in self._in_flight if island in run.islands]

    def cancel_client(self, client_id: int, error: Callable[[Run], BaseException]) -> int:
        """Fails the queued runs of a client that left with `error(run)`; returns how many. Its admitted runs
        go on."""
        return self._cancel_queued(lambda run: run.client_id == client_id, error)

    def _cancel_queued(self, doomed: Callable[[Run], bool], error: Callable[[Run], BaseException]) -> int:
        """Takes the queued runs that `doomed` picks out of their queues and fails each with `error(run)`."""
        with self._lock:
            queues = [self._fifo, *self._queues.values()]
            taken = [item for queue in queues for item in queue if doomed(item[0])]
            for queue in queues:
                kept = [item for item in queue if not doomed(item[0])]
                queue.clear()
                queue.extend(kept)
        for run, _ in taken:
            self._cancel(run, error(run))
        with self._lock:
            self._pump()
        return len(taken)

    def hold(self) -> None:
        """Stops admitting work until `release()`; submissions queue up meanwhile."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Resumes admitting work, in the order the policy gives."""
        with self._lock:
            self._held = False
            self._pump()

    def close(self) -> None:
        """Fails every queued run and stops the admission thread."""
        with self._lock:
            self._closed = True
            queued = list(self._fifo) + [item for q in self._queues.values() for item in q]
            self._fifo.clear()
            self._queues.clear()
            self._unblocked.notify_all()
        for run, _ in queued:
            self._cancel(run, RunFailed(f"the runtime closed before run {run.id} of {run.plan.program} was "
                                        f"admitted"))
        self._thread.join(timeout=10)

    # -- admission -------------------------------------------------------------

    def _queue(self, run: Run) -> collections.deque:
        if self.policy == "fifo":
            return self._fifo
        return self._queues.setdefault(run.client_id, collections.deque())

    def _next(self) -> collections.deque | None:
        """Returns the queue whose head is admitted next (None if nothing is queued)."""
        if self.policy == "fifo":
            return self._fifo or None
        waiting = [c for c, q in self._queues.items() if q]
        if not waiting:
            return None
        floor = min(self._virtual.get(c, 0.0) for c in waiting)
        client = min(waiting, key=lambda c: (max(self._virtual.get(c, 0.0), floor), c))
        return self._queues[client]

    def _pump(self) -> None:
        """Admits queued runs while the head fits (and the share window allows); under the lock."""
        while not self._held and not self._closed:
            queue = self._next()
            if queue is None:
                self._blocked = False
                return
            run, works = queue[0]
            if self.policy == "share" and len(self._in_flight) >= self.window:
                self._poll(len(self._in_flight))
            room = self.policy == "fifo" or len(self._in_flight) < self.window
            if not (room and self.ledger.fits(run.need)):
                self._poll(len(self._in_flight))
                room = self.policy == "fifo" or len(self._in_flight) < self.window
                if not (room and self.ledger.fits(run.need)):
                    self._blocked = True
                    self._unblocked.notify_all()
                    return
            queue.popleft()
            if self.policy == "share":
                floor = min([self._virtual.get(run.client_id, 0.0)] +
                            [self._virtual.get(c, 0.0) for c, q in self._queues.items() if q])
                self._virtual[run.client_id] = max(self._virtual.get(run.client_id, 0.0), floor) + \
                    run.cost / run.weight
            self._admit(run, works)

    def _admit(self, run: Run, works: Works) -> None:
        self.ledger.take(run.need)
        self._in_flight.append(run)
        self._deliver(run, works)
        run.admitted = True
        self._admissions.notify_all()

    def _deliver(self, run: Run, works: Works) -> None:
        ticket = next(self._tickets)
        self.delivered.append((ticket, run.client_id))
        self.islands.start(run, {island: IslandWork(ticket, run.id, run.client_id, run.key, steps, inputs, last)
                                 for island, (steps, inputs, last) in works.items()})

    def _poll(self, limit: int) -> bool:
        """Retires the oldest admitted runs whose device work is over (at most `limit`); True if any."""
        retired = False
        for run in list(itertools.islice(self._in_flight, limit)):
            if not all(self.islands[i].run_done(run.id) for i in run.islands):
                break
            self._retire(run)
            retired = True
        return retired

    def _retire(self, run: Run) -> None:
        """Gives back a run's peak, keeping the bytes of the results still held."""
        self._in_flight.remove(run)
        self.ledger.give(run.need)
        for buffer in run.plan.outputs:
            need = result_need(run.plan, buffer)
            if need and buffer not in run.released and run.error is None and run.client_id not in self._gone:
                self.ledger.take(need)
                self._held_results[(run.id, buffer)] = (run.client_id, need)

    def _cancel(self, run: Run, error: BaseException) -> None:
        run.error = error
        for island in run.islands:
            self.islands[island].fail_run(run.id, error)
        with self._lock:
            run.admitted = True
            self._admissions.notify_all()

    def _admission_loop(self) -> None:
        """While a queued run cannot be admitted, waits for the oldest admitted run to finish."""
        while True:
            with self._lock:
                self._unblocked.wait_for(lambda: self._closed or (self._blocked and not self._held))
                if self._closed:
                    return
                oldest = self._in_flight[0] if self._in_flight else None
                if oldest is None:
                    self._unblocked.wait(0.5)   # only held results block it: wait for a release
                    self._pump()
                    continue
            try:
                for island in oldest.islands:
                    self.islands[island].wait_run(oldest.id, timeout=0.5)
            except TimeoutError:
                continue
            with self._lock:
                if oldest in self._in_flight:
                    self._retire(oldest)
                self._pump()
