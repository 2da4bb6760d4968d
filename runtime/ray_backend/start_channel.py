"""The start channel: how a run's start messages reach the island actors, in the gang scheduler's ticket
order. A run costs one start message per island it uses, whatever its number of steps, over the driver's
TCP connection to each island actor (`connection.py`).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING

from ..island_work import IslandWork
from .connection import ConnectionBroken

if TYPE_CHECKING:
    from .proxy import RayIsland

START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included)
PENDING = 32            # start messages whose acknowledgement may stay unread


class StartChannel:
    """Start messages over each island actor's connection (`connection.py`), one frame per island per run:
    no Ray call and no object store. TCP keeps an actor's messages in the order sent, which is ticket order,
    so one channel serves every client's runs, runs that park at a recv, and data-dependent steps (a cond's
    later steps are one more message). The actor acknowledges each message once taken; the
    acknowledgements are read later, in order: when the releases a message carried must have been taken
    (`received`, before a question about objects), and whatever has come, without waiting, when `PENDING`
    messages are unread. Requests on a connection need none: they follow the starts sent before them.

    A send never waits for an acknowledgement, nor for the rest of a frame the actor began to send: it is made
    under the gang scheduler's lock, and a stalled actor (stopped, or its host unreachable without closing the
    connection) held that lock, and every client on every island, for up to `REPLY_TIMEOUT` seconds. The
    island monitor finds such an actor instead (`IslandConnection.stalled`). A send still waits, up to
    `REPLY_TIMEOUT`, when more than `QUEUED` bytes (64 MiB of arguments) wait for an actor that reads none of
    them (`IslandConnection.send`). A connection that broke (its actor died) marks the actor dead, as a failed
    actor call does."""

    def __init__(self, islands: dict[str, RayIsland]):
        self._islands = islands
        self._pending: collections.OrderedDict[int, list] = collections.OrderedDict()  # run -> (proxy, number)s
        self._lock = threading.Lock()

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list],
             lends: dict[str, list]) -> None:
        """Sends one message to every island of the run, and to every other island with releases queued or
        results to lend (with no work), so that releases keep their place among starts; called in ticket
        order."""
        sent = []
        for name, island in self._islands.items():
            work, released, lent = works.get(name), releases.get(name, []), lends.get(name, [])
            if (work is None and not released and not lent) or island.connection is None:
                continue
            number, island.calls_sent = island.calls_sent, island.calls_sent + 1
            island.calls["start" if work is not None else "lends" if lent else "releases"] += 1
            try:
                island.connection.send_start(number, work, released, lent)
            except ConnectionBroken as error:
                island._died(error)
                continue
            sent.append((island, number))
        with self._lock:
            self._pending[run_id] = sent
            oldest = [self._pending.popitem(last=False)[1] for _ in range(len(self._pending) - PENDING)]
        for island in {island for taken in oldest for island, _ in taken}:
            try:
                island.connection.poll()     # (waits for nothing: a stalled actor is the monitor's to find)
            except ConnectionBroken as error:
                island._died(error)

    def received(self, run_id: int, deadline: float | None = None, island: RayIsland | None = None) -> None:
        """Returns once the run's start messages (to `island` alone, if given) were taken or their actors died,
        or at `deadline` (a `time.monotonic()`), if given, at the latest."""
        with self._lock:
            sent = self._pending.pop(run_id, None)
        self._take([(i, n) for i, n in sent or () if island is None or i is island], deadline)

    @staticmethod
    def _take(sent: list, deadline: float | None = None) -> None:
        """Reads the acknowledgements of one message's starts: an actor whose connection broke, or that took
        none for `REPLY_TIMEOUT` seconds, is lost; one that took none by `deadline` is only waited for no
        more (a later wait reads them: acknowledgements are counted, `IslandConnection.taken`)."""
        for island, number in sent:
            try:
                island.connection.wait_taken(number, deadline)
            except ConnectionBroken as error:
                island._died(error)
            except TimeoutError as error:
                if deadline is None or time.monotonic() < deadline:
                    island._died(error)
