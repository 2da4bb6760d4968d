"""A service you can leave running (issue 23), with real processes and sockets.

Connections are bounded: a flood of connections that never finish their handshake, from another
process, does not keep a good client from connecting and running; an oversized length prefix is refused
without the service's memory growing; a silent connection is dropped after the idle timeout while a
client that keeps alive keeps its objects; past the connection cap a client is told so, and the owner may
still ask for the full status, on a bounded number of connections. A client sees
only its own objects in `status`; the full report is the owner's, on the Unix socket. A service file
that another user owns or others can write is refused. `pw-serve` stops in order on every SIGTERM, under
load, and exits 0 on SIGINT; a client of a stopped (SIGSTOP) service gets a ServiceError naming it within
its deadline, and one whose service died gets a ServiceError too. A hostile plan is refused by the
service, which goes on serving. Every wait is bounded; every process started here is stopped.
"""

import concurrent.futures
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.endpoint import Endpoint
from pathways_mlir.runtime.limits import Limits
from pathways_mlir.runtime.remote_client import RemoteClient, RemoteError
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.service import ServiceError, open_connection, read_service_file
from pathways_mlir.runtime.wire import recv_message, send_message
import output_lines
from fetching import stop_process, until
from test_endpoint import raw_frame, wait_dropped
from test_service import TIMEOUT, procs, serve, stop  # noqa: F401  (procs is a fixture)

X = np.random.default_rng(2).normal(size=(8, 16)).astype(np.float32)

block = pw.jit(lambda x: jnp.tanh(x) * 2.0, slice=pw.virtual_slice(2, axes="d"), in_specs=P("d"),
               out_specs=P("d"))


@pw.program
def step(x):
    return block(block(x))


WANT = np.tanh(np.tanh(X) * 2.0) * 2.0

FLOOD = """
import socket, sys
path, held = sys.argv[1], []
while True:                                  # never sends a byte; keeps its last 1000 connections open
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    held.append(s)
    if len(held) == 300:
        print("flooding", flush=True)
    if len(held) > 1000:
        held.pop(0).close()
"""

CLIENT = """
import sys
import numpy as np
import pathways_mlir as pw
from pathways_mlir.runtime.island_work import RunFailed
from pathways_mlir.runtime.remote_client import RemoteError
from pathways_mlir.runtime.service import ServiceError, open_connection
service_file, timeout, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
client = open_connection(service_file, timeout=timeout)
print("ready", client.object_count(), flush=True)
if mode == "load":                           # runs until the service goes: always a run in flight
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    f = pw.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T, slice=pw.virtual_slice(2, axes="d"), in_specs=P("d"),
               out_specs=P("d"))
    x = np.ones((256, 256), np.float32)
    try:
        np.asarray(f.compiled(x, runtime=client)(x))
        print("running", flush=True)
        while True:
            handles = [f.compiled(x, runtime=client)(x) for _ in range(4)]
            np.asarray(handles[-1])
    except (ServiceError, RemoteError, RunFailed) as error:   # the service went, or stopped its runtime first
        print("error", type(error).__name__, error, flush=True)
else:
    sys.stdin.readline()
    try:
        client.object_count()
    except ServiceError as error:
        print("error", type(error).__name__, error, flush=True)
"""


@pytest.fixture
def runtime():
    rt = Runtime(embedded_device_map(2, 4))
    yield rt
    rt.close()


def read_line(proc, timeout=TIMEOUT) -> str:
    return output_lines.read_line(proc, timeout, "the process")


def start(procs, *args, code=CLIENT):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    return proc


