"""What islands are given and keep of each run: work items, the runs under way there, their errors.

Shared by the island (`island.py`), its executor (`island_executor.py`), the gang scheduler and the
Ray backend, which all speak of runs in these terms.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from jax._src import config as jax_config   # the thread's own value of a flag: no public reader

from .island_program import Instruction, IslandLayout, RecvInstruction

HISTORY = 100_000        # how many work items (and, on Ray, runs) an island remembers
FAILED_HISTORY = 10_000  # how many failed runs' errors an island keeps
# How many deliveries the order records keep (`Island.executed`, `GangScheduler.delivered`): read by order checks
# and `pw-bench multi-tenancy` (up to about 7,000 runs), nothing else; at `HISTORY` a long-running service held
# about 35 MB of them.
ORDER_HISTORY = 16_384



class Readable(Protocol):
    """What reads a result (a `Handle`, a `SharedRef`), as an island's `fetch` is told: `_check()` raises a one-line
    error once the result was released (its handle deleted or donated, its client closed)."""

    def _check(self) -> None:
        """Raises ValueError if the result was released."""


class RunFailed(RuntimeError):
    """A run failed; raised by whatever reads its buffers."""


class IslandLost(RunFailed):
    """An island was lost (its host died): raised for its runs in flight and the results that lived there."""


class RunCancelled(RunFailed):
    """A run was cancelled by its client, or passed its deadline (`timeout=`)."""


class IslandWedged(RunFailed):
    """An island's executor has been stuck in one instruction for longer than the runtime's `wedge_timeout`."""


# The names under which a run's failure travels between processes (island actors, the service's clients), the
# subclasses before their base.
FAILURE_KINDS = {"cancelled": RunCancelled, "wedged": IslandWedged, "lost": IslandLost, "failed": RunFailed}

UNCHECKED = (False, False)
_UNCHECKED_CONTEXT = contextlib.nullcontext()


def debug_checks() -> tuple[bool, bool]:
    """Whether JAX's `jax_debug_nans` and `jax_debug_infs` are on in this thread, as (nans, infs); UNCHECKED
    when they are off here and for every thread (`jax.config.update`).

    `jax.jit` checks a launch's results on the thread that calls it, under
    that thread's flags (`with jax.debug_nans(True)` sets them for it
    alone, and `with jax.debug_nans(False)` turns a global one off for it).
    A run takes the flags of the call that started it, so that its launches
    are checked the same way wherever they execute (`checking`).
    """
    nans, infs = jax_config.debug_nans.value, jax_config.debug_infs.value
    if nans or infs or jax_config.debug_nans.get_global() or jax_config.debug_infs.get_global():
        return nans, infs
    return UNCHECKED


def checking(checks: tuple[bool, bool]):
    """A context in which launches check their results as `checks` (`debug_checks`) say."""
    if checks is UNCHECKED:
        return _UNCHECKED_CONTEXT
    stack = contextlib.ExitStack()
    stack.enter_context(jax.debug_nans(checks[0]))
    stack.enter_context(jax.debug_infs(checks[1]))
    return stack


def failure_kind(error: BaseException) -> str:
    """The name under which a run's failure travels to another process (`failure` makes it again there)."""
    return next((kind for kind, cls in FAILURE_KINDS.items() if isinstance(error, cls)), "failed")


def failure(kind: str, message: str) -> RunFailed:
    """A run's failure that another process sent as `failure_kind` and message: of the same class."""
    return FAILURE_KINDS.get(kind, RunFailed)(message)


class StoreRef(NamedTuple):
    """An argument that is a result kept on the receiving island: buffer `buffer` of run `run_id`.

    The island takes the array from its own object store (or, not produced
    yet, when its run produces it), so the value never leaves the island.
    """

    run_id: int
    buffer: int


