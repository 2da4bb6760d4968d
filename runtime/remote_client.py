"""The client end of an endpoint: a runtime in another process, reached through a socket.

`RemoteClient` sends plans (their structure as JSON, their compiled
functions as bytes) and host arrays, and gets back `RemoteHandle`s that
fetch their values on demand and are released when dropped. To the front
end it is also a runtime: programs are lowered in the client's process for
the endpoint's topology and run there (`pw.connect`, `runtime/service.py`).

Liveness: every reply is awaited at most `timeout` seconds (`DEADLINE` by
default); a wait for a result is made of requests the endpoint answers
within a fraction of that, so a hung endpoint (stopped, wedged, gone) is a
`ServiceError` naming it within `timeout`, and the connection is closed. A
run's first compiles its plan there, which may take longer: the endpoint
says it is compiling every quarter of `timeout` until then, and each such
frame starts the wait again, for a reply and for a send that waits for the
endpoint to read (a large run sent while it compiles the one before).
A thread sends a keepalive whenever the connection has been quiet for a
quarter of the endpoint's idle timeout, so an idle client keeps its objects.

Reading a pytree of results (`jax.device_get`, which announces every leaf
with `copy_to_host_async` before it reads them) costs one request: a fetch
brings back, besides its own value, those announced whose values are
computed, held here until read or released: what is held and what fetches
in flight ask for stay within `AHEAD_BYTES`. A handle donated to a run, or
whose run this client cancelled, drops what is held of it: read, it raises
as it does in-process.

A dropped handle's release goes with the connection's next request, or,
if none comes within `RELEASE_DELAY`, that thread sends it; a release sent
alone is not waited for: its reply is read with a later request's. So is a
run of a program (`run` with `refresh`): its client chooses its result keys,
returns its handles at once and reads its reply with the next request, so
runs in flight cost no round trip each. A run the service refused makes its
handles raise its error (and so does a later run taking one); one refused
because the cluster's topology changed is lowered again (`refresh`) and
sent again with the same keys, and a request it made fail is asked again. A plan
is sent once per plan object, and once the program that made it is gone
(nothing holds the plan), its name goes the same way, and the endpoint
forgets the plan (as the embedded runtime forgets a plan nothing holds).
"""

from __future__ import annotations

import base64
import collections
import itertools
import numbers
import os
import queue
import socket
import threading
import time
import weakref
from typing import Callable

import jax.numpy as jnp
import numpy as np

from pathways_mlir.dialect.memory_plan import reuses
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .admission import OutOfDeviceMemory
from .array_reference import ArrayReference, Reference, wait_limit
from .authentication import client_handshake, read_key
from .client import RefusedArgument, check_weight
from .dispatch import narrowed, taken_as
from .dispatch_mode import DispatchMode
from .executables import ARRAY_TYPE, numpy_dtype
from .fair_lock import FairLock
from .island_work import RunFailed
from .runtime import forget_runtime, release_default
from .status import Status
from .limits import Limits
from .plan_check import refuse_debug_checks, refuse_kept_functions
from .resource_manager import TopologyChanged
from .wire import DTYPES, ERROR_KINDS, MIN_PROGRESS, FrameReader, ProtocolError, send_message, too_many_dims

DEADLINE = 120.0     # seconds a client waits for any one reply by default
POLL = 5.0           # the longest a request waiting for a result asks the endpoint to hold on
UNANSWERED = 64      # release and run requests sent at most before their replies are read
UNANSWERED_BYTES = 64 << 20   # bytes of arguments of runs whose replies are not read, at most (kept to resend)
RETRIES = 3          # times a request is asked again after runs it followed were lowered again
RELEASE_DELAY = 0.02  # seconds a dropped handle's release waits for a request to carry it
WANTED = 8192        # values announced for reading (`copy_to_host_async`) and not brought back yet, at most
AHEAD_BYTES = 64 << 20   # bytes of values held, or asked for, ahead of their read by a client, at most
FORKED = ("a connection to the service belongs to the process that made it, not to a child of os.fork(): connect "
          "again in the child (pw.connect), or start worker processes with the 'spawn' or 'forkserver' method")


class RemoteError(RuntimeError):
    """An error the endpoint reported for a request. One the embedded runtime raises as ValueError, TypeError or
    PermissionError (a wrong argument, a released or donated handle, a shared object one may not read) is one of
    the subclasses below, so that `except ValueError:` catches it here as it does in-process, and
    `except RemoteError:` still does."""


class RemoteValueError(RemoteError, ValueError):
    """A request the service refused with a ValueError (see `RemoteError`)."""


class RemoteTypeError(RemoteError, TypeError):
    """A request the service refused with a TypeError (see `RemoteError`)."""


class RemotePermissionError(RemoteError, PermissionError):
    """A request the service refused with a PermissionError (see `RemoteError`)."""


# The class the client raises for each kind of error reply (`wire.ERROR_KINDS`); any other kind: RemoteError.
RAISED = {**ERROR_KINDS, "value": RemoteValueError, "type": RemoteTypeError, "permission": RemotePermissionError}


class ServiceError(ConnectionError):
    """A service that cannot be started, reached or heard from; the message is one line naming it."""


