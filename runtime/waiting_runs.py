"""The runs waiting for admission: one queue per client, and how often each has been overtaken.

Each client's runs wait in the order it submitted them; the scheduler looks at
every client's oldest waiting run (its head). A run admitted while an older
run of another client waits at the head of its queue overtakes that run; the
first head overtaken `OVERTAKES` times holds the reservation, which the
scheduler honours (it is looked at first, and meanwhile only runs that fit
beside it are admitted). Not locked: the scheduler's lock guards it.
"""

from __future__ import annotations

import collections
import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

if TYPE_CHECKING:
    from .policies import DeviceSeconds, Policy
    from .run import Run

OVERTAKES = 64        # how many runs may overtake a queued run before it holds a reservation (goes next)


class WaitingRun:
    """A run waiting for admission, with its work, its arrival number and how often it was overtaken."""

    __slots__ = ("run", "works", "arrival", "overtaken")

    def __init__(self, run: Run, works: Any, arrival: int):
        self.run, self.works, self.arrival, self.overtaken = run, works, arrival, 0


class WaitingRuns:
    """Every client's waiting runs, in submission order, and the one holding the reservation (or None)."""

    def __init__(self):
        self._queues: dict[int, collections.deque[WaitingRun]] = {}
        self._arrivals = itertools.count()
        self.count = 0              # how many runs wait (what the fast paths read: `len` is a call)
        self.reserved: WaitingRun | None = None

    def __len__(self) -> int:
        return self.count

    def add(self, run: Run, works: Any) -> None:
        """Queues `run` behind its client's waiting runs; a cond's branch run (`run.parent`) goes first: its
        parent, admitted before them, waits for it."""
        queue = self._queues.setdefault(run.client_id, collections.deque())
        item = WaitingRun(run, works, next(self._arrivals))
        if run.parent is None:
            queue.append(item)
        else:
            queue.appendleft(item)
        self.count += 1

    def has_client(self, client_id: int) -> bool:
        """Whether a run of this client waits."""
        return bool(self._queues.get(client_id))

    def clients(self) -> Iterable[int]:
        """Returns the clients with runs waiting (an empty queue is dropped, `take` and `remove`)."""
        return self._queues.keys()

    def queues(self) -> Iterator[collections.deque[WaitingRun]]:
        """Yields each client's waiting runs, oldest first."""
        return iter(self._queues.values())

    def heads(self, policy: Policy, device_seconds: DeviceSeconds) -> list[WaitingRun]:
        """Returns every client's oldest waiting run, in the order the policy looks at them (the one holding
        the reservation first)."""
        heads = [q[0] for q in self._queues.values() if q]
        if len(heads) < 2:
            return heads
        policy.order(heads, device_seconds)
        if self.reserved is not None and self.reserved in heads:
            heads.remove(self.reserved)
            heads.insert(0, self.reserved)
        return heads

    def take(self, item: WaitingRun) -> None:
        """Takes a head off its client's queue to be admitted, counting it as overtaking older runs. A queue
        left empty goes (one per client that ever waited would stay, and every admission looks at each)."""
        queue = self._queues[item.run.client_id]
        queue.popleft()
        if not queue:
            del self._queues[item.run.client_id]
        self.count -= 1
        if self.reserved is item:
            self.reserved = None
            return
        if item.run.parent is None:       # a branch run continues its parent: it overtakes nobody
            self._overtake(item.arrival)

    def overtaken_by_newcomer(self) -> None:
        """A run is admitted without waiting: it arrived after every waiting run, and overtakes each head."""
        if self.count:
            self._overtake(math.inf)

    def _overtake(self, arrival: float) -> None:
        for queue in self._queues.values():
            if queue and queue[0].arrival < arrival:
                queue[0].overtaken += 1
                if queue[0].overtaken >= OVERTAKES and self.reserved is None:
                    self.reserved = queue[0]

    def remove(self, doomed: Callable[[Run], bool]) -> list[WaitingRun]:
        """Takes out, and returns, the waiting runs that `doomed` picks (every one: `lambda run: True`)."""
        taken = []
        for client, queue in list(self._queues.items()):
            kept = collections.deque()
            for item in queue:
                (taken if doomed(item.run) else kept).append(item)
            if kept:
                self._queues[client] = kept
            else:
                del self._queues[client]
        self.count -= len(taken)
        if self.reserved in taken:
            self.reserved = None
        return taken
