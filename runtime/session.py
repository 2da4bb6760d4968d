"""One served connection of an endpoint: the requests it answers for its client.

After the handshake the endpoint sends `{"ok": true, "limits": {...}}` (or
why it will not serve). Requests, one frame each:

- `load` {plan, executables}: a plan as `ProgramPlan.to_python` without its
  compiled functions, which come as the frame's arrays of bytes (uint8) in
  the order `executables` names them; the reply names it by the SHA-256 of
  its JSON (`ProgramPlan.to_json`), and every connection loading the same
  plan shares it. A plan is checked (`runtime/plan_check.py`) once;
- `run` {name, version, dispatch, args, keys, progress}: each argument `["array", i]` (the
  frame's i-th array), `["handle", k]` (one of this connection's
  results) or `["shared", token]` (a shared object, read-only); the reply
  has `handles`, `[key, shape, dtype]` per output, unless the request chose
  the keys. `keys`, if given, are the keys the
  client chose for the run's distinct results (`ProgramPlan.distinct_outputs`,
  in order; keys not in use), so that it may send the run without waiting
  for its reply (which then says nothing more than `ok`: 64 unread replies
  naming a step's hundreds of results filled the socket while the client,
  sending its next run, did not read them, and both ends waited for good): a
  run refused with them has its keys remembered
  (`REFUSED` per connection), and a request naming one is refused with the
  run's own error. A plan lowered
  for another topology `version` than the cluster's is refused
  (`TopologyChanged`), and the client lowers it again. The plan's first run
  compiles it, for as long as that takes: with `progress` (seconds, at least
  `MIN_PROGRESS`), the endpoint sends `{"ok": true, "progress": "compiling
  ..."}` that often until then, before the reply, so a client that bounds its
  wait for a frame knows the service is at work;
- `fetch` {handle, timeout, value}: waits for a result to be computed (at
  most `timeout` seconds, null: as long as it takes) and sends it unless
  `value` is false; with `token` instead of `handle`, a shared object's
  (any connection given its token may read it);
- `share` {handle, timeout, prng_impl, weak_type}: shares one of this
  connection's results once its run is over (waiting at most `timeout`
  seconds, default 60) (`runtime/shared.py`); the reply's `token` (256
  random bits) is the only way to name it, for any connection the owner
  gives it to. `prng_impl` (a typed PRNG key implementation's name, or
  null) and `weak_type` say how the owner's front end reads the result (its
  key data as keys; weakly typed), for readers to read it so. `shared`
  {token}: checks a token, replying with the object's shape and dtype,
  `prng_impl` and `weak_type` (as `share` does besides its token). An
  unknown token, or one whose object the owner released, is refused; a
  reader cannot release the object (only its own handles), and a token is
  forgotten when the owner releases its handle, or with its connection;
- `topology`: the cluster's topology (`Topology.to_json`) and its version;
- `status` {full}: the runtime's status as this connection may see it: the
  queue, the islands and the reserved bytes, with its own runs and objects
  only; `full: true`, every client's and the connections, is for the
  service's owner (its own user, on the Unix socket); either lists at most
  `status.LISTED` runs per list and counts them all, so it fits a header;
- `weight` {weight}: the connection's client's weight from now on (its
  share under the `share` policy; `pw.connect(weight=...)` sends it);
- `objects`: how many objects this connection owns; `ping`; `release`;
  `close` (answered at once; the connection's objects are released and its
  place among the endpoint's `max_connections` freed after it, once its runs
  under way are over or `Client.close`'s bound has passed).

Any request may carry `release`, a list of this connection's handles to
release before it is served (dropped handles travel this way), and
`forget`, names of plans it loaded that its client no longer holds (each
`load` of a name counts once; at most `max_plans` names, of `max_plan_bytes`
together, are held; a plan for islands or devices the cluster does not have
is refused at `load`, as `TopologyChanged`). A request
may carry only the fields its kind reads (`FIELDS`), and arrays only if it
is a `load` or a `run`; any other is refused before anything is done, and the
parsed request is dropped before its reply is sent, so a request keeps no
more of its header than it reads (parsed JSON is about 25x its bytes), and
none of it while its reply waits for the peer to read it. Every reply
is `{"ok": true, ...}` or `{"ok": false, "error": "...", "kind": "..."}`
(`runtime/wire.py`'s `ERROR_KINDS`: `timeout`, `topology`, `memory`, a run's failure, `value`, `type`,
`permission`; `busy`, or `error` for any other).
A request the endpoint cannot serve gets an error reply; a frame that breaks
the format gets one and the connection is dropped.

Past `max_connections`, a connection of the service's owner on its Unix
socket (at most `max_status_connections` such at once) gets the refusal
with `"status_only": true` and the limits, and stays open for
`{"op": "status", "full": true}`, `ping` and `close` only
(`serve_status`): `pw-serve --status` sees who holds the connections when
they are all held. Any other request gets the refusal and ends it.
"""

