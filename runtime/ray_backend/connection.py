"""The driver's TCP connection to an island actor: start messages one way, requests and their replies both.

Opened when the runtime's islands are made (or an island's actor is
restored): the driver gives the actor a fresh key through Ray
(`IslandActor.open_connection`), connects to the address the actor answers
and proves it holds the key (`authentication.py`). Frames are the endpoint's
wire format (`wire.py`: a JSON header and raw array bytes, never pickle):

    driver -> actor  {"number": n, "work": ..., "releases": ..., "lends": ...}  start message n (`encode_start`)
                     {"request": i, "kind": "fetch", "run": r, "buffer": b,    a result's value and those of
                      "timeout": t, "siblings": [[r, b], ...], "value": true}  its siblings produced (false:
                                                                               only once it exists)
                     {"request": i, "kind": "wait_run", "run": r, "timeout": t}  once run r is over there
                     {"request": i, "kind": "runs_done", "runs": [...]}        which of these runs are over
    actor -> driver  {"taken": n}                                              start message n was taken
                     {"reply": i, ...} + arrays                                request i's answer (a run's
                                                                               end says what it failed with)
                     {"reply": i, "kind": k, "error": message}                 request i raised

TCP keeps each direction in order, so start messages reach the actor in
ticket order, and a request comes after the starts sent before it (no wait
for their acknowledgements). About 20 us of the driver's time per message,
against about 1 ms for a Ray actor call here, and a result comes back in
one hop, however large, with no object store between. Whoever waits for an
acknowledgement or a reply reads the frames that come, one reader at a
time, handing the others theirs.
"""

from __future__ import annotations

import collections
import itertools
import os
import select
import socket
import threading
import time
from typing import Callable, NamedTuple

import numpy as np

from ..authentication import client_handshake
from ..island_work import IslandWork, PeerRef, RunFailed, StoreRef, failure, raised
from ..limits import Limits
from ..wire import ERROR_KINDS, FrameReader, ProtocolError, frame_parts, reported
from .data_plane import Lend, Withdraw

CONNECT_TIMEOUT = 120.0  # seconds for an actor to answer where it listens (its JAX may still be starting)
REPLY_TIMEOUT = 120.0    # seconds an acknowledgement may take, or a frame's rest once its first byte came
POLL = 1.0               # seconds a reader waits for a frame before it looks at its deadline again
QUEUED = 64 << 20        # bytes a connection's writer may hold unsent before a send waits for it
# What one frame may carry: each end proved it holds the connection's key, so these bound only mistakes.
LIMITS = Limits(max_header_bytes=1 << 30, max_array_bytes=1 << 46, max_arrays=1 << 24)


class ConnectionBroken(ConnectionError):
    """The connection to an island actor broke (the actor died, or a frame broke the wire format)."""


