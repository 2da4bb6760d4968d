"""The interfaces the front end programs against (a cluster runtime and a client that runs programs on it),
and the one the runtime drives its islands through (an island, and a backend's group of them).

Two implementations of each exist. In this process, `Runtime` is the
cluster and a `Client` of it runs programs. Attached to a service
(`pw.connect`), one `RemoteClient` is both: the connection is this process's
view of the cluster and its one client. `Compiled` (`frontend/compiled.py`)
uses only what is declared here, so a program runs the same on either, and
`tests/test_interface.py` checks that each implementation has every member
with the declared parameters.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .dispatch_mode import DispatchMode
from .island_work import Readable


@runtime_checkable
class TopologySource(Protocol):
    """The cluster's topology and its version, which programs are lowered for."""

    @property
    def version(self) -> int: ...

    def snapshot(self) -> tuple[int, Topology]:
        """Returns (version, topology), read together."""


@runtime_checkable
class ClusterRuntime(Protocol):
    """A cluster programs are lowered for and loaded on."""

    resources: TopologySource

    def load(self, plan: ProgramPlan) -> Any:
        """Loads a plan (lowered for `resources`' current topology) so that it can run."""

    def object_count(self) -> int:
        """Counts the objects held for this process's clients."""

    def close(self) -> None:
        """Releases everything held for this process."""


@runtime_checkable
class ProgramClient(Protocol):
    """Runs programs on a cluster and owns their results (handles)."""

    @property
    def runtime(self) -> ClusterRuntime: ...

    def run(self, plan: ProgramPlan, args: Sequence, dispatch: DispatchMode | str = DispatchMode.PARALLEL,
            timeout: float | None = None) -> list:
        """Runs a loaded plan on `args`; returns one handle per program output."""

    def cancel(self, handle) -> bool:
        """Cancels the run of one of its handles; returns False if the run was already over."""

    def share(self, handle) -> Any:
        """Returns a read-only reference to one of its results, which other clients may read."""

    def close(self) -> None:
        """Releases everything it owns."""


@runtime_checkable
class IslandEndpoint(Protocol):
    """One island as the runtime drives it: the embedded `Island` in this process, or the `RayIsland` proxy
    of an actor. A run's work reaches it through its group (`IslandGroup.start`), in ticket order."""

    lost: BaseException | None

    @property
    def dying(self) -> bool:
        """Whether the island's host was seen dead and the runtime has not taken it out yet."""

    def load(self, key: int, plan: ProgramPlan) -> None:
        """Keeps a plan under `key` for the runs that use this island."""

    def prepare(self, key: int, step_ids) -> None:
        """Compiles the executables of those steps of a loaded plan."""

    def has_plan(self, key: int) -> bool:
        """Whether a plan is loaded here under `key` (a restored island has none of the lost one's)."""

    def unload(self, key: int) -> None:
        """Forgets a loaded plan that nothing runs any more (its runs are over)."""

    def fetch(self, run_id: int, buffer: int, timeout: float | None = None, reader: Readable | None = None):
        """Returns a run's buffer once it exists; raises the run's error if it failed, and what `reader._check()`
        raises (its result was released) instead of waiting for a result released meanwhile."""

    def produced(self, run_id: int, buffer: int, timeout: float | None = None) -> None:
        """Returns once a run's buffer exists, bringing nothing back; raises as `fetch` does."""

    def want(self, run_id: int, buffer: int, nbytes: int) -> None:
        """Notes that a run's buffer of `nbytes` bytes will be read soon: an island in another process may bring
        it back with the next value read from it."""

    def release(self, run_id: int, buffer: int) -> None:
        """Drops a run's result (its handle was released)."""

    def release_owner(self, owner) -> int:
        """Drops every result an owner holds; returns how many."""

    def owned_by(self, owner) -> list:
        """The (run, buffer) keys of the results an owner holds here."""

    def object_count(self) -> int:
        """Counts the results held here."""

    def fail_run(self, run_id: int, error: BaseException) -> None:
        """Fails a run here because it failed elsewhere (or was cancelled)."""

    def run_done(self, run_id: int, patient: bool = False) -> bool:
        """Whether a run's work here is over (dispatched, and its device work finished). An island in another
        process that does not answer in time says no: a poll waits briefly, a `patient` look (before a cancel,
        which loses a result that was over) as long as a status request."""

    def failure(self, run_id: int) -> BaseException | None:
        """The error a run failed with here, as far as this island knows now (no wait), else None."""

    def wait_run(self, run_id: int, timeout: float | None = None) -> None:
        """Waits until a run's work here is over; TimeoutError after `timeout` seconds."""

    def device_seconds(self, run_id: int) -> float | None:
        """The device time a finished run took here (once), or None if it is not known."""

    def compilations(self) -> int:
        """Counts the executables compiled here."""

    def status(self, client: int | None = None) -> dict:
        """What the island is doing: its runs, what each waits for, its transfers (`Island.status`); with
        `client`, that client's runs and objects only."""

    def lose(self) -> None:
        """Takes the island out as a dead host would (its runs fail with `IslandLost`)."""

    def restored(self) -> "IslandEndpoint":
        """Returns a fresh island in place of this lost one."""

    def close(self) -> None:
        """Stops the island; runs still under way there fail."""


@runtime_checkable
class IslandGroup(Protocol):
    """A backend's islands by name (a dict), how runs reach them, and what they can do (`runtime/backends.py`)."""

    keep_arguments: bool
    fast_lanes: bool
    traces: bool
    in_process: bool

    def start(self, run, works: dict, inline: bool = False) -> list:
        """Delivers one run's work to its islands, in ticket order; returns the work the caller runs inline."""

    def peer_reference(self, run, buffer: int, plan, input_buffer: int):
        """A reference to a result kept on one island for an input on another, or None (it is fetched)."""

    def pin(self, run, keys) -> None:
        """`run` takes kept results by reference: their releases must not overtake its start."""

    def unpin(self, run) -> None:
        """`run` will never start (its submission failed, or it was cancelled while queued): its references
        will never be sent. It may be called under the scheduler's lock: it must not wait on an island."""

    def on_run_done(self, wake) -> None:
        """Calls `wake()` whenever an island sees a run's device work over (where islands tell)."""

    def watch(self, lose, restore) -> None:
        """Calls `lose(island)` when an island dies on its own, `restore(island)` when it can come back."""

    def unwatch(self) -> None:
        """Stops watching (before the islands close)."""

    def close(self) -> None:
        """Closes every island."""