class RemoteHandle(ArrayReference):
    """A handle to a result held by an endpoint for this process; behaves like a local `Handle`.

    `np.asarray(h)`, `h.result(timeout)` (a JAX array here), `h.block_until_ready()`, `h.shape`,
    `h.dtype`; passed to a later run of the same client, it stays on the cluster. `delete()` releases the
    result at once; dropping the last reference releases it with the connection's next request, or within
    `RELEASE_DELAY` seconds. Passed for a donated input, it is deleted once the run that took it is sent,
    and the service refuses it from then on, with a donated `Handle`'s error.
    """

    __slots__ = ("_client", "_key", "shape", "dtype", "_finalizer", "_donated", "__weakref__")
    _from_elsewhere = True

    def __init__(self, client: "RemoteClient", key: int, shape, dtype: str):
        self._client, self._key, self.shape, self.dtype = client, key, tuple(shape), np.dtype(DTYPES[dtype])
        self._donated = False
        self._finalizer = weakref.finalize(self, client._drop, key)
        self._finalizer.atexit = False       # at exit the connection closes and releases everything

    def result(self, timeout: float | None = None):
        """Returns the value as a JAX array, waiting at most `timeout` seconds (None: as long as it takes)
        for it to be produced; raises TimeoutError past it, the run's error if it failed."""
        return jnp.asarray(self._fetch(wait_limit(timeout), True))

    def copy_to_host_async(self) -> None:
        """Announces that the value will be read soon (`jax.device_get` gives this to every leaf of a pytree
        before it reads them): the connection's next fetch brings it back with its own value if it is computed
        by then (`RemoteClient._ahead`), so a pytree's values cost one request, not one each. Nothing for a
        released handle (reading it raises)."""
        if not self.is_deleted() and self._key not in self._client._refused:
            self._client._want(self._key, self.nbytes, self._finalizer)

    def block_until_ready(self) -> "RemoteHandle":
        """Waits until the value has been computed (nothing is sent back)."""
        self._fetch(None, False)
        return self

    def _host_value(self, timeout: float | None = None):
        return self._fetch(wait_limit(timeout), True)

    def is_ready(self) -> bool:
        """Whether reading the value would not wait: one request that waits for nothing (True once its value is
        computed, or its run failed, whose error reading it raises)."""
        try:
            self._fetch(0.0, False)
        except TimeoutError:
            return False
        except (RunFailed, OutOfDeviceMemory):
            pass                                 # failed: reading raises its error at once
        return True

    def is_deleted(self) -> bool:
        """Whether the result was released here: deleted, donated to a run sent, or its connection closed."""
        return not self._finalizer.alive or self._donated or self._client.closed_here

    def delete(self) -> None:
        """Releases the result on the cluster now."""
        if self._finalizer.detach() is not None:
            self._client._forget_ahead(self._key)
            if not self._client.closed:              # closing released it already
                self._client._release_now(self._key)

    def _check(self) -> None:
        """Raises ValueError in one line, as a `Handle` does, if this handle was released, or its connection
        was closed (`close()`, which released its result); nothing is asked of the service."""
        if not self._finalizer.alive:
            raise ValueError(f"remote handle {self._key} was released")
        refused = self._client._refused.get(self._key)
        if refused is not None:
            raise refused[0](refused[1])         # a new error each time: a raised one's frames would hold this
        if self._client.closed_here:
            raise ValueError(f"remote handle {self._key} belongs to the closed connection to the service at "
                             f"{self._client.name}: its result was released")

    def _fetch(self, timeout: float | None, value: bool):
        """Asks for the value in polls (`RemoteClient._polled`) until it is there or `timeout` has passed; a value
        brought back ahead of its read is taken as it is. A fetch of the value asks for the values announced for
        reading too (`copy_to_host_async`)."""
        self._check()
        client = self._client
        held = client._prefetched.get(self._key)
        if held is not None:
            if value:
                client._forget_ahead(self._key)
            return held if value else None
        deadline = None if timeout is None else time.monotonic() + timeout
        request = {"op": "fetch", "handle": self._key, "value": value}
        also = client._ahead(self._key) if value and client._wanted else []
        if also:
            request["also"] = also
        arrived = {}
        try:
            try:
                reply, arrays = client._polled(request, deadline, f"the result was not ready within {timeout} s")
            except ValueError:
                self._check()                    # released by another thread meanwhile: says so, as above
                raise
            if also:
                arrived = dict(zip(reply.get("also", ()), arrays[1:]))
        finally:
            if also:
                client._arrived_ahead(also, arrived)
        return arrays[0] if value else None

    def __repr__(self) -> str:
        return f"RemoteHandle(shape={self.shape}, dtype={self.dtype.name})"