class IslandConnection:
    """The driver's end of one island actor's connection (see the module)."""

    def __init__(self, sock: socket.socket, on_broken: Callable[[ConnectionBroken], object] = lambda error: None):
        if sock.gettimeout() is None:
            raise ValueError("an island connection's socket needs a timeout (its sends must not block)")
        self.sock = sock
        self.taken = -1                  # the last start message the actor acknowledged
        self._unacknowledged: collections.deque[tuple[int, float]] = collections.deque()  # (number, sent at)
        self._drained = 0.0              # when the writer last handed the socket all it held (`stalled`)
        self._reader = FrameReader(sock)
        self._state = threading.Condition()
        self._reading = False            # a waiter is reading frames for everyone
        self._replies: dict[int, tuple[dict, list]] = {}
        self._abandoned: set[int] = set()   # requests whose waiter gave up: their replies are dropped
        self._requests = itertools.count()
        self.broken: ConnectionBroken | None = None
        self._on_broken = on_broken      # told when the writer finds the connection broken
        self._outbox: collections.deque = collections.deque()   # bytes the writer sends, in order
        self._queued = 0                 # bytes in `_outbox`
        self._out = threading.Condition()
        self._writer: threading.Thread | None = None
        self._closed = False

    @staticmethod
    def open(actor, key: bytes,
             on_broken: Callable[[ConnectionBroken], object] = lambda error: None) -> "IslandConnection":
        """Connects to `actor`, which listens once asked (`IslandActor.open_connection`); raises Ray's error if
        the actor is dead, ConnectionError if its address cannot be reached or the handshake fails.
        `on_broken` is called (on the writer's thread) if a queued send finds the connection broken."""
        import ray

        host, port = ray.get(actor.open_connection.remote(key.hex()), timeout=CONNECT_TIMEOUT)
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        except OSError as error:
            raise ConnectionError(f"cannot reach the island actor at {host}:{port} ({error}): the driver must "
                                  f"reach each island actor's node over TCP, on a port its system picks") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(sock, key)
            sock.settimeout(REPLY_TIMEOUT)   # for the rest of a frame once it began, and for the writer's sends
        except BaseException:
            sock.close()
            raise
        return IslandConnection(sock, on_broken)

    def send(self, header: dict, arrays=()) -> None:
        """Sends one frame without waiting for the actor to read it (see the module): what the socket takes at
        once goes now, the rest is copied and left to the writer. Raises ConnectionBroken if the connection
        broke."""
        parts = frame_parts(header, arrays, LIMITS)
        with self._out:
            if self._queued > QUEUED and not self._out.wait_for(
                    lambda: self._queued <= QUEUED or self._closed or self.broken is not None, REPLY_TIMEOUT):
                raise self._broke(TimeoutError(f"the actor read nothing of {self._queued} bytes for "
                                               f"{REPLY_TIMEOUT:g} s"))
            if self._closed:           # (its descriptor may be another file's by now)
                raise self._broke(OSError("the connection was closed"))
            if self.broken is not None:
                raise raised(self.broken)
            if not self._outbox:
                parts = self._write_now(parts)
            if parts:
                copies = [bytes(part) for part in parts]
                self._outbox.extend(copies)
                self._queued += sum(map(len, copies))
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_queued, name="pw-island-writer", daemon=True)
                    self._writer.start()
                self._out.notify()

    def send_start(self, number: int, work: IslandWork | None, releases: list, lends: list) -> None:
        """Sends start message `number` (`encode_start`) as `send` does, and notes when: `stalled` tells how long
        the oldest one the actor has not acknowledged has waited."""
        self.send(*encode_start(number, work, releases, lends))
        with self._state:
            self._owed().append((number, time.monotonic()))

    def poll(self, whole: bool = False) -> None:
        """Reads the frames that have come whole, waiting for none, so that the actor's acknowledgements never
        fill the socket (a frame begun stays for a later reader: under the scheduler's lock, waiting for its rest
        held every client as long as the actor took to send it); with `whole`, a frame begun is read whole, as a
        waiter reads it (`_read`: at most `REPLY_TIMEOUT` for its rest). Nothing if another thread reads them
        now. Raises ConnectionBroken if the connection broke."""
        with self._state:
            if self._reading:
                return
            if self.broken is not None:
                raise raised(self.broken)
            self._reading = True
        try:
            while (frame := self._read(0.0) if whole else self._read_whole()) is not None:
                with self._state:
                    self._hand_out(*frame)
        finally:
            with self._state:
                self._reading = False
                self._state.notify_all()

    def stalled(self) -> float:
        """Reads the frames that have come (`poll`, a frame begun included); returns how many seconds the actor
        has owed an acknowledgement with nothing left to send it: since the oldest start it has not acknowledged
        was sent, or since the writer last handed the socket all it held, if later (0.0 if it owes none, or while
        the writer still holds bytes: their sends are bounded by the socket's timeout). A start's bytes take as
        long as they take to go: a large one read slowly is no stall."""
        self.poll(whole=True)
        if self._queued:
            return 0.0
        with self._state:
            owed = self._owed()
            return time.monotonic() - max(owed[0][1], self._drained) if owed else 0.0

    def _owed(self) -> collections.deque:
        """The starts the actor has not acknowledged, (number, sent at), the acknowledged ones forgotten. Under
        `_state`."""
        waiting = self._unacknowledged
        while waiting and waiting[0][0] <= self.taken:
            waiting.popleft()
        return waiting

    def _write_now(self, parts: list) -> list:
        """Writes what the socket takes of `parts` without waiting (its descriptor is non-blocking: the socket
        has a timeout); returns the parts left, the first maybe cut. Under `_out`, with nothing queued."""
        for i, part in enumerate(parts):
            view = memoryview(part).cast("B")
            while view:
                try:
                    view = view[os.write(self.sock.fileno(), view):]
                except BlockingIOError:
                    return [view, *parts[i + 1:]]
                except OSError as error:
                    raise self._broke(error) from None
        return []

    def _write_queued(self) -> None:
        """The writer: sends the queued bytes in order, each send bounded by the socket's timeout
        (`REPLY_TIMEOUT`); an actor that reads none of them by then is lost (`on_broken`), as one that
        acknowledges nothing is."""
        while True:
            with self._out:
                # (it looks every POLL seconds for a break a reader found: `_broke` takes no `_out`, which a
                # send holds while it may call it)
                while not (self._outbox or self._closed or self.broken is not None):
                    self._out.wait(POLL)
                if self._closed or self.broken is not None:
                    self._outbox.clear()
                    self._queued = 0
                    self._out.notify_all()
                    return
                head = self._outbox[0]
            try:
                sent = self.sock.send(head)
            except OSError as error:
                broken = self._broke(error)
                if not self._closed:
                    self._on_broken(broken)
                continue
            with self._out:
                if sent == len(head):
                    self._outbox.popleft()
                else:
                    self._outbox[0] = memoryview(head)[sent:]
                self._queued -= sent
                if not self._outbox:
                    self._drained = time.monotonic()
                self._out.notify_all()         # (a send waiting for room)

    def wait_taken(self, number: int, deadline: float | None = None) -> None:
        """Returns once the actor acknowledged start message `number` (at most `REPLY_TIMEOUT` seconds, and until
        `deadline`, a `time.monotonic()`, if sooner); TimeoutError past that."""
        limit = time.monotonic() + REPLY_TIMEOUT
        self._wait(lambda: self.taken >= number, limit if deadline is None else min(limit, deadline))

    def fetch(self, run_id: int, buffer: int, timeout: float | None, siblings: list[tuple[int, int]],
              value: bool = True, slack: float = 0.0):
        """Returns a result's value and those of its `siblings` ((run, buffer) pairs) the actor has ready
        ({(run, buffer): array}), as `IslandActor.fetch` does; with `value` False returns once it exists (None,
        {}). The actor waits `timeout` seconds for it (None: as long as it takes), the reply `slack` more."""
        header, arrays = self.request("fetch", {"run": run_id, "buffer": buffer, "timeout": timeout,
                                                "siblings": siblings, "value": value},
                                      None if timeout is None else timeout + slack)
        if not value:
            return None, {}
        try:
            named = [(_integer(run), _integer(other)) for run, other in header.get("siblings", [])]
        except (TypeError, ValueError) as error:
            raise self._broke(ProtocolError(f"a malformed answer: {type(error).__name__}: {error}")) from None
        if len(arrays) != len(named) + 1:
            raise self._broke(ProtocolError(f"a reply of {len(arrays)} arrays for {len(named)} siblings"))
        return arrays[0], dict(zip(named, arrays[1:]))

    def wait_run(self, run_id: int, timeout: float | None, slack: float = 0.0) -> RunFailed | None:
        """Returns once run `run_id`'s work is over on the actor (which waits `timeout` seconds, the reply
        `slack` more): the error the run failed with there, or None."""
        header, _ = self.request("wait_run", {"run": run_id, "timeout": timeout},
                                 None if timeout is None else timeout + slack)
        try:
            return _failure(header["failed"])
        except (KeyError, TypeError, ValueError) as error:
            raise self._broke(ProtocolError(f"a malformed answer: {type(error).__name__}: {error}")) from None

    def runs_done(self, run_ids: list[int], timeout: float) -> dict[int, tuple[float | None, RunFailed | None]]:
        """Returns which of `run_ids` are over on the actor: {run: (the device seconds it measured, or None;
        the error it failed with there, or None)}."""
        header, _ = self.request("runs_done", {"runs": run_ids}, timeout)
        try:
            return {_integer(run): (seconds if type(seconds) in (int, float) else None, _failure(failed))
                    for run, seconds, failed in header["done"]}
        except (KeyError, TypeError, ValueError) as error:
            raise self._broke(ProtocolError(f"a malformed answer: {type(error).__name__}: {error}")) from None

    def request(self, kind: str, fields: dict, timeout: float | None) -> tuple[dict, list]:
        """Sends request `kind` with `fields`; returns its reply's header and arrays once it comes (within
        `timeout` seconds, None: as long as it takes; TimeoutError past it). Raises what the island raised,
        rebuilt from its kind (`wire.ERROR_KINDS`; any other as RunFailed), or ConnectionBroken."""
        request = next(self._requests)
        self.send({"request": request, "kind": kind, **fields})
        try:
            header, arrays = self._wait(lambda: self._replies.pop(request, None),
                                        None if timeout is None else time.monotonic() + timeout)
        except TimeoutError:
            with self._state:
                if self._replies.pop(request, None) is None:
                    self._abandoned.add(request)
            raise
        if "error" in header:
            raise ERROR_KINDS.get(header.get("kind"), RunFailed)(str(header["error"]))
        return header, arrays

    def close(self) -> None:
        """Closes the connection (the actor stops reading it; what the writer holds is dropped); a waiter reading
        it raises ConnectionBroken at once (a host that died without closing its end, as a node killed hard,
        would leave it waiting)."""
        with self._out:
            self._closed = True
            self._out.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass                       # closed already, or never connected
        self.sock.close()

    def _wait(self, ready, deadline: float | None):
        """Returns `ready()`'s first true result, reading frames while none is (one reader at a time); raises
        TimeoutError past `deadline`, ConnectionBroken if the connection broke."""
        with self._state:
            while True:
                found = ready()
                if found:
                    return found
                if self.broken is not None:
                    raise raised(self.broken)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("an island actor did not answer in time")
                if not self._reading:
                    self._reading = True
                    break
                self._state.wait(left)
        try:
            while True:
                left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
                frame = self._read(max(left, 0.0))
                with self._state:
                    if frame is not None:
                        self._hand_out(*frame)
                    found = ready()
                    if found:
                        return found
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError("an island actor did not answer in time")
        finally:
            with self._state:
                self._reading = False
                self._state.notify_all()

    def _read_whole(self) -> tuple[dict, list] | None:
        """Reads one frame if it has come whole (None if not), waiting for nothing; raises ConnectionBroken."""
        try:
            return self._reader.recv_arrived(LIMITS)
        except (OSError, EOFError, ValueError) as error:     # (ProtocolError is a ValueError)
            raise self._broke(error) from None

    def _read(self, wait: float) -> tuple[dict, list] | None:
        """Reads one frame if one begins within `wait` seconds (None if not); raises ConnectionBroken."""
        try:
            if not self._reader.buffered and not select.select([self.sock], [], [], wait)[0]:
                return None
            return self._reader.recv(LIMITS, frame_timeout=REPLY_TIMEOUT)
        except (OSError, EOFError, ValueError) as error:     # (ProtocolError is a ValueError)
            raise self._broke(error) from None

    def _hand_out(self, header: dict, arrays: list) -> None:
        """Files one frame for its waiter (under `_state`)."""
        if "taken" in header:
            taken = header["taken"]
            if type(taken) is not int or taken <= self.taken:
                raise self._broke(ProtocolError(f"an acknowledgement out of order: {taken!r} after {self.taken}"))
            self.taken = taken
        elif type(header.get("reply")) is int:
            if header["reply"] in self._abandoned:
                self._abandoned.discard(header["reply"])
            else:
                self._replies[header["reply"]] = (header, arrays)
        else:
            raise self._broke(ProtocolError("a frame that is neither an acknowledgement nor a reply"))
        self._state.notify_all()

    def _broke(self, error: BaseException) -> ConnectionBroken:
        """Marks the connection broken by `error` (every waiter raises it from now on); returns a copy of it
        to raise (`raised`: each raise of the kept one would add the raiser's frames to it)."""
        with self._state:
            if self.broken is None:
                self.broken = ConnectionBroken(f"the connection to the island actor broke: {type(error).__name__}: "
                                               f"{(str(error).splitlines() or [''])[0]}")
                self._state.notify_all()
            return raised(self.broken)


