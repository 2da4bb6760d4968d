"""The driver's proxy for an island actor (`RayIsland`): the island messages, as frames on its connection and
actor calls."""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan

from ..island_work import (HISTORY, REFERENCES, IslandLost, IslandWork, Readable, RunFailed, client_owner,
                           failure_kind, raised)
from ..status import unreachable
from .connection import ConnectionBroken, IslandConnection
from .names import wait_until_free

if TYPE_CHECKING:
    from .cluster import RayIslands

STATUS_TIMEOUT = 10.0   # seconds an island has to answer a status request
# Seconds an island has to say which runs are over to a poll (answered at once, unless the actor is stalled):
# a look that gets no answer says "not known to be over". One before a cancel waits `STATUS_TIMEOUT`.
RUNS_DONE_TIMEOUT = 2.0
RELEASE_BATCH = 64      # queued releases sent in a call of their own once this many wait
RUNS_DONE_BATCH = 256   # earlier runs asked about with each `runs_done` call
SIBLING_BYTES = 1 << 20  # a fetch brings back the run's other results read before up to this size each
FETCHED_BYTES = 64 << 20  # bytes of values held, or asked for, ahead of their read in the driver per island
WANTED = 8192           # results announced for reading (`want`) and not brought back yet, at most per island


class RayIsland:
    """The driver's proxy for an island actor: the island messages, as frames on its connection (`start`,
    `fetch`, `produced`, `run_done`, `wait_run`) and actor calls (the others).

    `start` goes through the runtime's start channel (`RayIslands.start`).
    Releases are queued and travel with the island's next start message (or
    in one call once `RELEASE_BATCH` have queued, or before any question
    about objects), so dropping a result costs no call of its own; the ledger
    of device memory is the driver's and frees the bytes at once. A fetch
    brings back the run's other small results on the island that were read
    of an earlier run of the same plan, so reading a run's outputs one by one
    costs one request, while results never read (a training state kept on the
    devices) never travel; and it brings back the results announced for
    reading (`want`: `jax.device_get` announces every leaf of a pytree before
    it reads them), so reading a pytree costs one request per island. What
    comes back ahead of its read is held until read or released; what is held
    and what fetches in flight ask for stay within `FETCHED_BYTES` per island.

    Once its actor is dead (the monitor saw it, or Ray failed a call with
    `RayActorError`), the proxy answers for it as a lost island would: work
    started here fails with `IslandLost` (and so does the run on its peers),
    results that lived here raise it, and nothing waits for the actor.
    """

    def __init__(self, name: str, actor, group: "RayIslands"):
        self.name = name
        self._actor = actor
        self._group = group
        self._lock = threading.Lock()
        self._closed = False
        self.calls: collections.Counter[str] = collections.Counter()   # messages sent, by kind
        # Runs known to be over -> the device time the actor measured (None: not known), until it is read.
        self._done: collections.OrderedDict[int, float | None] = collections.OrderedDict()
        self._fetched: dict[tuple[int, int], np.ndarray] = {}   # results brought back with a sibling, not read yet
        self._fetched_bytes = 0                    # their bytes
        self._wanted: dict[tuple[int, int], int] = {}   # results announced for reading (`want`) -> their bytes
        # Siblings asked for by a fetch whose reply has not come -> their bytes, and those bytes in all: with
        # `_fetched_bytes`, at most `FETCHED_BYTES` (fetches in flight at once share the room).
        self._asked: dict[tuple[int, int], int] = {}
        self._asked_bytes = 0
        self._read: dict[int | None, set[int]] = {}   # plan key -> the results here ever read of its runs
        self._releases: list[tuple[int, int]] = []
        # Runs started here -> (plan key, client id), the latest `HISTORY` of them.
        self._runs: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        # Of each plan loaded, by key, its program and islands: a run failing here names its program and tells
        # its peers (not the plan: the runtime forgets a plan nothing holds, `Runtime._forget_unused`).
        self._plans: dict[int, tuple[str, tuple[str, ...]]] = {}
        self.transfers = False                     # whether its actor runs a transfer server (`data_plane.py`)
        self.calls_sent = 0                        # start messages sent to its actor (`StartChannel`)
        self.connection: IslandConnection | None = None   # to its actor (`connection.py`), once opened
        self._dead: IslandLost | None = None       # set once the actor is known to be dead
        self.lost: IslandLost | None = None        # set once the runtime took the island out (`lose`)
        # Runs failed here since the actor died, and (after `lose`) every run whose results lived here.
        self._failed: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
        self._successor: RayIsland | None = None   # the proxy of the actor restored in this lost one's place

    @property
    def dying(self) -> bool:
        """Whether the actor is known dead and the runtime has not taken the island out yet (the monitor does,
        moments later)."""
        return self._dead is not None and self.lost is None and not self._closed

    def _call(self, message: str, *args, counted_as: str | None = None):
        """Calls the actor's `message` method; returns the reply's object reference. It counts in `calls` as
        `counted_as` (default: `message`).

        After `close` it raises instead: a Ray call would start a new Ray session.
        """
        if self._closed:
            raise RunFailed(f"{self.name} is closed")
        self.calls[counted_as or message] += 1
        return getattr(self._actor, message).remote(*args)

    def _get(self, ref, timeout: float | None = None):
        """Waits for a reply; raises `IslandLost` if Ray says the actor died (see `_died`)."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as error:
            raise self._died(error) from None

    def _died(self, error: BaseException) -> IslandLost:
        """Marks the actor dead (Ray said so with `error`): the runs under way here fail, and the monitor
        takes the island out. Returns a copy (`raised`) of the `IslandLost` that stands for it."""
        if self._dead is None:
            self._dead = IslandLost(f"island {self.name} was lost ({type(error).__name__}: "
                                    f"{(str(error).splitlines() or [''])[0]})")
            self._hang_up()
            self._fail_under_way()
            self._group.monitor.report(self.name)
        return raised(self._dead)

    def _hang_up(self) -> None:
        """Closes the connection to the dead actor: what waits on it (a fetch, a start's acknowledgement) fails
        now, not when the actor's host closes its end, which a host that died never does."""
        if self.connection is not None:
            self.connection.close()

    def _fail_under_way(self) -> None:
        """Fails every run started here and not known to be over, as a lost embedded island does."""
        with self._lock:
            runs = [(run_id, key) for run_id, (key, _) in self._runs.items() if run_id not in self._done]
        for run_id, key in runs:
            self.lose_run(run_id, key)

    def lose_run(self, run_id: int, key: int) -> None:
        """Fails a run with `IslandLost` here and on its peers (a peer parked on a recv from here included)."""
        program, islands = self._plans[key]
        error = IslandLost(f"island {self.name} was lost: run {run_id} of {program} used it")
        self._failed_here(run_id, error)
        for island in islands:
            if island != self.name:
                self._group[island].fail_run(run_id, error)

    def _failed_here(self, run_id: int, error: BaseException) -> None:
        """Remembers that a run failed (the latest `HISTORY` of them); once restored, the proxy in this one's
        place remembers it too (`restored`)."""
        with self._lock:
            self._failed.setdefault(run_id, error)
            while len(self._failed) > HISTORY:
                self._failed.popitem(last=False)
            successor = self._successor
        if successor is not None:
            successor._failed_here(run_id, error)

    def load(self, key: int, plan: ProgramPlan) -> None:
        if self._dead is not None:
            raise raised(self._dead)
        self._get(self._call("load", key, plan.to_json()))
        self._plans[key] = (plan.program, tuple(plan.islands))

    def prepare(self, key: int, step_ids) -> None:
        if self._dead is not None:
            raise raised(self._dead)
        self._get(self._call("prepare", key, list(step_ids)))

    def has_plan(self, key: int) -> bool:
        """Whether a plan was loaded onto this island's actor under `key` (a restored island's fresh actor has
        none of the lost one's)."""
        return key in self._plans

    def unload(self, key: int) -> None:
        self._plans.pop(key, None)
        with self._lock:
            self._read.pop(key, None)
        self._group.forget_results(key)       # (each of the plan's islands asks: the first forgets)
        if self._dead is None and not self._closed:
            self._call("unload", key)          # not waited for: nothing of the plan runs any more

    def started(self, work: IslandWork) -> IslandWork:
        """Notes a run's start here; returns the work as it travels."""
        with self._lock:
            self._runs[work.run_id] = (work.plan_key, work.client_id)
            while len(self._runs) > HISTORY:
                self._runs.popitem(last=False)
        return work._replace(inputs=tuple((b, v if isinstance(v, REFERENCES) else np.asarray(v))
                                          for b, v in work.inputs))

    def take_releases(self) -> list[tuple[int, int]]:
        """Returns (and forgets) the releases queued since the last message."""
        with self._lock:
            releases, self._releases = self._releases, []
        return releases

    def fail_run(self, run_id: int, error: BaseException) -> None:
        if self._dead is not None:
            self._failed_here(run_id, error)
        elif self._live():
            self._call("fail_run", run_id, str(error), failure_kind(error))

    def lost_result(self, run_id: int) -> BaseException | None:
        """What reading a result of run `run_id` kept here raises once the actor died, or the run failed on an
        actor that died (also after a restore: the fresh actor never had it); None if it may be kept. A copy of
        the kept error (`raised`): raised, the kept one would hold the raiser's frames (a handle among them)."""
        if self._dead is None and run_id not in self._failed:
            return None
        kept = self._failed.get(run_id)
        return raised(kept) if kept is not None else IslandLost(f"island {self.name} was lost, with the results "
                                                                f"of run {run_id} that lived there")

    def refuse(self, run_id: int, error: BaseException) -> None:
        """A run is not sent here (it takes a result that `lost_result`): it fails with `error`."""
        self._failed_here(run_id, error)

    def want(self, run_id: int, buffer: int, nbytes: int) -> None:
        """Notes that a result of `nbytes` bytes will be read soon (its handle's `copy_to_host_async`): the next
        fetch from this island brings it back with its own value if it is produced by then. At most `WANTED`
        are noted; the others are read alone."""
        key = (run_id, buffer)
        with self._lock:
            if len(self._wanted) < WANTED and key not in self._fetched:
                self._wanted[key] = nbytes

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None, reader: Readable | None = None):
        """Returns a result, held here ahead of its read or asked of the actor (with the other results worth
        bringing back with it); `reader` checks once more that it was not released before the actor is asked,
        which cannot check it while it waits."""
        lost = self.lost_result(run_id)
        if lost is not None:
            raise lost
        with self._lock:
            self._wanted.pop((run_id, buffer), None)
            value = self._take_fetched((run_id, buffer))
            key = self._runs.get(run_id, (None, None))[0]
            read = self._read.setdefault(key, set())
            read.add(buffer)
            siblings = {} if value is not None else self._siblings(run_id, buffer, key, read)
        if value is not None:
            return value
        ready = {}
        try:
            if reader is not None:
                reader._check()
            value, ready = self._request(run_id, buffer, timeout, list(siblings))
        finally:
            with self._lock:        # (a sibling released meanwhile left `_asked`: its value is dropped)
                for sibling in siblings:
                    if self._unask(sibling) and sibling in ready:
                        self._wanted.pop(sibling, None)
                        self._fetched[sibling] = ready[sibling]
                        self._fetched_bytes += ready[sibling].nbytes
        return value

    def _siblings(self, run_id: int, buffer: int, key: int | None, read: set[int]) -> dict[tuple[int, int], int]:
        """The results a fetch of `buffer` of run `run_id` (of plan `key`) asks for besides, with their bytes: the
        run's others here ever read of the plan's runs, up to `SIBLING_BYTES` each, and those announced for
        reading (`want`), as long as what the driver holds ahead of its read and what fetches in flight ask for
        stay within `FETCHED_BYTES`. None already held, asked for by another fetch, or released. They are asked
        for from now on (`_asked`, until `_unask`). Under the lock."""
        room = FETCHED_BYTES - self._fetched_bytes - self._asked_bytes
        released = set(self._releases)
        others = [((run_id, b), n) for b, n in self._group.results(key, self.name).items()
                  if b != buffer and b in read and n <= SIBLING_BYTES]
        chosen = {}
        for sibling, nbytes in [*others, *self._wanted.items()]:
            if nbytes <= room and sibling not in chosen and sibling not in self._fetched \
                    and sibling not in self._asked and sibling not in released:
                chosen[sibling] = nbytes
                room -= nbytes
        self._asked.update(chosen)
        self._asked_bytes += sum(chosen.values())
        return chosen

    def _unask(self, key: tuple[int, int]) -> bool:
        """A result asked for ahead of its read is no longer (its fetch ended, or it was released): its bytes
        leave the room's count. Returns whether it was asked for. Under the lock."""
        nbytes = self._asked.pop(key, None)
        if nbytes is None:
            return False
        self._asked_bytes -= nbytes
        return True

    def _take_fetched(self, key: tuple[int, int]) -> np.ndarray | None:
        """Takes a value brought back ahead of its read (None if none is held). Under the lock."""
        value = self._fetched.pop(key, None)
        if value is not None:
            self._fetched_bytes -= value.nbytes
        return value

    def _forget_ahead(self, key: tuple[int, int]) -> None:
        """Forgets what is noted, asked for or held of a result ahead of its read (it was released). Under the
        lock."""
        self._take_fetched(key)
        self._wanted.pop(key, None)
        self._unask(key)

    def produced(self, run_id: int, buffer: int, timeout: float | None = None) -> None:
        """Returns once a buffer of a run exists on the actor, bringing nothing back; raises as `fetch` does."""
        lost = self.lost_result(run_id)
        if lost is not None:
            raise lost
        self._request(run_id, buffer, timeout, [], value=False)

    def _request(self, run_id: int, buffer: int, timeout: float | None, siblings: list[int], value: bool = True):
        """Asks the actor for a result over its connection (the island waits for the value itself, `timeout`
        seconds, and the reply has `STATUS_TIMEOUT` more to travel); once the actor is dead, the result raises
        `IslandLost` (`lost_result`)."""
        if self._closed:
            raise RunFailed(f"{self.name} is closed")
        try:
            return self._ask_connection("fetch" if value else "produced", run_id, buffer, timeout, siblings, value,
                                        slack=STATUS_TIMEOUT)
        except IslandLost:
            if self._dead is None:
                raise                        # the run failed so (a peer island was lost)
            raise self.lost_result(run_id) from None    # (the actor is dead: never None)

    def _ask_connection(self, kind: str, *args, **kwargs):
        """Calls the connection's `fetch` (counted as `kind`), `wait_run` or `runs_done` with `args`, requests that
        come after every start sent before them (no wait for the starts' acknowledgements); a connection that
        broke marks the actor dead and raises its `IslandLost`."""
        connection = self.connection
        if connection is None:
            raise raised(self._dead) if self._dead is not None else \
                IslandLost(f"island {self.name} has no connection to its actor")
        self.calls[kind] += 1
        try:
            return getattr(connection, "fetch" if kind == "produced" else kind)(*args, **kwargs)
        except ConnectionBroken as error:
            if self._closed:
                raise RunFailed(f"{self.name} is closed") from None
            raise self._died(error) from None

    def release(self, run_id: int, buffer: int) -> None:
        with self._lock:        # what was brought back ahead of its read, or is on its way, goes now
            self._forget_ahead((run_id, buffer))
        if not self._live() or self._dead is not None or run_id in self._failed:
            return       # handles dropped at exit, after the actors are gone, or of results gone: nothing to do
        if self._group.kept.hold_back(self, (run_id, buffer)):
            return       # a run whose start is not sent yet takes it: released after that start
        with self._lock:
            self._releases.append((run_id, buffer))
            full = len(self._releases) >= RELEASE_BATCH
        if full:
            self.flush_releases()

    def flush_releases(self, wait: bool = False, deadline: float | None = None) -> None:
        """Sends the queued releases now, in the start channel (`RayIslands.flush_releases`: a release never
        overtakes a start that reads its object); with `wait`, returns once the islands took them (with
        `deadline`, once this one did, at that `time.monotonic()` at the latest)."""
        if (wait or self._releases) and self._live() and self._dead is None:
            self._group.flush_releases(wait, deadline, None if deadline is None else self)

    def _live(self) -> bool:
        import ray

        return not self._closed and ray.is_initialized()

    def _ask(self, message: str, *args, otherwise=None):
        """Asks the actor a question about its objects (`_answer`) and returns its reply; `otherwise` once the
        island is closed or its actor dead, or if it did not answer in time (a stalled actor)."""
        if self._closed or self._dead is not None:
            return otherwise
        try:
            return self._answer(message, *args)
        except (IslandLost, TimeoutError):
            return otherwise

    def _answer(self, message: str, *args):
        """Sends the queued releases, then asks `message` and returns the reply: the actor answers once it took
        every start sent before (`IslandActor.asked`). TimeoutError if it has not answered within
        `STATUS_TIMEOUT` seconds in all."""
        import ray

        deadline = time.monotonic() + STATUS_TIMEOUT
        self.flush_releases(wait=True, deadline=deadline)
        reply = self._call("asked", self.calls_sent, message, *args, counted_as=message)
        try:
            return self._get(reply, max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"island {self.name} did not answer within {STATUS_TIMEOUT:g} s") from None

    def release_owner(self, owner) -> int:
        if self._closed or self._dead is not None:
            return 0
        with self._lock:        # the owner's results brought back ahead of their read, or on their way, go too
            for key in [k for k in (*self._fetched, *self._wanted, *self._asked)
                        if client_owner(self._runs.get(k[0], (None, None))[1]) == owner]:
                self._forget_ahead(key)
        return self._ask("release_owner", owner, otherwise=0)

    def failure(self, run_id: int) -> BaseException | None:
        """Returns the error a run failed with here (cancelled, failed elsewhere, the island lost, or failed
        inside the actor: `run_done` and `wait_run` learn that with the run's end), else None."""
        return self._failed.get(run_id)

    def run_done(self, run_id: int, patient: bool = False) -> bool:
        """Returns whether the run's work here is over: not if the actor does not answer within
        `RUNS_DONE_TIMEOUT` seconds (`STATUS_TIMEOUT`, `patient`). One request also asks about every run started
        earlier that is not known to be over, and the answers are kept: the scheduler and the clients poll
        runs in order, so the next questions are answered here. Once the actor is dead, a run is over
        here if it was known to be, or failed, or the island was taken out."""
        if run_id in self._done:
            return True
        if self._dead is None and not self._closed:
            with self._lock:
                others = [r for r in self._runs if r != run_id and r not in self._done][:RUNS_DONE_BATCH]
            try:
                self._over(self._ask_connection("runs_done", [run_id] + others,
                                                STATUS_TIMEOUT if patient else RUNS_DONE_TIMEOUT))
                return run_id in self._done
            except (IslandLost, TimeoutError):
                pass                         # (not answered in time: not known to be over)
        return run_id in self._failed or self.lost is not None

    def _over(self, ended: dict[int, tuple[float | None, BaseException | None]]) -> None:
        """Remembers runs whose work here is over, with their device time (the latest `HISTORY` of them), and
        what those that failed inside the actor failed with."""
        for run_id, (_, error) in ended.items():
            if error is not None:
                self._failed_here(run_id, error)      # first: a run known to be over is known to have failed
        with self._lock:
            for run_id, (taken, _) in ended.items():
                if taken is not None or run_id not in self._done:
                    self._done[run_id] = taken
            while len(self._done) > HISTORY:
                self._done.popitem(last=False)

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        if self._dead is not None or self._closed or run_id in self._done:
            return              # its work here ended with the actor, or is known to be over
        try:
            error = self._ask_connection("wait_run", run_id, timeout, slack=STATUS_TIMEOUT)
        except IslandLost:
            return
        self._over({run_id: (None, error)})

    def device_seconds(self, run_id: int) -> float | None:
        """Returns (once) the device time a finished run took here, as the actor measured it (`runs_done`
        brings it back with the answer); None if not known (the run's end was learnt by `wait_run`, or the
        actor had not recorded it yet)."""
        with self._lock:
            if run_id not in self._done:
                return None
            taken, self._done[run_id] = self._done[run_id], None
        return taken

    def owned_by(self, owner) -> list:
        return self._ask("owned_by", owner, otherwise=[])

    def object_count(self) -> int:
        return self._ask("object_count", otherwise=0)

    def compilations(self) -> int:
        return self._ask("compilations", otherwise=0)

    def status(self, client: int | None = None) -> dict:
        """Returns the island's status (see `Island.status`; of `client` only, if given) and its node, or why
        it did not answer."""
        if self._dead is not None:
            return unreachable(self._dead)
        try:
            return self._answer("status", client)
        except Exception as error:  # noqa: BLE001  (a dead or stuck island is part of the report)
            return unreachable(error)

    def lose(self) -> None:
        """Takes the island out as a dead host (`Runtime.lose_island`): kills the actor if it still runs, and
        returns once Ray has let its name go (so that a restore can take it), the other islands told to
        withdraw what they offered it (`RayIslands.withdraw`); results of every run it had raise `IslandLost`
        from now on, also once the island is restored."""
        import time

        import ray

        if self._dead is None:
            self._dead = IslandLost(f"island {self.name} was lost")
            self._hang_up()
            self._fail_under_way()
        with self._lock:
            runs = list(self._done)
        for run_id in runs:
            self._failed_here(run_id, IslandLost(f"island {self.name} was lost, with the results of run {run_id} "
                                                 f"that lived there"))
        self.lost = self._dead
        ray.kill(self._actor)
        wait_until_free(self.name, time.monotonic() + STATUS_TIMEOUT)
        self._group.withdraw(self.name)

    def restored(self) -> "RayIsland":
        """Returns the proxy of a fresh actor in place of this lost island's (see `RayIslands.restart`); the
        results lost here still raise `IslandLost`, and so do those of runs that fail here from now on (a run
        started here before the fresh proxy takes this one's place): the fresh actor never had them, and a
        fetch of their results would wait for them."""
        fresh = self._group.restart(self.name)
        with self._lock:
            fresh._failed.update(self._failed)
            self._successor = fresh
        return fresh

    def close(self) -> None:
        import ray

        if self._closed:
            return
        if ray.is_initialized():
            if self._dead is None:
                try:
                    self._get(self._call("close"), STATUS_TIMEOUT)
                except Exception:  # noqa: BLE001  (a dead or stuck island is killed all the same)
                    pass
            ray.kill(self._actor)
        self._hang_up()
        self._closed = True