class RemoteSharedRef(ArrayReference):
    """A shared object on a service (`runtime/shared.py`), named by its unguessable token: any connection
    given the token may pass it to its programs as a read-only argument. `token` is what the owner hands
    to readers (`RemoteClient.shared(token)` on their side). Like a `SharedRef`, it reads as an array:
    `ref.result(timeout)` (a JAX array), `np.asarray(ref)` and the rest of a handle's array protocol fetch
    its value through its connection (`client`), in requests bounded as a `RemoteHandle`'s are."""

    __slots__ = ("token", "shape", "dtype", "_connection")
    _from_elsewhere = True

    def __init__(self, token: str, shape, dtype: str, client: "RemoteClient | None" = None):
        self.token, self.shape, self.dtype = token, tuple(shape), np.dtype(DTYPES[dtype])
        self._connection = client

    def result(self, timeout: float | None = None):
        """Returns the value as a JAX array, waiting at most `timeout` seconds (None: as long as it takes);
        raises as a run taking it would once its owner released it."""
        return jnp.asarray(self._fetch(wait_limit(timeout)))

    def _host_value(self, timeout: float | None = None):
        return self._fetch(wait_limit(timeout))

    def is_ready(self) -> bool:
        """True, as a `SharedRef`'s (an object is shared once its run is over); raises, as a run taking it
        would, once its owner released it (one request checks the token)."""
        self._connected()._call({"op": "shared", "token": self.token})
        return True

    def is_deleted(self) -> bool:
        """Whether the object is gone for this reference: its owner released it (one request checks the
        token), or its connection was closed."""
        if self._connected().closed:           # closed here, or lost: nothing is read through it any more
            return True
        try:
            self.is_ready()
        except (PermissionError, ServiceError):   # released; or the connection was lost while asking
            return True
        return False

    def _fetch(self, timeout: float | None) -> np.ndarray:
        """Asks the service for the object's value in polls (`RemoteClient._polled`), as a handle does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        _, arrays = self._connected()._polled({"op": "fetch", "token": self.token}, deadline,
                                              f"the shared object was not there within {timeout} s")
        return arrays[0]

    def _connected(self) -> "RemoteClient":
        """The connection this reference reads through; ValueError in one line if it was made without one."""
        if self._connection is None:
            raise ValueError("this RemoteSharedRef was made without a connection to read it through: take it from "
                             "client.shared(token)")
        return self._connection

    def __repr__(self) -> str:
        return f"RemoteSharedRef(shape={self.shape}, dtype={self.dtype.name})"


class ServiceTopology:
    """What the front end reads of a remote cluster's resource manager: its topology and version."""

    def __init__(self, client: "RemoteClient"):
        self._client = client
        self.version = -1        # as last read: a run of a plan lowered for an older one raises TopologyChanged

    def snapshot(self) -> tuple[int, Topology]:
        """Asks the endpoint for (version, topology) read together."""
        reply, _ = self._client._call({"op": "topology"})
        self.version = reply["version"]
        return reply["version"], Topology.from_json(reply["topology"], "the endpoint's topology")


