"""The island monitor: a thread in the driver that notices island actors dying and islands coming back.

It notices an island whose actor died (killed, its process gone, or its node
removed) from Ray itself: each actor has one call in flight (`watch`) that
only returns when the island closes, and that Ray fails as soon as it knows
the actor is dead; any other call that Ray fails with `RayActorError` says
the same (`report`). It notices a stalled actor (stopped, or its host cut
off without closing the connection) from its connection: an actor that has
owed an acknowledgement for `REPLY_TIMEOUT` seconds, with every byte the
driver sent it handed to the socket, is lost, as one whose connection broke
(`IslandConnection.stalled`, which also reads the acknowledgements that
came, so that they never fill the socket; a large start read slowly is no
stall). The
monitor then takes the island out through
`Runtime.lose_island`, the path the embedded backend uses. When a node
offering a lost island's resource joins the cluster in place of the node
that died, it brings the island back (`Runtime.restore_island`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from . import connection
from .names import island_name

if TYPE_CHECKING:
    from .cluster import RayIslands
    from .proxy import RayIsland

WATCH_PERIOD = 0.2      # seconds: how often the monitor looks at islands a call saw dead
JOIN_PERIOD = 1.0       # seconds: how often the monitor looks for a node offering a lost island's resource

log = logging.getLogger("pathways_mlir.runtime")


class IslandMonitor:
    """Watches the island actors of a `RayIslands`; started by the runtime (`start`), stopped before the
    islands close (`stop`: closing is not losing)."""

    def __init__(self, islands: "RayIslands"):
        self._islands = islands
        self._watches: dict = {}                # each actor's `watch` call -> its proxy
        self._reported: set[str] = set()        # islands whose actor a call saw dead
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch_actor(self, island: "RayIsland") -> None:
        """Keeps the actor's `watch` call in flight."""
        with self._lock:
            self._watches[island._actor.watch.remote()] = island

    def report(self, island: str) -> None:
        """A call saw island `island`'s actor dead: the monitor takes the island out."""
        with self._lock:
            self._reported.add(island)

    def start(self, lose: Callable[[str], object], restore: Callable[[str], object]) -> None:
        """Starts the monitor thread: it calls `lose(island)` for an island whose actor died, within
        `WATCH_PERIOD` of Ray knowing it, and `restore(island)` for a lost island once a node other than the
        one it was lost on (or one a restart failed on) offers its resource (checked every `JOIN_PERIOD`
        while an island is lost)."""
        self._thread = threading.Thread(target=self._watch, args=(lose, restore), name="pw-ray-monitor",
                                         daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the monitor (before the islands close: closing is not losing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * WATCH_PERIOD)

    def _watch(self, lose, restore) -> None:
        import ray

        next_join = 0.0
        while not self._stop.is_set():
            try:
                with self._lock:
                    watches = dict(self._watches)
                if watches:
                    ready, _ = ray.wait(list(watches), num_returns=1, timeout=WATCH_PERIOD)
                else:
                    ready = []
                    self._stop.wait(WATCH_PERIOD)
                for ref in ready:
                    with self._lock:
                        proxy = self._watches.pop(ref)
                    try:
                        ray.get(ref)               # returned: the island closed
                    except ray.exceptions.RayActorError as error:
                        proxy._died(error)
                self._find_stalled()
                with self._lock:
                    reported, self._reported = self._reported, set()
                for island in reported:
                    proxy = self._islands[island]
                    if proxy.dying:
                        log.warning("%s: its runs fail with IslandLost and programs lower again without it",
                                    proxy._dead)
                        lose(island)
                if time.monotonic() >= next_join and any(p.lost is not None for p in self._islands.values()):
                    next_join = time.monotonic() + JOIN_PERIOD
                    for island in self._joinable():
                        restore(island)
                        log.warning("island %s is back (node %s): programs use it from their next lowering",
                                    island, self._islands.nodes[island])
            except Exception as error:  # noqa: BLE001  (the monitor outlives any one failure)
                if self._stop.is_set() or not ray.is_initialized():
                    return
                log.warning("the island monitor: %s: %s", type(error).__name__, error)
                self._stop.wait(WATCH_PERIOD)

    def _find_stalled(self) -> None:
        """Marks dead every island actor that has owed an acknowledgement for `REPLY_TIMEOUT` seconds with all the
        driver's bytes handed to its socket (`IslandConnection.stalled`), or whose connection broke."""
        for proxy in list(self._islands.values()):
            link = proxy.connection
            if link is None or proxy._dead is not None or proxy._closed:
                continue
            try:
                waited = link.stalled()
            except connection.ConnectionBroken as error:
                proxy._died(error)
                continue
            if waited > connection.REPLY_TIMEOUT:     # (read at each look: a test shortens it)
                proxy._died(TimeoutError(f"its actor took no start message for {waited:.0f} s"))

    def _joinable(self) -> list[str]:
        """The lost islands whose resource an alive node offers, other than the node each was lost on and
        the nodes a restart failed on."""
        import ray

        if self._islands.one_machine:
            return []
        alive = [node for node in ray.nodes() if node["Alive"]]
        nodes, failed = self._islands.nodes, self._islands.failed_nodes
        return [island for island, proxy in self._islands.items() if proxy.lost is not None and not proxy._closed and
                {n["NodeID"] for n in alive if n["Resources"].get(island_name(island))} - {nodes[island]} - failed]
