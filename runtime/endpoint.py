"""A local endpoint: clients in other processes share this process's cluster.

`Endpoint(runtime)` listens on 127.0.0.1; every authenticated connection is
one `Client` of the shared runtime, so each remote process sees only its own
objects, its runs go through the runtime's gang scheduler, and everything it
owns is released when it disconnects, cleanly or not (a crashed process is
an owner that failed; a request waiting for a result notices within
half a second). `RemoteClient` is the other end: it sends plans (as JSON)
and host arrays, and gets back `RemoteHandle`s that fetch their values on
demand and are released when dropped. To the front end a `RemoteClient` is
also a runtime: programs are lowered in the client's process for the
endpoint's topology and run there (`pw.connect`, `runtime/service.py`).

Authentication: each endpoint draws a random key and writes it, as hex, to a
file only its owner can read (`Endpoint.key_path`). A client proves it holds
the key, and the endpoint proves it back, by HMAC-SHA256 over fresh nonces
from both sides; the key never crosses the socket. Each connection does its
handshake in its own thread within `handshake_timeout` seconds; a wrong key,
a silent peer or garbage only drops that connection.

Wire format, no pickle: every message is one frame,

    u32 header length (big-endian) | JSON object | raw bytes of each array

where the header's "arrays" lists `[dtype, shape]` per array. Dtypes are
numeric only (`DTYPES`), in this machine's byte order (both ends share it),
and sizes are checked against `MAX_HEADER_BYTES` and `MAX_ARRAY_BYTES` before
anything is allocated. Requests:

- `load` {plan}: a plan as `ProgramPlan.to_json`; the reply names it by the
  SHA-256 of its JSON, and every connection loading the same plan shares it;
- `run` {name, version, dispatch, args}: each argument `["array", i]` (the
  frame's i-th array) or `["handle", k]` (one of this connection's
  results); the reply has `[key, shape, dtype]` per output. A plan lowered
  for another topology `version` than the cluster's is refused
  (`TopologyChanged`), and the client lowers it again;
- `fetch` {handle, timeout, value}: waits for a result (at most `timeout`
  seconds, null: as long as it takes) and sends it unless `value` is false;
- `topology`: the cluster's topology (`Topology.to_json`) and its version;
- `status`: `Endpoint.status()`, the runtime's status with the service's
  address and the clients connected;
- `objects`: how many objects this connection owns; `release`; `close`.

Any request may carry `release`, a list of this connection's handles to
release before it is served (dropped handles travel this way). Every reply
is `{"ok": true, ...}` or `{"ok": false, "error": "...", "kind": "..."}`
(`timeout`, `topology` or `error`).
A request the endpoint cannot serve gets an error reply; a frame that breaks
the format gets one and the connection is dropped.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import itertools
import json
import math
import os
import secrets
import select
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time
import weakref

import jax.numpy as jnp
import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .client import Client
from .handles import Handle
from .island import RunFailed
from .plan_check import check_plan
from .resource_manager import TopologyChanged
from .runtime import Runtime, release_default
from .status import Status

HOST = "127.0.0.1"
HANDSHAKE_TIMEOUT = 10.0            # seconds a connection has to prove it holds the key
MAX_HEADER_BYTES = 256 << 20        # a plan carries its compiled functions
MAX_ARRAY_BYTES = 4 << 30           # all the arrays of one message together
MAX_DIMS = 32
MAX_PENDING_HANDSHAKES = 256        # connections past this are dropped unread
_PEER_CHECK = 0.5                   # seconds between checks that a client waiting for a result is still there
DTYPES = {name: np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}
DTYPES["bfloat16"] = np.dtype(jnp.bfloat16)

_MAGIC = b"PWE1"
_NONCE = 32
_LENGTH = struct.Struct(">I")


class ProtocolError(ValueError):
    """A frame that breaks the wire format; the connection is dropped."""


class AuthenticationError(ConnectionError):
    """One end of a connection does not hold the endpoint's key."""


