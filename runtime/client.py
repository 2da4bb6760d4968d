"""Clients: the single controller's view of the cluster.

A client runs program plans and holds the results as handles. Several clients
(threads of one process) share one runtime; each sees only its own objects,
unless their owner shares them (`share`, `runtime/shared.py`), and closing a
client releases everything it owns. A client's weight (from 1e-6 to 1e6) is
its share when the runtime's scheduler uses the `share` policy.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import weakref
from typing import NamedTuple, Sequence

from pathways_mlir.dialect.plan import ProgramPlan

from .array_reference import Reference
from .dispatch import Dispatcher, check_dtype, check_timeout
from .dispatch_mode import DispatchMode
from .executables import numpy_dtype
from .handles import Handle, nothing_dropped, release_dropped
from .island_work import Readable, RunFailed, StoreRef, client_owner
from .plan_check import refuse_debug_checks
from .run import Run
from .runtime import RunCancelled, Runtime, get_runtime, in_forked_child, on_close, refuse_forked
from .shared import SharedRef
from .wire import too_many_dims

_client_ids = itertools.count(1)
# A weight's bounds: under `share` a client's virtual time grows by its runs' device time over its weight, and
# one of 1e-300 pushed every later client's start past where their own runs' charges round away.
MIN_WEIGHT = 1e-6
_CLOSE_TIMEOUT = 60.0    # seconds close() waits for the client's runs under way before releasing anyway


def check_weight(weight) -> None:
    """Raises ValueError in one line unless `weight` is a number from `MIN_WEIGHT` to its inverse."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not MIN_WEIGHT <= weight <= 1 / MIN_WEIGHT:
        raise ValueError(f"a client's weight must be a number from {MIN_WEIGHT:g} to {1 / MIN_WEIGHT:g}, not "
                         f"{weight!r:.40}")


class RefusedArgument(ValueError):
    """An argument a client's run refuses before anything runs: a handle of another client (other clients read a
    client's result only through `owner.share(handle)`, read-only: taken as it is, a run of theirs could donate
    (delete) it, and its bytes would move to their account), or an array of a rank no frame carries
    (`wire.too_many_dims`) for an island out of this process. The message is `argument` (how the error names
    it: `argument 2 of program @f`; the front end names it by its key path) and `why`; `position` is its index
    in the run's arguments."""

    def __init__(self, argument: str, position: int, why: str):
        super().__init__(f"{argument}{why}")
        self.argument, self.position, self.why = argument, position, why


