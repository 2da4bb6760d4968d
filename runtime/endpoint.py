"""A local endpoint: clients in other processes share this process's cluster.

`serve(runtime, address)` listens on a loopback socket; every connection is
one `Client` of the shared runtime, so each remote process sees only its own
objects, and everything it owns is released when it disconnects, cleanly or
not (a crashed process is an owner that failed). `RemoteClient` is the other
end: it sends plans (as JSON) and host arrays, and gets back handles that
fetch their values on demand.

Messages are plain Python data (dicts, strings, NumPy arrays) pickled by
`multiprocessing.connection`, authenticated with a shared key.
"""

from __future__ import annotations

import itertools
import threading
from multiprocessing.connection import Client as _Connect
from multiprocessing.connection import Listener

import numpy as np

from pathways_mlir.dialect.plan import ProgramPlan

from .client import Client
from .runtime import Runtime

DEFAULT_AUTHKEY = b"pathways-mlir"


class Endpoint:
    """Serves a runtime to other processes on a loopback address."""

    def __init__(self, runtime: Runtime, address=("127.0.0.1", 0), authkey: bytes = DEFAULT_AUTHKEY):
        if address[0] not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the endpoint serves loopback addresses only, not {address[0]}")
        self.runtime = runtime
        self._listener = Listener(address, authkey=authkey)
        self.address = self._listener.address
        self._thread = threading.Thread(target=self._accept, name="pw-endpoint", daemon=True)
        self._closed = False
        self._thread.start()

    def close(self) -> None:
        """Stops accepting connections."""
        self._closed = True
        try:
            _Connect(self.address, authkey=DEFAULT_AUTHKEY).close()   # wake the accept loop
        except OSError:
            pass
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self._listener.accept()
            except OSError:
                return
            if self._closed:
                connection.close()
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection) -> None:
        client = Client(self.runtime)
        plans: dict[str, ProgramPlan] = {}
        handles: dict[int, object] = {}
        ids = itertools.count()
        try:
            while True:
                request = connection.recv()
                op = request["op"]
                try:
                    if op == "load":
                        plans[request["name"]] = ProgramPlan.from_json(request["plan"])
                        reply = {"ok": True}
                    elif op == "run":
                        results = client.run(plans[request["name"]], request["args"], request["dispatch"])
                        reply = {"ok": True, "handles": []}
                        for h in results:
                            key = next(ids)
                            handles[key] = h
                            reply["handles"].append((key, h.shape, str(h.dtype)))
                    elif op == "fetch":
                        reply = {"ok": True, "value": np.asarray(handles[request["handle"]])}
                    elif op == "release":
                        handles.pop(request["handle"]).delete()
                        reply = {"ok": True}
                    elif op == "objects":
                        reply = {"ok": True, "count": len(client.objects())}
                    elif op == "close":
                        connection.send({"ok": True})
                        return
                    else:
                        reply = {"ok": False, "error": f"unknown request '{op}'"}
                except Exception as error:  # noqa: BLE001  (sent back to the remote client)
                    reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
                connection.send(reply)
        except (EOFError, OSError):
            pass   # the remote process went away: its objects are released below
        finally:
            handles.clear()
            client.close()
            connection.close()


class RemoteError(RuntimeError):
    """An error the endpoint reported for a request."""


class RemoteHandle:
    """A handle held by another process: fetches the value on demand."""

    def __init__(self, client: "RemoteClient", key: int, shape, dtype: str):
        self._client, self._key, self.shape, self.dtype = client, key, tuple(shape), dtype

    def __array__(self, dtype=None, copy=None):
        value = self._client._call({"op": "fetch", "handle": self._key})["value"]
        return value.astype(dtype) if dtype is not None else value

    def delete(self) -> None:
        """Releases the buffer on the cluster."""
        self._client._call({"op": "release", "handle": self._key})


class RemoteClient:
    """A client of a cluster served by an `Endpoint` in another process."""

    def __init__(self, address, authkey: bytes = DEFAULT_AUTHKEY):
        self._connection = _Connect(tuple(address), authkey=authkey)
        self._lock = threading.Lock()

    def load(self, name: str, plan: ProgramPlan) -> None:
        """Sends a plan to the cluster under `name`."""
        self._call({"op": "load", "name": name, "plan": plan.to_json()})

    def run(self, name: str, args, dispatch: str = "parallel") -> list[RemoteHandle]:
        """Runs a loaded plan on host arrays; returns remote handles."""
        reply = self._call({"op": "run", "name": name, "args": [np.asarray(a) for a in args],
                            "dispatch": dispatch})
        return [RemoteHandle(self, key, shape, dtype) for key, shape, dtype in reply["handles"]]

    def object_count(self) -> int:
        """Returns how many objects this client owns on the cluster."""
        return self._call({"op": "objects"})["count"]

    def close(self) -> None:
        """Disconnects; the cluster releases everything this client owns."""
        self._call({"op": "close"})
        self._connection.close()

    def _call(self, request: dict) -> dict:
        with self._lock:
            self._connection.send(request)
            reply = self._connection.recv()
        if not reply["ok"]:
            raise RemoteError(reply["error"])
        return reply
