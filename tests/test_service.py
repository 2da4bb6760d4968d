"""The shared service with real processes: `pw-serve` (embedded backend, 2 islands of 2 CPU devices) and
client processes that attach with `pw.connect` (tests/service_client.py).

Two clients run programs and check them against plain JAX; a run waits for memory a client holds, and the
service's status names it; a client killed while its run is queued has that run dropped; the holder is
killed with SIGKILL, its objects and memory come back, the parked run finishes, and `pw-serve --status`
shows the baseline again. Every wait has a timeout; every process
started here is stopped.
"""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathways_mlir.runtime.service import ServiceError, open_connection
from output_lines import read_line

SERVE = [sys.executable, "-m", "pathways_mlir.cli.pw_serve"]
CLIENT = str(Path(__file__).with_name("service_client.py"))
TIMEOUT = 300        # bounds each wait for a process: a client first traces, lowers and runs its programs, which
#                      takes about 20 s here alone and several times that on a 2-core machine at load 10 or more
# Per device: a `big` run (256 KiB per device at its peak) fits alone, but not beside a held result of
# `big` (128 KiB per device).
MEMORY = 327680


def read_json(proc, timeout=TIMEOUT) -> dict:
    """Reads one JSON line that `proc` prints (waits at most `timeout`)."""
    line = read_line(proc, timeout)
    assert line, f"the process exited ({proc.wait(TIMEOUT)}): {proc.stderr.read()[-3000:]}"
    return json.loads(line)


def stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream:
            try:
                stream.close()
            except BrokenPipeError:      # a line still buffered for a process that is gone
                pass