from __future__ import annotations

import base64
import collections
import itertools
import select
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan

from .client import Client
from .handles import Handle
from .resource_manager import TopologyChanged
from .wire import (MIN_PROGRESS, FrameReader, ProtocolError, Reported, check_dims, reported, send_message,
                   too_many_dims)

if TYPE_CHECKING:
    from .endpoint import Endpoint

# The fields each request kind reads, besides `op`, `release` and `forget`; any other field is refused.
FIELDS = {"load": {"plan", "executables"},
          "run": {"name", "version", "dispatch", "args", "timeout", "keys", "progress"},
          "fetch": {"handle", "token", "timeout", "value", "also"}, "release": set(), "cancel": {"handle"},
          "share": {"handle", "timeout", "prng_impl", "weak_type"}, "shared": {"token"}, "objects": set(),
          "topology": set(), "status": {"full"}, "ping": set(), "weight": {"weight"}}
_WITH_ARRAYS = {"load", "run"}      # the only requests that read a frame's arrays
# The only requests a connection past the endpoint's limit may send (`serve_status`), exactly these.
STATUS_ONLY = ({"op": "status", "full": True}, {"op": "ping"}, {"op": "close"})

_SHARE_WAIT = 60.0                  # seconds `share` waits for the result's run to be over
_PEER_CHECK = 0.5                   # seconds between checks that a client waiting for a result is still there
_READY_PAUSE = 1e-4                 # seconds of the first pause between looks at a result still being computed
_MAX_IMPL_NAME = 100                # characters of a PRNG implementation's name a `share` request may give
REFUSED = 4096                      # keys of refused runs a connection remembers (the oldest are forgotten)
MAX_KEY = 2 ** 53                   # client-chosen keys are below this (JSON numbers every client reads exactly)