class PeerRef(NamedTuple):
    """An argument that is a result kept on another island: buffer `buffer` of run `run_id` (of the plan
    loaded as `plan_key`), kept on `island`.

    The receiving island pulls it from there over the data plane (Ray:
    `runtime/ray_backend/data_plane.py`), as its distinct shards: a mesh of
    `mesh_shape` over the source's `axes` that it uses, sharded as `sharding`
    (the source buffer's spec), of dtype `dtype`. The value never comes to
    the driver.
    """

    run_id: int
    buffer: int
    plan_key: int
    island: str
    dtype: str
    mesh_shape: tuple[int, ...]
    axes: tuple[str, ...]
    sharding: tuple


REFERENCES = (StoreRef, PeerRef)   # the arguments that name a kept result instead of carrying an array


class IslandWork(NamedTuple):
    """One run's steps for one island, delivered as one message in ticket order.

    `inputs` are (buffer, array) pairs placed on their home sharding first:
    program arguments (a `StoreRef` for a result this island keeps, a
    `PeerRef` for one another island keeps), or values a host branch produced. `last` says no more work of this run will
    come to this island.
    """

    ticket: int
    run_id: int
    client_id: int
    plan_key: int
    step_ids: tuple[int, ...]
    inputs: tuple[tuple[int, Any], ...] = ()
    last: bool = True
    checks: tuple[bool, bool] = UNCHECKED     # the JAX debug checks of the call that started it (`debug_checks`)


def host_arrays_copied(inputs: tuple[tuple[int, Any], ...]) -> tuple[tuple[int, Any], ...]:
    """`inputs` ((buffer, value) pairs) with each NumPy array replaced by a copy of it.

    A run whose arguments are placed on their devices later than the call
    (queued by the scheduler, or behind an island's other work) is given
    copies, so that what the caller writes into its arrays after the call (a
    data loader refilling one batch buffer) does not reach the run: `jax.jit`
    copies a NumPy argument at the call too. JAX arrays cannot change.
    """
    return tuple((buffer, value.copy() if isinstance(value, np.ndarray) else value) for buffer, value in inputs)


class Islands(dict):
    """A runtime's islands by name, and how a run's work reaches them.

    What its islands can do (`runtime/backends.py`): `keep_arguments`,
    whether a handle passed to a later run goes as a reference instead of
    its array (embedded islands share this process, so the array is the
    cheaper; remote ones keep it: Ray): a `StoreRef` to its own island, a
    `PeerRef` (`peer_reference`) to another; `fast_lanes`,
    whether a single-island plan's runs may execute on the caller's thread
    (`runtime/fast_lane.py`); `traces`, whether the islands record traces;
    `in_process`, whether they run in this process, and so can run the
    functions it keeps instead of serialising (`runtime/executables.py`).
    """

    keep_arguments = False
    fast_lanes = True
    traces = True
    in_process = True

    def peer_reference(self, run, buffer: int, plan, input_buffer: int) -> PeerRef | None:
        """A `PeerRef` to buffer `buffer` of `run`, kept on its island, for `plan`'s input `input_buffer` on
        another island; None where the islands cannot pass it between them (the driver fetches it)."""
        return None

    def pin(self, run, keys) -> None:
        """`run` takes the kept results `keys` ((run id, buffer) pairs) by reference: their releases must not
        overtake its start. Nothing here: islands that keep no arguments are given arrays."""

    def unpin(self, run) -> None:
        """`run` will never start (its submission failed, or it was cancelled while queued): its references
        (`pin`) will never be sent."""

    def on_run_done(self, wake) -> None:
        """Calls `wake()` whenever an island sees a run's device work over (its completion tracker)."""
        for island in self.values():
            island.on_done = wake

    def watch(self, lose, restore) -> None:
        """Calls `lose(island)` when an island dies on its own (embedded islands do not: nothing to watch)."""

    def unwatch(self) -> None:
        """Stops watching (before the islands close: closing is not losing)."""

    def start(self, run, works: dict[str, IslandWork], inline: bool = False) -> list[tuple[Any, IslandWork]]:
        """Delivers one run's work to its islands: one `start` message each, in ticket order. With `inline`,
        returns the (island, work) pairs the caller runs itself, with `run_inline`, once it holds no lock. A
        run whose plan one of its islands lacks (`replaced`) is delivered nowhere: it fails on each."""
        replaced = self.replaced(run, works)
        if replaced is not None:
            for name in works:
                self[name].fail_run(run.id, replaced)
            return []
        jobs = []
        for name, work in works.items():
            if self[name].start(work, inline):
                jobs.append((self[name], work))
        return jobs

    def replaced(self, run, works: dict[str, IslandWork]) -> "IslandLost | None":
        """An `IslandLost` for a run whose plan one of the islands of `works` does not have: the plan was loaded
        onto the island it replaced, lost and restored since (between the run's load and its delivery); None
        if each has it."""
        for name, work in works.items():
            if not self[name].has_plan(work.plan_key):
                return IslandLost(f"island {name} was lost and restored while run {run.id} of {run.plan.program} "
                                  f"was starting: its plan was loaded onto the lost island")
        return None

    def close(self) -> None:
        """Closes every island (runs still under way there fail)."""
        for island in self.values():
            island.close()


