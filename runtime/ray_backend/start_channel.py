"""The start channel: how a run's start messages reach the island actors, in the gang scheduler's ticket
order. A run costs one `start` message per island it uses, whatever its number of steps: through a Ray
Compiled Graph (`CompiledStarts`) when every island actor is on the driver's node, else as numbered actor
calls (`CalledStarts`: Ray runs an actor's calls concurrently, so the actor takes them in number order).
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING

from ..island_work import IslandLost, IslandWork

if TYPE_CHECKING:
    from .proxy import RayIsland

START_TIMEOUT = 120.0   # seconds for every island actor to start (its JAX included), or to take a start
PENDING = 32            # compiled start executions whose acknowledgement may stay unread


def _get(ref, timeout: float | None = None):
    import ray

    return ray.get(ref, timeout=timeout)


class GraphBroken(RuntimeError):
    """The compiled start graph lost an actor before the monitor saw it die; nothing of the execution was
    sent."""


class CompiledStarts:
    """Start messages through a Ray Compiled Graph: one execution per run, whatever the program.

    The graph is the same for every program and client: one node per island
    actor (`start_compiled`), all reading the driver's message (each run's
    work by island, and the releases queued for each). An execution writes
    to shared-memory channels instead of submitting actor tasks (about
    50-200 us against about 1 ms a call here), and executions reach every
    actor in the order they were made, which is the gang scheduler's ticket
    order. Each execution's acknowledgement is read later, in order: before
    asking an island about a run (`received`), or when `PENDING` are unread.
    """

    def __init__(self, islands: dict[str, RayIsland]):
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as message:
            graph = MultiOutputNode([island._actor.start_compiled.bind(message) for island in islands.values()])
        self._graph = graph.experimental_compile(_max_inflight_executions=2 * PENDING)
        # This process reads the acknowledgement channels (written by the actors, so held by them) and
        # writes the input channels; Ray registers it as a reader of each on its first read or in the
        # teardown's close. After an actor died, its channels' objects are gone from the object store, and
        # registering then aborts the process (experimental_mutable_object_provider.cc: "must be in the
        # local object store to register as reader"): Ray's own monitor tears the graph down on a death.
        # Registering every channel now, while every actor lives, makes those later registrations no-ops.
        submitter = getattr(self._graph, "_dag_submitter", None)
        fetcher = getattr(self._graph, "_dag_output_fetcher", None)
        for channel in (*getattr(submitter, "_output_channels", ()), *getattr(fetcher, "_input_channels", ())):
            channel.ensure_registered_as_reader()
        self._islands = islands
        self._pending: collections.deque[tuple[int, tuple, list]] = collections.deque()   # (run, islands, acks)
        self._lock = threading.Lock()
        self.broken = False     # an island actor died: the graph delivers nothing more (see `_take`)
        self._unread: list = []  # the acknowledgements of executions that will never be read
        self._executions = 0     # executions made

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list],
             lends: dict[str, list]) -> None:
        """Sends one run's work (and the queued releases, and the results kept on islands that the run takes
        on others: `lends`) to every island; called in ticket order."""
        import ray

        try:
            refs = self._graph.execute({"works": works, "releases": releases, "lends": lends})
        except (ray.exceptions.RayChannelError, ray.exceptions.RayActorError):
            self.broken = True          # an island actor died before the monitor saw it: nothing was sent
            raise GraphBroken("an island actor of the compiled start graph died") from None
        self._executions += 1
        for name in works:
            self._islands[name].calls["start"] += 1
        with self._lock:
            self._pending.append((run_id, tuple(works), refs))
            while len(self._pending) > PENDING:
                self._take(*self._pending.popleft())

    def received(self, run_id: int) -> None:
        """Returns once every island has taken the execution carrying `run_id`'s work (if it is pending)."""
        with self._lock:
            if not any(r == run_id for r, _, _ in self._pending):
                return
            while self._pending:
                taken, names, refs = self._pending.popleft()
                self._take(taken, names, refs)
                if taken == run_id:
                    return

    def sent(self, island: RayIsland) -> tuple[int, int]:
        """What `island`'s actor must have taken before it answers a question (`IslandActor.asked`): every
        execution made (each reaches every actor), and no start call."""
        return self._executions, 0

    def _take(self, run_id: int, names: tuple, refs) -> None:
        """Reads one execution's acknowledgements. Once an island actor died, every acknowledgement fails and
        which islands took the run's start is unknown: the run fails on all its islands (the monitor finds
        the dead actor). Nothing is read once an actor is known dead (see `close`)."""
        import ray

        self.broken = self.broken or any(island._dead is not None for island in self._islands.values())
        try:
            if not self.broken:
                _get(refs, START_TIMEOUT)
                return
        except (ray.exceptions.RayActorError, ray.exceptions.RayChannelError):
            self.broken = True
        self._unread.append(refs)   # until the teardown is over: a dropped unread ref reads its channel
        for name in names:
            self._islands[name].fail_run(run_id, IslandLost(f"an island actor died while the start of run "
                                                            f"{run_id} was on its way"))

    def close(self) -> None:
        """Reads the acknowledgements still pending, tears the graph down (the actors stay) and drops it, so
        that Ray ends the graph's driver proxy actor (a Python process of its own, which outlived the
        runtime on a Ray instance that outlives it).

        Once an island actor is dead, nothing is read from the graph's channels: Ray's own monitor
        tears the graph down on the death, and a read racing with that teardown can abort this
        process inside Ray (a failed check registering a channel that is gone). That includes the
        read a Compiled Graph reference makes when it is dropped unread, so unread references are
        kept until the teardown is over. The runs whose acknowledgement was pending fail, as when
        an acknowledgement fails."""
        with self._lock:
            try:
                while self._pending:
                    self._take(*self._pending.popleft())
            except Exception:  # noqa: BLE001  (a stuck island: tear down all the same)
                pass
            self._graph.teardown()
            self._unread.clear()
            self._graph = None


