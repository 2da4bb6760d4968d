"""The local endpoint: framed JSON and raw arrays (never pickle), an HMAC handshake
with a per-service key on a private Unix socket, and an accept loop that outlives bad and
half-open connections."""

import functools
import hashlib
import re
import multiprocessing.connection as mpc
import os
import pickle
import secrets
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.authentication import AuthenticationError, ServerHandshake, client_handshake
from pathways_mlir.runtime.endpoint import Endpoint
from pathways_mlir.runtime.limits import Limits
from pathways_mlir.runtime.remote_client import RemoteClient, RemoteError, ServiceError
from pathways_mlir.runtime.wire import FrameReader, ProtocolError, recv_message, send_message
from fetching import until
from pathways_mlir.runtime.resource_manager import TopologyChanged
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.dialect.topology import Topology
import output_lines

X = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
TIMEOUT = 120


@pytest.fixture
def runtime():
    rt = Runtime(embedded_device_map(2, 4))
    yield rt
    rt.close()


def affine(x):
    return x * 3.0 - 1.0


def sine_squared(x):
    return jnp.sin(x) ** 2


def program(plan_builder, topology):
    """island0 (2-way) -> DCN -> island1 (4-way): the plan remote clients run."""
    p = plan_builder(topology)
    a = p.slice("a", (2,), ("x",), "island0", (0, 2))
    b = p.slice("b", (4,), ("y",), "island1", (0, 4))
    x = p.input((8, 16), a, [("x",), ()])
    y = p.launch(affine, [x], a, [("x",), ()])
    z = p.launch(sine_squared, [p.dcn(y, b, [("y",), ()])], b, [("y",), ()])
    return p.build([z]), np.asarray(jax.jit(sine_squared)(jax.jit(affine)(X)))


class Payload:
    """Creates a file when unpickled: what an attacker would send."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


_REMOTE = """
import sys, numpy as np
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.runtime.remote_client import RemoteClient
plan_path, address, key_path, x_path, out_path, ending = sys.argv[1:]
client = RemoteClient(address, key_path=key_path, timeout=120)
[h] = client.run(ProgramPlan.from_json(open(plan_path).read()), [np.load(x_path)])
np.save(out_path, np.asarray(h))
print(client.object_count(), flush=True)
if ending == "close":
    client.close()
else:
    sys.stdin.read()   # holds its objects until it is killed
