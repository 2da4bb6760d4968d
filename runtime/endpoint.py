"""A local endpoint: clients in other processes share this process's cluster.

`Endpoint(runtime)` serves a runtime to other processes of this user that
hold its key. Every authenticated connection is one `Client` of the shared
runtime, so each remote process sees only its own objects, its runs go
through the runtime's gang scheduler, and everything it owns is released
when it disconnects, cleanly or not (a crashed process is an owner that
failed; a request waiting for a result notices within half a second).
`RemoteClient` (`runtime/remote_client.py`) is the other end.

Listening: on a Unix socket (`socket_path`) in a directory only its owner
can enter, so other users cannot connect at all; with `port`, also on TCP
127.0.0.1:`port` (0: any free port; `tcp_address`).

Bounds (`Limits`, `runtime/limits.py`; each an option): handshakes
(`runtime/authentication.py`) advance in the accept thread as their bytes
arrive, never blocking it; each has `handshake_timeout` seconds, at most
`max_pending_per_peer` are under way per peer (a process on the Unix
socket, a host on TCP) and `max_pending` in all, the oldest dropped first,
so a flood of silent connections cannot lock out a client that completes
its handshake. At most `max_connections` are served at once; the next is
told so, and if it is the service's owner's on the Unix socket, it may
still ask for the full status (`session.serve_status`), at most
`max_status_connections` such at once: the operator sees who holds the
connections exactly when they are all held. A served connection that
sends nothing for `idle_timeout` seconds is dropped (clients send
keepalives), and frames are bounded as `runtime/wire.py` says before
anything is allocated.

After the handshake, each connection is one `Session` (`runtime/session.py`),
which says the requests it answers.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import selectors
import shutil
import socket
import stat
import struct
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

from pathways_mlir.dialect.plan import ProgramPlan

from .authentication import AuthenticationError, ServerHandshake, read_key, write_private
from .client import Client
from .plan_check import check_plan
from .runtime import Runtime
from .session import Session, serve_status
from .shared import SharedRef
from .status import Status
from .limits import Limits
from .wire import send_message

HOST = "127.0.0.1"
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


@dataclass
class _Pending:
    """A connection whose handshake is under way, in the accept thread."""

    handshake: ServerHandshake
    peer: tuple
    uid: int | None
    deadline: float


class Endpoint:
    """Serves a runtime to other processes that hold its key (read from `key_path`): on a Unix socket
    (`socket_path`, default: in a new private directory) and, with `port`, on TCP 127.0.0.1 too."""

    def __init__(self, runtime: Runtime, socket_path: str | None = None, port: int | None = None,
                 key_path: str | None = None, limits: Limits = Limits()):
        self.runtime, self.limits = runtime, limits
        self._dir = None if socket_path and key_path else tempfile.mkdtemp(prefix="pw-endpoint-")   # mode 0700
        self.socket_path = str(socket_path or os.path.join(self._dir, "socket"))
        self.key_path = str(key_path or os.path.join(self._dir, "key"))
        self._listeners = [_unix_listener(self.socket_path)]
        if port is not None:
            try:
                self._listeners.append(socket.create_server((HOST, port), backlog=128))
            except BaseException:
                self._listeners[0].close()
                os.unlink(self.socket_path)
                if self._dir:
                    shutil.rmtree(self._dir, ignore_errors=True)
                raise
        for listener in self._listeners:
            listener.setblocking(False)               # the accept thread takes every waiting connection
        self.tcp_address = self._listeners[1].getsockname()[:2] if port is not None else None
        self.address = self.socket_path
        self._key = secrets.token_bytes(32)
        write_private(self.key_path, self._key.hex())
        self._wake, self._waker = socket.socketpair()
        self._lock = threading.Lock()
        self._large = threading.Lock()               # headers over 64 KiB are parsed one at a time
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._status_threads: set[threading.Thread] = set()   # the connections past the limit, for the status only
        self._closed = False
        # Plans by the SHA-256 of their JSON, shared by every connection, while a connection that loaded one
        # keeps it (weakly here: then the runtime forgets it too, `Runtime._forget_unused`).
        self._plans: weakref.WeakValueDictionary[str, ProgramPlan] = weakref.WeakValueDictionary()
        self._clients: set[int] = set()               # the client ids of the connections being served
        # Shared objects by their tokens, for every connection, each with how its owner reads it (`share`).
        self._shared: dict[str, tuple[SharedRef, dict]] = {}
        self._thread = threading.Thread(target=self._accept, name="pw-endpoint", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stops accepting, drops every connection (their objects are released), waits at most `timeout`
        seconds in all for the endpoint's threads, and deletes the socket and the key file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout
        self._waker.send(b"x")
        self._thread.join(timeout)
        with self._lock:
            connections, threads = list(self._connections), [*self._threads, *self._status_threads]
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # already gone
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for s in (*self._listeners, self._wake, self._waker):
            s.close()
        self._remove_files()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def plan(self, parsed: ProgramPlan) -> tuple[str, ProgramPlan, int]:
        """Returns a plan's name (the SHA-256 of its JSON), the plan and its JSON's bytes, checking each
        distinct plan once, so that every connection running the same program shares one loaded plan on the
        islands."""
        text = parsed.to_json().encode()
        name = hashlib.sha256(text).hexdigest()
        with self._lock:
            found = self._plans.get(name)
        if found is None:
            check_plan(parsed)                             # raises PlanError on executables it does not trust
            with self._lock:
                found = self._plans.setdefault(name, parsed)
        return name, found, len(text)

    def share(self, ref: SharedRef, value_type: dict) -> str:
        """Returns a new unguessable token naming the shared object `ref` for every connection, which reads it
        as `value_type` says its owner's front end does (`prng_impl`, `weak_type`: `frontend/wire.value_type`;
        the runtime holds its plain data)."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._shared[token] = ref, value_type
        return token

    def shared(self, token) -> SharedRef:
        """Returns the shared object a token names; raises PermissionError in one line if it names none (never
        made, or its owner released it or left)."""
        return self.typed_shared(token)[0]

    def typed_shared(self, token) -> tuple[SharedRef, dict]:
        """Returns the shared object a token names and its value type (see `share`); raises as `shared` does."""
        with self._lock:
            found = self._shared.get(token) if isinstance(token, str) else None
            if found is not None and found[0].released:
                del self._shared[token]
                found = None
        if found is None:
            raise PermissionError(f"no shared object has the reference {str(token)[:6]!r}...: a reference is "
                                  f"given by its owner (share) and lives while the owner keeps the object")
        return found

    def forget(self, tokens) -> None:
        """Forgets the tokens a connection made (it left: its objects are released)."""
        with self._lock:
            for token in tokens:
                self._shared.pop(token, None)

    def status(self, client: int | None = None) -> Status:
        """Returns the runtime's status with this endpoint's addresses and the clients it serves, or, for
        `client`, what that client may see: the queue, the islands and the reserved bytes, with its own
        runs and objects only."""
        with self._lock:
            clients = sorted(self._clients)
        status = self.runtime.status(client)
        where = f"unix:{self.socket_path}" + (f", {self.tcp_address[0]}:{self.tcp_address[1]}"
                                              if self.tcp_address else "")
        status["service"] = {"address": where, "connections": clients if client is None else [client]}
        return status

    def _remove_files(self) -> None:
        try:
            if read_key(self.key_path) == self._key:   # not a later endpoint's key at the same path
                os.unlink(self.key_path)
                if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                    os.unlink(self.socket_path)
        except (OSError, ValueError):
            pass   # gone, or a later endpoint's
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- accepting: handshakes in this thread, one thread per served connection ------------------

    def _accept(self) -> None:
        pending: dict[socket.socket, _Pending] = {}      # oldest first
        with selectors.DefaultSelector() as selector:
            for listener in self._listeners:
                selector.register(listener, selectors.EVENT_READ, "listen")
            selector.register(self._wake, selectors.EVENT_READ, "wake")
            try:
                while not self._closed:
                    first = next(iter(pending.values()), None)
                    timeout = None if first is None else max(0.0, first.deadline - time.monotonic())
                    for key, _ in selector.select(timeout):
                        if self._closed:
                            return
                        if key.data == "listen":
                            self._take(key.fileobj, pending, selector)
                        elif key.data == "handshake" and key.fileobj in pending:
                            self._advance(key.fileobj, pending, selector)
                    now = time.monotonic()
                    for connection in [c for c, p in pending.items() if p.deadline <= now]:
                        _drop(connection, pending, selector)
            finally:
                for connection in list(pending):
                    _drop(connection, pending, selector)

    def _take(self, listener: socket.socket, pending: dict, selector) -> None:
        """Accepts every connection waiting and starts their handshakes, dropping the oldest pending one of
        the same peer (or of all) past the limits."""
        for _ in range(self.limits.max_pending):     # then back to the handshakes under way
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return         # none left
            except OSError:
                time.sleep(0.01)   # the peer left before it was accepted, or no file descriptors are free
                return
            self._start_handshake(connection, pending, selector)

    def _start_handshake(self, connection: socket.socket, pending: dict, selector) -> None:
        try:
            peer, uid = _peer(connection)
        except OSError:
            connection.close()   # gone already
            return
        same = [c for c, p in pending.items() if p.peer == peer]
        if len(same) >= self.limits.max_pending_per_peer:
            _drop(same[0], pending, selector, busy=True)
        elif len(pending) >= self.limits.max_pending:
            _drop(next(iter(pending)), pending, selector, busy=True)
        handshake = ServerHandshake(connection, self._key)
        try:
            connection.setblocking(False)
            handshake.start()
        except OSError:
            connection.close()
            return
        pending[connection] = _Pending(handshake, peer, uid, time.monotonic() + self.limits.handshake_timeout)
        selector.register(connection, selectors.EVENT_READ, "handshake")

    def _advance(self, connection: socket.socket, pending: dict, selector) -> None:
        entry = pending[connection]
        try:
            done = entry.handshake.advance()
        except (AuthenticationError, EOFError, OSError):
            _drop(connection, pending, selector)      # a wrong key, a vanished or a broken peer: only this one
            return
        if done:
            selector.unregister(connection)
            del pending[connection]
            self._admit(connection, entry.uid)

    def _admit(self, connection: socket.socket, uid: int | None) -> None:
        """Serves an authenticated connection in its own thread, or tells it the endpoint is full: past
        `max_connections`, a connection of the service's owner on the Unix socket may still ask for the full
        status (at most `max_status_connections` such at once), so the operator sees who holds them all."""
        connection.setblocking(True)
        connection.settimeout(self.limits.idle_timeout)
        refusal = f"the service serves its limit of {self.limits.max_connections} connections; try later"
        with self._lock:
            full = len(self._threads) >= self.limits.max_connections
            status_only = full and uid == os.getuid() and \
                len(self._status_threads) < self.limits.max_status_connections
            served = (status_only or not full) and not self._closed
            if served:
                if status_only:
                    thread = threading.Thread(target=self._serve_status, args=(connection, refusal),
                                              name="pw-endpoint-status", daemon=True)
                    self._status_threads.add(thread)
                else:
                    thread = threading.Thread(target=self._serve, args=(connection, uid),
                                              name="pw-endpoint-connection", daemon=True)
                    self._threads.add(thread)
                self._connections.add(connection)
        if not served:
            try:
                send_message(connection, {"ok": False, "kind": "busy", "error": refusal})
            except OSError:
                pass   # gone already
            connection.close()
            return
        try:
            thread.start()
        except RuntimeError:
            with self._lock:
                self._connections.discard(connection)
                self._threads.discard(thread)
                self._status_threads.discard(thread)
            connection.close()

    def _serve(self, connection: socket.socket, uid: int | None) -> None:
        client = None
        try:
            if connection.family != socket.AF_UNIX:
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # a frame's parts go at once
            send_message(connection, {"ok": True, "limits": self.limits.to_python()})
            client = Client(self.runtime)
            with self._lock:
                self._clients.add(client.id)
            Session(self, client, connection, owner=uid == os.getuid()).serve()
        except Exception:  # noqa: BLE001  (a bad, silent or vanished peer ends only its own connection)
            pass
        finally:
            if client is not None:
                try:
                    client.close()   # its queued runs are cancelled and the remote process's objects released here
                except Exception:  # noqa: BLE001  (the runtime closed first: nothing is left to release)
                    pass
            connection.close()
            with self._lock:
                if client is not None:
                    self._clients.discard(client.id)
                self._connections.discard(connection)
                self._threads.discard(threading.current_thread())

    def _serve_status(self, connection: socket.socket, refusal: str) -> None:
        try:
            serve_status(self, connection, refusal)
        except Exception:  # noqa: BLE001  (a bad, silent or vanished peer ends only its own connection)
            pass
        finally:
            connection.close()
            with self._lock:
                self._connections.discard(connection)
                self._status_threads.discard(threading.current_thread())


def _unix_listener(path: str) -> socket.socket:
    """Listens on a Unix socket at `path` (mode 0600), replacing a socket left there by a dead endpoint."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def _peer(connection: socket.socket) -> tuple[tuple, int | None]:
    """Returns who is at the other end, for the pending limits (a process, or a host), and its uid (Unix
    socket only)."""
    if connection.family == socket.AF_UNIX:
        pid, uid, _ = _CREDENTIALS.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                _CREDENTIALS.size))
        return ("pid", pid), uid
    return ("host", connection.getpeername()[0]), None


def _drop(connection: socket.socket, pending: dict, selector, busy: bool = False) -> None:
    """Ends a pending handshake; `busy`: dropped for the limits on handshakes, which the client is told."""
    selector.unregister(connection)
    if busy:
        pending[connection].handshake.refuse()
    del pending[connection]
    connection.close()