def serve(procs, *args, env=None, backend="embedded"):
    """Starts `pw-serve ARGS` (2 islands of 2 devices, any free port); returns it once it says it listens."""
    proc = subprocess.Popen([*SERVE, "--islands", "2", "--per-island", "2", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    procs.append(proc)
    line = read_line(proc, TIMEOUT, "pw-serve")
    assert line.startswith(f"pw-serve: serving 2 island(s) (island0: 2 devices, island1: 2 devices, {backend} "
                           "backend) on unix:"), line + (proc.stderr.read()[-3000:] if proc.poll() else "")
    return proc


@pytest.fixture
def procs():
    """The processes a test starts; all are stopped at its end."""
    started = []
    try:
        yield started
    finally:
        for p in reversed(started):
            stop(p)


@pytest.fixture
def service(tmp_path, procs):
    """A running `pw-serve`: (its process, its service file, the test's processes)."""
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    service_file = directory / "service.json"
    proc = serve(procs, "--device-memory-bytes", str(MEMORY), "--service-file", str(service_file))
    return proc, service_file, procs


def client(service_file, role, procs):
    """Starts a client process (see service_client.py)."""
    proc = subprocess.Popen([sys.executable, CLIENT, str(service_file), role], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    return proc


def status_text(service_file) -> str:
    result = subprocess.run([*SERVE, "--status", "--service-file", str(service_file)], capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def wait_status(observer, done, timeout=60):
    """Polls the service's status until `done(status)`; returns the last status."""
    deadline = time.monotonic() + timeout
    status = observer.status(full=True)
    while not done(status) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = observer.status(full=True)
    return status


def baseline(status) -> bool:
    return (status["clients"] == {} and status["scheduler"]["queued"] == []
            and all(n == 0 for per_device in status["reserved"].values() for n in per_device))


def client_script(snippet: str, service_file) -> str:
    """Runs `snippet`, a client of the service, in a process of its own (its first argument the service file);
    returns what it printed, once it exited 0."""
    result = subprocess.run([sys.executable, "-c", snippet, str(service_file)], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def assert_back_to_baseline(service_file) -> None:
    """Waits (at most a minute) until the service holds, reserves and queues nothing for any client."""
    with open_connection(str(service_file), timeout=60) as observer:
        assert baseline(wait_status(observer, baseline)), observer.status(full=True)


def test_clients_share_the_service_and_a_killed_one_is_reclaimed(service, tmp_path):
    proc, service_file, procs = service
    found = json.loads(service_file.read_text())
    assert found["host"] == "127.0.0.1" and found["pid"] == proc.pid
    assert found["socket"] == str(service_file.with_suffix(".sock"))
    assert oct(service_file.stat().st_mode & 0o777) == oct(0o600)
    assert oct(Path(found["key_path"]).stat().st_mode & 0o777) == oct(0o600)
    observer = open_connection(str(service_file), timeout=TIMEOUT)
    try:
        start = observer.status(full=True)
        assert baseline(start) and start["reserved"] == {"island0": [0, 0], "island1": [0, 0]}

        closer, holder = client(service_file, "close", procs), client(service_file, "hold", procs)
        assert read_json(closer) == {"stage": "checked", "objects": 3}          # each sees only its own objects
        assert read_json(holder) == {"stage": "checked", "objects": 3}
        assert read_json(closer) == {"stage": "closed"}
        assert closer.wait(TIMEOUT) == 0
        assert read_json(holder) == {"stage": "holding", "objects": 4}
        held = wait_status(observer, lambda s: len(s["clients"]) == 1)
        [(holder_id, objects)] = held["clients"].items()
        assert objects["objects"] == 4 and held["reserved"]["island0"] == [131072, 131072]

        parker = client(service_file, "park", procs)                            # big does not fit beside it
        assert read_json(parker) == {"stage": "checked", "objects": 3}
        refused = read_json(parker)                                             # and only a handle holds it:
        assert refused["stage"] == "refused"                                    # refused at once, naming who
        assert ("program big needs 262144 bytes on device 0 of island0" in refused["message"]
                and f"client {holder_id} holds 1 object(s), 131072 bytes" in refused["message"])
        assert observer.status(full=True)["scheduler"]["queued"] == []
        text = status_text(service_file)
        assert f"client {holder_id}: 4 object(s), " in text and "island0: bytes reserved per device: [131072" in text

        holder.kill()                                                           # dies holding its results
        holder.wait(TIMEOUT)
        wait_status(observer, lambda s: holder_id not in s["clients"], timeout=30)
        parker.stdin.write("\n")
        parker.stdin.flush()
        assert read_json(parker) == {"stage": "done"}                           # its memory came back
        assert parker.wait(TIMEOUT) == 0
        end = wait_status(observer, baseline)
        assert baseline(end) and end["service"]["connections"] == [max(end["service"]["connections"])]
    finally:
        observer.close()
    text = status_text(service_file)
    assert "island0: bytes reserved per device: [0, 0]" in text and "island1: bytes reserved per device: [0, 0]" in text
    assert not re.search(r"^client \d+:", text, re.M) and "queued run" not in text

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 0
    assert proc.stdout.read().strip() == "pw-serve: SIGTERM: stopping"
    assert list(service_file.parent.iterdir()) == []                            # service file and key removed


def test_a_client_cancels_its_run_on_the_service(service):
    _, service_file, procs = service
    canceller = client(service_file, "cancel", procs)
    assert read_json(canceller) == {"stage": "checked", "objects": 3}
    cancelled = read_json(canceller)
    assert cancelled["stage"] == "cancelled" and "was cancelled by client" in cancelled["message"]
    assert canceller.wait(TIMEOUT) == 0


def test_the_service_stops_on_sigterm_while_an_island_computes(service):
    proc, service_file, procs = service
    spinner = client(service_file, "spin", procs)
    assert read_json(spinner) == {"stage": "checked", "objects": 3}
    assert read_json(spinner) == {"stage": "spinning"}
    proc.send_signal(signal.SIGTERM)                  # the computation has most of a minute to go
    assert proc.wait(TIMEOUT) == 0
    assert proc.stdout.read().strip().endswith("pw-serve: SIGTERM: stopping")
    assert list(service_file.parent.iterdir()) == []


def test_service_errors_are_one_line(service, tmp_path):
    proc, service_file, procs = service
    port = json.loads(service_file.read_text())["port"]
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    (other / "bad.json").write_text('{"host": "127.0.0.1"}')
    cases = [
        (["--port", "0", "--service-file", str(service_file)],
         f"a service is already running (pid {proc.pid}, unix:{service_file.with_suffix('.sock')}, service file "
         f"{service_file}); "
         "stop it first or choose another --service-file"),
        (["--port", str(port), "--service-file", str(other / "service.json")],
         f"cannot listen on 127.0.0.1:{port}: Address already in use (another pw-serve? --port 0 picks a free port)"),
        (["--port", "0", "--service-file", str(public / "service.json")],
         f"{public} must belong to you and be private for the service's key (chmod 700 {public})"),
        (["--port", "0", "--service-file", str(other / "bad.json" / "service.json")],     # it was an internal error
         f"cannot make the service's directory {other / 'bad.json'}: a file on its path is not a folder"),
        (["--status", "--service-file", str(other / "none.json")],
         f"no service file at {other / 'none.json'}: is pw-serve running?"),
        (["--status", "--service-file", str(other / "bad.json")],
         f"{other / 'bad.json'} is not a service file: it needs socket (str), key_path (str), pid (int) and "
         "optionally host (str) with port (int)"),
        (["--status", "--service-file", str(service_file), "--address", "auto"],
         "--status asks a service (--service-file) or a Ray cluster (--address), not both"),
        (["--islands", "2"], "--islands and --per-island go together"),
        (["--islands", "1", "--per-island", "100000"],            # it named PW_CLUSTER='1x100000', not the flags
         "--islands 1 --per-island 100000 is 100000 CPU devices; an embedded cluster has at most 4096"),
        (["--address", "auto"], "--address names a Ray cluster to own islands on: it needs --backend ray"),
        # nan and inf pass click's FloatRange: nan was an internal error, and with inf the service dropped every
        # connection before its welcome (a socket cannot take an infinite timeout).
        (["--idle-timeout", "nan"], "endpoint limit idle_timeout must be a positive number, not nan"),
        (["--idle-timeout", "inf"], "endpoint limit idle_timeout must be at most 1e+09 seconds, not inf"),
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:      # most of each process is importing JAX, on one core
        results = list(pool.map(lambda case: subprocess.run([*SERVE, *case[0]], capture_output=True, text=True,
                                                             timeout=TIMEOUT), cases))
    for (args, error), result in zip(cases, results):
        assert (result.returncode, result.stdout, result.stderr) == (1, "", f"pw-serve: error: {error}\n"), args
    assert list(other.iterdir()) == [other / "bad.json"] and list(public.iterdir()) == []

    with pytest.raises(ServiceError, match=f"connecting to 127.0.0.1:{port} needs key_path"):
        open_connection(f"127.0.0.1:{port}")
    (other / "wrong.key").write_text(os.urandom(32).hex())
    with pytest.raises(ServiceError, match=f"cannot reach the service at 127.0.0.1:{port}: the endpoint refused"):
        open_connection(f"127.0.0.1:{port}", key_path=str(other / "wrong.key"))
    key_path = json.loads(service_file.read_text())["key_path"]
    with open_connection(f"127.0.0.1:{port}", key_path=key_path, timeout=TIMEOUT) as direct:
        assert direct.object_count() == 0
    assert proc.poll() is None                                                  # still serving


def test_readme_two_terminals(tmp_path, procs):
    """The README's shared-service example: `pw-serve` in one process, the snippet in another."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## A shared service"):]
    [snippet] = re.findall(r"```py\n# terminal 2.*?\n(.*?)```", section, re.S)[:1]
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    env = {**os.environ, "PW_SERVICE_DIR": str(directory)}       # where pw-serve and pw.connect() look
    proc = serve(procs, env=env)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("[1.8185034 1.8185034]\n")
    assert re.search(r"^client \d+: 1 object\(s\), 512 bytes$", result.stdout, re.M)
    assert "island1: bytes reserved per device: [256, 256]" in result.stdout
    proc.send_signal(signal.SIGINT)                              # Ctrl-C
    assert proc.wait(TIMEOUT) == 0 and list(directory.iterdir()) == []


def test_a_script_connecting_to_no_service_ends_in_one_line(tmp_path):
    """A script whose `pw.connect()` finds no service ends with one line naming its own call, exit 1;
    `PW_TRACEBACK=1` gives the traceback, and errors of other classes keep theirs."""
    script = tmp_path / "train.py"
    script.write_text("import pathways_mlir as pw\n\nclient = pw.connect()\n")
    env = {**os.environ, "PW_SERVICE_DIR": str(tmp_path / "none")}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", f"{script}:3: ServiceError: no service file at {tmp_path / 'none' / 'service.json'}: "
               "is pw-serve running?\n")
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                           env={**env, "PW_TRACEBACK": "1"})
    assert shown.returncode == 1 and shown.stderr.startswith("Traceback (most recent call last):")
    script.write_text("import pathways_mlir as pw\n\n{}['key']\n")
    other = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert other.returncode == 1 and other.stderr.startswith("Traceback") and "KeyError: 'key'" in other.stderr


def test_a_bug_in_a_placed_function_shows_the_scripts_frames_not_the_packages(tmp_path):
    """A script's own bug (a shape mismatch in its placed function) keeps its traceback, less the package's
    frames (tracing, lowering, the runtime), with a note; `PW_TRACEBACK=1` shows them."""
    script = tmp_path / "train.py"
    script.write_text("import numpy as np, jax.numpy as jnp\nimport pathways_mlir as pw\n\n"
                      "@pw.jit(slice=pw.virtual_slice(2, axes='data'))\ndef layer(x, w):\n    return x @ w\n\n"
                      "layer(np.ones((4, 3), np.float32), np.ones((5, 2), np.float32))\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1 and result.stderr.startswith("Traceback (most recent call last):")
    assert f'File "{script}", line 8, in <module>' in result.stderr and f'File "{script}", line 6, in layer' \
        in result.stderr and "TypeError: dot_general requires contracting dimensions" in result.stderr
    own = [os.sep + os.path.join("frontend", ""), os.sep + os.path.join("runtime", "")]
    assert not any(folder in result.stderr for folder in own), result.stderr
    assert "pathways_mlir removed its own frames from this traceback; PW_TRACEBACK=1 shows them" in result.stderr
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                           env={**os.environ, "PW_TRACEBACK": "1"})
    assert shown.returncode == 1 and any(folder in shown.stderr for folder in own)


def test_lines_a_process_printed_together_are_read_one_by_one(procs):
    """The `hold` client prints "checked" and then "holding" at once; on a loaded machine both were in the
    pipe when the test read the first, and a buffered readline took the second into Python's buffer,
    where select() does not see it: the test waited 300 s for a line it already had."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys\nprint('{\"stage\": \"checked\"}')\n"
                             "print('{\"stage\": \"holding\"}', flush=True)\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    assert read_json(proc) == {"stage": "checked"}
    assert read_json(proc, timeout=10) == {"stage": "holding"}      # the process prints nothing more
    proc.stdin.close()
    assert proc.wait(TIMEOUT) == 0 and proc.stdout.read() == ""


def test_a_client_with_jax_enable_x64_keeps_its_64_bit_values(service):
    """The service's islands hold arrays as clients send them: a client with `jax_enable_x64` gets float64 and
    int64 results (the service once narrowed its arrays to 32 bits and refused its executables' arguments:
    'Dtype mismatch for args[0]: expected float64 and called with float32'); a client without it keeps
    32-bit values on the same service."""
    _, service_file, _ = service
    snippet = """
import sys
import jax
jax.config.update("jax_enable_x64", sys.argv[2] == "x64")
import numpy as np
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
scale = pw.jit(lambda a, b: a * b, slice=pw.virtual_slice(2, axes="x"))
floats, ints = scale(np.arange(4.0), 2.0), scale(np.arange(4), 3)
print(np.asarray(floats).dtype, np.asarray(ints).dtype, np.asarray(floats).tolist(), np.asarray(ints).tolist())
client.close()
"""
    for mode, want in [("x64", "float64 int64"), ("x32", "float32 int32")]:
        result = subprocess.run([sys.executable, "-c", snippet, str(service_file), mode], capture_output=True,
                                text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout == f"{want} [0.0, 2.0, 4.0, 6.0] [0, 3, 6, 9]\n"


def test_narrow_dtypes_and_weak_types_go_through_the_service(service):
    """Arguments and results of JAX's narrow dtypes (int4, fp4, the fp8 variants) travel to and from the
    service's islands in frames as they are (frames carried bfloat16 and two fp8 types only), and a weakly
    typed result is read weakly typed, as from the embedded runtime."""
    _, service_file, _ = service
    snippet = """
import sys
import jax.numpy as jnp
import numpy as np
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
same = pw.jit(lambda a: (a, (a.astype(jnp.float32) * 2).astype(a.dtype)), slice=pw.virtual_slice(2, axes="x"))
for dtype in ("int4", "uint4", "float4_e2m1fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    a, doubled = same(np.array([1, 2, 1, 2], np.float32).astype(jnp.dtype(dtype)))
    print(dtype, np.asarray(a).dtype, np.asarray(doubled).dtype, np.asarray(doubled).astype(np.float32).tolist())
lr = pw.jit(lambda lr: lr * 0.5, slice=pw.virtual_slice(2, axes="x"))(0.1)
print(type(lr).__name__, lr.weak_type, lr.result().weak_type, (jnp.ones(2, jnp.bfloat16) * lr).dtype)
client.close()
"""
    stdout = client_script(snippet, service_file)
    assert stdout.splitlines() == [f"{d} {d} {d} [2.0, 4.0, 2.0, 4.0]" for d in (
        "int4", "uint4", "float4_e2m1fn", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")] + \
        ["WeakHandle True True bfloat16"]


def test_a_result_returned_twice_through_the_service_is_one_handle(service):
    """A program returning one value twice (`return y, y`) gets one remote handle in both places: dropping one
    name keeps the result for the other (two keys of one service handle released it with the first), and once
    both are dropped the service holds nothing and reserves nothing."""
    _, service_file, _ = service
    snippet = """
import gc, sys
import numpy as np
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
double = pw.jit(lambda v: v * 2, slice=pw.virtual_slice(2, axes="x"))
@pw.program
def twice(v):
    y = double(v)
    return y, y
for _ in range(3):
    first, second = twice(np.ones(4, np.float32))
    assert first is second
    del first
    gc.collect()
    print(np.asarray(second.result(timeout=60)).tolist(), client.object_count())
    del second
    gc.collect()
    print(client.object_count())
client.close()
"""
    stdout = client_script(snippet, service_file)
    assert stdout == "[2.0, 2.0, 2.0, 2.0] 1\n0\n" * 3
    assert_back_to_baseline(service_file)


def test_a_cond_result_returned_through_the_service_is_held_until_dropped(service):
    """A pw.cond's result that a program returns as it is, held by a remote handle, is one of the client's
    objects on the service (its status counts its bytes), and dropping the handle gives it back, leaving the
    service as it was. Before, the service counted none of it while the array lay on its devices."""
    _, service_file, _ = service
    snippet = """
import gc, sys
import jax.numpy as jnp
import numpy as np
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
on1 = pw.virtual_slice(1, axes="x", island="island1")
grow = pw.jit(lambda v: jnp.tile(v, 4) * 2.0, slice=on1)
positive = pw.jit(lambda v: v.sum() > 0, slice=on1)
bump = pw.jit(lambda y: y + 1.0, slice=on1)
keep = pw.jit(lambda y: y * 1.0, slice=on1)
@pw.program
def chosen(v):
    return pw.cond(positive(v), bump, keep, grow(v))
for _ in range(3):
    y = chosen(np.ones(256, np.float32))
    value = np.asarray(y.result(timeout=60))[:2].tolist()
    print(value, client.object_count(), list(client.status()["clients"].values()))
    del y
    gc.collect()
    print(client.object_count())
client.close()
"""
    stdout = client_script(snippet, service_file)
    assert stdout == "[3.0, 3.0] 1 [{'objects': 1, 'bytes': 4096}]\n0\n" * 3
    assert_back_to_baseline(service_file)


def test_a_host_callback_is_refused_through_the_service_in_one_line(service):
    """A placed function that calls back to the host (jax.debug.print) stays in the process that traced it
    (jax.export cannot serialise it): the service's islands, in another process, cannot run it, and the client
    says so in one line before sending anything; the connection goes on serving."""
    _, service_file, _ = service
    snippet = """
import sys
import jax, numpy as np
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
def printing(v):
    jax.debug.print("v={v}", v=v)
    return v + 1
try:
    pw.jit(printing, slice=pw.virtual_slice(2, axes="x"))(np.ones(2, np.float32))
except NotImplementedError as error:
    print(error)
print(np.asarray(pw.jit(lambda v: v * 2, slice=pw.virtual_slice(2, axes="x"))(np.ones(2, np.float32))).tolist())
client.close()
"""
    stdout = client_script(snippet, service_file)
    refusal, doubled = stdout.splitlines()
    assert re.fullmatch(r"executable @printing\w* calls back to the host \(jax.debug.print, jax.debug.callback, "
                        r"jax.pure_callback or io_callback\), which only islands in the process that traced it can "
                        r"run, and the islands of pw-serve run in the service's process: run it on the embedded "
                        r"backend, or return the values and print them from the handles", refusal), refusal
    assert doubled == "[2.0, 2.0]"


def test_a_function_on_explicit_axes_runs_through_the_service(service):
    """A placed function traced on a slice of Explicit axes (JAX's explicit sharding mode) is exported for its
    slice's devices: the service's plan check takes it for a slice of that size (it refused any export for more
    than one device), and its result is NumPy's."""
    _, service_file, _ = service
    snippet = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, PartitionSpec as P
import pathways_mlir as pw
client = pw.connect(sys.argv[1])
s = pw.virtual_slice(2, axes="x", axis_types=AxisType.Explicit)
layer = pw.jit(lambda v, w: jnp.einsum("bi,io->bo", v, w, out_sharding=P("x", None)), slice=s, in_specs=(P("x"), None))
v, w = np.arange(8.0, dtype=np.float32).reshape(4, 2), np.ones((2, 3), np.float32)
print(np.allclose(np.asarray(layer(v, w)), v @ w))
client.close()
"""
    stdout = client_script(snippet, service_file)
    assert stdout == "True\n"


def test_an_elastic_trainer_trains_through_the_service_as_plain_jax_does(service):
    """`pw.ElasticTrainer` with a client of the service: its state stays in the service between steps (remote
    handles), its snapshots are read with its timeout, and the trained parameters are plain JAX's."""
    _, service_file, _ = service
    snippet = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import pathways_mlir as pw
client = pw.connect(sys.argv[1])

def loss(p, x, y):
    return jnp.mean((x @ p["w"] - y) ** 2)

def sgd(p, x, y):
    value, g = jax.value_and_grad(loss)(p, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, p, g), value

placed = pw.jit(sgd, slice=pw.virtual_slice(2, axes="data"), in_specs=(None, P("data"), P("data")), out_specs=None)
step = pw.program(lambda p, b: placed(p, *b))

def batch(i):
    x = np.random.default_rng(i).normal(size=(8, 4)).astype(np.float32)
    return x, x @ np.ones((4, 1), np.float32)

trainer = pw.ElasticTrainer(step, batch, snapshot_every=5, client=client, timeout=60)
state = trainer.run({"w": np.zeros((4, 1), np.float32)}, 20)
want = {"w": jnp.zeros((4, 1))}
for i in range(20):
    want = jax.jit(sgd)(want, *batch(i))[0]
print(type(state["w"]).__name__, np.allclose(np.asarray(state["w"]), np.asarray(want["w"]), rtol=1e-5, atol=1e-6))
client.close()
"""
    stdout = client_script(snippet, service_file)
    assert stdout == "RemoteHandle True\n"


@pytest.mark.parametrize("timeout", ["5", 0, -1, float("nan"), True])
def test_a_bad_reply_timeout_is_refused_before_connecting(tmp_path, timeout):
    """`timeout="5"` was a bare TypeError, and 0, -1 or nan a ServiceError saying the service could not be
    reached; each is now refused, in one line, before any service is looked for."""
    with pytest.raises(ValueError, match=r"^timeout must be a positive number of seconds or None, not "):
        open_connection(str(tmp_path / "no-service.json"), timeout=timeout)
