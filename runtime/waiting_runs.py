"""The runs waiting for admission: one queue per client, and how often each has been overtaken.

Each client's runs wait in the order it submitted them; the scheduler looks at
every client's oldest waiting run (its head). A run admitted while an older
run of another client waits at the head of its queue overtakes that run; of
the heads it overtakes `OVERTAKES` times or more, the oldest (by arrival)
holds the reservation if none does, which the scheduler honours (it is
looked at first, and meanwhile only runs that fit beside it are admitted).
The runs of each queue are indexed by kind too (their need and donations:
runs of one kind fit, or do not, together), so that the scheduler can look
at the oldest of each kind rather than at every waiting run
(`oldest_of_each_kind`). Not locked: the scheduler's lock guards it.
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


def _kind(run: Run) -> tuple:
    """What decides whether a run fits, beside what is reserved: its need (one object for a plan's runs) and
    the results donated to it."""
    return id(run.need), run.donations


class WaitingRuns:
    """Every client's waiting runs, in submission order, and the one holding the reservation (or None)."""

    def __init__(self):
        self._queues: dict[int, collections.deque[WaitingRun]] = {}
        # client -> kind -> its waiting runs of that kind, oldest first (cond branch runs, which need no memory
        # of their own, are not indexed)
        self._kinds: dict[int, dict[tuple, collections.deque[WaitingRun]]] = {}
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
            self._index(item)
        else:
            queue.appendleft(item)
        self.count += 1

    def _index(self, item: WaitingRun) -> None:
        """Appends a waiting run (not a cond's branch run) to its client's runs of its kind."""
        kinds = self._kinds.setdefault(item.run.client_id, {})
        kinds.setdefault(_kind(item.run), collections.deque()).append(item)

    def has_client(self, client_id: int) -> bool:
        """Whether a run of this client waits."""
        return bool(self._queues.get(client_id))

    def clients(self) -> Iterable[int]:
        """Returns the clients with runs waiting (an empty queue is dropped, `take` and `remove`)."""
        return self._queues.keys()

    def queues(self) -> Iterator[collections.deque[WaitingRun]]:
        """Yields each client's waiting runs, oldest first."""
        return iter(self._queues.values())

    def oldest_of_each_kind(self, arrival: float) -> Iterator[WaitingRun]:
        """Yields, for each client, the oldest of its waiting runs of each kind (`_kind`) that arrived before
        `arrival`, cond branch runs aside."""
        for kinds in self._kinds.values():
            for runs in kinds.values():
                if runs[0].arrival < arrival:
                    yield runs[0]

    def reserve_for(self, item: WaitingRun) -> None:
        """Gives the reservation to the head of `item`'s queue: `item` itself, or the run it waits behind."""
        self.reserved = self._queues[item.run.client_id][0]

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
        client = item.run.client_id
        queue = self._queues[client]
        queue.popleft()
        if not queue:
            del self._queues[client]
        if item.run.parent is None:
            kinds = self._kinds[client]
            runs = kinds[_kind(item.run)]
            runs.popleft()           # (the oldest of its kind: queues are in arrival order, branch runs aside)
            if not runs:
                del kinds[_kind(item.run)]
            if not kinds:
                del self._kinds[client]
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
        """Counts a run that arrived at `arrival` as overtaking every older head; the oldest head overtaken
        `OVERTAKES` times gets the reservation if none holds it (several may get there in one call; the order of
        the queues is only that of their clients' first waiting runs)."""
        oldest = None
        for queue in self._queues.values():
            head = queue[0]
            if head.arrival < arrival:
                head.overtaken += 1
                if head.overtaken >= OVERTAKES and (oldest is None or head.arrival < oldest.arrival):
                    oldest = head
        if self.reserved is None:
            self.reserved = oldest

    def remove(self, doomed: Callable[[Run], bool]) -> list[WaitingRun]:
        """Takes out, and returns, the waiting runs that `doomed` picks (every one: `lambda run: True`)."""
        taken = []
        for client, queue in list(self._queues.items()):
            kept = collections.deque()
            for item in queue:
                (taken if doomed(item.run) else kept).append(item)
            if len(kept) == len(queue):
                continue
            self._kinds.pop(client, None)
            if kept:
                self._queues[client] = kept
                for item in kept:
                    if item.run.parent is None:
                        self._index(item)
            else:
                del self._queues[client]
        self.count -= len(taken)
        if self.reserved in taken:
            self.reserved = None
        return taken
