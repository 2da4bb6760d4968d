"""The shared service: one long-running runtime that processes attach to as clients.

`pw-serve` makes a `Service`: a `Runtime` (embedded, or owning islands on a
Ray cluster) served by an `Endpoint` on a Unix socket (and, with a port, on
TCP 127.0.0.1 too), found by other processes through a service file, JSON
`{"socket", "key_path", "pid"}` (and `"host"`, `"port"` with TCP) written
(mode 0600) beside the endpoint's socket and key in a directory only its
owner can enter: `$PW_SERVICE_DIR/service.json`, else
`~/.cache/pathways-mlir/service.json`, or a path of one's own.

`connect(address)` attaches this process: it returns a `RemoteClient` and
makes it the process's default runtime, so programs called here are lowered
here (for the service's topology, again when its version changes) and run
there, each plan sent once, results held there as `RemoteHandle`s. Every
connection is one client of the shared runtime: it sees only its own
objects, its runs go through the shared gang scheduler, and everything it
owns is released when it disconnects or its process dies. A service file is
trusted only if it, and its directory, belong to this user and others
cannot write them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat

from .authentication import write_private
from .client import check_weight
from .endpoint import Endpoint
from .limits import Limits
from .remote_client import DEADLINE, RemoteClient, ServiceError, check_reply_timeout
from .runtime import Runtime, connect_default

SERVICE_DIR_ENV = "PW_SERVICE_DIR"
MAX_SOCKET_PATH = 107      # bytes in a Unix socket's address (sun_path less its terminating NUL)


def default_service_file() -> str:
    """Returns where `pw-serve` writes its service file and `connect()` looks for it by default."""
    directory = os.environ.get(SERVICE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "pathways-mlir")
    return os.path.join(directory, "service.json")


def read_service_file(path: str) -> dict:
    """Returns a service file's fields (socket, key_path, pid; host and port with TCP); raises ServiceError
    naming what is wrong, or if the file or its directory is another user's or writable by others."""
    _trusted(os.path.dirname(os.path.abspath(path)), "directory", missing_ok=True)
    try:
        _trusted(path, "service file")
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ServiceError(f"no service file at {path}: is pw-serve running?") from None
    except (OSError, ValueError, RecursionError) as error:
        raise ServiceError(f"cannot read the service file {path}: {error}") from None
    kinds = {"socket": str, "key_path": str, "pid": int}
    if not isinstance(data, dict) or any(type(data.get(k)) is not kind for k, kind in kinds.items()) or \
            ("port" in data) != ("host" in data) or \
            ("port" in data and (type(data["port"]) is not int or type(data["host"]) is not str)):
        raise ServiceError(f"{path} is not a service file: it needs "
                           + ", ".join(f"{k} ({kind.__name__})" for k, kind in kinds.items())
                           + " and optionally host (str) with port (int)")
    return data


class Service:
    """Serves `runtime` on a Unix socket beside the service file (and on TCP 127.0.0.1:`port` if `port`
    is given; 0: any free port) and writes the service file.

    Requires the service file's directory to be private (made, mode 0700, if missing) and no live service
    to own the file. `limits` bounds each connection (`runtime/wire.py`). `close()` stops the endpoint
    (every connection's objects are released), and removes the service file, the socket and the key; the
    runtime stays the caller's.
    """

    def __init__(self, runtime: Runtime, port: int | None = None, service_file: str | None = None,
                 limits: Limits = Limits()):
        self.service_file = os.path.abspath(service_file or default_service_file())
        directory = os.path.dirname(self.service_file)
        _private_directory(directory)
        stem = os.path.splitext(self.service_file)[0]
        socket_path = stem + ".sock"
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise ServiceError(f"the socket path {socket_path} is longer than a Unix socket allows "
                               f"({MAX_SOCKET_PATH} bytes): choose a shorter --service-file")
        if os.path.exists(self.service_file):
            _refuse_live(self.service_file)
        try:
            self.endpoint = Endpoint(runtime, socket_path, port, key_path=stem + ".key", limits=limits)
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else str(error)
            where = f"127.0.0.1:{port}" if port is not None else socket_path
            raise ServiceError(f"cannot listen on {where}: {reason}"
                               + (" (another pw-serve? --port 0 picks a free port)" if port else "")) from None
        fields = {"socket": socket_path, "key_path": self.endpoint.key_path, "pid": os.getpid()}
        self.address = f"unix:{socket_path}"
        if self.endpoint.tcp_address is not None:
            host, self.port = self.endpoint.tcp_address
            fields.update(host=host, port=self.port)
            self.address += f" and {host}:{self.port}"
        write_private(self.service_file, json.dumps(fields))

    def close(self, timeout: float = 30.0) -> None:
        """Stops serving (waiting at most `timeout` seconds for its connections), then removes the service
        file (if it is still this service's), the socket and the key."""
        self.endpoint.close(timeout)
        try:
            if read_service_file(self.service_file)["pid"] == os.getpid():
                os.unlink(self.service_file)
        except (ServiceError, OSError):
            pass   # gone already, or a later service's