def check_reply_timeout(timeout) -> None:
    """Raises ValueError in one line unless `timeout`, a client's bound on each reply, is None or a positive
    number of seconds."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
                                or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r:.40}")


class RemoteClient:
    """A client of a cluster served by an `Endpoint` in another process.

    `address` is the endpoint's Unix socket path or its TCP `(host, port)`; the key comes from the
    endpoint's `key_path` or is given as bytes (`key`). `timeout` bounds the wait for each reply
    (`DEADLINE` by default; None: no bound); connecting and the handshake wait at
    most 10 s. `name` is how errors name the service (default: the address). `weight` (from 1e-6 to 1e6) is
    the client's share under the service's `share` policy, as `pw.Client`'s. With `status_only`, a
    connection the endpoint refuses for its `max_connections` but keeps open for its owner's full status
    (`session.serve_status`) is taken too: then `status(full=True)` is all it may ask (`self.status_only`).

    To the front end it is also the runtime (`pw.connect` makes it the process's
    default): `resources` holds the cluster's topology and version, which programs
    are lowered for here; `load` sends a plan once; `run` returns `RemoteHandle`s.
    """

    def __init__(self, address, key_path: str | None = None, key: bytes | None = None,
                 timeout: float | None = DEADLINE, name: str | None = None, status_only: bool = False,
                 weight: float = 1.0):
        check_weight(weight)
        if (key_path is None) == (key is None):
            raise ValueError("RemoteClient needs the endpoint's key_path or its key (one of them)")
        check_reply_timeout(timeout)
        timeout = wait_limit(timeout)        # past what a lock can wait (infinity): no bound, as a result's
        key = read_key(key_path) if key is None else key
        self.address = address if isinstance(address, str) else tuple(address)
        self.name = name or (f"unix:{address}" if isinstance(address, str) else f"{address[0]}:{address[1]}")
        self.timeout = timeout
        # seconds between the service's frames saying a run's plan still compiles (None: no bound, none needed)
        self._progress = None if timeout is None else max(MIN_PROGRESS, timeout / 4)
        self._socket = _connect(self.address, timeout)
        try:
            client_handshake(self._socket, key)
            self._socket.settimeout(timeout)
            self._reader = FrameReader(self._socket)
            welcome, _ = self._reader.recv()
            self.status_only = welcome.get("ok") is not True and welcome.get("status_only") is True
            if welcome.get("ok") is not True and not (status_only and self.status_only):
                raise ServiceError(f"the service at {self.name} refused the connection: "
                                   f"{str(welcome.get('error'))[:200]}")
            self.limits = Limits.from_python(welcome.get("limits"))
        except TimeoutError:
            self._socket.close()
            raise ServiceError(f"no welcome from the service at {self.name} in {timeout} s") from None
        except (ProtocolError, EOFError, ValueError) as error:
            self._socket.close()
            raise ServiceError(f"the service at {self.name} sent no welcome: {error}") from None
        except BaseException:
            self._socket.close()
            raise
        self._lock = FairLock()      # first come, first served: a polling request never starves the others
        self._dropped: collections.deque[int] = collections.deque()   # handles to release with the next request
        self._forgotten: collections.deque[str] = collections.deque()  # names of plans gone, for the same request
        # the requests sent whose replies are not read yet, in order: None for a release, a `SentRun` for a run
        self._unanswered: collections.deque[SentRun | None] = collections.deque()
        self._unanswered_bytes = 0               # their arguments' bytes
        self._refused: dict[int, tuple[type, str]] = {}   # handle key -> the error of the run refused with it
        self._keys = itertools.count(1)          # the keys this client chooses for its runs' results
        self._rerun: list[SentRun] = []          # runs refused for a topology change, to lower and send again
        # id(plan) -> (the plan, weakly; its name there; the topology version it was lowered for)
        self._names: dict[int, tuple[weakref.ref, str, int]] = {}
        self._last = time.monotonic()            # when the connection last carried a request
        self._stop = threading.Event()
        self._wakeups: queue.SimpleQueue = queue.SimpleQueue()   # a drop (or closing) wakes `_keep_alive`
        self._release_pending = False            # a wakeup for dropped handles is on its way
        self.requests: collections.Counter[str] = collections.Counter()   # requests sent, by op
        # Values announced for reading (`RemoteHandle.copy_to_host_async`): key -> (bytes, the handle's finalizer,
        # which says whether it is alive); those asked for by a fetch whose reply has not come -> their bytes;
        # those brought back and not read yet. Changed by single dict operations, without a lock: a finalizer
        # (`_drop`) changes them on any thread. The bytes held or asked for are summed from them (`_ahead`), so no
        # count drifts; `_choosing` makes the fetches that choose what to ask for at once share the room.
        self._wanted: dict[int, tuple[int, weakref.finalize]] = {}
        self._asked: dict[int, int] = {}
        self._prefetched: dict[int, np.ndarray] = {}
        self._choosing = threading.Lock()
        self.closed = False
        self._forked = False                     # this process is a child of os.fork() of the one that connected
        self.closed_here = False                 # closed by `close()` (not lost): its handles' results were released
        self.resources = ServiceTopology(self)
        self._keepalive = threading.Thread(target=self._keep_alive, name="pw-remote-keepalive", daemon=True)
        self._keepalive.start()
        _CONNECTIONS.add(self)
        if weight != 1.0:
            try:
                self._call({"op": "weight", "weight": weight})
            except BaseException:
                self.close()
                raise

    @property
    def runtime(self) -> "RemoteClient":
        """The runtime this client runs on, for the front end: the connection itself."""
        return self

    def load(self, plan: ProgramPlan) -> str:
        """Sends a plan to the cluster (once per plan): its structure as JSON, each compiled function as
        bytes; returns its name there (the SHA-256 of the plan's JSON)."""
        found = self._names.get(id(plan))
        if found is None or found[0]() is not plan:
            if self.resources.version < 0:
                self.resources.snapshot()        # a plan made without reading the topology: for the current one
            version = self.resources.version     # what the plan was lowered for: the latest topology read
            refuse_kept_functions(plan, "the islands of pw-serve run in the service's process")
            structure = plan.to_python()
            names = sorted(structure.pop("executables"))
            blobs = [np.frombuffer(base64.b64decode(plan.executables[n]), np.uint8) for n in names]
            reply, _ = self._call({"op": "load", "plan": structure, "executables": names}, blobs)
            found = self._names[id(plan)] = (weakref.ref(plan), reply["name"], version)
            weakref.finalize(plan, self._forget, id(plan), reply["name"]).atexit = False
        return found[1]

    def _forget(self, key: int, name: str) -> None:
        """A plan sent here is gone (its finalizer): the endpoint forgets it with the connection's next
        request, or within `RELEASE_DELAY`, as a dropped handle is released (`_drop`). Its id may be reused
        from now on, not before."""
        self._names.pop(key, None)
        if not self.closed:
            self._forgotten.append(name)
            self._wake()

    def run(self, plan: ProgramPlan, args, dispatch: DispatchMode | str = DispatchMode.PARALLEL,
            timeout: float | None = None, refresh: Callable[[], ProgramPlan] | None = None) -> list[RemoteHandle]:
        """Runs `plan` on `args` (arrays, this client's remote handles, shared objects); returns one remote
        handle per output, at once. Raises TopologyChanged if the cluster's topology changed since `plan` was sent.
        With `timeout`, the service cancels the run if it is not over by then (see `Client.start`).

        With `refresh` (which lowers the program again for the cluster's topology and returns its plan), a run
        without a `timeout`, donated inputs or shared objects is sent without waiting for its reply (see the
        module): the handles are made here, under keys this client chooses, and a run refused for a topology
        change is lowered again and sent again. Those three are checked by the service when the run is
        submitted, so such a run waits for its reply, and a misuse raises at the call, as in-process. Once it is
        taken, its donated arguments are gone, as in-process (`_donated`)."""
        dispatch = DispatchMode.parse(dispatch)
        refuse_debug_checks("the islands of pw-serve run in the service's process")
        self._send_again()                       # runs refused before this one go first
        name = self.load(plan)
        version = self._names[id(plan)][2]
        spec, arrays = self._arguments(plan, args)
        keys = {b: next(self._keys) for b in plan.distinct_outputs}     # (every run's: the service chooses none)
        request = {"op": "run", "name": name, "version": version, "dispatch": dispatch, "args": spec,
                   "timeout": timeout, "keys": list(keys.values()), "progress": self._progress}
        if refresh is None or timeout is not None or plan.donated or any(a[0] == "shared" for a in spec):
            self._call(request, arrays)
            if plan.donated:
                _donated(plan, args)
        else:
            sent = SentRun(request, arrays, refresh)
            with self._lock:
                self._check_open()
                self._send_unanswered(request, arrays, sent)
        made = {b: RemoteHandle(self, key, plan.buffers[b].shape, numpy_dtype(plan.buffers[b].dtype).name)
                for b, key in keys.items()}
        return [made[b] for b in plan.outputs]     # (an output returned twice is one handle)

    def _arguments(self, plan: ProgramPlan, args) -> tuple[list, list]:
        """A run's `args` as the request names them, and the arrays its frame carries."""
        spec, arrays = [], []
        for position, arg in enumerate(args):
            if isinstance(arg, RemoteHandle):
                if arg._client is not self:      # (the front end names it by its key path)
                    raise RefusedArgument(f"argument {position} of program @{plan.program}", position,
                                          " is a remote handle of another connection: pass its owner's read-only "
                                          "reference, owner.share(handle), instead")
                arg._check()
                spec.append(["handle", arg._key])
            elif isinstance(arg, RemoteSharedRef):
                spec.append(["shared", arg.token])
            elif type(arg) is ARRAY_TYPE and arg.is_deleted():       # (one a run here donated), as in-process
                raise RuntimeError(f"argument {position} of program @{plan.program} is a deleted jax.Array (deleted, "
                                   f"or donated to another computation, before the call)")
            elif too_many_dims(arg) is not None:
                # Named here: the frame's refusal would name it by its place among the frame's arrays.
                raise RefusedArgument(f"argument {position} of program @{plan.program}", position, too_many_dims(arg))
            else:
                spec.append(["array", len(arrays)])
                arrays.append(self._narrowed(plan, position, arg))
        return spec, arrays

    @staticmethod
    def _narrowed(plan: ProgramPlan, position: int, arg):
        """An array argument as this process's JAX takes it for its input (`dispatch.narrowed`: a float64 NumPy
        array for a float32 input, without x64); the service checks the rest."""
        if position >= len(plan.inputs) or not hasattr(arg, "dtype"):
            return arg
        expected = numpy_dtype(plan.buffers[plan.inputs[position]].dtype)
        return narrowed(arg, expected) if taken_as(arg.dtype, expected) else arg

    def share(self, handle: Reference, timeout: float | None = None) -> Reference:
        """Shares one of this client's results (`handle`: its remote handle, or a front end's wrapper of one,
        `Reference.owned`), waiting (at most `timeout` seconds, None: as long as it takes) until its run is over,
        in requests the endpoint answers within `POLL` s, as `RemoteHandle.result` waits; returns its reference,
        whose `token` other clients pass to `shared` (see `runtime/shared.py` and `Client.share`). The reference
        reads as `handle` does (a `RemoteSharedRef`, or one wrapped as a front end's typed keys or weakly typed
        value are), and so does a reader's: the service keeps how the front end reads them
        (`frontend/wire.value_type`)."""
        from pathways_mlir.frontend.wire import value_type     # (here: the front end imports this module)

        owned = handle.owned() if isinstance(handle, Reference) else handle
        if not isinstance(owned, RemoteHandle):
            raise ValueError(f"a connection can share only its own remote handles, not {owned!r:.80}")
        if owned._client is not self:
            raise ValueError("a remote handle of another connection cannot be shared here")
        timeout = wait_limit(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        owned._fetch(timeout, False)
        reply, _ = self._polled({"op": "share", "handle": owned._key, **value_type(handle)}, deadline,
                                f"the result's run was not over within {timeout} s")
        return handle.wrapping(RemoteSharedRef(reply["token"], reply["shape"], reply["dtype"], self))

    def shared(self, token: str) -> Reference:
        """Returns the shared object a token names, checked by the service (a token it never gave, or whose
        object its owner released, is refused: PermissionError), read as its owner's reference reads it (a
        `RemoteSharedRef`, or one wrapped as typed keys or a weakly typed value: `frontend/wire.shared_as`)."""
        from pathways_mlir.frontend.wire import shared_as     # (here: the front end imports this module)

        if not isinstance(token, str):
            raise ValueError(f"a shared object's token is a string, not {type(token).__name__}")
        reply, _ = self._call({"op": "shared", "token": token})
        return shared_as(RemoteSharedRef(token, reply["shape"], reply["dtype"], self), reply["prng_impl"],
                         reply["weak_type"])

    def cancel(self, handle: RemoteHandle) -> bool:
        """Cancels the run of `handle` on the service (see `Client.cancel`); False if it was over."""
        handle = handle.owned() if isinstance(handle, Reference) else handle
        if handle._client is not self:
            raise ValueError("a remote handle of another connection cannot be cancelled here")
        if self.closed_here:
            self._check_open()
        handle._check()
        cancelled = self._call({"op": "cancel", "handle": handle._key})[0]["cancelled"]
        if cancelled:
            # Reading the run's results raises now, so none may be read from what was brought back ahead. Which
            # handles are the run's is not known here: every value announced, held or on its way goes
            # (`_arrived_ahead` holds only those still announced and asked for); a read asks the service again.
            self._forget_all_ahead()
        return cancelled

    def object_count(self) -> int:
        """Returns how many objects this client owns on the cluster."""
        return self._call({"op": "objects"})[0]["count"]

    def status(self, full: bool = False) -> Status:
        """Returns the service's status as this client may see it: the scheduler's queue, each island's runs
        and what each waits for, and the bytes reserved per device, with this client's own runs and objects
        only. `full=True` asks for every client's (granted to the service's owner on its Unix socket)."""
        return _status(self._call({"op": "status", "full": full})[0]["status"])

    def close(self) -> None:
        """Disconnects; the cluster releases everything this client owns. Stops being the default runtime. In a
        child of os.fork() (`_after_fork_in_child`) it only stops being usable there: the socket is the parent's
        too, and a `close` sent on it ended the parent's connection (a data loader's worker exiting did)."""
        if self._forked:
            self.closed = True
            return
        release_default(self)
        self._stop.set()
        self._wakeups.put(None)
        with self._lock:
            if not self.closed:              # (closed already, by `_broken` say: what it kept still goes, below)
                self.closed = self.closed_here = True
                self._forget_all_ahead()     # (its handles raise from now on)
                try:
                    send_message(self._socket, {"op": "close"}, (), self.limits)
                    for _ in range(len(self._unanswered) + 1):
                        self._receive()      # past the frames saying a run's plan still compiles
                except (OSError, ProtocolError):
                    pass   # the endpoint is gone (a ServiceError), and with it everything this client owned
                finally:
                    self._socket.close()
        forget_runtime(self)
        if self._keepalive is not threading.current_thread():
            self._keepalive.join(10)

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _keep_alive(self) -> None:
        """Sends the releases of dropped handles that no request has carried within `RELEASE_DELAY`, and pings
        the endpoint whenever the connection has been quiet for a quarter of its idle timeout."""
        interval = self.limits.idle_timeout / 4
        while not self._stop.is_set():
            try:
                self._wakeups.get(timeout=max(0.05, interval - (time.monotonic() - self._last)))
                if self._stop.wait(RELEASE_DELAY):      # a drop: the next request may carry its release meanwhile
                    return
            except queue.Empty:
                pass
            self._release_pending = False               # a drop from now on wakes this thread again
            if not (self._dropped or self._forgotten or time.monotonic() - self._last >= interval):
                continue
            if not self._lock.acquire(timeout=RELEASE_DELAY):
                if self._dropped or self._forgotten:    # a long request holds the connection: try again later
                    self._release_pending = True
                    self._wakeups.put(None)
                continue
            try:
                if self.closed:
                    return
                if self._dropped or self._forgotten:
                    self._send_release()
                elif time.monotonic() - self._last >= interval:   # not when a request carried the drops meanwhile
                    self._exchange({"op": "ping"}, (), ())
            except (OSError, RemoteError):
                return     # the next request says what happened
            finally:
                self._lock.release()

    def _drop(self, key: int) -> None:
        """A remote handle was dropped: its release goes with the connection's next request, or within
        `RELEASE_DELAY` (`_keep_alive`). It never waits: it may run inside `_call`, or in a finalizer on any
        thread (a `SimpleQueue` may be put to there)."""
        self._dropped.append(key)
        self._refused.pop(key, None)
        self._forget_ahead(key)
        self._wake()

    def _want(self, key: int, nbytes: int, finalizer: weakref.finalize) -> None:
        """Notes that a handle's value (`nbytes` bytes) will be read soon (`RemoteHandle.copy_to_host_async`); at
        most `WANTED` are noted, the others are read alone."""
        if len(self._wanted) < WANTED and key not in self._prefetched:
            self._wanted[key] = (nbytes, finalizer)

    def _ahead(self, key: int) -> list[int]:
        """The handles whose values a fetch of handle `key` asks for besides (`also`): those announced for reading,
        not held or asked for already, while what is held ahead of its read and what fetches in flight ask for
        stay within `AHEAD_BYTES`, and the reply within the frame's limits. They are asked for from now on, until
        `_arrived_ahead`; `key` itself is no longer announced."""
        self._wanted.pop(key, None)
        with self._choosing:
            room = min(AHEAD_BYTES - sum(value.nbytes for value in list(self._prefetched.values()))
                       - sum(list(self._asked.values())), self.limits.max_array_bytes // 2)
            also = []
            for other, (nbytes, finalizer) in list(self._wanted.items()):
                if len(also) >= self.limits.max_arrays - 1:
                    break
                if other != key and nbytes <= room and finalizer.alive and other not in self._asked:
                    self._asked[other] = nbytes
                    also.append(other)
                    room -= nbytes
        return also

    def _arrived_ahead(self, asked: list[int], arrived: dict[int, np.ndarray]) -> None:
        """A fetch that asked for the values of handles `asked` ahead of their read ended, bringing back
        `arrived`: those of handles still announced and asked for are held until read or released (`_drop`,
        `delete`, `_donated`); the others go. Each leaves `_asked` only once held, so its bytes always count."""
        for key in asked:
            held = key in arrived and key in self._asked and self._wanted.pop(key, None) is not None
            if held:
                self._prefetched[key] = arrived[key]
            if self._asked.pop(key, None) is None and held:
                self._prefetched.pop(key, None)     # forgotten meanwhile (`_forget_ahead`): nothing is held of it

    def _forget_ahead(self, key: int) -> None:
        """Forgets what is noted, asked for or held of a handle's value ahead of its read (read, released or
        donated)."""
        self._wanted.pop(key, None)
        self._asked.pop(key, None)
        self._prefetched.pop(key, None)

    def _forget_all_ahead(self) -> None:
        """Forgets every value noted, asked for or held ahead of its read."""
        self._wanted.clear()
        self._asked.clear()
        self._prefetched.clear()

    def _wake(self) -> None:
        """Wakes `_keep_alive` to send what was dropped, unless a wakeup is on its way already (or this is a child
        of os.fork(), which has no `_keep_alive`)."""
        if not self._release_pending and not self._forked:
            self._release_pending = True
            self._wakeups.put(None)

    def _release_now(self, key: int) -> None:
        """Releases one handle now (`delete`), not waiting for the reply; while another thread's request holds the
        connection (a read polls for up to `POLL` s), as a drop (`_drop`: with the next request, or once the
        connection is free), so that `delete` never waits for that request."""
        self._refuse_forked()
        if not self._lock.acquire(blocking=False):
            self._drop(key)
            return
        try:
            self._check_open()
            self._send_release([key])
        finally:
            self._lock.release()

    def _polled(self, request: dict, deadline: float | None, late: str) -> tuple[dict, list[np.ndarray]]:
        """Sends `request` (one that waits for a result) in polls the endpoint answers within `POLL` s (or half
        the client's deadline), each with the `timeout` left, until one is answered; raises TimeoutError(`late`)
        once `deadline` (a monotonic time, None: none) has passed."""
        poll = POLL if self.timeout is None else min(POLL, self.timeout / 2)
        while True:
            wait = poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic()))
            try:
                return self._call({**request, "timeout": wait})
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(late) from None

    def _call(self, request: dict, arrays=(), release=()) -> tuple[dict, list[np.ndarray]]:
        """Sends one request and returns its reply (see `_exchange`). Runs sent before it that the service
        refused for a topology change are lowered and sent again first (`_send_again`), and the request is asked
        again if it failed after them (up to `RETRIES` times)."""
        for attempt in range(RETRIES + 1):
            self._send_again()
            with self._lock:
                self._check_open()
                try:
                    return self._exchange(request, arrays, release)
                except TopologyChanged:          # (also what a request naming a refused run's handle gets)
                    if not self._rerun or attempt == RETRIES:
                        raise
                release = ()                     # sent with the first attempt
        raise AssertionError("unreachable")      # the last attempt returns or raises

    def _send_again(self) -> None:
        """Lowers the runs the service refused for a topology change again (each run's `refresh`, which asks
        the service for its topology and loads the new plan) and sends them again, with the same keys, in the
        order they were first sent; a run that cannot be lowered again has its handles raise why. Holds no
        lock while it lowers. (Every request goes through here first: in a child of os.fork() it raises.)"""
        self._refuse_forked()
        with self._lock:
            rerun, self._rerun = self._rerun, []
        for sent in rerun:
            try:
                plan = sent.refresh()
                name = self.load(plan)
                request = {**sent.request, "name": name, "version": self._names[id(plan)][2]}
            except Exception as error:  # noqa: BLE001  (the run's handles raise it)
                self._refuse(sent, error)
                continue
            with self._lock:
                self._check_open()
                self._send_unanswered(request, sent.arrays, SentRun(request, sent.arrays, sent.refresh))

    def _refuse_forked(self) -> None:
        """Raises RuntimeError in one line in a child of os.fork() of the process that connected (before any lock:
        one a thread of the parent held at the fork is held for good here)."""
        if self._forked:
            raise RuntimeError(FORKED)

    def _check_open(self) -> None:
        if self.closed:
            raise ServiceError(f"the connection to the service at {self.name} is closed")

    def _send_release(self, release=()) -> None:
        """Sends a `release` request for the dropped handles and `release`, forgetting the plans gone
        (holding the lock), without waiting for its reply: the next exchange reads it."""
        self._send_unanswered({"op": "release"}, (), None, release)

    def _send_unanswered(self, request: dict, arrays, sent: "SentRun | None", release=()) -> None:
        """Sends a request whose reply the next exchange reads (holding the lock), carrying the dropped handles'
        releases and `release`: a release (`sent` None) or a run. At most `UNANSWERED` such replies wait unread,
        and runs' arguments of at most `UNANSWERED_BYTES` (kept to send a run again)."""
        nbytes = sum(getattr(a, "nbytes", 0) for a in arrays)
        self._read_unanswered(arrived=True)
        if len(self._unanswered) >= UNANSWERED or self._unanswered_bytes + nbytes > UNANSWERED_BYTES:
            self._read_unanswered()
        self._send(request, arrays, release)
        self._unanswered.append(sent)
        if sent is not None:
            sent.nbytes = nbytes
            self._unanswered_bytes += nbytes

    def _exchange(self, request: dict, arrays, release) -> tuple[dict, list[np.ndarray]]:
        """Sends one request and reads its reply (holding the lock), after the replies of releases sent
        before it. A connection that breaks or stays silent past the deadline is closed, and that is a
        ServiceError naming the service."""
        self._send(request, arrays, release)
        self._read_unanswered()
        reply, values = self._receive()
        if reply.get("ok") is not True:
            raise _raised(reply)
        return reply, values

    def _take_drops(self, release=()) -> tuple[list[int], list[str]]:
        """Takes what one request carries besides (holding the lock): the releases of `release` and of the
        dropped handles, and the names of the plans gone (`forget`), as many as take at most half the endpoint's
        header limit (a frame over it is refused); those left wait for the next request, or `_keep_alive`."""
        room = self.limits.max_header_bytes // 2 - sum(len(str(key)) + 1 for key in release)
        release = list(release)
        while self._dropped and len(str(self._dropped[0])) + 1 <= room:    # (finalizers only append meanwhile)
            room -= len(str(self._dropped[0])) + 1
            release.append(self._dropped.popleft())
        forget = []
        while self._forgotten and len(self._forgotten[0]) + 3 <= room:
            room -= len(self._forgotten[0]) + 3
            forget.append(self._forgotten.popleft())
        if self._dropped or self._forgotten:
            self._wake()
        return release, forget

    def _put_back(self, release: list[int], forget: list[str]) -> None:
        """Puts back what `_take_drops` took for a request that was not sent, for the next request, or
        `_keep_alive`, to carry."""
        self._dropped.extend(release)
        self._forgotten.extend(forget)
        if release or forget:
            self._wake()

    def _read_unanswered(self, arrived: bool = False) -> None:
        """Reads the replies of the requests sent without waiting (with `arrived`, those that came whole, waiting
        for none: read before each such request, they never fill the socket while this client sends, which
        left both ends waiting for good once 50-odd runs were refused, their replies unread): a release's only
        says it was taken; a run refused makes its handles raise its error, or, refused for a topology change,
        waits to be sent again (`_send_again`)."""
        while self._unanswered:
            if arrived:
                frame = self._arrived()
                if frame is None:
                    return
                reply = frame[0]
                if "progress" in reply:
                    continue
            else:
                reply, _ = self._receive()
            sent = self._unanswered.popleft()
            if sent is None:
                continue
            self._unanswered_bytes -= sent.nbytes
            if reply.get("ok") is not True:
                error = _raised(reply)
                if isinstance(error, TopologyChanged):
                    self._rerun.append(sent)
                else:
                    self._refuse(sent, error)

    def _arrived(self) -> tuple[dict, list[np.ndarray]] | None:
        """The next frame if it came whole (None if not), waiting for nothing."""
        try:
            return self._reader.recv_arrived(self.limits)
        except (OSError, EOFError, ProtocolError) as error:
            raise self._lost(error) from None

    def _refuse(self, sent: "SentRun", error: BaseException) -> None:
        """Makes the handles of a run sent without waiting raise `error` (a new one each time:
        `RemoteHandle._check`)."""
        for key in sent.request["keys"]:
            self._refused[key] = (type(error), str(error))

    def _send(self, request: dict, arrays, release=()) -> None:
        """Sends `request` (holding the lock), carrying the releases of the dropped handles and `release`, and
        the names of the plans gone (`_take_drops`). Those never make it fail: a frame over the endpoint's limits
        with them, refused before anything was sent, is sent without them, and they are put back for the next
        request, or `_keep_alive` (the service kept their objects until the connection closed); without them too,
        it raises why (ValueError). (An interrupt, Ctrl-C, before the frame is sent still loses them.)"""
        release, forget = self._take_drops(release)
        if not (release or forget):
            self._send_frame(request, arrays)
            return
        carrying = {**request, "release": release} if release else request
        try:
            self._send_frame({**carrying, "forget": forget} if forget else carrying, arrays)
            return
        except ValueError:
            self._put_back(release, forget)
        self._send_frame(request, arrays)     # (not while the first error is handled: it would chain to it)

    def _send_frame(self, header: dict, arrays) -> None:
        """Sends one frame; raises ValueError, having sent nothing, if it is over the endpoint's limits
        (`frame_parts`). A connection that breaks is closed, and that is a ServiceError naming the service."""
        self._last = time.monotonic()
        try:
            send_message(self._socket, header, arrays, self.limits, patient=True)
        except (OSError, ProtocolError) as error:
            raise self._lost(error) from None
        self.requests[str(header.get("op"))] += 1

    def _receive(self) -> tuple[dict, list[np.ndarray]]:
        """Reads the next reply, past the frames saying a run's plan still compiles (each awaited `timeout` s)."""
        try:
            while True:
                reply, values = self._reader.recv(self.limits)
                if "progress" not in reply:
                    return reply, values
        except TimeoutError:
            self._broken()   # a late reply would answer the next request
            raise ServiceError(f"no reply from the service at {self.name} in {self.timeout} s; "
                               "the connection is closed") from None
        except (OSError, EOFError, ProtocolError) as error:
            raise self._lost(error) from None

    def _lost(self, error: BaseException) -> ServiceError:
        """Closes a connection that broke (`error`); returns the ServiceError that says so."""
        self._broken()
        reason = "it closed the connection" if isinstance(error, EOFError) else \
            getattr(error, "strerror", None) or str(error)
        return ServiceError(f"lost the service at {self.name}: {reason}")

    def _broken(self) -> None:
        self.closed = True
        self._stop.set()
        self._wakeups.put(None)
        self._socket.close()


_CONNECTIONS: "weakref.WeakSet[RemoteClient]" = weakref.WeakSet()    # this process's connections


def _after_fork_in_child() -> None:
    """Marks every connection of the parent as not this child's (`RemoteClient._refuse_forked`, `close`): its
    requests raise in one line, where they went on the parent's socket, interleaved with the parent's, and its
    close at the child's exit (the default runtime's) ended the parent's connection."""
    for client in list(_CONNECTIONS):
        client._forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _connect(address, timeout: float | None) -> socket.socket:
    """Opens a socket to a Unix socket path or a TCP (host, port), connecting within 10 s."""
    if isinstance(address, str):
        deadline = time.monotonic() + 10
        while True:     # a full backlog refuses at once (EAGAIN) on a Unix socket: try again until the deadline
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.connect(address)
                return sock
            except BlockingIOError:
                sock.close()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the socket {address} accepted no connection in 10 s") from None
                time.sleep(0.01)
            except BaseException:
                sock.close()
                raise
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SentRun:
    """A run sent without waiting for its reply: its request (with the keys chosen for its results), the arrays
    it carries and how to lower its program again (`refresh`), kept until its reply is read."""

    __slots__ = ("request", "arrays", "refresh", "nbytes")

    def __init__(self, request: dict, arrays, refresh: Callable[[], ProgramPlan]):
        self.request, self.arrays, self.refresh, self.nbytes = request, arrays, refresh, 0


def _donated(plan: ProgramPlan, args) -> None:
    """The run of `plan` on `args` was taken: a remote handle passed for a donated input says it is deleted (the
    service donated its result, and refuses it from now on with a donated `Handle`'s error); a JAX array the
    plan writes a result into (`memory_plan.reuses`) is deleted, as `jax.jit` and the embedded runtime's launch,
    compiled with it donated, delete it."""
    donated = [(b, a) for b, a in zip(plan.inputs, args) if b in plan.donated]
    for _, arg in donated:
        if isinstance(arg, RemoteHandle):
            arg._donated = True
            arg._client._forget_ahead(arg._key)    # read, it asks the service, which raises as in-process
    arrays = [(b, a) for b, a in donated if type(a) is ARRAY_TYPE]
    if arrays:
        reused = {b for island in plan.islands for taken in reuses(plan, island).values() for b in taken}
        for buffer, array in arrays:
            if buffer in reused:
                array.delete()


def _raised(reply: dict) -> BaseException:
    """The error an error reply says, of its kind's class (`RAISED`)."""
    return RAISED.get(reply.get("kind"), RemoteError)(str(reply.get("error", "the endpoint sent a malformed reply")))


def _status(data: dict) -> Status:
    """A `Status` from its JSON form (client ids come back as numbers)."""
    return Status(data, clients={int(c): v for c, v in data["clients"].items()})