def computed(array) -> bool:
    """Whether the computation writing `array` is over as far as the island can tell: the array is ready,
    its computation failed (its reader raises), or it was donated to a later launch, which XLA runs
    after it (a deleted array has no readiness to ask)."""
    try:
        return array.is_deleted() or array.is_ready()
    except Exception:  # noqa: BLE001
        return True


def client_owner(client_id: int) -> tuple[str, int]:
    """The owner of a client's results in the object store."""
    return ("client", client_id)


def without_traceback(error: BaseException) -> BaseException:
    """Returns `error` with its traceback (and its causes' tracebacks) dropped: frames hold arrays."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return error


def raised(error: BaseException) -> BaseException:
    """Returns a copy of a kept error to raise: raising the kept one would attach a traceback to it, whose
    frames would keep a failed run's arrays alive as long as the error is kept."""
    copy = type(error)(*error.args)
    copy.__cause__ = error.__cause__
    return copy


class IslandRun:
    """What an island holds of one run under way: slots, queued programs, where it stopped."""

    __slots__ = ("id", "client_id", "plan_key", "program", "layout", "slots", "queue", "pc", "tracked", "last",
                 "executing", "began", "earliest_end", "latest_end", "referenced", "awaiting", "parked",
                 "queued", "checks")

    def __init__(self, run_id: int, client_id: int, plan_key: int, program: str, layout: IslandLayout):
        self.id, self.client_id, self.plan_key, self.program, self.layout = run_id, client_id, plan_key, program, layout
        self.slots: list = [None] * len(layout.slot)
        self.queue: collections.deque[tuple[Instruction, ...]] = collections.deque()
        self.pc = 0
        self.tracked: list = []          # arrays whose readiness means the run's device work is done
        self.last = False
        self.executing = False
        self.began: float | None = None  # when the executor first ran its instructions (monotonic)
        self.earliest_end = 0.0          # its device work was not over yet then (its dispatch's end, or a look)
        self.latest_end: float | None = None   # it was over by then (its dispatch's end, if XLA ran it inline)
        self.referenced: dict[int, Any] = {}   # buffer -> the kept array a StoreRef or PeerRef argument names
        self.awaiting = 0                # such arguments not here yet (not produced, or on their way)
        self.parked = False              # its work waits for those arguments (resumed by `_resume`)
        self.queued = False              # a fast lane's run queued for the executor (not run by its caller)
        self.checks = UNCHECKED          # the JAX debug checks its launches make (`debug_checks`)


def waits_for(run: IslandRun) -> str:
    """Says what a run under way on an island waits for."""
    if run.executing:
        return "nothing: its steps are executing"
    if run.awaiting:
        return (f"{run.awaiting} argument(s) kept here or on a peer island that have not arrived yet (or that it "
                f"donates and a peer has yet to pull)")
    if run.queue:
        instruction = run.queue[0][run.pc]
        if isinstance(instruction, RecvInstruction) and run.slots[instruction.dst] is None:
            return f"recv of {instruction.what}"
        return "its turn on the island's executor"
    if not run.last:
        return "more work of this run from the scheduler (after a host cond, or the next sequential step)"
    return "its turn on the island's executor"