def error_reply(request: int, error: BaseException) -> dict:
    """The reply of a request that raised `error`: its kind (`wire.ERROR_KINDS`, else "failed") and message."""
    kind, message = reported(error, "failed")
    return {"reply": request, "kind": kind, "error": message}


class Request(NamedTuple):
    """A request the actor read (`decode_request`): its id and kind, and the fields its kind has (the others
    at their defaults)."""

    request: int
    kind: str
    run: int = -1
    buffer: int = -1
    timeout: float | None = None
    siblings: tuple[tuple[int, int], ...] = ()
    value: bool = True
    runs: tuple[int, ...] = ()


def decode_request(header: dict) -> Request:
    """Reads a request (`IslandConnection.request`); raises ProtocolError if it is malformed."""
    try:
        request, kind = _integer(header["request"]), header["kind"]
        if kind == "runs_done":
            return Request(request, kind, runs=tuple(map(_integer, header["runs"])))
        timeout = header["timeout"]
        if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
            raise ValueError(f"timeout {timeout!r}")
        if kind == "wait_run":
            return Request(request, kind, run=_integer(header["run"]), timeout=timeout)
        if kind == "fetch":
            return Request(request, kind, _integer(header["run"]), _integer(header["buffer"]), timeout,
                           tuple((_integer(run), _integer(other)) for run, other in header["siblings"]),
                           bool(header["value"]))
        raise ValueError(f"unknown request kind {str(kind)[:40]!r}")
    except (KeyError, TypeError, ValueError) as error:
        raise ProtocolError(f"a malformed request: {type(error).__name__}: {error}") from None


