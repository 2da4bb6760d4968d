"""os.fork() after the runtime ran (a data loader's worker processes, say): a child refuses every pw call in one
line, where it waited forever for the parent's threads, and a child that never uses pw exits, where it hung at
interpreter exit in JAX's MLIR thread pool. Every wait has a timeout; a child still there at the end is killed.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import FORKED, Runtime
from test_service import procs  # noqa: F401  (a fixture)
from test_service import service  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="this platform has no os.fork")

WAIT = 30.0     # seconds a child may take; the old code's children never ended


def _in_child(body) -> tuple[object, int | None]:
    """Runs `body` in a child of os.fork(); returns what it returned (through a pipe, as JSON; None if nothing
    came within `WAIT` seconds) and the child's exit code (None: it was still running, and is killed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                        # the child: never back into pytest
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(body()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + WAIT
    try:
        data = b""
        while select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = None
                return (json.loads(data) if data else None), os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        return (json.loads(data) if data else None), None
    finally:
        os.close(read_end)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_forked_child_refuses_every_pw_call_in_one_line(device_map):
    rt = Runtime(device_map)
    try:
        client = Client(rt)
        f = pw.jit(lambda x: x * 3 + 1, slice=pw.virtual_slice(2, axes="data"), in_specs=P("data"),
                   out_specs=P("data"))
        x = np.ones((8, 16), np.float32)
        handle = f(x, client=client)
        np.asarray(handle)

        def calls():
            g = pw.jit(lambda x: x - 1, slice=pw.virtual_slice(2, axes="data"), in_specs=P("data"),
                       out_specs=P("data"))
            tries = {"placed function": lambda: f(x, client=client),
                     "new placed function": lambda: g(x, client=client),
                     "on the default runtime": lambda: f(x),
                     "handle read": lambda: np.asarray(handle),
                     "pw.status": pw.status,
                     "Runtime.status": rt.status,
                     "Client": lambda: Client(rt),
                     "pw.configure": lambda: pw.configure(islands=2, per_island=4)}
            errors = {}
            for name, call in tries.items():
                try:
                    call()
                    errors[name] = "no error"
                except Exception as error:  # noqa: BLE001  (reported to the parent)
                    errors[name] = f"{type(error).__name__}: {error}"
            return errors

        errors, code = _in_child(calls)
        assert code == 0, f"the child did not end within {WAIT} s"
        assert len(errors) == 8 and set(errors.values()) == {f"RuntimeError: {FORKED}"}, errors
        assert np.allclose(np.asarray(f(x, client=client)), x * 3 + 1)      # the parent's runtime still works
    finally:
        rt.close()


# The parent's wait for its child `pid` in the scripts below: its exit code in `code` (None: still running after
# WAIT seconds, and killed).
_WAIT_FOR_CHILD = """code = None
try:
    deadline = time.monotonic() + {wait}
    while code is None and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        code = os.waitstatus_to_exitcode(status) if done else None
        time.sleep(0.05)
finally:
    if code is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
""".format(wait=WAIT)


# A fresh interpreter, whose exit runs the destructors (pytest's child must not exit through pytest): after a
# `jax.jit` function and a placed function ran, a child that never uses pw does NumPy work and exits with
# sys.exit (it hung there; without the `jax.jit` call it crashed there with SIGSEGV), another (a multiprocessing
# worker) with os._exit.
_NEVER_USES_PW = """
import json, multiprocessing, os, signal, sys, time
import jax
import numpy as np
import pathways_mlir as pw
from jax.sharding import PartitionSpec as P

np.asarray(jax.jit(lambda x: x * 3 + 1)(np.ones((8, 16), np.float32)))
f = pw.jit(lambda x: x * 3 + 1, slice=pw.virtual_slice(2, axes="data"), in_specs=P("data"), out_specs=P("data"))
np.asarray(f(np.ones((8, 16), np.float32)))
pid = os.fork()
if pid == 0:
    np.ones(3).sum()
    sys.exit(0)
{wait_for_child}with multiprocessing.get_context("fork").Pool(2) as pool:
    sums = pool.map_async(np.sum, [np.ones(3), np.ones(4)]).get(timeout={wait})
print(json.dumps({{"exit code": code, "sums": [float(s) for s in sums]}}))
"""


def test_a_forked_child_that_never_uses_pw_exits():
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PW_CLUSTER")}
    script = _NEVER_USES_PW.format(wait=WAIT, wait_for_child=_WAIT_FOR_CHILD)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=4 * WAIT,
                            env=environ)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"exit code": 0, "sums": [3.0, 4.0]}, result.stderr


# A fresh interpreter connected to a `pw-serve` (the default runtime, `pw.connect`): a child calls a placed function
# and exits with sys.exit. The child's call went on the parent's socket, and its exit closed the parent's
# connection (the default runtime's close sent `close` on it): the parent's next read was a ServiceError.
_CONNECTED = """
import json, os, signal, sys, time
import numpy as np
import pathways_mlir as pw
from jax.sharding import PartitionSpec as P

pw.connect({service_file!r}, timeout={wait})
f = pw.jit(lambda x: x * 3 + 1, slice=pw.virtual_slice(2, axes="data"), in_specs=P("data"), out_specs=P("data"))
x = np.ones((8, 16), np.float32)
handle = f(x)
np.asarray(handle)
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read_end)
    try:
        np.asarray(f(x))
        said = "no error"
    except Exception as error:
        said = f"{{type(error).__name__}}: {{error}}"
    os.write(write_end, said.encode())
    sys.exit(0)
os.close(write_end)
{wait_for_child}said = os.read(read_end, 65536).decode()
print(json.dumps({{"exit code": code, "child": said, "old": float(np.asarray(handle).sum()),
                  "new": float(np.asarray(f(x)).sum())}}))
"""


def test_a_forked_child_of_a_connected_process_refuses_and_leaves_the_parents_connection(service):
    from pathways_mlir.runtime.remote_client import FORKED

    _, service_file, _ = service
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PW_CLUSTER")}
    script = _CONNECTED.format(service_file=str(service_file), wait=WAIT, wait_for_child=_WAIT_FOR_CHILD)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=8 * WAIT,
                            env=environ)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {"exit code": 0, "child": f"RuntimeError: {FORKED}",
                                                          "old": 512.0, "new": 512.0}, result.stderr[-3000:]