class Session:
    """One authenticated connection: its client, the plans it loaded and its handles."""

    def __init__(self, endpoint: Endpoint, client: Client, connection: socket.socket, owner: bool):
        self.endpoint, self.client, self.connection, self.owner = endpoint, client, connection, owner
        self.reader = FrameReader(connection)
        self.plans: dict[str, ProgramPlan] = {}
        self.loads: dict[str, int] = {}          # plan name -> its loads not forgotten yet
        self.plan_bytes: dict[str, int] = {}     # plan name -> its JSON's bytes, compiled functions included
        self.handles: dict[int, Handle] = {}
        # client-chosen key of a refused run -> (its error's kind, its message), as `_handle` raises it again
        self.refused: collections.OrderedDict[int, tuple[str, str]] = collections.OrderedDict()
        self.tokens: dict[int, str] = {}         # handle key -> the token it is shared as (forgotten on release)
        self.ids = itertools.count()

    def serve(self) -> None:
        """Answers requests until the peer closes, sends a malformed frame, is idle too long or takes longer
        than the idle timeout to send the rest of a frame."""
        try:
            while True:
                try:
                    request, arrays = self.reader.recv(self.endpoint.limits, self.endpoint._large,
                                                       self.endpoint.limits.idle_timeout)
                except ProtocolError as error:
                    send_message(self.connection, {"ok": False, "error": str(error)})
                    return
                if request.get("op") == "close":
                    send_message(self.connection, {"ok": True})
                    return
                try:
                    op = self._check_fields(request, arrays)
                    self._release(request.pop("release", []))
                    self._forget(request.pop("forget", []))
                    reply, out = REQUESTS[op](self, request, arrays)
                    reply["ok"] = True
                except Exception as error:  # noqa: BLE001  (sent back to the remote client)
                    kind, message = reported(error, "error")
                    reply, out = {"ok": False, "error": message, "kind": kind}, []
                del request, arrays          # not kept while the reply waits for the peer to read it
                _send_reply(self.connection, reply, out, self.endpoint.limits)
        finally:
            self.endpoint.forget(list(self.tokens.values()))
            self.handles.clear()

    def load(self, request: dict, arrays) -> tuple[dict, list]:
        """Reads a plan (its compiled functions are the frame's arrays, in the order `executables` names
        them), checks it once per endpoint; replies with its name, the SHA-256 of its JSON. Its JSON is
        converted holding the endpoint's parsing lock and then dropped, as a large header is parsed."""
        _field(request, "plan", dict)
        names = _field(request, "executables", list)
        if len(names) != len(arrays) or not all(isinstance(n, str) for n in names) \
                or any(a.dtype != np.uint8 or a.ndim != 1 for a in arrays):
            raise ValueError("request 'load' needs one array of bytes (uint8) per name in 'executables'")
        executables = {n: base64.b64encode(a.tobytes()).decode("ascii") for n, a in zip(names, arrays)}
        with self.endpoint._large:          # the plan's JSON is referenced only here, and gone once converted
            plan = ProgramPlan.from_python({**request.pop("plan"), "executables": executables})
        name, plan, size = self.endpoint.plan(plan)
        if name not in self.plans:
            self._check_room(plan, size)
        self.plans[name] = plan
        self.plan_bytes[name] = size
        self.loads[name] = self.loads.get(name, 0) + 1
        return {"name": name}, []

    def _check_room(self, plan: ProgramPlan, size: int) -> None:
        """Raises in one line if this connection may not hold one more plan, of `size` bytes (the endpoint's
        `max_plans` and `max_plan_bytes`), or if `plan` uses islands or devices the cluster does not have
        (`TopologyChanged`: the client lowers it again), so a plan that could never run is not kept."""
        limits = self.endpoint.limits
        if len(self.plans) >= limits.max_plans:
            raise ValueError(f"this connection holds {len(self.plans)} plans, the endpoint's limit (max_plans): "
                             f"a plan is forgotten once its client no longer holds the program that made it")
        held = sum(self.plan_bytes.values())
        if held + size > limits.max_plan_bytes:
            raise ValueError(f"this connection holds plans of {held} bytes, and this one of {size} bytes would pass "
                             f"the endpoint's limit of {limits.max_plan_bytes} (max_plan_bytes): a plan is "
                             f"forgotten once its client no longer holds the program that made it")
        self.client.runtime.check_fits(plan)

    def run(self, request: dict, arrays) -> tuple[dict, list]:
        """Runs a plan this connection loaded, lowered for topology `version`, on `args` (each `["array", i]`,
        the frame's i-th array, `["handle", k]`, one of its handles, or `["shared", token]`, a shared object);
        replies with one handle per output, under the client's `keys` if it chose them (a run refused with them
        has them remembered as refused, with its error)."""
        keys = self._chosen_keys(request.get("keys"))
        try:
            return self._run(request, arrays, keys)
        except Exception as error:
            if keys:
                refused = reported(error, "error")
                for key in keys:        # (its own line: the one the call would have raised in-process)
                    self.refused[key] = refused
                while len(self.refused) > REFUSED:
                    self.refused.popitem(last=False)
            raise

    def _chosen_keys(self, keys) -> list[int] | None:
        """The keys a `run` request chose for its results (None if it chose none): distinct integers in
        [0, MAX_KEY) that name no handle of this connection; ValueError otherwise. A refused run's keys may be
        chosen again (the client sends the run again)."""
        if keys is None:
            return None
        if not (isinstance(keys, list) and all(type(k) is int and 0 <= k < MAX_KEY for k in keys)
                and len(set(keys)) == len(keys)):
            raise ValueError(f"request 'run' needs 'keys' as distinct integers in [0, 2**53), not {str(keys)[:80]}")
        used = next((k for k in keys if k in self.handles), None)
        if used is not None:
            raise ValueError(f"request 'run' chose key {used}, which names a handle of this connection already")
        for key in keys:
            self.refused.pop(key, None)
        return keys

    def _run(self, request: dict, arrays, keys: list[int] | None) -> tuple[dict, list]:
        name = _field(request, "name", str)
        if name not in self.plans:
            raise ValueError(f"no plan is loaded as {name[:40]!r}")
        version, current = _field(request, "version", int), self.client.runtime.resources.version
        if version != current:
            raise TopologyChanged(f"the plan was lowered for topology version {version}; the cluster's is "
                                  f"{current}")
        args = []
        for arg in _field(request, "args", list):
            if not (isinstance(arg, list) and len(arg) == 2 and
                    ((arg[0] in ("array", "handle") and type(arg[1]) is int) or
                     (arg[0] == "shared" and isinstance(arg[1], str)))):
                raise ValueError(f"an argument must be [\"array\", index], [\"handle\", key] or "
                                 f"[\"shared\", token], not {str(arg)[:80]}")
            if arg[0] == "shared":
                args.append(self.endpoint.shared(arg[1]))
            elif arg[0] == "handle":
                args.append(self._handle(arg[1]))
            elif 0 <= arg[1] < len(arrays):
                args.append(arrays[arg[1]])
            else:
                raise ValueError(f"argument array {arg[1]} is not in the request's {len(arrays)} arrays")
        plan = self.plans[name]
        held, limit = len(self.handles), self.endpoint.limits.max_objects
        if held + len(plan.distinct_outputs) > limit:
            raise ValueError(f"this connection holds {held} results; a run of @{plan.program[:80]} would make it "
                             f"hold {held + len(plan.distinct_outputs)}, over the endpoint's limit (max_objects) of "
                             f"{limit}: release results (handle.delete())")
        if keys is not None and len(keys) != len(plan.distinct_outputs):
            raise ValueError(f"request 'run' chose {len(keys)} keys for a plan of {len(plan.distinct_outputs)} "
                             f"distinct results")
        dispatch, progress = _field(request, "dispatch", str), _seconds(request, "progress", MIN_PROGRESS)
        if progress is not None and not self.client.runtime.is_loaded(plan):
            self._compile(plan, progress)
        results = self.client.run(plan, args, dispatch, request.get("timeout"), inline=not self._run_ahead())
        chosen = iter(keys) if keys is not None else None
        reply, made = [], {}
        for handle in results:
            key = made.get(id(handle))
            if key is None:                     # (an output returned twice is one handle: one key, `Client.handles`)
                key = made[id(handle)] = next(chosen) if chosen is not None else self._new_key()
                self.handles[key] = handle
            reply.append([key, list(handle.shape), np.dtype(handle.dtype).name])
        return ({} if keys is not None else {"handles": reply}), []     # (the client made its handles: module)

    def _compile(self, plan: ProgramPlan, every: float) -> None:
        """Loads `plan` on the islands, which compiles its executables, sending the client a progress frame
        `every` seconds until it is done: a client bounds its wait for each frame, and a compile longer than
        that made it give the connection up, its objects with it."""
        done = threading.Event()

        def tell() -> None:
            frame = {"ok": True, "progress": f"compiling @{plan.program[:80]}"}
            try:
                while not done.wait(every):
                    send_message(self.connection, frame)
            except OSError:
                return              # the client left: the session's next read finds it

        teller = threading.Thread(target=tell, name="pw-session-progress", daemon=True)
        teller.start()
        try:
            self.client.runtime.load(plan)
        finally:
            done.set()
            teller.join()        # no progress frame after the reply

    def _run_ahead(self) -> bool:
        """Whether the client's next request, read ahead already, is another run (runs sent without waiting for
        their replies): the run before it is then launched by its islands' executors while this thread serves
        the next (8 runs in flight through `pw-serve`: 1.18x quiet, 1.03-1.06x busy). Otherwise this thread
        launches it itself (an idle island's work, `Client.start`): the next request, a fetch of its result say,
        would wait for two handoffs between threads. Read from the header's bytes (a client's JSON has no
        spaces); a guess either way costs only time."""
        return b'"op":"run"' in self.reader.header_ahead()

    def _new_key(self) -> int:
        """A key no handle or refused run of this connection has (for a run whose client chose none)."""
        key = next(self.ids)
        while key in self.handles or key in self.refused:
            key = next(self.ids)
        return key

    def share(self, request: dict, arrays) -> tuple[dict, list]:
        """Shares one of this connection's results once its run is over, waiting at most `timeout` seconds
        (default and null: `_SHARE_WAIT`; TimeoutError past it, and the client asks again); replies with its
        token (see `Endpoint.share`), made once per result (each kept till the result is released), and what
        `shared` replies. Readers read it as `prng_impl` and `weak_type` say (as the first share gave them)."""
        key = _field(request, "handle", int)
        timeout = _seconds(request, "timeout")
        value_type = _value_type(request)
        handle = self._handle(key)
        token = self.tokens.get(key)
        if token is None:
            ref = self.client.share(handle, timeout=_SHARE_WAIT if timeout is None else timeout)
            token = self.tokens[key] = self.endpoint.share(ref, value_type)
        return {"token": token, **self._described(token)}, []

    def shared(self, request: dict, arrays) -> tuple[dict, list]:
        """Checks a shared object's token; replies with its data's shape and dtype, and how its owner reads
        them (`prng_impl`, `weak_type`)."""
        return self._described(_field(request, "token", str)), []

    def _described(self, token: str) -> dict:
        """The shape, dtype and value type of the shared object `token` names (see `Endpoint.typed_shared`)."""
        ref, value_type = self.endpoint.typed_shared(token)
        return {"shape": list(ref.shape), "dtype": np.dtype(ref.dtype).name, **value_type}

    def cancel(self, request: dict, arrays) -> tuple[dict, list]:
        """Cancels the run of one of this connection's handles (see `Client.cancel`)."""
        return {"cancelled": self.client.cancel(self._handle(_field(request, "handle", int)))}, []

    def fetch(self, request: dict, arrays) -> tuple[dict, list]:
        """Waits (at most `timeout` seconds, none: as long as it takes) until a handle's value exists and is
        computed (`_computed`: reading an array JAX handed out early would wait for its device work unbounded);
        sends it unless `value` is false; with `token` instead of `handle`, a shared object's (`shared`). Gives
        up if the peer leaves meanwhile. With `also` (this connection's handle keys, sent with the value), the
        values of those already computed come back too, their keys in the reply's `also` (`_also`)."""
        if "token" in request:
            if "handle" in request:
                raise ValueError("request 'fetch' names a handle or a shared object's token, not both")
            if "also" in request:
                raise ValueError("request 'fetch' of a shared object's token takes no 'also'")
            handle = self.endpoint.shared(_field(request, "token", str))
        else:
            handle = self._handle(_field(request, "handle", int))
        send = request.get("value", True)
        if type(send) is not bool:
            raise ValueError(f"request 'fetch' needs 'value' as bool, not {str(send)[:40]}")
        also = self._also_handles(request["also"], send) if "also" in request else {}
        timeout = _seconds(request, "timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        value = None
        while True:
            wait = _PEER_CHECK if deadline is None else min(_PEER_CHECK, max(0.0, deadline - time.monotonic()))
            until = time.monotonic() + wait
            try:
                if value is None:
                    value = handle.result(wait)
                if _computed(value, until):
                    break
            except TimeoutError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the result was not ready within {timeout} s")
            if _peer_left(self.connection):
                raise EOFError("the client left while waiting for a result")
        if not send:
            return {}, []
        check_dims(value, "the result")          # (an error reply, not a frame its client drops)
        if not also:
            return {}, [np.asarray(value)]
        value = np.asarray(value)
        keys, values = _also(also, self.endpoint.limits.max_array_bytes - value.nbytes)
        return ({"also": keys} if keys else {}), [value, *values]

    def _also_handles(self, keys, send: bool) -> dict[int, Handle]:
        """The handles of a fetch's `also` keys (see `fetch`), each announced for reading (`copy_to_host_async`: an
        island in another process brings them back with the fetched value); a key of no handle here (released
        since) is left out. ValueError in one line if `also` is not a list of keys that fit a reply's frame."""
        most = self.endpoint.limits.max_arrays
        if type(keys) is not list or len(keys) >= most or not all(type(key) is int for key in keys) or \
                (keys and not send):
            raise ValueError(f"request 'fetch' needs 'also' as a list of fewer than {most} handle keys, with "
                             f"'value' true")
        handles = {key: self.handles[key] for key in keys if key in self.handles}
        for handle in handles.values():
            handle.copy_to_host_async()
        return handles

    def release(self, request: dict, arrays) -> tuple[dict, list]:
        """Nothing more (also `ping`): every request releases the handles listed in its `release` field
        first, and any request shows the connection is not idle."""
        return {}, []

    def weight(self, request: dict, arrays) -> tuple[dict, list]:
        """Sets this connection's client's weight (`Client.set_weight`: its share under the `share` policy) for
        its runs from now on."""
        self.client.set_weight(request.get("weight"))
        return {}, []

    def objects(self, request: dict, arrays) -> tuple[dict, list]:
        """Counts the objects this connection's client owns."""
        return {"count": len(self.client.objects())}, []

    def topology(self, request: dict, arrays) -> tuple[dict, list]:
        """Sends the cluster's topology (JSON) and its version, for clients that lower programs themselves."""
        version, topology = self.client.runtime.resources.snapshot()
        return {"topology": topology.to_json(), "version": version}, []

    def status(self, request: dict, arrays) -> tuple[dict, list]:
        """Sends the service's status as this connection may see it (`Endpoint.status`); the full report
        (`full: true`) only to the service's owner, on its Unix socket."""
        full = request.get("full", False)
        if type(full) is not bool:
            raise ValueError(f"request 'status' needs 'full' as bool, not {str(full)[:40]}")
        if not full:
            return {"status": self.endpoint.status(self.client.id)}, []
        if not self.owner:
            raise PermissionError("the full status is for the service's owner, on its Unix socket")
        return {"status": self.endpoint.status()}, []

    def _check_fields(self, request: dict, arrays) -> str:
        """Returns the request's kind; refuses an unknown one, a field its kind does not read, and arrays
        sent with a request that reads none (see `FIELDS`)."""
        op = request.get("op")
        fields = FIELDS.get(op) if isinstance(op, str) else None
        if fields is None:
            raise ValueError(f"unknown request {str(op)[:40]!r}")
        extra = sorted(k for k in request if k not in fields and k not in ("op", "release", "forget"))
        if extra:
            raise ValueError(f"request {op!r} has no field {extra[0][:40]!r}: it takes "
                             + (", ".join(sorted(fields)) or "none") + " (and release, forget)")
        if arrays and op not in _WITH_ARRAYS:
            raise ValueError(f"request {op!r} takes no arrays, not {len(arrays)}")
        return op

    def _release(self, keys) -> None:
        if not isinstance(keys, list) or not all(type(k) is int for k in keys):
            raise ValueError("'release' must be a list of handle keys")
        for key in keys:
            self.refused.pop(key, None)
            handle = self.handles.pop(key, None)     # a key released twice, or never made, is ignored
            if handle is not None:
                handle.delete()
                token = self.tokens.pop(key, None)
                if token is not None:
                    self.endpoint.forget((token,))       # its shared object is released with it

    def _forget(self, names) -> None:
        """Counts one load of each of `names` forgotten; a plan none of whose loads is left goes (its runs in
        flight hold it until they are over). A name not loaded here is ignored, as a key released twice."""
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("'forget' must be a list of plan names")
        for name in names:
            left = self.loads.get(name, 0) - 1
            if left > 0:
                self.loads[name] = left
            elif left == 0:
                del self.loads[name], self.plans[name], self.plan_bytes[name]

    def _handle(self, key: int) -> Handle:
        if key not in self.handles:
            if key in self.refused:
                raise Reported(*self.refused[key])
            if not 0 <= key < MAX_KEY:           # (not echoed: it may have thousands of digits)
                raise ValueError("no handle: a handle's key is an integer from 0 to 2**53 - 1")
            raise ValueError(f"no handle {key}")
        return self.handles[key]


# What answers each request: the class's functions, not the session's bound methods, which the session would
# hold in a cycle, keeping its plans and their executables after its client left until a cyclic collection ran
# (never, in an idle service).
REQUESTS = {"load": Session.load, "run": Session.run, "fetch": Session.fetch, "release": Session.release,
            "cancel": Session.cancel, "share": Session.share, "shared": Session.shared, "objects": Session.objects,
            "topology": Session.topology, "status": Session.status, "ping": Session.release,
            "weight": Session.weight}


def serve_status(endpoint: Endpoint, connection: socket.socket, refusal: str) -> None:
    """Serves a connection of the service's owner past the endpoint's `max_connections`: tells it `refusal`
    in a welcome saying it may still ask for the full status (`status_only`), then answers the requests of
    `STATUS_ONLY` until the peer closes, is idle too long or sends any other, which gets `refusal` and ends it.
    It holds no client: the report lists the connections that hold the endpoint's places, not this one."""
    limits = endpoint.limits
    send_message(connection, {"ok": False, "kind": "busy", "error": refusal, "status_only": True,
                              "limits": limits.to_python()})
    reader = FrameReader(connection)
    while True:
        try:
            request, arrays = reader.recv(limits, endpoint._large, limits.idle_timeout)
        except ProtocolError as error:
            send_message(connection, {"ok": False, "error": str(error)})
            return
        if arrays or request not in STATUS_ONLY:
            send_message(connection, {"ok": False, "kind": "busy",
                                      "error": f"{refusal}: this connection may ask for the full status only"})
            return
        op = request["op"]
        _send_reply(connection, {"ok": True, "status": endpoint.status()} if op == "status" else {"ok": True}, (),
                    limits)
        if op == "close":
            return


def _computed(value, until: float) -> bool:
    """Returns whether `value` (a result's array, which JAX may hand out before its device work is over) is
    computed, waiting for it until `until` (a monotonic time) at most: reading it (`np.asarray`) would wait
    for its computation however long that takes, and the client's wait is bounded by its deadline."""
    ready = getattr(value, "is_ready", None)
    pause = _READY_PAUSE
    while ready is not None and not ready():
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(2 * pause, 0.05)
    return True


def _send_reply(connection: socket.socket, reply: dict, arrays, limits) -> None:
    """Sends a request's reply, or, if it is over the endpoint's `limits` (found before a byte was sent), an
    error saying so."""
    try:
        send_message(connection, reply, arrays, limits)
    except ValueError as error:
        send_message(connection, {"ok": False, "error": f"the reply cannot be sent: {error}", "kind": "error"})


def _also(handles: dict[int, Handle], room: int) -> tuple[list[int], list[np.ndarray]]:
    """The keys and values of those `handles` whose values are computed already, within `room` bytes in all; the
    others are left out (each is fetched on its own when read: one not ready, of a failed run, or of a rank no
    frame carries, waits or raises there)."""
    keys, values = [], []
    for key, handle in handles.items():
        try:
            value = handle.result(0)
        except Exception:  # noqa: BLE001  (not produced yet, failed, released: read on its own)
            continue
        if value.nbytes <= room and too_many_dims(value) is None and _computed(value, 0.0):
            keys.append(key)
            values.append(np.asarray(value))
            room -= value.nbytes
    return keys, values


def _peer_left(connection: socket.socket) -> bool:
    """Returns whether the peer has closed its end (it sends nothing while it waits for a reply)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _seconds(request: dict, name: str, least: float = 0.0) -> float | None:
    """A request's field `name` in seconds: a finite number of at least `least`, or null (also when absent)."""
    value = request.get(name)
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                              or not least <= value <= sys.float_info.max):   # NaN, inf, ints past a float
        bound = "a non-negative number" if least == 0 else f"a number of seconds of at least {least}"
        raise ValueError(f"request {str(request.get('op'))[:40]!r} needs {name!r} as {bound} or null, not "
                         f"{value!r:.40}")
    return value


def _value_type(request: dict) -> dict:
    """How a `share` request's owner reads its result: `prng_impl`, the name of a typed PRNG key implementation
    (of at most `_MAX_IMPL_NAME` characters) or null (also when absent), and `weak_type`, a bool (false when
    absent); ValueError in one line for anything else."""
    impl, weak = request.get("prng_impl"), request.get("weak_type", False)
    if impl is not None and not (isinstance(impl, str) and 0 < len(impl) <= _MAX_IMPL_NAME):
        raise ValueError(f"request 'share' needs 'prng_impl' as a name of at most {_MAX_IMPL_NAME} characters or "
                         f"null, not {impl!r:.40}")
    if not isinstance(weak, bool):
        raise ValueError(f"request 'share' needs 'weak_type' as a bool, not {weak!r:.40}")
    return {"prng_impl": impl, "weak_type": weak}


def _field(request: dict, name: str, kind: type):
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"request {str(request.get('op'))[:40]!r} needs {name!r} as {kind.__name__}")
    return value