def encode_start(number: int, work, releases: list, lends: list) -> tuple[dict, list]:
    """Returns the frame of start message `number` (`decode_start` reads it): its JSON header and its arrays
    (the work's host arguments, by position)."""
    arrays = []
    encoded = None
    if work is not None:
        inputs = []
        for buffer, value in work.inputs:
            if isinstance(value, StoreRef):
                inputs.append([buffer, "store", value.run_id, value.buffer])
            elif isinstance(value, PeerRef):
                inputs.append([buffer, "peer", *value])
            else:
                inputs.append([buffer, "array", len(arrays)])
                arrays.append(value)
        encoded = {"ticket": work.ticket, "run": work.run_id, "client": work.client_id, "plan": work.plan_key,
                   "steps": list(work.step_ids), "inputs": inputs, "last": work.last}
    return ({"number": number, "work": encoded, "releases": [list(pair) for pair in releases],
             "lends": [["withdraw", lend.peer] if isinstance(lend, Withdraw) else ["lend", *lend] for lend in lends]},
            arrays)


def decode_start(header: dict, arrays: list[np.ndarray]):
    """Reads a start message's frame (`encode_start`): (its number, the `IslandWork` or None, the releases,
    the lends); raises ProtocolError if it is malformed."""
    try:
        number = _integer(header["number"])
        encoded = header["work"]
        work = None
        if encoded is not None:
            inputs = []
            for item in encoded["inputs"]:
                buffer, kind = _integer(item[0]), item[1]
                if kind == "store":
                    inputs.append((buffer, StoreRef(_integer(item[2]), _integer(item[3]))))
                elif kind == "peer":
                    run_id, source, plan_key, island, dtype, mesh_shape, axes, sharding = item[2:]
                    inputs.append((buffer, PeerRef(_integer(run_id), _integer(source), _integer(plan_key),
                                                   str(island), str(dtype), tuple(map(_integer, mesh_shape)),
                                                   tuple(map(str, axes)),
                                                   tuple(tuple(map(str, dim)) for dim in sharding))))
                elif kind == "array":
                    inputs.append((buffer, arrays[_integer(item[2])]))
                else:
                    raise ValueError(f"unknown input kind {kind!r}")
            work = IslandWork(_integer(encoded["ticket"]), _integer(encoded["run"]), _integer(encoded["client"]),
                              _integer(encoded["plan"]), tuple(map(_integer, encoded["steps"])), tuple(inputs),
                              bool(encoded["last"]))
        releases = [(_integer(run_id), _integer(buffer)) for run_id, buffer in header["releases"]]
        lends = []
        for item in header["lends"]:
            if item[0] == "withdraw":
                lends.append(Withdraw(str(item[1])))
            elif item[0] == "lend":
                run_id, buffer, plan_key, reader, reader_buffer, peer, mesh_shape = item[1:]
                lends.append(Lend(_integer(run_id), _integer(buffer), _integer(plan_key), _integer(reader),
                                  _integer(reader_buffer), str(peer), tuple(map(_integer, mesh_shape))))
            else:
                raise ValueError(f"unknown lend kind {item[0]!r}")
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise ProtocolError(f"a malformed start message: {type(error).__name__}: {error}") from None
    return number, work, releases, lends


def _integer(value) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is not an integer")
    return value


def _failure(failed) -> RunFailed | None:
    """A run's failure as the actor sent it (null, or [kind, message]: `IslandActor._failed`), made again."""
    if failed is None:
        return None
    if type(failed) is not list or len(failed) != 2 or not all(type(part) is str for part in failed):
        raise TypeError(f"{str(failed)[:80]!r} is not a failure's kind and message")
    return failure(*failed)