class RemoteError(RuntimeError):
    """An error the endpoint reported for a request."""


# -- frames -----------------------------------------------------------------


def send_message(sock: socket.socket, header: dict, arrays=()) -> None:
    """Sends one frame: `header` as JSON, then the raw bytes of `arrays` (numeric dtypes only)."""
    arrays = [_wire_array(a) for a in arrays]
    total = sum(a.nbytes for a in arrays)
    if total > MAX_ARRAY_BYTES:
        raise ValueError(f"arrays of {total} bytes are over the endpoint's limit of {MAX_ARRAY_BYTES}")
    data = json.dumps({**header, "arrays": [[a.dtype.name, list(a.shape)] for a in arrays]},
                      separators=(",", ":")).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise ValueError(f"a header of {len(data)} bytes is over the endpoint's limit of {MAX_HEADER_BYTES}")
    sock.sendall(_LENGTH.pack(len(data)) + data)
    for a in arrays:
        sock.sendall(a.reshape(-1).view(np.uint8))


def recv_message(sock: socket.socket) -> tuple[dict, list[np.ndarray]]:
    """Receives one frame; raises ProtocolError if it is malformed, EOFError if the peer left."""
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if size > MAX_HEADER_BYTES:
        raise ProtocolError(f"a header of {size} bytes is over the limit of {MAX_HEADER_BYTES}")
    try:
        header = json.loads(_recv_exact(sock, size))
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"the header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise ProtocolError("the header is not a JSON object")
    arrays = []
    for dtype, shape, nbytes in _array_specs(header.pop("arrays", [])):
        data = np.empty(nbytes, np.uint8)    # pages are committed as the bytes arrive
        _recv_into(sock, memoryview(data))
        arrays.append(data.view(dtype).reshape(shape))
    return header, arrays


def _wire_array(value) -> np.ndarray:
    array = np.asarray(value)
    dtype = DTYPES.get(array.dtype.name)
    if dtype is None:
        raise ValueError(f"arrays of dtype {array.dtype} cannot be sent: only {', '.join(DTYPES)}")
    return array.astype(dtype, order="C", copy=False)


def _array_specs(specs) -> list[tuple[np.dtype, tuple[int, ...], int]]:
    """Checks a header's array list against the allow-list and the size limit."""
    if not isinstance(specs, list):
        raise ProtocolError("'arrays' must be a list of [dtype, shape]")
    out, total = [], 0
    for spec in specs:
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], list)):
            raise ProtocolError(f"an array must be described as [dtype, shape], not {str(spec)[:80]}")
        name, shape = spec
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ProtocolError(f"dtype {str(name)[:40]!r} is not allowed: only {', '.join(DTYPES)}")
        if len(shape) > MAX_DIMS or not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"a shape must be at most {MAX_DIMS} non-negative integers, not {str(shape)[:80]}")
        nbytes = math.prod(shape) * dtype.itemsize
        total += nbytes
        if total > MAX_ARRAY_BYTES:
            raise ProtocolError(f"arrays of {total} bytes are over the limit of {MAX_ARRAY_BYTES}")
        out.append((dtype, tuple(shape), nbytes))
    return out


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    _recv_into(sock, memoryview(data))
    return data


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("the connection was closed")
        view = view[n:]


# -- keys and the handshake ---------------------------------------------------