"""


def start_remote(endpoint, tmp_path, plan, name, ending):
    """Starts a client process that runs `plan` on X through `endpoint`."""
    (tmp_path / "plan.json").write_text(plan.to_json())
    np.save(tmp_path / "x.npy", X)
    return subprocess.Popen(
        [sys.executable, "-c", _REMOTE, str(tmp_path / "plan.json"), endpoint.address,
         endpoint.key_path, str(tmp_path / "x.npy"), str(tmp_path / f"{name}.npy"), ending],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_line(proc, timeout=TIMEOUT) -> str:
    return output_lines.read_line(proc, timeout, "the client process")


def wait_dropped(sock, timeout=30):
    """Reads until the endpoint closes `sock`; fails if it is still open after `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass


def wait_released(runtime, timeout=30):
    deadline = time.monotonic() + timeout
    while sum(runtime.usage().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sum(runtime.usage().values())


def endpoint_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pw-endpoint")]


def unix(path: str) -> socket.socket:
    """A raw connection to a Unix socket."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def raw_frame(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


class _Frames:
    """Collects frames (`send_message`) to be written to a socket at once."""

    def __init__(self):
        self.data = b""

    def sendall(self, data) -> None:
        self.data += bytes(data)


def test_frames_carry_numeric_arrays_only():
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10), b.settimeout(10)
        arrays = [np.arange(6, dtype=d).reshape(2, 3) for d in ("int8", "uint16", "int64", "float16", "float64")]
        arrays += [np.array(True), np.zeros((0, 4), np.complex64), np.ones(5, jnp.bfloat16),
                   np.ones(3, jnp.float8_e4m3fn), np.ones(3, jnp.float8_e5m2), np.arange(-3, 3).astype(jnp.int4),
                   np.ones(3, jnp.float4_e2m1fn), np.ones(3, jnp.float8_e8m0fnu),
                   np.arange(12, dtype=">i4")[::2]]
        send_message(a, {"op": "x", "n": [1, "two"]}, arrays)
        header, got = recv_message(b)
        assert header == {"op": "x", "n": [1, "two"]}
        for want, value in zip(arrays, got):
            assert value.dtype == want.dtype.newbyteorder("=") and value.shape == want.shape
            np.testing.assert_array_equal(value, want)
        with pytest.raises(ValueError, match="dtype object cannot be sent"):
            send_message(a, {}, [np.array([Payload("x")])])
        with pytest.raises(ValueError, match="dtype <U3 cannot be sent"):
            send_message(a, {}, [np.array(["abc"])])

        bad = {
            b'{"arrays": [["float32", [1099511627776]]]}': "over the limit",   # 2^40 elements
            b'{"arrays": [["float32", [65536, 65536]], ["int8", [1]]]}': "over the limit",
            b'{"arrays": [["object", [1]]]}': "dtype 'object' is not allowed",
            b'{"arrays": [["O", [1]]]}': "dtype 'O' is not allowed",
            b'{"arrays": [["float32", [-1]]]}': "non-negative integers",
            b'{"arrays": [["float32", [true]]]}': "non-negative integers",
            b'{"arrays": [["float32", [' + b",".join([b"1"] * 65) + b"]]]}": "non-negative integers",
            b'{"arrays": [["float32"]]}': r"\[dtype, shape\]",
            b'{"arrays": 3}': "must be a list",
            b"[1, 2]": "not a JSON object",
            b"{" * 100000: "not JSON",
            b"\xff\xfe": "not JSON",
            pickle.dumps(Payload("never")): "not JSON",
        }
        for header, error in bad.items():
            a.sendall(raw_frame(header))
            start = time.monotonic()
            with pytest.raises(ProtocolError, match=error):
                recv_message(b)
            assert time.monotonic() - start < 5      # rejected before allocating or reading
        assert Limits().max_array_bytes < 1 << 40
        a.sendall(struct.pack(">I", 1 << 31))
        with pytest.raises(ProtocolError, match="header of 2147483648 bytes"):
            recv_message(b)


def test_frames_carry_arrays_of_up_to_numpys_64_dimensions_and_a_sender_refuses_more():
    """The wire took at most 32 dimensions, and only its receiver checked: a sender wrote a frame of an array of
    more (NumPy takes 64), which dropped its connection (found by a fault finder). It takes NumPy's 64 now, and
    a JAX array of more (JAX takes them) is refused before a byte is sent, naming it and the limit."""
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10), b.settimeout(10)
        deep = np.arange(2, dtype=np.int32).reshape((1,) * 63 + (2,))
        send_message(a, {"op": "x"}, [np.ones(3), deep])
        header, [_, got] = recv_message(b)
        assert header == {"op": "x"} and got.shape == deep.shape
        np.testing.assert_array_equal(got, deep)
        with pytest.raises(ValueError, match=r"^array 1 of the frame has 65 dimensions, over the limit of 64 of an "
                                             r"array sent"):
            send_message(a, {"op": "x"}, [np.ones(3), jnp.ones((1,) * 65)])
        assert select.select([b], [], [], 0)[0] == []                  # nothing was sent


def test_a_reader_that_reads_ahead_keeps_each_frame_whole():
    """A `FrameReader` asks its socket for up to 64 KiB at a time and keeps the bytes past a frame: frames that
    arrived together, a frame whose array is larger than that, and one that arrives a byte at a time are read
    one by one, each whole; a peer that leaves in the middle of a frame is EOFError."""
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10), b.settimeout(10)
        small = np.arange(6, dtype=np.int16).reshape(2, 3)
        big = np.arange(100_000, dtype=np.float32)
        frames = [({"n": i}, [small * i]) for i in range(3)] + [({"big": 1}, [small, big, small])]
        slow = raw_frame(b'{"slow":1,"arrays":[["int16",[2,3]]]}') + small.tobytes()
        together = threading.Event()

        def send():
            for i, (header, arrays) in enumerate(frames):
                send_message(a, header, arrays)
                if i == 2:
                    together.set()           # the small frames wait in the socket together
            for i in range(len(slow)):
                a.sendall(slow[i:i + 1])
            a.sendall(slow[:7])
            a.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        assert together.wait(10)
        reader = FrameReader(b)
        for header, arrays in frames + [({"slow": 1}, [small])]:
            got_header, got = reader.recv(frame_timeout=10)
            assert got_header == header and len(got) == len(arrays)
            for want, value in zip(arrays, got):
                np.testing.assert_array_equal(value, want)
        with pytest.raises(EOFError):
            reader.recv()
        sender.join(10)


def test_a_reader_shows_the_header_of_a_frame_it_read_ahead_whole_and_nothing_of_one_it_did_not():
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10), b.settimeout(10)
        frames = _Frames()
        for header in ({"op": "run", "keys": [1]}, {"op": "fetch", "handle": 1}):
            send_message(frames, header, [np.arange(3, dtype=np.float32)] if "keys" in header else [])
        cut = len(frames.data) - 5                    # the fetch's header but its last 5 bytes
        a.sendall(frames.data[:cut])
        reader = FrameReader(b)
        assert reader.header_ahead() == b""           # nothing read yet
        assert reader.recv(frame_timeout=10)[0] == {"op": "run", "keys": [1]}
        assert reader.header_ahead() == b""           # the fetch's header is not whole
        a.sendall(frames.data[cut:])
        send_message(a, {"op": "ping"})
        assert reader.recv(frame_timeout=10)[0] == {"op": "fetch", "handle": 1}
        assert reader.header_ahead() in (b"", b'{"op":"ping","arrays":[]}')     # as much as the socket had
        assert reader.recv(frame_timeout=10)[0] == {"op": "ping"} and reader.header_ahead() == b""


def test_key_is_random_per_service_private_and_removed_on_close(runtime, tmp_path):
    chosen = tmp_path / "service.key"
    chosen.write_text("stale\n")
    one, two = Endpoint(runtime), Endpoint(runtime, key_path=str(chosen))
    try:
        assert two.key_path == str(chosen)
        for endpoint in (one, two):
            assert stat.S_ISSOCK(os.stat(endpoint.address).st_mode) and endpoint.tcp_address is None
            assert stat.S_IMODE(os.stat(os.path.dirname(endpoint.address)).st_mode) == 0o700
            assert stat.S_IMODE(os.stat(endpoint.key_path).st_mode) == 0o600
            assert os.stat(endpoint.key_path).st_uid == os.getuid()
        keys = [open(e.key_path).read() for e in (one, two)]
        assert keys[0] != keys[1] and len(bytes.fromhex(keys[0])) == 32
        with RemoteClient(two.address, key=bytes.fromhex(keys[1]), timeout=TIMEOUT) as client:
            assert client.object_count() == 0
        with pytest.raises(ValueError, match="key_path or its key"):
            RemoteClient(one.address)
    finally:
        one.close()
        two.close()
    assert not os.path.exists(one.key_path) and not os.path.exists(os.path.dirname(one.key_path))
    assert not chosen.exists() and not list(tmp_path.iterdir())
    one.close()                                     # closing twice is harmless
    assert not endpoint_threads()
    with pytest.raises(FileNotFoundError):
        unix(one.address)


def test_clients_check_the_endpoint_and_time_out_waiting():
    key, timed_out = secrets.token_bytes(32), threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)

        def impostor_then_silent():
            with server.accept()[0] as first:            # does not hold the key
                first.sendall(b"PWE1" + secrets.token_bytes(32))
                first.recv(64)
                first.sendall(secrets.token_bytes(32))
            with server.accept()[0] as second:           # holds it, welcomes, then never replies
                handshake = ServerHandshake(second, key)
                handshake.start()
                while not handshake.advance():
                    pass
                send_message(second, {"ok": True, "limits": Limits().to_python()})
                timed_out.wait(30)

        thread = threading.Thread(target=impostor_then_silent, daemon=True)
        thread.start()
        with pytest.raises(AuthenticationError, match="does not hold the key"):
            RemoteClient(server.getsockname(), key=key)
        client = RemoteClient(server.getsockname(), key=key, timeout=0.5)
        with pytest.raises(ServiceError, match=r"no reply from the service at 127.0.0.1:\d+ in 0.5 s; the "
                                               "connection is closed"):
            client.object_count()
        timed_out.set()
        with pytest.raises(OSError):
            client.object_count()                        # closed: a late reply cannot answer it
        thread.join(30)
        assert not thread.is_alive()


def slow_to_compile(x):
    """Some 3 s of XLA:CPU compile here: 300 dependent matrix products."""
    for i in range(300):
        x = jnp.sin(x @ jnp.ones((16, 16)) * (1.0 + i * 1e-3))
    return x


@functools.lru_cache(maxsize=None)
def compile_seconds() -> float:
    """How long `slow_to_compile` takes to compile here, measured once: a second measurement in this process
    hit JAX's cache and took no time, so a test after the first got its timeout's floor, whatever its compile
    took (found by a review: the reason `test_a_large_run_sent_...` failed on busy machines)."""
    started = time.perf_counter()
    jax.jit(slow_to_compile).lower(X).compile()
    return time.perf_counter() - started


def test_a_compile_longer_than_the_clients_timeout_keeps_the_connection(runtime, plan_builder):
    """A plan's first run compiles it on the service's thread, and a client waits at most its timeout for any
    frame: a compile longer than that made it give the connection up (`no reply ... in 1.0 s`), and the service
    released the client's objects with it. The service now says it is still compiling every quarter of the
    client's timeout, and the client waits on; the timeout is half of what this compile takes here (a wide margin:
    the frames come an eighth of it apart, and a loaded machine delays them)."""
    timeout = max(0.5, compile_seconds() / 2)
    p = plan_builder(runtime.resources.topology)
    a = p.slice("a", (2,), ("x",), "island0", (0, 2))
    plan = p.build([p.launch(slow_to_compile, [p.input((8, 16), a, [("x",), ()])], a, [("x",), ()])])
    endpoint = Endpoint(runtime)
    client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=timeout)
    try:
        [kept] = client.run(program(plan_builder, runtime.resources.topology)[0], [X])
        [y] = client.run(plan, [X])                                    # waits for its compile
        np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(slow_to_compile)(X)), rtol=1e-5)
        assert client.object_count() == 2 and np.asarray(kept).shape == (8, 16)   # the connection and its objects
        with pytest.raises(RemoteError, match=r"'progress' as a number of seconds of at least 0.01 or null"):
            client._call({"op": "run", "name": client.load(plan), "version": runtime.resources.version,
                           "dispatch": "parallel", "args": [["array", 0]], "progress": 0}, [X])
    finally:
        client.close()
        endpoint.close()


def test_closing_reads_past_the_frames_saying_a_plan_still_compiles(runtime, plan_builder, monkeypatch):
    """`close()` reads the reply of each run sent without waiting, then the close's: it took the frames saying
    the service still compiles a run's plan for those replies, and closed the socket before the service had
    answered (or read) the close. It reads past them now, as every other wait for a reply does."""
    p = plan_builder(runtime.resources.topology)
    a = p.slice("a", (1,), ("x",), "island0", (0, 1))
    plan = p.build([p.launch(lambda x: slow_to_compile(slow_to_compile(x)), [p.input((8, 16), a)], a, [(), ()])])
    endpoint = Endpoint(runtime)
    client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=4.0)   # progress every 1 s
    try:
        [y] = client.run(plan, [X], refresh=lambda: plan)          # sent without waiting; its plan compiles there
        frames = []
        recv = client._reader.recv

        def recording(*args, **kwargs):
            frames.append(recv(*args, **kwargs)[0])
            return frames[-1], []
        monkeypatch.setattr(client._reader, "recv", recording)
        assert select.select([client._socket], [], [], TIMEOUT)[0]   # a progress frame came: it compiles there
        client.close()
        replies = [f for f in frames if "progress" not in f]
        assert len(replies) == 2 and frames[-1] == {"ok": True} and len(frames) > 2, frames  # the run's, the close's
    finally:
        client.close()
        endpoint.close()
    assert wait_released(runtime) == 0


def test_a_large_run_sent_while_the_service_compiles_the_one_before_keeps_the_connection(runtime, plan_builder,
                                                                                          monkeypatch):
    """A client sends a run without waiting for the reply to the one before; while that one's plan compiles the
    service reads nothing, so a run whose arguments fill the socket's buffers waits in its send. The client's
    timeout bounded the whole send: it gave the connection up after it, and the service released the client's
    objects (found by fault-finding). The frames saying the service still compiles now keep the send waiting,
    as they keep a wait for a reply. The timeout is half of what this compile takes here, so the frames come an
    eighth of it apart; the test checks that such frames came while the run was being sent."""
    timeout = max(1.0, compile_seconds())                          # the plan's function is twice as long

    def twice_slow_plus(x, y):
        return slow_to_compile(slow_to_compile(x)) + y[0]

    p = plan_builder(runtime.resources.topology)
    a = p.slice("a", (1,), ("x",), "island0", (0, 1))
    plan = p.build([p.launch(twice_slow_plus, [p.input((8, 16), a), p.input((1 << 20,), a)], a, [(), ()])])
    y = np.ones(1 << 20, np.float32)                               # 4 MiB: more than the sockets' buffers hold
    endpoint = Endpoint(runtime)
    client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=timeout)
    try:
        # Each sent without waiting for its reply (as the front end sends them, able to lower the plan again).
        [first] = client.run(plan, [X, y], refresh=lambda: plan)       # its plan compiles on the service's thread
        [second] = client.run(plan, [X, y * 2], refresh=lambda: plan)  # sent meanwhile
        frames = []
        recv = client._reader.recv

        def recording(*args, **kwargs):
            frames.append(recv(*args, **kwargs))
            return frames[-1]
        monkeypatch.setattr(client._reader, "recv", recording)
        want = np.asarray(jax.jit(lambda x: slow_to_compile(slow_to_compile(x)))(X))
        np.testing.assert_allclose(np.asarray(first), want + 1, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(second), want + 2, rtol=1e-5)
        assert any("progress" in header for header, _ in frames)    # the send outlasted a progress interval
    finally:
        client.close()
        endpoint.close()


def test_attacks_run_nothing_and_later_clients_still_connect(runtime, tmp_path, plan_builder):
    plan, want = program(plan_builder, runtime.resources.topology)
    control, target = tmp_path / "control", tmp_path / "pwned"
    pickle.loads(pickle.dumps(Payload(control))).close()
    assert control.exists()                          # the payload is live: unpickling it creates a file
    payload = pickle.dumps(Payload(target))
    endpoint = Endpoint(runtime, limits=Limits(handshake_timeout=1.0))
    opened, procs = [], []
    try:
        live = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)   # served all along
        opened.append(live._socket)
        for first_bytes in (b"", b"PWE1" + bytes(10)):                       # half-open connections
            s = unix(endpoint.address)
            s.sendall(first_bytes)
            opened.append(s)

        old = mpc.Client(endpoint.address)           # the old multiprocessing-connection style
        old.send(Payload(target))
        wait_dropped(socket.socket(fileno=os.dup(old.fileno())))
        old.close()
        with pytest.raises((OSError, EOFError, mpc.AuthenticationError)):
            mpc.Client(endpoint.address, authkey=b"pathways-mlir")            # the old public key

        raw = unix(endpoint.address)
        raw.sendall(payload)
        wait_dropped(raw)
        raw.close()

        with pytest.raises(AuthenticationError, match="refused the key"):
            RemoteClient(endpoint.address, key=secrets.token_bytes(32))
        (tmp_path / "wrong.key").write_text(secrets.token_hex(32))
        with pytest.raises(AuthenticationError):
            RemoteClient(endpoint.address, key_path=str(tmp_path / "wrong.key"))

        # Even with the key: pickle is not a frame, and oversized or object arrays are refused.
        for frame, error in [(raw_frame(payload), "not JSON"),
                             (raw_frame(b'{"op":"run","name":"p","dispatch":"parallel",'
                                        b'"arrays":[["float32",[1099511627776]]]}'), "over the limit"),
                             (raw_frame(b'{"op":"run","arrays":[["object",[1]]]}'), "not allowed")]:
            insider = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
            insider._socket.sendall(frame)
            reply, _ = recv_message(insider._socket)
            assert reply["ok"] is False and error in reply["error"]
            wait_dropped(insider._socket)
            insider._socket.close()

        for request, error in [({"op": "exec", "code": "print(1)"}, "unknown request 'exec'"),
                               ({"op": ["run"]}, r"unknown request \"\['run'\]\""),
                               ({"op": "fetch", "handle": "0"}, "needs 'handle' as int"),
                               ({"op": "fetch", "handle": 7}, "no handle 7"),
                               ({"op": "load", "plan": "{}"}, "needs 'plan' as dict"),
                               ({"op": "load", "plan": {}, "executables": []}, "PlanError: plan: missing .topology."),
                               ({"op": "load", "plan": {}, "executables": ["f"]}, "one array of bytes"),
                               ({"op": "run", "name": "p", "dispatch": "parallel"}, "no plan is loaded"),
                               ({"op": "run", "name": live.load(plan), "dispatch": "parallel"},
                                "needs 'version' as int"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [["file", 0]]},
                                r"an argument must be \[\"array\", index\], \[\"handle\", key\] or \[\"shared\", token\]"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [["shared", 0]]}, r"or \[\"shared\", token\], not \['shared', 0\]"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [["shared", "guess"]]}, "^no shared object has the reference"),
                               ({"op": "share", "handle": 7}, "no handle 7"),
                               ({"op": "shared", "token": 7}, "needs 'token' as str"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [["array", 0]]},
                                "argument array 0 is not in the request's 0 arrays"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [], "timeout": -1}, "a run's timeout must be a positive number of seconds"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [], "keys": [3, 3]}, r"needs 'keys' as distinct integers in \[0, 2\*\*53\)"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [], "keys": [2 ** 60]}, r"needs 'keys' as distinct integers"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [], "keys": "7"}, r"needs 'keys' as distinct integers"),
                               ({"op": "run", "name": live.load(plan), "version": 0, "dispatch": "parallel",
                                 "args": [], "keys": [5, 6, 7, 8]}, r"chose 4 keys for a plan of \d distinct results"),
                               ({"op": "objects", "release": ["0"]}, "'release' must be a list of handle keys"),
                               ({"op": "status", "release": [5, 6]}, None)]:
            if error is None:
                assert live._call(request)[0]["status"]["scheduler"]["queued"] == []   # unknown keys: ignored
                continue
            with pytest.raises(RemoteError, match=error):
                live._call(request)
        with pytest.raises(TopologyChanged, match="lowered for topology version 5; the cluster's is 0"):
            live._call({"op": "run", "name": live.load(plan), "version": 5, "dispatch": "parallel", "args": []})
        assert live.object_count() == 0              # bad requests leave the connection serving

        assert not target.exists()
        procs.append(start_remote(endpoint, tmp_path, plan, "later", "close"))
        out, _ = procs[0].communicate(timeout=TIMEOUT)
        assert procs[0].returncode == 0 and out.split() == ["1"]
        np.testing.assert_allclose(np.load(tmp_path / "later.npy"), want, rtol=1e-6)
        live.close()
        for s in opened[1:]:
            wait_dropped(s)                          # the handshake timeout dropped the half-open ones
        assert not target.exists()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
        endpoint.close()
        for s in opened:
            s.close()
    assert not endpoint_threads()
    assert wait_released(runtime) == 0


def test_a_zero_size_array_whose_other_dimensions_overflow_is_refused_in_one_line(runtime):
    """[0, 2**64] holds 0 bytes, but NumPy cannot make the array: the service says so, not a dropped socket."""
    with Endpoint(runtime) as endpoint:
        for shape in (b"[0,18446744073709551616]", b"[0,4294967296,4294967296]"):
            insider = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
            insider._socket.sendall(raw_frame(b'{"op":"ping","arrays":[["float32",' + shape + b']]}'))
            reply, _ = recv_message(insider._socket)
            assert reply["ok"] is False and "over the limit" in reply["error"] and \
                "counting its dimensions other than 0" in reply["error"]
            wait_dropped(insider._socket)
            insider._socket.close()
        with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as later:
            assert later.object_count() == 0


def test_a_timeout_that_is_not_a_finite_number_is_refused_by_name(runtime):
    """Python's JSON reads Infinity, and integers of hundreds of digits no float holds: a fetch or share whose
    timeout was one of these was served (Infinity) or failed with an OverflowError, not a refusal naming it."""
    double = pw.jit(lambda x: 2 * x, slice=pw.virtual_slice(1, axes="d", island="island0"), in_specs=None,
                    out_specs=None)
    with Endpoint(runtime) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        held = double.compiled(X, runtime=client)(X)
        held.block_until_ready()                 # (its run's reply, read with this request: the socket is quiet)
        assert client.object_count() == 1
        for op in (b"fetch", b"share"):
            for timeout in (b"Infinity", b"NaN", b"1" + b"0" * 400):
                header = b'{"op":"%s","handle":%d,"timeout":%s}' % (op, held._key, timeout)
                with client._lock:
                    client._socket.sendall(raw_frame(header))
                    reply, _ = recv_message(client._socket)
                assert reply["ok"] is False and reply["kind"] == "value" and reply["error"].startswith(
                    f"request '{op.decode()}' needs 'timeout' as a non-negative number or null, not "), reply
        np.testing.assert_allclose(np.asarray(held), 2 * X)          # the connection and its result stay


def test_a_result_over_the_endpoints_array_limit_is_an_error_and_the_client_keeps_its_objects(runtime):
    """The endpoint cannot send the value (default: over 4 GiB): the fetch says so in one line, and the
    connection, and the client's objects, stay."""
    tile = pw.jit(lambda x: jnp.tile(x, (40, 1)), slice=pw.virtual_slice(1, axes="d", island="island0"),
                  in_specs=None, out_specs=None)
    with Endpoint(runtime, limits=Limits(max_array_bytes=4096)) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        held = tile.compiled(X, runtime=client)(X)                   # 20480 bytes, from 512
        with pytest.raises(RemoteError, match="the reply cannot be sent: arrays of 20480 bytes are over the "
                                              "endpoint's limit of 4096"):
            np.asarray(held)
        held.block_until_ready()                                     # no value sent: fine
        assert client.object_count() == 1


def test_clients_in_other_processes_share_the_cluster(runtime, tmp_path, plan_builder):
    plan, want = program(plan_builder, runtime.resources.topology)
    endpoint = Endpoint(runtime)
    procs = []
    try:
        procs = [start_remote(endpoint, tmp_path, plan, "clean", "close"),
                 start_remote(endpoint, tmp_path, plan, "killed", "hold")]
        assert read_line(procs[1]).split() == ["1"]          # each sees only its own object
        out, _ = procs[0].communicate(timeout=TIMEOUT)
        assert procs[0].returncode == 0 and out.split() == ["1"]
        for name in ("clean", "killed"):
            np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), want, rtol=1e-6)
        assert runtime.object_count() >= 1                   # the second process still holds its result
        procs[1].kill()                                      # dies mid-session
        procs[1].wait(timeout=30)
        assert wait_released(runtime) == 0 and runtime.object_count() == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
        endpoint.close()


def test_remote_handles_behave_like_handles_and_go_when_dropped(runtime, plan_builder):
    plan, want = program(plan_builder, runtime.resources.topology)
    endpoint = Endpoint(runtime)
    one = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
    two = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
    try:
        name = one.load(plan)
        assert name == hashlib.sha256(plan.to_json().encode()).hexdigest() == two.load(plan) == one.load(plan)
        assert len(endpoint._plans) == 1                   # one parsed, loaded plan for every connection
        runtime.scheduler.hold()
        [h] = one.run(plan, [X])
        assert (h.shape, h.dtype, h.ndim) == ((8, 16), np.float32, 2)
        with pytest.raises(TimeoutError, match="not ready within 0.2 s"):
            h.result(timeout=0.2)
        assert h.is_ready() is False and h.is_deleted() is False
        runtime.scheduler.release()
        until(h.is_ready, "the released run over", TIMEOUT)
        value = h.result(timeout=TIMEOUT)
        assert isinstance(value, jax.Array)
        np.testing.assert_allclose(value, want, rtol=1e-6)
        assert h.block_until_ready() is h
        np.testing.assert_allclose(h[1], want[1], rtol=1e-6)
        np.testing.assert_allclose(h.sum(axis=0), np.asarray(want).sum(axis=0), rtol=1e-5)   # a method on the value
        assert isinstance(np.float64(2) * h, jax.Array) and (np.ones(h.shape) + h).dtype == np.float32  # as JAX's
        assert h.aval.shape == (8, 16) and h.aval.dtype == np.float32
        # Where it lies is where its value, fetched, would: said without fetching it.
        fetch = one._polled
        one._polled = lambda *a: pytest.fail("read where the value lies by fetching it")
        where = (h.sharding, h.device, h.devices(), h.committed, h.is_fully_replicated)
        one._polled = fetch
        assert where == (value.sharding, value.device, value.devices(), value.committed, value.is_fully_replicated)

        [again] = one.run(plan, [h])                       # a result as an argument stays on the cluster
        np.testing.assert_allclose(np.asarray(again), np.sin(np.asarray(want) * 3 - 1) ** 2, rtol=1e-5)
        with pytest.raises(ValueError, match=r"^argument 0 of program @\w+ is a remote handle of another connection: "
                                             r"pass its owner's read-only reference, owner\.share\(handle\), instead$"):
            two.run(plan, [h])
        with pytest.raises(RemoteError, match="'timeout' as a non-negative number or null"):
            one._call({"op": "fetch", "handle": h._key, "timeout": -1})
        with pytest.raises(RemoteError, match=r"^no handle: a handle's key is an integer from 0 to 2\*\*53 - 1$"):
            one._call({"op": "fetch", "handle": 10 ** 4000})
        assert (one.object_count(), two.object_count()) == (2, 0)

        del again                                          # dropped: released at once, the connection is free
        assert one.object_count() == 1
        h.delete()
        h.delete()                                         # twice is harmless
        assert h.is_deleted()
        with pytest.raises(ValueError, match="was released"):
            np.asarray(h)
        assert one.object_count() == 0
        [kept] = one.run(plan, [X])
        one.close()
        kept.delete()                                      # after closing: closing released it already
        with pytest.raises(ServiceError, match="the connection to the service at unix:.* is closed"):
            one.run(plan, [X])
    finally:
        runtime.scheduler.release()
        one.close()
        two.close()
        endpoint.close()
    assert wait_released(runtime) == 0 and runtime.object_count() == 0


def test_dropped_handles_are_released_with_the_next_request_or_soon_after(runtime, plan_builder, monkeypatch):
    """A dropped remote handle's release goes with the connection's next request, or the keep-alive thread sends
    it within `RELEASE_DELAY`: dropping 100 handles sends a few requests, not 100, and none waits for a reply.
    A deleted one's release is sent at once, its reply read with a later request's; every later reply still
    answers its own request."""
    from pathways_mlir.runtime import remote_client

    plan, want = program(plan_builder, runtime.resources.topology)
    endpoint = Endpoint(runtime)
    client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
    sent, events = [], []                                   # sent: the requests; events: "s" sent, "r" read
    real_send, real_receive = remote_client.send_message, client._reader.recv
    monkeypatch.setattr(remote_client, "send_message",
                        lambda sock, header, *a, **k: sent.append(header) or events.append("s")
                        or real_send(sock, header, *a, **k))
    monkeypatch.setattr(client._reader, "recv", lambda *a, **k: events.append("r") or real_receive(*a, **k))
    try:
        handles = [h for _ in range(200) for h in client.run(plan, [X])]
        handles[-1].block_until_ready()
        assert client.object_count() == 200
        events.clear()
        for h in handles[:100]:
            h.delete()
        del h
        assert events.count("s") == 100                     # deleted: one release each, sent at once
        unanswered = max(len(sends) for sends in "".join(events).split("r"))
        assert unanswered <= remote_client.UNANSWERED      # replies read as they come, at the latest once that
                                                            # many were unread
        assert client.object_count() == 100                # the releases were served before the question

        sent.clear()
        handles.clear()                                     # the other 100 dropped: the keep-alive thread sends them
        deadline = time.monotonic() + TIMEOUT
        while runtime.object_count() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runtime.object_count() == 0
        assert 1 <= len(sent) < 20 and all(r["op"] == "release" for r in sent)
        assert sum(len(r["release"]) for r in sent) == 100

        [one, two] = client.run(plan, [X]) + client.run(plan, [X])
        monkeypatch.setattr(remote_client, "RELEASE_DELAY", TIMEOUT)   # the keep-alive thread leaves it to the run
        sent.clear()
        key = one._key
        del one                                             # dropped: the next request carries its release
        [again] = client.run(plan, [two])
        assert sent[0]["op"] == "run" and sent[0]["release"] == [key]
        np.testing.assert_allclose(np.asarray(again), np.sin(np.asarray(want) * 3 - 1) ** 2, rtol=1e-5)
        assert client.object_count() == 2
    finally:
        client.close()
        endpoint.close()
    assert wait_released(runtime) == 0 and runtime.object_count() == 0


def test_programs_are_lowered_for_the_endpoint_and_again_when_its_topology_changes(runtime):
    s = pw.virtual_slice(2, axes="d")
    block = pw.jit(lambda x: jnp.tanh(x) * 2.0, slice=s, in_specs=P("d"), out_specs=P("d"))

    @pw.program
    def step(x):
        return block(block(x))

    want = np.tanh(np.tanh(X) * 2.0) * 2.0
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        compiled = step.compiled(X, runtime=remote)
        assert compiled.runtime is remote and compiled.plan.topology == runtime.resources.topology
        with pytest.raises(NotImplementedError, match=r"runs on devices of another process"):
            compiled.input_shardings
        np.testing.assert_allclose(np.asarray(step.run(X, client=remote)), want, rtol=1e-6)
        first = compiled.plan
        [used] = [island for island, steps in first.islands.items() if steps]
        runtime.lose_island(used)                          # the service's topology changes under the client
        np.testing.assert_allclose(np.asarray(step.run(X, client=remote)), want, rtol=1e-6)
        assert compiled.plan is not first and used not in [i.name for i in compiled.plan.topology.islands]
        assert step.compiled(X, runtime=remote) is compiled


def test_a_step_of_hundreds_of_results_called_without_reading_them_keeps_the_connection(runtime):
    """Each run's reply named every result (`[key, shape, dtype]`), though the client chose their keys: 64
    unread replies of a step of 256 results filled the socket while the client, sending its next run, read none
    of them, and both ends waited until the client gave the connection up, its objects with it (an optimizer's
    or a pipeline's state stepped in a loop; found by a fault finder). Such a reply says `ok` alone now."""
    width = 256
    step = pw.jit(lambda state, x: {f"w{i}": state[f"w{i}"] + x for i in range(width)},
                  slice=pw.virtual_slice(1, axes="d"))
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=20) as remote:
        state = {f"w{i}": np.zeros(2, np.float32) for i in range(width)}
        for _ in range(100):
            state = step.run(state, np.float32(1), client=remote)
        np.testing.assert_array_equal(np.asarray(state["w0"]), [100, 100])


def test_runs_refused_one_after_another_without_their_replies_read_keep_the_connection(runtime):
    """Every run refused (over the connection's `max_objects`), none read: 50-odd error replies unread filled
    the socket while the client sent its next run, and both ends waited for good (found by a review). The
    client reads the replies that came before each run it sends without waiting."""
    width = 256
    step = pw.jit(lambda state, x: {f"w{i}": state[f"w{i}"] + x for i in range(width)},
                  slice=pw.virtual_slice(1, axes="d"))
    with Endpoint(runtime, limits=Limits(max_objects=100)) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=20) as remote:
        state = {f"w{i}": np.zeros(2, np.float32) for i in range(width)}
        results = [step.run(state, np.float32(1), client=remote) for _ in range(300)]
        for result in (results[0], results[-1]):
            with pytest.raises(RemoteError, match=r"would make it hold 256, over the endpoint's limit "
                                                  r"\(max_objects\)"):
                np.asarray(result["w0"])


def test_runs_in_flight_are_sent_without_waiting_and_a_refused_one_raises_where_it_is_used(runtime):
    """A program's runs through a service are sent without waiting for their replies (the client chose their
    result keys): eight in flight wait for no reply (those that came are read before each send, waiting for
    none: the last stays unanswered), and their values come back right. A run the
    service refuses (a handle donated there, passed again) makes its handle raise the line the call raises
    in-process, where it is read or passed on; the connection goes on serving."""
    s = pw.virtual_slice(2, axes="d")
    double = pw.jit(lambda x: x * 2.0, slice=s, in_specs=P("d"), out_specs=P("d"))
    eat = pw.jit(lambda x: x + 1.0, slice=s, in_specs=P("d"), out_specs=P("d"), donate_argnums=0)
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        np.asarray(double.run(X, client=remote))          # the plan loaded, its reply read
        outs = [double.run(X * k, client=remote) for k in range(8)]
        assert 1 <= len(remote._unanswered) <= 8
        for k, out in enumerate(outs):
            np.testing.assert_allclose(np.asarray(out), X * k * 2.0)
        donated = double.run(X, client=remote, timeout=TIMEOUT)   # a run with a timeout waits for its reply,
        eat.run(donated, client=remote).block_until_ready()        # and so does a donation; their keys are the
        #                                                            client's too, never one it chooses later
        refused = double.run(donated, client=remote)            # passed again: refused by the service, later
        line = r"^handle to buffer \d+ of run \d+ was donated to program @lambda: a donated handle cannot be used again$"
        with pytest.raises(ValueError, match=line):
            refused.result(TIMEOUT)
        with pytest.raises(ValueError, match=line):
            double.run(refused, client=remote).result(TIMEOUT)
        del outs, out, donated, refused
        np.testing.assert_allclose(np.asarray(double.run(X, client=remote)), X * 2.0)
        until(lambda: remote.object_count() == 0, "every result released", TIMEOUT)


def test_a_run_read_with_requests_behind_it_is_launched_by_its_islands_executor(runtime, monkeypatch):
    """The session's thread launched every run it served, so the runs a client had sent behind a run waited for
    its launches (arguments placed, copies, XLA's dispatch; 8 runs in flight are 1.18x faster now on a quiet
    machine). A run whose session has read another run behind it already is launched by its island's executor
    while the session serves that; a run alone in the socket, or with its fetch behind it, is still launched by
    the session's thread, which saves two handoffs."""
    from pathways_mlir.runtime.island_program import LaunchInstruction

    threads = []                              # the thread of every launch (the real one runs)
    launch = LaunchInstruction.execute

    def recorded(self, *args):
        threads.append(threading.current_thread().name)
        return launch(self, *args)

    monkeypatch.setattr(LaunchInstruction, "execute", recorded)
    double = {island: pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice(1, axes="d", island=island), in_specs=None,
                             out_specs=None) for island in ("island0", "island1")}
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        names = {island: remote.load(f.compiled(X, runtime=remote).plan) for island, f in double.items()}

        def run(island: str, key: int) -> dict:
            return {"op": "run", "name": names[island], "version": remote.resources.version, "dispatch": "parallel",
                    "args": [["array", 0]], "keys": [key]}

        with remote._lock:
            send_message(remote._socket, run("island0", 1000), [X])     # alone: replied to before more is sent
            assert recv_message(remote._socket)[0]["ok"]
            frames = _Frames()
            for request, arrays in ((run("island0", 1001), [X]), (run("island1", 1002), [X]),
                                    ({"op": "fetch", "handle": 1002}, [])):
                send_message(frames, request, arrays)
            remote._socket.sendall(frames.data)                         # one write: the session reads them at once
            replies = [recv_message(remote._socket) for _ in range(3)]
        assert all(reply["ok"] for reply, _ in replies), replies
        np.testing.assert_allclose(replies[2][1][0], X * 2.0)
        # 1001, a run read behind it: island0's executor; 1002, its fetch behind it: the session's thread.
        assert sorted(threads) == ["pw-endpoint-connection", "pw-endpoint-connection", "pw-island0"], threads


def test_runs_in_flight_when_the_topology_changes_are_lowered_again_and_sent_in_order(runtime):
    """Runs sent without waiting that the service refuses because its topology changed (an island lost) are
    lowered again and sent again with their keys, in order: a chain of them, each taking the one before,
    gives plain JAX's values."""
    s = pw.virtual_slice(2, axes="d")
    block = pw.jit(lambda x: jnp.tanh(x) * 2.0, slice=s, in_specs=P("d"), out_specs=P("d"))
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        compiled = block.compiled(X, runtime=remote)
        first = np.asarray(block.run(X, client=remote))
        [used] = [island for island, steps in compiled.plan.islands.items() if steps]
        runtime.lose_island(used)
        chain = [block.run(X, client=remote)]
        for _ in range(3):
            chain.append(block.run(chain[-1], client=remote))
        want = X
        for value in chain:
            want = np.tanh(want) * 2.0
            np.testing.assert_allclose(np.asarray(value), want, rtol=1e-6)
        np.testing.assert_allclose(first, np.tanh(X) * 2.0, rtol=1e-6)
        assert used not in [i.name for i in compiled.plan.topology.islands]


def test_an_argument_of_another_dtype_is_refused_when_its_run_is_submitted(runtime):
    """A run sent to the service with an argument of another dtype than its plan's is refused at once, in the
    line `Compiled.__call__` gives in-process (the same check, in the dispatcher), not later on the island;
    float64 passes as float32 (no x64), as in JAX. A client holding a plan is refused the same way."""
    tanh = pw.jit(lambda x: jnp.tanh(x) * 2.0, slice=pw.virtual_slice(2, axes="d"), in_specs=P("d"),
                  out_specs=P("d"))
    want = np.tanh(X) * 2.0
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        plan = tanh.compiled(X, runtime=remote).plan
        local = pw.Client(runtime)
        for dtype in (np.int8, np.bool_, jnp.bfloat16):
            error = (f"argument leaf 0 of program @lambda has dtype {np.dtype(dtype).name}, but it was compiled "
                     f"for float32[8, 16]")
            with pytest.raises(RemoteError, match=f"^{re.escape(error)}$") as refused:
                remote.run(plan, [X.astype(dtype)])
            assert isinstance(refused.value, TypeError)
            with pytest.raises(TypeError, match=re.escape(error)):
                local.run(plan, [X.astype(dtype)])
        assert remote.object_count() == 0 and local.objects() == []
        [y] = remote.run(plan, [X.astype(np.float64)])
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
        assert np.asarray(y).dtype == np.float32
        local.close()


def test_a_handshake_dropped_past_the_per_process_limit_says_so(runtime):
    """A process opening more connections at once than the endpoint completes handshakes for has the oldest
    dropped, by design: that client is told so, not that its key was refused. The newer one is served."""
    with Endpoint(runtime, limits=Limits(max_pending_per_peer=1)) as endpoint:
        key = bytes.fromhex(open(endpoint.key_path).read().strip())
        first = unix(endpoint.address)
        assert select.select([first], [], [], 30)[0]        # accepted: its handshake is under way
        second = unix(endpoint.address)                     # the same process: the first is dropped
        hello = second.recv(36, socket.MSG_PEEK | socket.MSG_WAITALL)
        assert len(hello) == 36
        with pytest.raises(AuthenticationError, match="the endpoint dropped the handshake: too many connections "
                                                      r"from this process \(or host\) were completing their "
                                                      "handshakes at once; open fewer at a time"):
            client_handshake(first, key)
        client_handshake(second, key)
        welcome, _ = recv_message(second)
        assert welcome["ok"] is True
        first.close()
        second.close()
        with pytest.raises(AuthenticationError, match="the endpoint refused the key"):   # a wrong key: as before
            RemoteClient(endpoint.address, key=secrets.token_bytes(32))


def scaled(plan_builder, topology, k: float):
    """A one-launch plan on island0 computing x * k: a distinct plan (and name) per `k`."""
    p = plan_builder(topology)
    a = p.slice("a", (2,), ("x",), "island0", (0, 2))
    return p.build([p.launch(lambda x: x * k, [p.input((8, 16), a, [("x",), ()])], a, [("x",), ()])])


def test_a_plan_its_client_drops_is_forgotten_while_the_connection_stays_open(runtime, plan_builder):
    """A remote client kept every plan it sent, and its connection every plan it loaded, until it closed: a
    client making programs as it went grew on both sides for good. Once nothing holds a plan in the client,
    the endpoint forgets it (with the next request, or soon after), as the embedded runtime does (a client
    keeps its runs until it sees them over: the next run lets go of those); a plan loaded twice (two plan
    objects of one name) goes with the last."""
    import gc

    def forgotten_but(plan, k, what):
        def only_it_left():
            runtime.usage()                              # retires the runs that are over (a run holds its plan)
            gc.collect()
            return list(endpoint._plans.values()) == [plan] and len(runtime._loaded) == 1
        gc.collect()
        runtime.usage()
        # the next run carries the names of the plans gone, and lets go of the client's runs over
        np.testing.assert_allclose(np.asarray(client.run(plan, [X])[0]), X * k, rtol=1e-6)
        until(only_it_left, what, TIMEOUT)
        assert len(client._names) == 1

    with Endpoint(runtime) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        for k in range(12):
            plan = scaled(plan_builder, runtime.resources.topology, float(k))
            [h] = client.run(plan, [X])
            np.testing.assert_allclose(np.asarray(h), X * k, rtol=1e-6)
            del plan, h
        twin, again = (scaled(plan_builder, runtime.resources.topology, 99.0) for _ in range(2))
        np.testing.assert_allclose(np.asarray(client.run(twin, [X])[0]), X * 99, rtol=1e-6)
        del twin
        forgotten_but(again, 99, "the dropped plans forgotten, not one whose twin is held")
        del again
        forgotten_but(scaled(plan_builder, runtime.resources.topology, 7.0), 7, "the last of two twins forgotten")


def test_a_connection_pw_connect_made_is_freed_once_closed(runtime, tmp_path):
    """Each pw.connect() and close() kept the connection alive on the client's side (+0.31 MB a cycle): the
    stages of a placed function called through it held it (a connection is its own runtime), and each connect
    registered one more atexit handler."""
    import atexit
    import gc
    import weakref

    from pathways_mlir.runtime.service import Service

    double = pw.jit(lambda x: x * 2, slice=pw.virtual_slice(2, axes="d"))
    (tmp_path / "service").mkdir(mode=0o700)
    service = Service(runtime, service_file=str(tmp_path / "service" / "service.json"))
    try:
        handlers = None
        for _ in range(3):
            remote = pw.connect(service.service_file, timeout=TIMEOUT)
            np.testing.assert_allclose(np.asarray(double(X)), X * 2, rtol=1e-6)
            if handlers is None:
                handlers = atexit._ncallbacks()
            remote.close()
            closed = weakref.ref(remote)
            del remote
            gc.collect()
            assert closed() is None, "the connection closed is still alive"
        assert atexit._ncallbacks() == handlers
    finally:
        service.close()


def test_a_connection_that_broke_is_freed_once_closed(runtime):
    """A connection whose service went away was marked closed as it broke, and its `close()` then returned before
    dropping what the process kept for it: the stages of a placed function called through it held it for good."""
    import gc
    import weakref

    double = pw.jit(lambda x: x * 2, slice=pw.virtual_slice(2, axes="d"))
    endpoint = Endpoint(runtime)
    remote = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
    np.testing.assert_allclose(np.asarray(double(X, client=remote)), X * 2, rtol=1e-6)
    endpoint.close()
    with pytest.raises(ServiceError):
        np.asarray(double(X, client=remote))       # it breaks
    remote.close()
    closed = weakref.ref(remote)
    del remote
    gc.collect()
    assert closed() is None, "the connection that broke is still alive"


def test_a_connection_holds_at_most_max_plans(runtime, plan_builder):
    """A connection could load plans without bound, each kept by the endpoint until it closed."""
    with Endpoint(runtime, limits=Limits(max_plans=3)) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        held = [scaled(plan_builder, runtime.resources.topology, float(k)) for k in range(4)]
        for plan in held[:3]:
            client.load(plan)
        client.load(held[0])                           # loaded already: no more held
        with pytest.raises(ValueError, match=r"^this connection holds 3 plans, the endpoint's limit "
                                             r"\(max_plans\)"):
            client.load(held[3])
        np.testing.assert_allclose(np.asarray(client.run(held[1], [X])[0]), X, rtol=1e-6)


def test_a_connection_holds_at_most_max_objects_results(runtime, plan_builder):
    """A connection could hold results without bound: 30,001 results of 0 bytes reserved no device memory and
    grew the service by 127 MB (found by fault-finding). A run that would take a connection past `max_objects`
    is refused in one line, naming the limit; a result released makes room again."""
    plan, _ = program(plan_builder, runtime.resources.topology)
    with Endpoint(runtime, limits=Limits(max_objects=3)) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        held = [client.run(plan, [X])[0] for _ in range(3)]
        with pytest.raises(ValueError, match=r"^this connection holds 3 results; a run of .* would make it hold 4, "
                                             r"over the endpoint's limit \(max_objects\)"):
            client.run(plan, [X])
        held.pop().delete()
        client.object_count()                          # (the release goes with a request)
        np.asarray(client.run(plan, [X])[0])


def test_a_result_shared_again_keeps_its_one_token(runtime, plan_builder):
    """Each share of the same result made another token, which the endpoint kept until the result was released:
    sharing one result in a loop grew the service without bound (found by fault-finding). Its token is now
    made once, and given again."""
    plan, _ = program(plan_builder, runtime.resources.topology)
    with Endpoint(runtime) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        [result] = client.run(plan, [X])
        tokens = {client.share(result).token for _ in range(5)}
        assert len(tokens) == 1 and len(endpoint._shared) == 1
        result.delete()
        client.object_count()                          # (the release goes with a request)
        assert not endpoint._shared


def test_a_connection_holds_plans_of_at_most_max_plan_bytes(runtime, plan_builder):
    """Under `max_plans` alone, a connection could hold 4096 plans of up to 8 MiB of JSON each, with their
    compiled functions: 300 distinct 0.5 MB plans grew the service by 430 MB. Their bytes together are now
    bounded, and a plan forgotten gives its bytes back."""
    import gc

    topology = runtime.resources.topology
    size = len(scaled(plan_builder, topology, 0.0).to_json())
    with Endpoint(runtime, limits=Limits(max_plan_bytes=int(2.5 * size))) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        zero, one, two = (scaled(plan_builder, topology, float(k)) for k in range(3))
        client.load(zero)
        client.load(one)
        with pytest.raises(ValueError, match=r"^this connection holds plans of \d+ bytes, and this one of \d+ "
                                             r"bytes would pass the endpoint's limit of \d+ \(max_plan_bytes\)"):
            client.load(two)
        np.testing.assert_allclose(np.asarray(client.run(one, [X])[0]), X, rtol=1e-6)
        del zero
        gc.collect()
        until(lambda: len(endpoint._plans) == 1, "the dropped plan forgotten by the service", TIMEOUT)
        np.testing.assert_allclose(np.asarray(client.run(two, [X])[0]), X * 2, rtol=1e-6)


def test_a_plan_for_devices_the_cluster_lacks_is_refused_at_load(runtime, plan_builder):
    """A plan placed on devices the service's cluster does not have was kept at `load`, and refused only
    when it ran. It is now refused when it is loaded, as a run of it is: `TopologyChanged` (the client lowers
    its program again), and the connection holds nothing for it."""
    import gc

    p = plan_builder(Topology.uniform(2, 8))
    a = p.slice("a", (8,), ("x",), "island0", (0, 8))
    plan = p.build([p.launch(affine, [p.input((8, 16), a, [("x",), ()])], a, [("x",), ()])])
    with Endpoint(runtime) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        with pytest.raises(TopologyChanged, match=r"^plan @\w+ places slice 'a' on devices \[0, 8\) of 'island0', "
                                                  r"which the cluster does not have"):
            client.load(plan)
        until(lambda: gc.collect() >= 0 and not endpoint._plans, "the refused plan not kept", TIMEOUT)


def test_a_plan_is_kept_while_a_connection_that_loaded_it_is_open(runtime, plan_builder):
    """The endpoint kept every distinct plan any connection loaded, and the runtime its programs and
    executables: a service that clients sent new programs grew for good. They now go with the last
    connection that loaded them, without a cyclic garbage collection, which an idle service may never run
    (a session held its request table of bound methods, a cycle that kept its plans after it ended; found by
    a soak of pw-serve)."""
    import gc

    def forgotten():
        runtime.usage()                                  # retires the runs that are over (a run holds its plan)
        # The islands last: whichever thread forgets the plan takes it from the runtime first.
        return len(endpoint._plans) == 0 and len(runtime._loaded) == 0 and \
            all(not island._plans for island in runtime.islands.values())

    plan, want = program(plan_builder, runtime.resources.topology)
    gc.collect()
    gc.disable()
    try:
        with Endpoint(runtime) as endpoint:
            with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as one, \
                    RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as two:
                for client in (one, two):
                    [h] = client.run(plan, [X])
                    np.testing.assert_allclose(np.asarray(h), want, rtol=1e-6)
                assert len(endpoint._plans) == 1 and len(runtime._loaded) == 1
                one.close()
                assert len(endpoint._plans) == 1                 # the other connection still has it
            del h, client
            until(forgotten, "the plan forgotten once the connections closed", TIMEOUT)
    finally:
        gc.enable()


init_with_key = pw.jit(lambda x: {"w": x * 2.0, "b": x[0] + 1.0, "key": jax.random.key(7)},
                       slice=pw.virtual_slice(2, axes="d"), in_specs=P("d"),
                       out_specs={"w": P("d"), "b": P("d"), "key": P()})


def counted_fetches(monkeypatch) -> list[bool]:
    """Records each remote handle's fetch (its `value` flag: True for a whole value) in the list returned."""
    from pathways_mlir.runtime.remote_client import RemoteHandle

    fetched, fetch = [], RemoteHandle._fetch
    monkeypatch.setattr(RemoteHandle, "_fetch", lambda h, timeout, value: (fetched.append(value),
                                                                            fetch(h, timeout, value))[1])
    return fetched


def test_orbax_saves_a_services_handles_fetching_each_value_once(runtime, tmp_path, monkeypatch):
    """Orbax reads an array's sharding and shards nine times in a save; a service's handle fetched its whole
    value for each. Each is now read once, and the checkpoint restores the values as JAX arrays."""
    import orbax.checkpoint as ocp

    fetched = counted_fetches(monkeypatch)
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        params = init_with_key.run(X, client=remote)
        state = {"params": params, "plain": jnp.arange(3.0)}          # a JAX array saved beside them
        ocp.PyTreeCheckpointer().save(tmp_path / "state", state)
        assert fetched.count(True) == 3                                 # a key handle's key data too
        with pytest.warns(UserWarning, match="Sharding info not provided"):      # Orbax's, without a target
            restored = ocp.PyTreeCheckpointer().restore(tmp_path / "state")
        assert all(isinstance(v, jax.Array) for v in jax.tree.leaves(restored))
        np.testing.assert_array_equal(restored["params"]["w"], X * 2.0)
        np.testing.assert_array_equal(restored["params"]["b"], X[0] + 1.0)
        np.testing.assert_array_equal(restored["plain"], np.arange(3.0))
        np.testing.assert_array_equal(jax.random.key_data(restored["params"]["key"]),
                                      jax.random.key_data(jax.random.key(7)))


@pytest.mark.filterwarnings("ignore:Use `save` instead")        # Orbax's, of `ocp.v1.save_pytree`: tested on purpose
@pytest.mark.filterwarnings("ignore:Sharding info not provided")   # Orbax's, without a target: restored as saved
def test_orbax_v1_saves_a_services_handles_fetching_each_value_once(runtime, tmp_path, monkeypatch):
    """Orbax's v1 API (`ocp.v1.save`, `ocp.v1.save_pytree`) makes its own `jax.Array` handler for each save, not
    the registry's: a service's handle fetched its whole value three times a save. Each is read once, and
    `ocp.v1.load`, to a target of the handles too, restores what saving the values as JAX arrays restores."""
    import orbax.checkpoint as ocp

    fetched = counted_fetches(monkeypatch)

    def saved(tree):
        """Each leaf's bytes (a key's key data), dtype and sharding."""
        return {k: (np.asarray(jax.random.key_data(v) if k == "key" else v).tobytes(), v.dtype, v.sharding)
                for k, v in tree.items()}

    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        state = init_with_key.run(X, client=remote)
        for name, save in (("save", ocp.v1.save), ("save_pytree", ocp.v1.save_pytree)):
            fetched.clear()
            save(tmp_path / name, state)
            assert fetched.count(True) == 3, name                   # a key handle's key data too
        arrays = jax.tree.map(lambda h: h.result(TIMEOUT), state)
        ocp.v1.save(tmp_path / "arrays", arrays)
        want = saved(arrays)
        assert saved(ocp.v1.load(tmp_path / "arrays", arrays)) == want
        assert saved(ocp.v1.load(tmp_path / "save", state)) == saved(ocp.v1.load(tmp_path / "save")) == want


def test_a_remote_client_runs_with_the_weight_it_connects_with():
    """`pw.connect` took no weight: every connection of a service had weight 1, so `pw-serve --policy share`
    could only give its clients equal shares (found by a fault finder)."""
    runtime = Runtime(embedded_device_map(1, 2), policy="share")
    admitted = []                                # (client id, weight) of each run the policy admits
    policy = runtime.scheduler.policy
    record = policy.admitted
    policy.admitted = lambda run, *rest: (admitted.append((run.client_id, run.weight)), record(run, *rest))[1]
    double = pw.jit(lambda x: 2 * x, slice=pw.virtual_slice(1, axes="d"))
    try:
        with Endpoint(runtime) as endpoint:
            with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT, weight=3.0) as heavy, \
                    RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as plain:
                for client in (heavy, plain, heavy):
                    np.testing.assert_array_equal(np.asarray(double.compiled(X, runtime=client)(X)), 2 * X)
                with pytest.raises(RemoteError, match=r"^a client's weight must be a number from 1e-06 to 1e\+06, "
                                                      r"not 'much'$"):
                    plain._call({"op": "weight", "weight": "much"})      # as a hostile peer would send it
            with pytest.raises(ValueError, match="a client's weight must be a number from 1e-06 to 1e"):
                RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT, weight=0)
    finally:
        runtime.close()
    [(heavy_id, three), (plain_id, one), again] = admitted
    assert (three, one) == (3.0, 1.0) and heavy_id != plain_id and again == (heavy_id, 3.0)


def test_device_get_of_a_pytree_of_remote_handles_is_one_fetch_request(runtime):
    """`jax.device_get` announces every leaf (`copy_to_host_async`) before it reads them: the first read's fetch
    brings back the others computed, so 40 results cost one request, not 40 (a fault finder: a request per leaf of
    an optimizer's state). The values are the same; a handle released after its announcement is not brought
    back, and what was brought back goes once read or released."""
    width = 40
    make = pw.jit(lambda x: {f"w{i}": x + i for i in range(width)}, slice=pw.virtual_slice(1, axes="d"))
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        state = make.run(np.zeros(2, np.float32), client=remote)
        for leaf in state.values():
            leaf.block_until_ready()
        before = remote.requests["fetch"]
        values = jax.device_get(state)
        assert remote.requests["fetch"] - before == 1
        assert {name: value.tolist() for name, value in values.items()} == {f"w{i}": [i, i] for i in range(width)}
        assert remote._prefetched == {} and remote._wanted == {}

        again = make.run(np.ones(2, np.float32), client=remote)
        for name in again:
            again[name].block_until_ready()
            again[name].copy_to_host_async()
        released = again.pop("w1")
        released.delete()
        del again["w2"]
        assert np.asarray(again["w0"]).tolist() == [1, 1]
        assert set(remote._prefetched) == {again[f"w{i}"]._key for i in range(3, width)}
        with pytest.raises(ValueError, match=r"^remote handle \d+ was released$"):
            np.asarray(released)
        assert np.asarray(again.pop("w3")).tolist() == [4, 4]      # taken as it was brought back
        del again
        assert remote._prefetched == {} and remote._wanted == {}


def test_fetches_in_flight_at_once_share_the_read_ahead_bound(runtime, monkeypatch):
    """What a client holds of values brought back ahead of their read is bounded (`AHEAD_BYTES`), but each
    fetch chose up to the whole room, not counting what a fetch still in flight had asked for: two threads
    reading at once held twice the bound (a review). Now what fetches in flight ask for counts, until their
    replies come, they fail, or the handles are released."""
    width = 8
    make = pw.jit(lambda x: {f"w{i}": x + i for i in range(width)}, slice=pw.virtual_slice(1, axes="d"))
    in_flight, go_on = threading.Event(), threading.Event()
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        polled = remote._polled

        def held_back(request, deadline, late):
            if "also" in request and not in_flight.is_set():    # the first fetch asking for others waits
                in_flight.set()
                go_on.wait(TIMEOUT)
            return polled(request, deadline, late)

        state, other = make.run(np.zeros(2, np.float32), client=remote), make.run(np.ones(2, np.float32),
                                                                                 client=remote)
        for leaf in [*state.values(), *other.values()]:
            leaf.block_until_ready()
        monkeypatch.setattr("pathways_mlir.runtime.remote_client.AHEAD_BYTES", 3 * state["w0"].nbytes)
        monkeypatch.setattr(remote, "_polled", held_back)
        for leaf in state.values():
            leaf.copy_to_host_async()
        box = []
        reader = threading.Thread(target=lambda leaf: box.append(np.asarray(leaf)), args=(state["w0"],), daemon=True)
        reader.start()                           # asks for w1, w2 and w3 besides: the whole room
        assert in_flight.wait(TIMEOUT)
        state.pop("w1").delete()                 # on its way: its room is free again
        assert np.asarray(other["w0"]).tolist() == [1, 1]      # asks for w4 besides, only
        go_on.set()
        reader.join(TIMEOUT)
        assert box[0].tolist() == [0, 0]
        assert set(remote._prefetched) == {state[name]._key for name in ("w2", "w3", "w4")} and remote._asked == {}
        monkeypatch.undo()
        assert {name: np.asarray(leaf).tolist() for name, leaf in state.items()} == \
            {f"w{i}": [i, i] for i in range(width) if i != 1}
        del state
        assert remote._prefetched == {} and remote._asked == {}