def service_dir(tmp_path):
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    return directory, directory / "service.json"


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        [line] = [ln for ln in f if ln.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def stop_keepalives(client: RemoteClient) -> None:
    """Stops `client`'s keepalive thread, as its close does, leaving its connection open: it sends no pings and
    no releases from then on."""
    client._stop.set()
    client._wakeups.put(None)            # else the thread sleeps up to a quarter of the idle timeout first
    client._keepalive.join(TIMEOUT)
    assert not client._keepalive.is_alive()


def test_a_handshake_flood_does_not_lock_out_a_good_client(runtime, procs):  # noqa: F811
    with Endpoint(runtime) as endpoint:
        flood = start(procs, endpoint.address, code=FLOOD)
        assert read_line(flood).strip() == "flooding"
        for _ in range(4):                                       # served while the flood goes on
            with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as good:
                np.testing.assert_allclose(np.asarray(step.run(X, client=good)), WANT, rtol=1e-6)
        assert flood.poll() is None                              # still flooding
        stop(flood)


def test_idle_connections_are_dropped_and_keepalives_keep_clients(runtime):
    with Endpoint(runtime, limits=Limits(idle_timeout=1.0)) as endpoint:
        kept = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        silent = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        stop_keepalives(silent)                                  # its keepalive stops: it goes silent
        [held] = kept.run(step.compiled(X, runtime=kept).plan, [X])
        silent._socket.settimeout(30)
        with pytest.raises(EOFError):                            # dropped by the endpoint, after 1 s idle
            recv_message(silent._socket)
        time.sleep(2.0)                                          # twice the idle timeout, keeping alive
        assert kept.object_count() == 1
        np.testing.assert_allclose(np.asarray(held), WANT, rtol=1e-6)
        kept.close()
        silent.close()


def test_a_frame_sent_a_byte_at_a_time_must_arrive_within_the_idle_timeout(runtime):
    """Each byte comes well within the idle timeout, but the frame as a whole takes longer: dropped."""
    header = json.dumps({"op": "ping", "release": [0] * 50}).encode()     # keys never made: ignored
    frame = struct.pack(">I", len(header)) + header
    with Endpoint(runtime, limits=Limits(idle_timeout=1.5)) as endpoint:
        drip = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        stop_keepalives(drip)                                    # no keepalives: only the frame's bytes
        dropped = False
        for i in range(len(frame)):                              # 0.1 s apart: about 12 s for the frame
            try:
                drip._socket.sendall(frame[i:i + 1])
            except OSError:
                dropped = True
                break
            time.sleep(0.1)
        if not dropped:
            drip._socket.settimeout(30)
            with pytest.raises((EOFError, ConnectionResetError)):   # not the ping's reply
                recv_message(drip._socket)
        drip.close()
        with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as later:
            assert later.object_count() == 0


def test_a_large_header_that_stalls_holds_up_only_its_own_connection(runtime):
    """Headers over 64 KiB are parsed one at a time; one whose bytes stop coming must not keep another
    client's large request waiting."""
    header = json.dumps({"op": "ping", "release": [0] * (50 << 10)}).encode()   # 150 KiB
    frame = struct.pack(">I", len(header)) + header
    with Endpoint(runtime, limits=Limits(idle_timeout=TIMEOUT)) as endpoint:
        stalled = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        stop_keepalives(stalled)
        stalled._socket.sendall(frame[:len(frame) // 2])         # and nothing more
        with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT / 4) as other:
            with other._lock:
                other._socket.sendall(frame)
                reply, _ = recv_message(other._socket)           # a socket timeout of TIMEOUT / 4
            assert reply == {"ok": True}
            assert other.object_count() == 0
        stalled._socket.sendall(frame[len(frame) // 2:])        # still served: its frame completes
        reply, _ = recv_message(stalled._socket)
        assert reply == {"ok": True}
        stalled.close()


def serve_frame_waiting_to_send(timeout=TIMEOUT):
    """The frame of the one connection thread's `Session.serve` once that thread is sending a reply (waits at
    most `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [thread] = [t for t in threading.enumerate() if t.name == "pw-endpoint-connection"]
        frame, names = sys._current_frames().get(thread.ident), []
        while frame is not None:
            names.append(frame.f_code.co_name)
            if frame.f_code.co_name == "serve" and "send_message" in names:
                return frame
            frame = frame.f_back
        time.sleep(0.05)
    raise AssertionError(f"the connection thread is not sending a reply after {timeout} s")


def test_a_request_keeps_only_the_fields_it_reads_and_none_while_its_reply_is_sent(runtime):
    """A header's parsed JSON is about 25x its bytes: a field its request does not read, one of another
    type, and arrays sent with a request that reads none are refused in one line; and the parsed request is
    dropped before its reply is sent, so a peer that does not read a large reply holds none of it."""
    tile = pw.jit(lambda x: jnp.tile(x, (8192, 1)), slice=pw.virtual_slice(1, axes="d", island="island0"),
                  in_specs=None, out_specs=None)
    with Endpoint(runtime) as endpoint, \
            RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as client:
        held = tile.compiled(X, runtime=client)(X)                       # 4 MiB: more than a socket buffers
        held.block_until_ready()
        for request, error in [
                ({"op": "fetch", "handle": held._key, "junk": [[]] * 1000},
                 "request 'fetch' has no field 'junk': it takes also, handle, timeout, token, value "
                 "(and release, forget)"),
                ({"op": "fetch", "handle": held._key, "value": "no"}, "needs 'value' as bool, not no"),
                ({"op": "status", "full": 1}, "needs 'full' as bool, not 1"),
                ({"op": "ping", "pad": "x"}, "request 'ping' has no field 'pad': it takes none (and release, forget)")]:
            with pytest.raises(RemoteError, match=re.escape(error)):
                client._call(request)
        with pytest.raises(RemoteError, match="request 'objects' takes no arrays, not 1"):
            client._call({"op": "objects"}, [X])
        assert client.object_count() == 1                               # refused requests: the connection serves
        with client._lock:                                               # the reply is not read for now
            send_message(client._socket, {"op": "fetch", "handle": held._key, "timeout": None, "value": True})
            serving = serve_frame_waiting_to_send()
            assert not {"request", "arrays"} & set(serving.f_locals)
            del serving
            reply, [value] = recv_message(client._socket)
        assert reply == {"ok": True}
        np.testing.assert_array_equal(value, np.tile(X, (8192, 1)))


def test_a_frame_of_more_arrays_than_the_limit_is_refused_in_one_line(runtime):
    """Each array costs the endpoint a few hundred bytes even when empty: past `max_arrays` (4096) a frame
    is refused before any is made, and a client does not send one."""
    specs = b",".join([b'["bool",[0]]'] * 4097)
    with Endpoint(runtime) as endpoint:
        insider = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        with pytest.raises(ValueError, match="4097 arrays are over the endpoint's limit of 4096 per frame"):
            insider._call({"op": "run"}, [np.zeros(0, bool)] * 4097)
        assert insider.object_count() == 0                              # nothing was sent
        insider._socket.sendall(raw_frame(b'{"op":"ping","arrays":[' + specs + b']}'))
        reply, _ = recv_message(insider._socket)
        assert reply == {"ok": False, "error": "4097 arrays are over the limit of 4096 per frame"}
        wait_dropped(insider._socket)
        insider._socket.close()
        with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as later:
            assert later.object_count() == 0


def test_a_request_refused_over_the_limits_keeps_the_releases_it_took(runtime):
    """A request carries the releases of the handles dropped since the last one; a frame refused before anything
    was sent (its arguments over the endpoint's limit) lost them, and the service kept their results until the
    connection closed. They are put back, once, and the next request carries them."""
    with Endpoint(runtime, limits=Limits(max_array_bytes=1 << 20)) as endpoint:
        client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        stop_keepalives(client)                          # only requests carry releases from now on
        plan = step.compiled(X, runtime=client).plan
        [dropped] = client.run(plan, [X])
        [kept] = client.run(plan, [X])
        assert client.object_count() == 2
        key = dropped._key
        del dropped
        with pytest.raises(ValueError, match=r"^arrays of 2097152 bytes are over the endpoint's limit of 1048576$"):
            client.run(plan, [np.zeros(1 << 19, np.float32)])
        assert list(client._dropped) == [key]            # put back once
        assert client.object_count() == 1                # this request carried it
        assert not client._dropped
        np.testing.assert_allclose(np.asarray(kept), WANT, rtol=1e-6)
        client.close()


def test_releases_never_make_a_request_over_the_header_limit(runtime):
    """The releases of a tree of handles dropped at once made the next request's header over the endpoint's
    limit, which refused it (ValueError, in a call that had nothing to do with them), and lost them. A request
    carries as many as take half the limit, and one whose header is over it with them goes without them; the
    next requests carry the rest."""
    with Endpoint(runtime, limits=Limits(max_header_bytes=16 << 10)) as endpoint:
        client = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        stop_keepalives(client)
        plan = step.compiled(X, runtime=client).plan
        [dropped] = client.run(plan, [X])
        client._dropped.extend(range(10**6, 10**6 + 8000))  # keys never made (ignored there): 64 KB of releases
        del dropped                                      # its release goes last
        with pytest.raises(PermissionError, match="no shared object has the reference 'AAAAAA'"):
            client.shared("A" * (10 << 10))              # answered by the service: the frame went
        for _ in range(20):
            if not client._dropped:
                break
            client.object_count()
        assert not client._dropped
        assert client.object_count() == 0
        client.close()


def test_past_the_connection_cap_a_client_is_told(runtime):
    """Past the cap a client is refused in one line. A connection's place is free once the endpoint has released
    its objects, after it answered `close` (a client closing with a computation under way does not wait for
    it): the test waits for that before it connects again, as it connected at once and was refused now and then
    on a busy machine (a CI run of 2026-12-05)."""
    with Endpoint(runtime, limits=Limits(max_connections=1)) as endpoint:
        with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as first:
            kept = step.run(X, client=first)                  # held at close, released there
            with pytest.raises(ServiceError, match="refused the connection: the service serves its limit of 1 "
                                                   "connections; try later"):
                RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        for _ in range(10):
            until(lambda: not endpoint.status()["service"]["connections"], "the connection released", TIMEOUT)
            with RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as later:
                assert later.object_count() == 0
                kept = step.run(X, client=later)                 # held at close, released there
                np.testing.assert_allclose(np.asarray(kept), WANT, rtol=1e-6)



def test_past_the_connection_cap_the_owner_may_still_ask_for_the_full_status(runtime):
    """`pw-serve --status` was refused exactly when the operator needs it, while the service serves its limit of
    connections (found by a fault finder). Past the cap a client is still refused, but the owner's connection on
    the Unix socket may ask for the full status, which lists the connections holding the places, and nothing
    else; such connections are bounded too (`max_status_connections`): past them, and over TCP, the refusal
    closes the connection."""
    def connect(address=None, status_only=True):
        return RemoteClient(address or endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT,
                            status_only=status_only)

    def no_status_connections():
        until(lambda: not endpoint._status_threads, "the status-only connections ended", TIMEOUT)

    full_now = "the service serves its limit of 1 connections; try later"
    refused = "refused the connection: " + full_now
    with Endpoint(runtime, port=0, limits=Limits(max_connections=1, max_status_connections=2)) as endpoint:
        with connect(status_only=False) as first:
            kept = step.run(X, client=first)
            kept.block_until_ready()
            [held] = endpoint.status()["service"]["connections"]
            with pytest.raises(ServiceError, match=refused):
                connect(status_only=False)                           # a client: refused, as before
            with connect() as operator:
                assert operator.status_only
                for _ in range(2):                                    # answered again and again
                    full = operator.status(full=True)
                    assert full["service"]["connections"] == [held] and list(full["clients"]) == [held]
            asker = connect()
            with pytest.raises(RemoteError, match=full_now + ": this connection may ask for the full status only"):
                asker.object_count()
            asker.close()
            no_status_connections()
            kept_open = [connect() for _ in range(2)]
            try:
                assert all(c.status_only for c in kept_open)
                with pytest.raises(ServiceError, match=refused):
                    connect()                                         # past max_status_connections
            finally:
                for c in kept_open:
                    c.close()
            with pytest.raises(ServiceError, match=refused):
                connect(endpoint.tcp_address)                         # over TCP: not the owner's Unix socket
            no_status_connections()
            with connect() as operator:                               # the places are free again
                assert operator.status(full=True)["service"]["connections"] == [held]
        until(lambda: not endpoint.status()["service"]["connections"], "the connection released", TIMEOUT)
        with connect() as client:                                     # a place is free: a client's connection
            assert not client.status_only and client.object_count() == 0

def test_status_shows_a_client_its_own_and_the_owner_everything(runtime):
    with Endpoint(runtime, port=0) as endpoint:
        one = RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT)
        two = RemoteClient(endpoint.tcp_address, key_path=endpoint.key_path, timeout=TIMEOUT)
        try:
            held = [one.run(step.compiled(X, runtime=one).plan, [X]), two.run(step.compiled(X, runtime=two).plan,
                                                                                [X])]
            [h.block_until_ready() for hs in held for h in hs]
            mine, theirs = one.status(), two.status()
            assert len(mine["clients"]) == 1 == len(theirs["clients"]) and mine["clients"] != theirs["clients"]
            assert len(mine["service"]["connections"]) == 1
            full = one.status(full=True)                        # the owner, on the Unix socket
            assert len(full["clients"]) == 2 and len(full["service"]["connections"]) == 2
            with pytest.raises(RemoteError, match="the full status is for the service's owner, on its Unix socket"):
                two.status(full=True)                           # over TCP: not
        finally:
            one.close()
            two.close()


def test_a_hostile_plan_is_refused_and_the_service_goes_on(runtime):
    from test_plan_check import _plan, _with_executable, host_callback

    hostile = _with_executable(_plan(), host_callback, "xla_ffi_python_cpu_callback")
    with Endpoint(runtime) as endpoint, RemoteClient(endpoint.address, key_path=endpoint.key_path,
                                                     timeout=TIMEOUT) as remote:
        with pytest.raises(RemoteError, match="PlanError: plan: executable @.* makes a custom call to "
                                              "'xla_ffi_python_cpu_callback'"):
            remote.load(hostile)
        np.testing.assert_allclose(np.asarray(step.run(X, client=remote)), WANT, rtol=1e-6)


def test_an_oversized_prefix_is_refused_with_bounded_memory(tmp_path, procs):  # noqa: F811
    directory, service_file = service_dir(tmp_path)
    proc = serve(procs, "--service-file", str(service_file))
    with open_connection(str(service_file), timeout=TIMEOUT) as client:
        before = peak_rss(proc.pid)
        client._socket.sendall(struct.pack(">I", 255 << 20) + b"{")     # 255 MiB announced (the old limit)
        reply, _ = recv_message(client._socket)
        assert reply["ok"] is False and f"a header of {255 << 20} bytes is over the limit of {8 << 20}" in \
            reply["error"]
        assert peak_rss(proc.pid) - before < 32 << 20                     # nothing of the kind was allocated
    with open_connection(str(service_file), timeout=TIMEOUT) as later:
        assert later.object_count() == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 0 and list(directory.iterdir()) == []


def test_a_foreign_or_writable_service_file_is_refused(tmp_path, procs):  # noqa: F811
    directory, service_file = service_dir(tmp_path)
    proc = serve(procs, "--service-file", str(service_file))
    fields = json.loads(service_file.read_text())
    assert read_service_file(str(service_file)) == fields
    impostor = tmp_path / "impostor"
    impostor.mkdir(mode=0o700)
    planted = impostor / "service.json"
    planted.write_text(json.dumps(fields))
    for change, owner in [(lambda: os.chown(planted, 12345, 12345), "owned by uid 12345"),
                          (lambda: os.chmod(planted, 0o666), "writable by others")]:
        os.chown(planted, os.getuid(), os.getgid())
        os.chmod(planted, 0o600)
        change()
        with pytest.raises(ServiceError, match=f"refusing the service file {planted}: it is {owner}"):
            open_connection(str(planted), timeout=TIMEOUT)
    os.chown(planted, os.getuid(), os.getgid())
    os.chmod(planted, 0o600)
    os.chmod(impostor, 0o777)                                    # a world-writable directory
    with pytest.raises(ServiceError, match=f"refusing the directory {impostor}: it is writable by others"):
        open_connection(str(planted), timeout=TIMEOUT)
    os.chmod(impostor, 0o700)
    link = impostor / "link.json"
    link.symlink_to(service_file)
    with pytest.raises(ServiceError, match=f"refusing the service file {link}: it is a symbolic link"):
        open_connection(str(link), timeout=TIMEOUT)
    with open_connection(str(planted), timeout=TIMEOUT) as client:   # ours and private: trusted
        assert client.object_count() == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 0


def sigterm_under_load(cycle, proc, directory, service_file, procs):  # noqa: F811
    """One cycle of `test_sigterm_under_load_stops_in_order_every_time`: pw-serve `proc` gets SIGTERM (SIGINT
    in cycle 9) while a client has runs in flight; it stops in order, its folder left empty."""
    load = start(procs, service_file, TIMEOUT, "load")
    assert read_line(load).split() == ["ready", "0"]
    assert read_line(load).strip() == "running"              # runs in flight from here on
    time.sleep(0.1 * (cycle % 3))                            # SIGTERM at different points of the runs
    signal_ = signal.SIGINT if cycle == 9 else signal.SIGTERM
    proc.send_signal(signal_)
    assert proc.wait(TIMEOUT) == 0, proc.stderr.read()[-3000:]
    assert proc.stdout.read().strip() == f"pw-serve: {signal_.name}: stopping"
    assert list(directory.iterdir()) == []                   # service file, socket and key removed
    line = read_line(load)
    assert line.startswith("error "), line + load.stderr.read()[-3000:]
    assert load.wait(TIMEOUT) == 0
    stop(load)
    stop(proc)


def test_sigterm_under_load_stops_in_order_every_time(tmp_path, procs):  # noqa: F811
    # Two service folders, taken in turn: the next cycle's pw-serve starts in the other one while a cycle runs
    # (a pw-serve's start, mostly importing JAX, was about a third of each cycle's time).
    (tmp_path / "even").mkdir()
    (tmp_path / "odd").mkdir()
    folders = [service_dir(tmp_path / "even"), service_dir(tmp_path / "odd")]
    with concurrent.futures.ThreadPoolExecutor(1) as starter:
        starting = starter.submit(serve, procs, "--service-file", str(folders[0][1]))
        for cycle in range(10):
            directory, service_file = folders[cycle % 2]
            proc = starting.result()
            if cycle < 9:
                starting = starter.submit(serve, procs, "--service-file", str(folders[(cycle + 1) % 2][1]))
            sigterm_under_load(cycle, proc, directory, service_file, procs)


def test_a_stopped_or_dead_service_is_an_error_naming_it(tmp_path, procs):  # noqa: F811
    directory, service_file = service_dir(tmp_path)
    proc = serve(procs, "--service-file", str(service_file))
    hung, dead = start(procs, service_file, 2, "wait"), start(procs, service_file, 30, "wait")
    assert read_line(hung).split() == ["ready", "0"] and read_line(dead).split() == ["ready", "0"]
    try:
        stop_process(proc.pid, TIMEOUT)
        hung.stdin.write("go\n")
        hung.stdin.flush()
        line = read_line(hung).strip()
        want = (f"error ServiceError no reply from the service at {service_file} (pid {proc.pid}) in 2.0 s; the "
                "connection is closed")
        assert line == want, line or f"exit {hung.wait(TIMEOUT)}: {hung.stderr.read()[-3000:]}"
    finally:
        proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(TIMEOUT)
    dead.stdin.write("go\n")
    dead.stdin.flush()
    assert read_line(dead).strip().startswith(f"error ServiceError lost the service at {service_file} (pid {proc.pid}): ")