def write_private(path: str, text: str) -> None:
    """Writes `text` and a newline to `path`, readable by its owner only (mode 0600), replacing any file."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".pw-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_key(path: str) -> bytes:
    """Returns the key an endpoint wrote to `path`."""
    with open(path) as f:
        text = f.read().strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} does not hold an endpoint key") from None


def _proof(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.digest(key, role + server_nonce + client_nonce, "sha256")


def _server_handshake(sock: socket.socket, key: bytes) -> None:
    server_nonce = secrets.token_bytes(_NONCE)
    sock.sendall(_MAGIC + server_nonce)
    answer = _recv_exact(sock, 2 * _NONCE)
    client_nonce, proof = bytes(answer[:_NONCE]), bytes(answer[_NONCE:])
    if not hmac.compare_digest(proof, _proof(key, b"client", server_nonce, client_nonce)):
        raise AuthenticationError("the client does not hold the endpoint's key")
    sock.sendall(_proof(key, b"server", server_nonce, client_nonce))


def _client_handshake(sock: socket.socket, key: bytes) -> None:
    try:
        hello = _recv_exact(sock, len(_MAGIC) + _NONCE)
    except EOFError:
        raise AuthenticationError("the endpoint closed the connection before the handshake") from None
    if hello[:len(_MAGIC)] != _MAGIC:
        raise AuthenticationError("the address is not a pathways-mlir endpoint")
    server_nonce, client_nonce = bytes(hello[len(_MAGIC):]), secrets.token_bytes(_NONCE)
    sock.sendall(client_nonce + _proof(key, b"client", server_nonce, client_nonce))
    try:
        proof = bytes(_recv_exact(sock, _NONCE))
    except (EOFError, ConnectionResetError):
        raise AuthenticationError("the endpoint refused the key") from None
    if not hmac.compare_digest(proof, _proof(key, b"server", server_nonce, client_nonce)):
        raise AuthenticationError("the endpoint does not hold the key")


# -- the server ---------------------------------------------------------------


class Endpoint:
    """Serves a runtime on 127.0.0.1 to other processes that hold its key (read from `key_path`)."""

    def __init__(self, runtime: Runtime, port: int = 0, key_path: str | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.runtime = runtime
        self.handshake_timeout = handshake_timeout
        self._listener = socket.create_server((HOST, port))
        self.address = self._listener.getsockname()
        self._key = secrets.token_bytes(32)
        self._key_dir = None if key_path else tempfile.mkdtemp(prefix="pw-endpoint-")   # mode 0700
        self.key_path = str(key_path or os.path.join(self._key_dir, "key"))
        write_private(self.key_path, self._key.hex())
        self._wake, self._waker = socket.socketpair()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._pending = 0
        self._closed = False
        self._plans: dict[str, ProgramPlan] = {}     # by the SHA-256 of their JSON, shared by every connection
        self._clients: set[int] = set()               # the client ids of the connections being served
        self._thread = threading.Thread(target=self._accept, name="pw-endpoint", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stops accepting, drops every connection (their objects are released), waits for the
        endpoint's threads and deletes the key file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._waker.send(b"x")
        self._thread.join(timeout)
        with self._lock:
            connections, threads = list(self._connections), list(self._threads)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # already gone
        for thread in threads:
            thread.join(timeout)
        for s in (self._listener, self._wake, self._waker):
            s.close()
        self._remove_key()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def plan(self, text: str) -> tuple[str, ProgramPlan]:
        """Returns a plan's name (the SHA-256 of its JSON) and the plan, parsing each distinct plan once, so
        that every connection running the same program shares one loaded plan on the islands."""
        name = hashlib.sha256(text.encode()).hexdigest()
        with self._lock:
            found = self._plans.get(name)
        if found is None:
            found = ProgramPlan.from_json(text)      # raises PlanError on a bad plan; nothing is kept
            check_plan(found)                        # and on executables it does not trust
            with self._lock:
                found = self._plans.setdefault(name, found)
        return name, found

    def status(self) -> Status:
        """Returns the runtime's status with this endpoint's address and the clients it serves."""
        with self._lock:
            clients = sorted(self._clients)
        status = self.runtime.status()
        status["service"] = {"address": f"{self.address[0]}:{self.address[1]}", "connections": clients}
        return status

    def _remove_key(self) -> None:
        try:
            if read_key(self.key_path) == self._key:   # not a later endpoint's key at the same path
                os.unlink(self.key_path)
        except (OSError, ValueError):
            pass
        if self._key_dir:
            shutil.rmtree(self._key_dir, ignore_errors=True)

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake, selectors.EVENT_READ)
            while True:
                selector.select()
                if self._closed:
                    return
                try:
                    connection, _ = self._listener.accept()
                except OSError:
                    time.sleep(0.01)   # the peer left before it was accepted, or no file descriptors are free
                    continue
                if not self._admit(connection):
                    connection.close()

    def _admit(self, connection: socket.socket) -> bool:
        """Starts a connection's thread; False when closed, too many handshakes are pending,
        or no thread can be started."""
        thread = threading.Thread(target=self._serve, args=(connection,), name="pw-endpoint-connection",
                                  daemon=True)
        with self._lock:
            if self._closed or self._pending >= MAX_PENDING_HANDSHAKES:
                return False
            self._pending += 1
            self._connections.add(connection)
            self._threads.add(thread)
        try:
            thread.start()
        except RuntimeError:
            with self._lock:
                self._pending -= 1
                self._connections.discard(connection)
                self._threads.discard(thread)
            return False
        return True

    def _serve(self, connection: socket.socket) -> None:
        client = None
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # a frame's parts go out at once
            connection.settimeout(self.handshake_timeout)
            try:
                _server_handshake(connection, self._key)
            finally:
                with self._lock:
                    self._pending -= 1
            connection.settimeout(None)
            client = Client(self.runtime)
            with self._lock:
                self._clients.add(client.id)
            _Session(self, client, connection).serve()
        except Exception:  # noqa: BLE001  (a bad, silent or vanished peer ends only its own connection)
            pass
        finally:
            if client is not None:
                try:
                    self.runtime.scheduler.cancel_client(client.id, lambda run: RunFailed(
                        f"run {run.id} of {run.plan.program} was queued when client {client.id} disconnected"))
                    client.close()   # the remote process's objects are released here
                except Exception:  # noqa: BLE001  (the runtime closed first: nothing is left to release)
                    pass
            connection.close()
            with self._lock:
                if client is not None:
                    self._clients.discard(client.id)
                self._connections.discard(connection)
                self._threads.discard(threading.current_thread())


class _Session:
    """One authenticated connection: its client, the plans it loaded and its handles."""

    def __init__(self, endpoint: Endpoint, client: Client, connection: socket.socket):
        self.endpoint, self.client, self.connection = endpoint, client, connection
        self.plans: dict[str, ProgramPlan] = {}
        self.handles: dict[int, Handle] = {}
        self.ids = itertools.count()
        self.requests = {"load": self.load, "run": self.run, "fetch": self.fetch, "release": self.release,
                         "objects": self.objects, "topology": self.topology, "status": self.status}

    def serve(self) -> None:
        """Answers requests until the peer closes or sends a malformed frame."""
        try:
            while True:
                try:
                    request, arrays = recv_message(self.connection)
                except ProtocolError as error:
                    send_message(self.connection, {"ok": False, "error": str(error)})
                    return
                op = request.get("op")
                if op == "close":
                    send_message(self.connection, {"ok": True})
                    return
                try:
                    self._release(request.get("release", []))
                    handler = self.requests.get(op) if isinstance(op, str) else None
                    if handler is None:
                        raise ValueError(f"unknown request {str(op)[:40]!r}")
                    reply, out = handler(request, arrays)
                    reply["ok"] = True
                except Exception as error:  # noqa: BLE001  (sent back to the remote client)
                    kind = next((k for k in _KINDS if isinstance(error, _KINDS[k])), "error")
                    reply, out = {"ok": False, "error": f"{type(error).__name__}: {error}", "kind": kind}, []
                send_message(self.connection, reply, out)
        finally:
            self.handles.clear()

    def load(self, request: dict, arrays) -> tuple[dict, list]:
        """Parses a plan's JSON (once per endpoint); replies with its name, the SHA-256 of the JSON."""
        name, plan = self.endpoint.plan(_field(request, "plan", str))
        self.plans[name] = plan
        return {"name": name}, []

    def run(self, request: dict, arrays) -> tuple[dict, list]:
        """Runs a plan this connection loaded, lowered for topology `version`, on `args` (each `["array", i]`,
        the frame's i-th array, or `["handle", k]`, one of its handles); replies with one handle per output."""
        name = _field(request, "name", str)
        if name not in self.plans:
            raise ValueError(f"no plan is loaded as {name[:40]!r}")
        version, current = _field(request, "version", int), self.client.runtime.resources.version
        if version != current:
            raise TopologyChanged(f"the plan was lowered for topology version {version}; the cluster's is "
                                  f"{current}")
        args = []
        for arg in _field(request, "args", list):
            if not (isinstance(arg, list) and len(arg) == 2 and arg[0] in ("array", "handle")
                    and type(arg[1]) is int):
                raise ValueError(f"an argument must be [\"array\", index] or [\"handle\", key], not {str(arg)[:80]}")
            if arg[0] == "handle":
                args.append(self._handle(arg[1]))
            elif 0 <= arg[1] < len(arrays):
                args.append(arrays[arg[1]])
            else:
                raise ValueError(f"argument array {arg[1]} is not in the request's {len(arrays)} arrays")
        results = self.client.run(self.plans[name], args, _field(request, "dispatch", str))
        reply = []
        for handle in results:
            key = next(self.ids)
            self.handles[key] = handle
            reply.append([key, list(handle.shape), np.dtype(handle.dtype).name])
        return {"handles": reply}, []

    def fetch(self, request: dict, arrays) -> tuple[dict, list]:
        """Waits (at most `timeout` seconds, none: as long as it takes) until a handle's value exists; sends
        it unless `value` is false. Gives up if the peer leaves meanwhile."""
        handle = self._handle(_field(request, "handle", int))
        timeout = request.get("timeout")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                    or not timeout >= 0):
            raise ValueError(f"request 'fetch' needs 'timeout' as a non-negative number or null, not {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _PEER_CHECK if deadline is None else min(_PEER_CHECK, max(0.0, deadline - time.monotonic()))
            try:
                value = handle.result(wait)
                break
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the result was not ready within {timeout} s") from None
                if _peer_left(self.connection):
                    raise EOFError("the client left while waiting for a result") from None
        return {}, [np.asarray(value)] if request.get("value", True) else []

    def release(self, request: dict, arrays) -> tuple[dict, list]:
        """Nothing more: every request releases the handles listed in its `release` field first."""
        return {}, []

    def objects(self, request: dict, arrays) -> tuple[dict, list]:
        """Counts the objects this connection's client owns."""
        return {"count": len(self.client.objects())}, []

    def topology(self, request: dict, arrays) -> tuple[dict, list]:
        """Sends the cluster's topology (JSON) and its version, for clients that lower programs themselves."""
        version, topology = self.client.runtime.resources.snapshot()
        return {"topology": topology.to_json(), "version": version}, []

    def status(self, request: dict, arrays) -> tuple[dict, list]:
        """Sends the service's status (`Endpoint.status`)."""
        return {"status": self.endpoint.status()}, []

    def _release(self, keys) -> None:
        if not isinstance(keys, list) or not all(type(k) is int for k in keys):
            raise ValueError("'release' must be a list of handle keys")
        for key in keys:
            handle = self.handles.pop(key, None)     # a key released twice, or never made, is ignored
            if handle is not None:
                handle.delete()

    def _handle(self, key: int) -> Handle:
        if key not in self.handles:
            raise ValueError(f"no handle {key}")
        return self.handles[key]


def _peer_left(connection: socket.socket) -> bool:
    """Returns whether the peer has closed its end (it sends nothing while it waits for a reply)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _field(request: dict, name: str, kind: type):
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"request {str(request.get('op'))[:40]!r} needs {name!r} as {kind.__name__}")
    return value


# -- the client ---------------------------------------------------------------


class RemoteHandle:
    """A handle to a result held by an endpoint for this process; behaves like a local `Handle`.

    `np.asarray(h)`, `h.result(timeout)` (a JAX array here), `h.block_until_ready()`, `h.shape`,
    `h.dtype`; passed to a later run of the same client, it stays on the cluster. Dropping the last
    reference, or `delete()`, releases the result (with the connection's next request at the latest).
    """

    __slots__ = ("_client", "_key", "shape", "dtype", "_finalizer", "__weakref__")

    def __init__(self, client: "RemoteClient", key: int, shape, dtype: str):
        self._client, self._key, self.shape, self.dtype = client, key, tuple(shape), np.dtype(DTYPES[dtype])
        self._finalizer = weakref.finalize(self, client._drop, key)
        self._finalizer.atexit = False       # at exit the connection closes and releases everything

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def result(self, timeout: float | None = None):
        """Returns the value as a JAX array, waiting at most `timeout` seconds (None: as long as it takes)
        for it to be produced; raises TimeoutError past it, RemoteError if the run failed."""
        return jnp.asarray(self._fetch(timeout, True))

    def block_until_ready(self) -> "RemoteHandle":
        """Waits until the value has been computed (nothing is sent back)."""
        self._fetch(None, False)
        return self

    def __array__(self, dtype=None, copy=None):
        value = self._fetch(None, True)
        return value.astype(dtype) if dtype is not None else value

    def __jax_array__(self):
        return self.result()

    def __getitem__(self, index):
        return np.asarray(self)[index]

    def delete(self) -> None:
        """Releases the result on the cluster now."""
        if self._finalizer.detach() is not None and not self._client.closed:   # closing released it already
            self._client._call({"op": "release"}, release=[self._key])

    def _fetch(self, timeout: float | None, value: bool):
        if not self._finalizer.alive:
            raise ValueError(f"remote handle {self._key} was released")
        reply, arrays = self._client._call({"op": "fetch", "handle": self._key, "timeout": timeout, "value": value})
        return arrays[0] if value else None

    def __repr__(self) -> str:
        return f"RemoteHandle(shape={self.shape}, dtype={self.dtype.name})"


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


class RemoteClient:
    """A client of a cluster served by an `Endpoint` in another process.

    `address` is the endpoint's `(host, port)`; the key comes from the endpoint's
    `key_path` or is given as bytes (`key`). `timeout` bounds the wait for each
    reply (None: as long as a run takes); connecting and the handshake wait at
    most `HANDSHAKE_TIMEOUT`.

    To the front end it is also the runtime (`pw.connect` makes it the process's
    default): `resources` holds the cluster's topology and version, which programs
    are lowered for here; `load` sends a plan once; `run` returns `RemoteHandle`s.
    """

    def __init__(self, address, key_path: str | None = None, key: bytes | None = None,
                 timeout: float | None = None):
        if (key_path is None) == (key is None):
            raise ValueError("RemoteClient needs the endpoint's key_path or its key (one of them)")
        key = read_key(key_path) if key is None else key
        self.address = tuple(address)
        self._socket = socket.create_connection(self.address, timeout=HANDSHAKE_TIMEOUT)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            _client_handshake(self._socket, key)
        except BaseException:
            self._socket.close()
            raise
        self._socket.settimeout(timeout)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._dropped: collections.deque[int] = collections.deque()   # handles to release with the next request
        self._names: dict[int, tuple[ProgramPlan, str, int]] = {}      # id(plan) -> (plan, name there, version)
        self.closed = False
        self.resources = ServiceTopology(self)

    @property
    def runtime(self) -> "RemoteClient":
        """The runtime this client runs on, for the front end: the connection itself."""
        return self

    def load(self, plan: ProgramPlan) -> str:
        """Sends a plan to the cluster (once per plan); returns its name there."""
        found = self._names.get(id(plan))
        if found is None or found[0] is not plan:
            if self.resources.version < 0:
                self.resources.snapshot()        # a plan made without reading the topology: for the current one
            version = self.resources.version     # what the plan was lowered for: the latest topology read
            reply, _ = self._call({"op": "load", "plan": plan.to_json()})
            found = self._names[id(plan)] = (plan, reply["name"], version)   # keeps `plan` alive, its id unique
        return found[1]

    def run(self, plan: ProgramPlan, args, dispatch: str = "parallel") -> list[RemoteHandle]:
        """Runs `plan` on `args` (arrays, or this client's remote handles); returns one remote handle per
        output, at once. Raises TopologyChanged if the cluster's topology changed since `plan` was sent."""
        name = self.load(plan)
        version = self._names[id(plan)][2]
        spec, arrays = [], []
        for arg in args:
            if isinstance(arg, RemoteHandle):
                if arg._client is not self:
                    raise ValueError("a remote handle of another connection cannot be an argument here")
                spec.append(["handle", arg._key])
            else:
                spec.append(["array", len(arrays)])
                arrays.append(arg)
        reply, _ = self._call({"op": "run", "name": name, "version": version, "dispatch": dispatch, "args": spec},
                              arrays)
        return [RemoteHandle(self, key, shape, dtype) for key, shape, dtype in reply["handles"]]

    def object_count(self) -> int:
        """Returns how many objects this client owns on the cluster."""
        return self._call({"op": "objects"})[0]["count"]

    def status(self) -> Status:
        """Returns the service's status: the scheduler's queue, each island's runs and what each waits for,
        every client's objects and bytes, the bytes reserved per device, and the clients it serves."""
        return _status(self._call({"op": "status"})[0]["status"])

    def close(self) -> None:
        """Disconnects; the cluster releases everything this client owns. Stops being the default runtime."""
        release_default(self)
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                send_message(self._socket, {"op": "close"})
                recv_message(self._socket)
            except (OSError, EOFError, ProtocolError):
                pass   # the endpoint is gone, and with it everything this client owned
            finally:
                self._socket.close()

    def __enter__(self) -> "RemoteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drop(self, key: int) -> None:
        """A remote handle was dropped: releases it now if the connection is free, else with the next request."""
        self._dropped.append(key)
        if not self.closed and self._lock.acquire(blocking=False):   # never waits: it may run inside `_call`
            try:
                if self._dropped and not self.closed:
                    self._exchange({"op": "release"}, (), ())
            except (OSError, EOFError, RemoteError, ProtocolError):
                pass   # a closed connection released everything already
            finally:
                self._lock.release()

    def _call(self, request: dict, arrays=(), release=()) -> tuple[dict, list[np.ndarray]]:
        with self._lock:
            if self.closed:
                raise ConnectionError("the connection to the endpoint is closed")
            return self._exchange(request, arrays, release)

    def _exchange(self, request: dict, arrays, release) -> tuple[dict, list[np.ndarray]]:
        dropped = []
        while self._dropped:
            dropped.append(self._dropped.popleft())
        if dropped or release:
            request = {**request, "release": [*dropped, *release]}
        send_message(self._socket, request, arrays)
        try:
            reply, values = recv_message(self._socket)
        except EOFError:
            raise ConnectionError("the endpoint closed the connection") from None
        except TimeoutError:
            self._socket.close()   # a late reply would answer the next request
            self.closed = True
            raise TimeoutError(f"no reply from the endpoint in {self._timeout} s; "
                               "the connection is closed") from None
        if reply.get("ok") is not True:
            error = str(reply.get("error", "the endpoint sent a malformed reply"))
            raise _KINDS.get(reply.get("kind"), RemoteError)(error)
        return reply, values


_KINDS = {"timeout": TimeoutError, "topology": TopologyChanged}    # errors a client raises as themselves


def _status(data: dict) -> Status:
    """A `Status` from its JSON form (client ids come back as numbers)."""
    return Status(data, clients={int(c): v for c, v in data["clients"].items()})