def connect(address: str | None = None, key_path: str | None = None,
            timeout: float | None = DEADLINE, weight: float = 1.0) -> RemoteClient:
    """Attaches this process to a service as one client and makes it the default runtime; returns the client.

    `address` is a service file (default: `default_service_file()`) or `"host:port"` (TCP) with the
    endpoint's `key_path`. `timeout` bounds the wait for each reply (default 120 s; None: no bound): a
    service that stops answering is a ServiceError naming it within that time. `weight` (from 1e-6 to 1e6)
    is this client's share under the service's `share` policy, as `pw.Client(weight=...)`'s in a process.
    Programs called here from now on run on the service, until `client.close()` or `pw.configure(...)`.
    """
    client = open_connection(address, key_path, timeout, weight=weight)
    connect_default(client)
    return client


def open_connection(address: str | None = None, key_path: str | None = None,
                    timeout: float | None = DEADLINE, status_only: bool = False, weight: float = 1.0) -> RemoteClient:
    """Connects to a service as one client (see `connect`) without making it the default runtime. With
    `status_only` (`pw-serve --status`), also while the service serves its limit of connections: then the
    connection may only ask for the full status (`RemoteClient`)."""
    check_reply_timeout(timeout)
    check_weight(weight)
    address = address or default_service_file()
    if re.fullmatch(r"[^:/\\]+:\d+", address):
        if key_path is None:
            raise ServiceError(f"connecting to {address} needs key_path, the service's key file")
        host, port = address.rsplit(":", 1)
        target, where = (host, int(port)), address
    else:
        found = read_service_file(address)
        key_path = key_path or found["key_path"]
        target, where = found["socket"], f"{address} (pid {found['pid']})"
    try:
        return RemoteClient(target, key_path=key_path, timeout=timeout, name=where, status_only=status_only,
                            weight=weight)
    except FileNotFoundError as error:
        what = "key file" if error.filename == key_path else "socket"
        raise ServiceError(f"no {what} at {error.filename}: is the service at {where} running?") from None
    except ServiceError:
        raise
    except (OSError, ValueError) as error:     # refused, not an endpoint, a wrong key, no key in the file
        reason = getattr(error, "strerror", None) or error
        raise ServiceError(f"cannot reach the service at {where}: {reason}") from None


def _trusted(path: str, what: str, missing_ok: bool = False) -> None:
    """Refuses a path that is a symbolic link, belongs to another user or others can write."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        owner = "a symbolic link" if stat.S_ISLNK(info.st_mode) else \
            f"owned by uid {info.st_uid}" if info.st_uid != os.getuid() else "writable by others"
        raise ServiceError(f"refusing the {what} {path}: it is {owner}; a service file and its directory must "
                           f"be yours and not writable by others")


def _private_directory(directory: str) -> None:
    """Makes `directory` (mode 0700) if missing; refuses one that others can enter or that is not ours, and
    one that cannot be made (a plain file on its path: one line, not an internal error)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as error:
        reason = "a file on its path is not a folder" if isinstance(error, (FileExistsError, NotADirectoryError)) \
            else error.strerror or error
        raise ServiceError(f"cannot make the service's directory {directory}: {reason}") from None
    info = os.stat(directory)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ServiceError(f"{directory} must belong to you and be private for the service's key "
                           f"(chmod 700 {directory})")


def _refuse_live(service_file: str) -> None:
    """Raises if the process named by an existing service file is alive and its socket accepts connections
    (a stale file is replaced)."""
    try:
        found = read_service_file(service_file)
    except ServiceError:
        return
    try:
        os.kill(found["pid"], 0)
    except ProcessLookupError:
        return
    except PermissionError:
        pass   # alive, someone else's
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(found["socket"])
    except OSError:
        return   # nothing listens there: the pid is another process's now
    finally:
        probe.close()
    raise ServiceError(f"a service is already running (pid {found['pid']}, unix:{found['socket']}, "
                       f"service file {service_file}); stop it first or choose another --service-file")
