"""The shared service: one long-running runtime that processes attach to as clients.

`pw-serve` makes a `Service`: a `Runtime` (embedded, or owning islands on a
Ray cluster) served by an `Endpoint` on 127.0.0.1, found by other processes
through a service file, JSON `{"host", "port", "key_path", "pid"}` written
(mode 0600) beside the endpoint's key in a directory only its owner can
enter: `$PW_SERVICE_DIR/service.json`, else `~/.cache/pathways-mlir/service.json`,
or a path of one's own.

`connect(address)` attaches this process: it returns a `RemoteClient` and
makes it the process's default runtime, so programs called here are lowered
here (for the service's topology, again when its version changes) and run
there, each plan sent once, results held there as `RemoteHandle`s. Every
connection is one client of the shared runtime: it sees only its own
objects, its runs go through the shared gang scheduler, and everything it
owns is released when it disconnects or its process dies.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat

from .endpoint import Endpoint, RemoteClient, write_private
from .runtime import Runtime, connect_default

DEFAULT_PORT = 7107
SERVICE_DIR_ENV = "PW_SERVICE_DIR"


class ServiceError(RuntimeError):
    """A service that cannot be started or reached; the message is one line."""


def default_service_file() -> str:
    """Returns where `pw-serve` writes its service file and `connect()` looks for it by default."""
    directory = os.environ.get(SERVICE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "pathways-mlir")
    return os.path.join(directory, "service.json")


def read_service_file(path: str) -> dict:
    """Returns a service file's fields (host, port, key_path, pid); raises ServiceError naming what is wrong."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ServiceError(f"no service file at {path}: is pw-serve running?") from None
    except (OSError, ValueError, RecursionError) as error:
        raise ServiceError(f"cannot read the service file {path}: {error}") from None
    kinds = {"host": str, "port": int, "key_path": str, "pid": int}
    if not isinstance(data, dict) or any(type(data.get(k)) is not kind for k, kind in kinds.items()):
        raise ServiceError(f"{path} is not a service file: it needs "
                           + ", ".join(f"{k} ({kind.__name__})" for k, kind in kinds.items()))
    return data


class Service:
    """Serves `runtime` on 127.0.0.1:`port` (0: any free port) and writes the service file.

    Requires the service file's directory to be private (made, mode 0700, if missing) and no live service
    to own the file. `close()` stops the endpoint (every connection's objects are released), and removes
    the service file and the key; the runtime stays the caller's.
    """

    def __init__(self, runtime: Runtime, port: int = DEFAULT_PORT, service_file: str | None = None):
        self.service_file = os.path.abspath(service_file or default_service_file())
        directory = os.path.dirname(self.service_file)
        _private_directory(directory)
        if os.path.exists(self.service_file):
            _refuse_live(self.service_file)
        try:
            self.endpoint = Endpoint(runtime, port, key_path=os.path.splitext(self.service_file)[0] + ".key")
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ServiceError(f"cannot listen on 127.0.0.1:{port}: {reason}"
                               + (" (another pw-serve? --port 0 picks a free port)" if port else "")) from None
        host, self.port = self.endpoint.address[:2]
        self.address = f"{host}:{self.port}"
        write_private(self.service_file, json.dumps({"host": host, "port": self.port,
                                                      "key_path": self.endpoint.key_path, "pid": os.getpid()}))

    def close(self) -> None:
        """Stops serving, then removes the service file (if it is still this service's) and the key."""
        self.endpoint.close()
        try:
            if read_service_file(self.service_file)["pid"] == os.getpid():
                os.unlink(self.service_file)
        except (ServiceError, OSError):
            pass   # gone already, or a later service's


def connect(address: str | None = None, key_path: str | None = None, timeout: float | None = None) -> RemoteClient:
    """Attaches this process to a service as one client and makes it the default runtime; returns the client.

    `address` is a service file (default: `default_service_file()`) or `"host:port"` with the endpoint's
    `key_path`. `timeout` bounds each reply (None: as long as a run takes). Programs called here from now
    on run on the service, until `client.close()` or `pw.configure(...)`.
    """
    client = open_connection(address, key_path, timeout)
    connect_default(client)
    return client


def open_connection(address: str | None = None, key_path: str | None = None,
                    timeout: float | None = None) -> RemoteClient:
    """Connects to a service as one client (see `connect`) without making it the default runtime."""
    address = address or default_service_file()
    if re.fullmatch(r"[^:/\\]+:\d+", address):
        if key_path is None:
            raise ServiceError(f"connecting to {address} needs key_path, the service's key file")
        host, port = address.rsplit(":", 1)
        where = address
    else:
        found = read_service_file(address)
        host, port, key_path = found["host"], found["port"], key_path or found["key_path"]
        where = f"{host}:{port} (service file {address})"
    try:
        return RemoteClient((host, int(port)), key_path=key_path, timeout=timeout)
    except FileNotFoundError:
        raise ServiceError(f"no key file at {key_path}: is the service at {where} running?") from None
    except (OSError, ValueError) as error:     # refused, not an endpoint, a wrong key, no key in the file
        reason = getattr(error, "strerror", None) or error
        raise ServiceError(f"cannot reach the service at {where}: {reason}") from None


def _private_directory(directory: str) -> None:
    """Makes `directory` (mode 0700) if missing; refuses one that others can enter or that is not ours."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ServiceError(f"{directory} must belong to you and be private for the service's key "
                           f"(chmod 700 {directory})")


def _refuse_live(service_file: str) -> None:
    """Raises if the process named by an existing service file is alive and its port accepts connections
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
    try:
        socket.create_connection((found["host"], found["port"]), timeout=5).close()
    except OSError:
        return   # nothing listens there: the pid is another process's now
    raise ServiceError(f"a service is already running (pid {found['pid']}, {found['host']}:{found['port']}, "
                       f"service file {service_file}); stop it first or choose another --service-file")