class CalledStarts:
    """Start messages as actor calls: one `start` call per island per run, numbered in ticket order
    (Ray runs an actor's calls concurrently, so each actor takes them in number order). Each message's
    replies are read later, in order, as `CompiledStarts` reads its acknowledgements: before asking an
    island about a run (`received`), or when `PENDING` are unread."""

    def __init__(self, islands: dict[str, RayIsland]):
        self._islands = islands
        self._refs: collections.OrderedDict[int, list] = collections.OrderedDict()   # run -> (proxy, start call)s
        self._lock = threading.Lock()

    def send(self, run_id: int, works: dict[str, IslandWork], releases: dict[str, list],
             lends: dict[str, list]) -> None:
        """Calls `start` on every island of the run, and on every other island with releases queued or results
        to lend (with no work), so that releases keep their place among starts; called in ticket order."""
        refs = [(self._islands[name], self._start(self._islands[name], works.get(name), releases.get(name, []),
                                                  lends.get(name, [])))
                for name in self._islands if name in works or releases.get(name) or lends.get(name)]
        with self._lock:
            self._refs[run_id] = refs
            oldest = [self._refs.popitem(last=False)[1] for _ in range(len(self._refs) - PENDING)]
        for taken in oldest:
            self._take(taken)

    @staticmethod
    def _start(island: RayIsland, work: IslandWork | None, releases: list, lends: list):
        """Calls `start` on one island, numbered by the start calls made to its actor (`calls_sent`)."""
        seq, island.calls_sent = island.calls_sent, island.calls_sent + 1
        return island._call("start", seq, work, releases, lends,
                            counted_as="start" if work is not None else "lends" if lends else "releases")

    def sent(self, island: RayIsland) -> tuple[int, int]:
        """What `island`'s actor must have taken before it answers a question (`IslandActor.asked`): every
        start call made to it (a restored actor's are counted from 0 again: its proxy is new)."""
        return 0, island.calls_sent

    def received(self, run_id: int) -> None:
        """Returns once the run's start calls were taken (or their actors died)."""
        with self._lock:
            refs = self._refs.pop(run_id, None)
        self._take(refs or ())

    @staticmethod
    def _take(refs: list) -> None:
        """Reads the replies of one message's start calls (an actor that died is lost)."""
        import ray

        for island, ref in refs:
            try:
                _get(ref, START_TIMEOUT)
            except ray.exceptions.RayActorError as error:
                island._died(error)

    def close(self) -> None:
        """Nothing to tear down."""
