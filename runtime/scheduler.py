"""The gang scheduler: one consistent order of work for every island.

Clients submit work (a run's steps, split by island); the scheduler gives
each submission a ticket and delivers its island items to the islands in
ticket order. Every island therefore sees every client's work in
the same relative order, which is what lets computations that span devices
(and programs that span islands) never deadlock: any step waits only on work
with an earlier or equal ticket.

Policies:
- `fifo`: tickets in arrival order, delivered at once.
- `share`: proportional share across clients by weight. Submissions wait in
  per-client queues; while fewer than `window` delivered submissions are still
  waiting for their islands to enqueue them, the scheduler delivers the one
  with the smallest virtual start time (start-time fair queueing: each
  client's virtual time advances by cost / weight per submission).

`hold()` stops deliveries (new work queues up) until `release()`; the runtime
uses it while the cluster is being reconfigured.
"""

from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

from .island import Island, IslandWork

POLICIES = ("fifo", "share")


@dataclass
class Submission:
    """A run's steps for each island, with the client's weight and the work's cost."""

    client_id: int
    weight: float
    cost: float
    run_id: int
    plan_key: int
    steps: dict[str, tuple[int, ...]]   # island -> step ids in island order
    on_executed: Callable[[], None] = field(default=lambda: None)


class GangScheduler:
    """Orders submissions from all clients and delivers them to islands."""

    def __init__(self, islands: dict[str, Island], policy: str = "fifo", window: int = 4):
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy '{policy}' (choose from {', '.join(POLICIES)})")
        self.islands = islands
        self.policy = policy
        self.window = window
        self._tickets = itertools.count()
        self._lock = threading.Condition()
        self._queues: dict[int, collections.deque[Submission]] = {}
        self._virtual: dict[int, float] = {}
        self._in_flight = 0
        self._closed = False
        self._held = False
        self._fifo: collections.deque[Submission] = collections.deque()
        # The latest (ticket, client id) delivered, for share checks; bounded for long runs.
        self.delivered: collections.deque[tuple[int, int]] = collections.deque(maxlen=100_000)
        if policy == "share":
            self._thread = threading.Thread(target=self._share_loop, name="pw-gang-scheduler", daemon=True)
            self._thread.start()

    def submit(self, submission: Submission) -> None:
        """Queues a submission (fifo: delivers it at once)."""
        with self._lock:
            if self.policy == "fifo":
                if self._held:
                    self._fifo.append(submission)
                else:
                    self._deliver(submission)
                return
            self._queues.setdefault(submission.client_id, collections.deque()).append(submission)
            self._lock.notify_all()

    def hold(self) -> None:
        """Stops delivering work until `release()`; submissions queue up meanwhile."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Resumes delivering work, in the order the policy gives."""
        with self._lock:
            self._held = False
            if self.policy == "fifo":
                while self._fifo:
                    self._deliver(self._fifo.popleft())
            self._lock.notify_all()

    def close(self) -> None:
        """Stops the share policy's thread."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _deliver(self, submission: Submission) -> None:
        ticket = next(self._tickets)
        self._in_flight += 1
        self.delivered.append((ticket, submission.client_id))
        islands = [i for i, steps in submission.steps.items() if steps]
        remaining = [len(islands)]

        def executed(_reply=None):
            with self._lock:
                remaining[0] -= 1
                last = remaining[0] == 0
                if last:
                    self._in_flight -= 1
                    self._lock.notify_all()
            if last:
                submission.on_executed()
        for island in islands:
            work = IslandWork(ticket, submission.run_id, submission.client_id, submission.plan_key,
                              submission.steps[island])
            self.islands[island].submit(work).add_done_callback(executed)
        if not islands:
            self._in_flight -= 1
            submission.on_executed()

    def _share_loop(self) -> None:
        with self._lock:
            while True:
                self._lock.wait_for(lambda: self._closed or (
                    not self._held and self._in_flight < self.window and any(self._queues.values())))
                if self._closed:
                    return
                floor = min((self._virtual.get(c, 0.0) for c, q in self._queues.items() if q), default=0.0)
                client = min((c for c, q in self._queues.items() if q),
                             key=lambda c: (max(self._virtual.get(c, 0.0), floor), c))
                submission = self._queues[client].popleft()
                start = max(self._virtual.get(client, 0.0), floor)
                self._virtual[client] = start + submission.cost / submission.weight
                self._deliver(submission)