class Client:
    """One user of the cluster, with its own objects and scheduling weight."""

    def __init__(self, runtime: Runtime | None = None, weight: float = 1.0):
        check_weight(weight)
        refuse_forked()
        self.runtime = runtime or get_runtime()
        if not isinstance(self.runtime, Runtime):
            raise ValueError("this process is a client of a service (pw.connect): its connection is its "
                             "client; connect again for another")
        self.id = next(_client_ids)
        self.weight = weight
        self.closed = False
        self._dispatcher = Dispatcher(self.runtime, self.id, weight)
        self._active: collections.deque[weakref.ref[Run]] = collections.deque()    # (`_remember`)
        self._shared: set[tuple[int, int]] = set()   # the results this client shared (never donated)
        self._lock = threading.Lock()

    def set_weight(self, weight: float) -> None:
        """Sets the client's weight (from 1e-6 to 1e6) for its runs started from now on: its share under the
        `share` policy (a service's session sets it for a remote client that asks)."""
        check_weight(weight)
        self.weight = self._dispatcher.weight = weight

    @property
    def owner(self) -> tuple[str, int]:
        """The owner of this client's results in the object store."""
        return client_owner(self.id)

    def start(self, plan: ProgramPlan, args: Sequence, dispatch: DispatchMode | str = DispatchMode.PARALLEL,
              timeout: float | None = None, inline: bool = True) -> Run:
        """Starts a run of `plan`; returns the run without waiting. With `timeout` (seconds), the run is
        cancelled if it is not over by then, and its handles raise `RunCancelled`. An argument may be a
        `SharedRef` (another client's shared object), read in place; a handle of another client is refused
        (`RefusedArgument`). With `inline`, this thread executes the run's work on an island that is idle
        (places its arguments and dispatches its launches), saving a handoff to the island's executor; a
        caller with other work waiting (a service's session with another run read ahead) passes False and
        returns as soon as the work is queued.

        A handle goes to the island of the input it is passed for as a
        reference when the islands keep arguments (Ray: a `StoreRef` on its
        own island, a `PeerRef` pulled from another; the value never travels
        through this process); otherwise as its array.
        A handle passed for an input the plan lists as donated (`plan.donated`)
        is given to the run: it cannot be used again, and admission counts its
        bytes as the run's own, which may write a result into its buffer."""
        refuse_forked()
        if not nothing_dropped():
            release_dropped()
        if type(dispatch) is not DispatchMode:
            dispatch = DispatchMode.parse(dispatch)
        if timeout is not None:
            check_timeout(timeout)
        lane = self.runtime.lane(plan) if timeout is None and dispatch is DispatchMode.PARALLEL else None
        run = None
        try:
            if lane is not None:
                with self._lock:
                    if self.closed:
                        raise RuntimeError(f"client {self.id} is closed")
                    run = lane.start(self.id, self.weight, args, inline)
                    if run is not None:
                        self._remember(run)
                        return run
            if not self.runtime.islands.in_process:          # (no lane there)
                refuse_debug_checks("this runtime's islands are Ray actors")
            shared = {i: a for i, a in enumerate(args) if isinstance(a, SharedRef)}
            for ref in shared.values():
                if ref._runtime is not self.runtime:
                    raise ValueError(f"{ref!r} belongs to another runtime than client {self.id}'s")
            donated = [(i, a) for i, (b, a) in enumerate(zip(plan.inputs, args))
                       if b in plan.donated and isinstance(a, Handle)] if plan.donated else ()
            passed_at = positions_by_identity(args, Handle) if donated else {}
            for i, handle in donated:
                if (handle._run.id, handle._buffer) in self._shared:
                    raise ValueError(f"the handle passed as argument {i} of program @{plan.program} is donated, "
                                     f"but it is shared (client.share): other clients read it, so it cannot be "
                                     f"donated")
                again = next((j for j in passed_at[id(handle)] if j != i), None)
                if again is not None:
                    raise ValueError(f"the handle passed as argument {i} of program @{plan.program} is donated, "
                                     f"but it is passed again as argument {again}: donate a copy, or neither")
            args = self._arguments(plan, args)
            with self._lock:      # close() cannot slip between the check and the run's registration
                if self.closed:
                    raise RuntimeError(f"client {self.id} is closed")
                run = self._dispatcher.start(plan, args, dispatch, timeout, shared=shared, inline=inline,
                                             donations=tuple((h._run.id, h._buffer) for _, h in donated))
                for _, handle in donated:
                    handle.donate(f"program @{plan.program}")
                self._remember(run)
                return run
        except BaseException as error:  # noqa: BLE001  (raised again: an interrupt, Ctrl-C)
            if run is not None:
                self.runtime.abandon(run, error)     # started, but its caller never gets it
            raise

    def _remember(self, run: Run) -> None:
        """Keeps a run under way for `close`, forgetting the runs the scheduler is done with, oldest first (the
        scheduler retires its runs in flight as its admissions and a fast lane's credits need, so those kept
        stay about as many as it holds). Kept weakly: a run under way is the scheduler's too, and one over must
        not hold its plan until this client's next call (an idle client kept the programs it dropped loaded,
        found as a test that failed now and then). Under the lock."""
        active = self._active
        while active and ((oldest := active[0]()) is None or oldest.retired):
            active.popleft()
        active.append(weakref.ref(run))

    def _arguments(self, plan: ProgramPlan, args: Sequence) -> list:
        """What the dispatcher gets for each argument (`_argument`), whatever their count."""
        return [self._argument(plan, i, plan.inputs[i] if i < len(plan.inputs) else None, a)
                for i, a in enumerate(args)]

    def _argument(self, plan: ProgramPlan, position: int, buffer: int | None, arg):
        """What the dispatcher gets for `arg`, argument `position`, passed for input `buffer` (None: no such
        input): where the islands keep arguments, a handle's or shared object's `StoreRef` for an input on its
        island, or its `PeerRef` for one on another island that can pull it (`Islands.peer_reference`); else its
        array (whose fetch raises the run's error if it failed, and which the dispatcher checks). A reference
        is checked here as the dispatcher checks an array: a result of another shape gives its array (refused
        there), one of another dtype is refused (`check_dtype`), and one of a run known to have failed (or been
        cancelled) is refused with an error of the failure's class: its island might still hold the result,
        and the failure could reach it after this run's start. A handle of another client is refused
        (`RefusedArgument`), before anything runs or is donated."""
        if isinstance(arg, (Handle, SharedRef)):
            if isinstance(arg, Handle) and arg._client is not self:
                _refuse_other_clients(arg, self, f"argument {position} of program @{plan.program}", position)
            islands = self.runtime.islands
            target = plan.island_of(buffer) if buffer is not None and islands.keep_arguments else None
            home = arg._run.island_of(arg._buffer)
            expected = plan.buffers[buffer] if buffer is not None else None
            if target is not None and home is not None and arg.shape == expected.shape:
                check_dtype(plan.program, position, arg.dtype, numpy_dtype(expected.dtype), expected.shape)
                if isinstance(arg, SharedRef):
                    if arg.released:
                        raise ValueError(arg.gone())
                    ref = StoreRef(arg._run.id, arg._buffer)
                else:
                    ref = arg.reference()
                if home != target:
                    ref = islands.peer_reference(arg._run, arg._buffer, plan, buffer)
                if ref is not None:
                    failed = arg._run.error
                    if failed is not None:
                        raise (type(failed) if isinstance(failed, RunFailed) else RunFailed)(
                            f"program @{plan.program} takes a result of run {arg._run.id}, which failed: {failed}")
                    return ref
            return arg.result()
        if isinstance(arg, Reference) and arg.is_deleted():
            arg.result()         # raises its one-line error now, not on the island (a service's closed handle)
        if not self.runtime.islands.in_process and buffer is not None and plan.island_of(buffer) is not None:
            why = too_many_dims(arg)          # (its island's actor takes it in a frame: refused before anything)
            if why is not None:
                raise RefusedArgument(f"argument {position} of program @{plan.program}", position, why)
        return arg

    def run(self, plan: ProgramPlan, args: Sequence, dispatch: DispatchMode | str = DispatchMode.PARALLEL,
            timeout: float | None = None, inline: bool = True) -> list[Handle]:
        """Runs `plan` on `args`; returns one handle per program output (see `start` for `timeout` and
        `inline`)."""
        run = self.start(plan, args, dispatch, timeout, inline)
        try:
            return self.handles(run)
        except BaseException as error:  # noqa: BLE001  (raised again: an interrupt, Ctrl-C)
            self.runtime.abandon(run, error)             # no handle would release its results
            raise

    def cancel(self, target: "Handle | Run") -> bool:
        """Cancels the run of a handle (or a run): queued, it leaves the queue; admitted, it fails on every
        island, and its memory comes back once its device work is over. Its handles raise `RunCancelled`.
        Returns False if the run was already over. A handle released or donated raises ValueError, as reading
        it does."""
        target = target.owned() if isinstance(target, Reference) else target
        if isinstance(target, Handle):
            target._check()                  # released or donated: raises as a read would, as a remote handle does
        run = target._run if isinstance(target, Handle) else target
        if run.client_id != self.id:
            raise ValueError(f"run {run.id} belongs to client {run.client_id}, not to client {self.id}")
        return self.runtime.cancel(run, RunCancelled(f"run {run.id} of {run.plan.program} was cancelled by "
                                                     f"client {self.id}"))

    def handles(self, run: Run) -> list[Handle]:
        """Returns handles to a run's outputs, in order. An output the program returns more than once
        (`return y, y`) is the same handle in each of its places: one result, released once it is dropped (two
        handles of one result would release it with the first one dropped, and the other would never be
        produced)."""
        plan = run.plan
        if plan.outputs == plan.distinct_outputs:      # (both tuples: no output twice)
            return list(map(functools.partial(Handle, self, run), plan.outputs))    # (no comprehension's call)
        made = {b: Handle(self, run, b) for b in plan.distinct_outputs}
        return [made[b] for b in plan.outputs]

    def wait(self, run: Run, timeout: float | None = None) -> None:
        """Waits until a run's work is over; raises its error if it failed."""
        self.runtime.wait(run, timeout)

    def fetch(self, run: Run, buffer: int, timeout: float | None = None, reader: Readable | None = None):
        """Returns the array of one of a run's buffers once it exists. Its `reader` (its handle; by default, a
        `ResultRead` of this client) raises once the result was released: a fetch that would wait for it raises
        so instead (`Island.fetch`)."""
        refuse_forked()
        if reader is None:
            reader = ResultRead(self, run, buffer)
        try:
            return self._dispatcher.fetch(run, buffer, timeout, reader)
        except RunFailed:
            if not self.runtime.closed:
                raise
            raise RunFailed(f"run {run.id} of {run.plan.program}: its results went with its runtime, which was "
                            f"closed (by Runtime.close, by pw.configure or pw.connect replacing the default runtime, "
                            f"or by pw-serve stopping)") from None

    def release(self, run: Run, buffer: int, donated: bool = False) -> None:
        """Releases one result of a run (a handle was deleted). A `donated` result's bytes stay reserved:
        the run it was donated to takes them over when admitted."""
        if self.closed or in_forked_child():
            return                       # closing released everything already; a forked child holds nothing
        if self._shared:
            self._shared.discard((run.id, buffer))
        island = run.plan.island_of(buffer)
        runtime = self.runtime
        if island is not None:
            runtime.islands[island].release(run.id, buffer)
        runtime.scheduler.release_result(run, buffer, donated)   # marks it released: see `keep_host_value`
        kept = run.on_devices.get(buffer) if run.on_devices and island is None else None
        if kept is not None:             # a cond's result its host kept on an island's devices
            runtime.islands[kept[0]].drop_host_value(run.id, buffer)

    def share(self, handle: Reference, timeout: float | None = None) -> Reference:
        """Returns a read-only reference to one of this client's results (`handle`: its handle, or a front end's
        wrapper of one, `Reference.owned`), which other clients may pass to their programs while this client
        keeps the handle (see `runtime/shared.py`). Waits (at most `timeout` seconds) until the result's run is
        over; raises ValueError for a result it cannot share. The reference reads as `handle` does: a `SharedRef`,
        or, for a front end's typed keys or weakly typed value, the `SharedRef` wrapped as its handle is
        (`Reference.wrapping`)."""
        owned = handle.owned() if isinstance(handle, Reference) else handle
        if not isinstance(owned, Handle) or owned._client is not self:
            raise ValueError(f"client {self.id} can share only its own handles, not {owned!r}")
        owned._value(timeout)              # raises if released, donated or failed (its value as fetched)
        self.runtime.wait(owned._run, timeout)
        self.runtime.scheduler.share(owned._run, owned._buffer, timeout)
        self._shared.add((owned._run.id, owned._buffer))
        return handle.wrapping(SharedRef(self.runtime, owned))

    def objects(self) -> list:
        """Returns the keys of the objects this client owns."""
        release_dropped()
        return self.runtime.owned_by(self.owner)

    def close(self) -> None:
        """Cancels the client's queued runs (their results would be released unread), waits for its runs
        under way (`_CLOSE_TIMEOUT` seconds in all), then releases every object it owns.

        The client can no longer run programs, and its handles raise.
        """
        with self._lock:
            self.closed = True
            active = [run for run in (ref() for ref in self._active) if run is not None]
            self._active.clear()
        self.runtime.scheduler.cancel_client(self.id, lambda run: RunCancelled(
            f"run {run.id} of {run.plan.program} was queued when client {self.id} closed"))
        deadline = time.monotonic() + _CLOSE_TIMEOUT
        for run in active:
            try:
                self.runtime.wait(run, max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001  (a failed run owns nothing more)
                pass
        self.runtime.release_client(self.id)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ResultRead(NamedTuple):
    """A result that `Client.fetch` reads without its handle (a test's, say): released once its handle was, or
    once its client closed. (A handle's release marks `run.released` after its island woke the readers: a read
    waiting then goes on waiting; a read through the handle itself checks its `_deleted`, marked before.)"""

    client: Client
    run: Run
    buffer: int

    def _check(self) -> None:
        """Raises ValueError in one line if the result was released."""
        if self.client.closed:
            raise ValueError(f"buffer {self.buffer} of run {self.run.id} belongs to closed client {self.client.id}: "
                             f"its result was released")
        if self.buffer in self.run.released:
            raise ValueError(f"buffer {self.buffer} of run {self.run.id} was released")


def positions_by_identity(args: Sequence, kind: type) -> dict[int, list[int]]:
    """Where each object of `kind` among `args` is passed (`id` -> its positions, in order): what tells a donated
    argument passed again in the same call, in one pass (searching the arguments again for each donated one
    cost a step donating a state of 400 leaves 3.5 ms)."""
    positions: dict[int, list[int]] = {}
    for position, arg in enumerate(args):
        if isinstance(arg, kind):
            positions.setdefault(id(arg), []).append(position)
    return positions


def cancel(handle) -> bool:
    """Cancels the run of `handle` (a `Handle`, or a `RemoteHandle` of a service) through the client that
    owns it (see `Client.cancel`); returns False if the run was already over."""
    owner = handle.owned() if isinstance(handle, Reference) else None
    if not hasattr(owner, "_client"):
        raise TypeError(f"pw.cancel takes a handle a program returned, not {type(handle).__name__}")
    return owner._client.cancel(owner)


# Each runtime's default client, until the runtime closes (`_forget_default_client`): the client holds its runtime,
# so a weak key never died and every closed runtime stayed.
_default_clients: dict[Runtime, Client] = {}
_default_lock = threading.Lock()


def default_client(runtime: Runtime | None = None) -> Client:
    """Returns the client that calls without an explicit client use (one per runtime; for a service this
    process is connected to, the connection)."""
    runtime = runtime or get_runtime()
    if not isinstance(runtime, Runtime):
        return runtime        # a `RemoteClient` (pw.connect) is its own runtime and this process's one client
    client = _default_clients.get(runtime)
    if client is None:
        with _default_lock:
            client = _default_clients.get(runtime)
            if client is None:
                client = Client(runtime)
                if not runtime.closed:      # (a closed runtime's would be kept for good: it was forgotten)
                    _default_clients[runtime] = client
    return client


def _forget_default_client(runtime) -> None:
    """Drops the default client of `runtime`, which closed (`on_close`)."""
    with _default_lock:
        _default_clients.pop(runtime, None)


on_close(_forget_default_client)


def _refuse_other_clients(handle: Handle, client: Client, argument: str, position: int) -> None:
    """Raises `RefusedArgument` for `handle`, another client's, `argument` of a run of `client` (ValueError as
    reading it does if it is released, its owner closed say: no owner could share it then)."""
    handle._check()
    fix = "its owner's read-only reference, owner.share(handle)" if handle._client.runtime is client.runtime \
        else "its value, np.asarray(handle) (its owner runs on another runtime)"
    raise RefusedArgument(argument, position, f" is a handle of client {handle._client.id}, not of client "
                                              f"{client.id}, which runs it: pass {fix}, instead")
