"""The shared service owning its islands on a real 2-node Ray cluster on this machine
(`pw-serve --backend ray --address`), with a client process attached by `pw.connect`.

The client's results equal plain JAX; then an operator closes island0's actor (found by name) on
purpose, so a run's island1 part waits forever for island0's send, and the service's status
(`pw-serve --status --service-file`) names that unmet dependency. Everything binds to 127.0.0.1; every
wait has a timeout; the cluster and every process are stopped at the end. Skipped where Ray is not
installed.
"""

import re
import signal
import subprocess
import sys
import time

import pytest
from test_service import TIMEOUT, client, procs, read_json, serve, status_text  # noqa: F401  (procs: a fixture)

from pathways_mlir.runtime.service import open_connection

pytest.importorskip("ray")

from pathways_mlir.benchmarks.ray_backend import start_cluster  # noqa: E402

CLOSE_ISLAND0 = """
import sys, ray
from pathways_mlir.runtime.ray_backend import NAMESPACE, connect, island_name
connect(sys.argv[1])
ray.get(ray.get_actor(island_name("island0"), namespace=NAMESPACE).close.remote(), timeout=60)
ray.shutdown()
"""


@pytest.fixture
def cluster():
    c = start_cluster(nodes=2)
    yield c
    c.shutdown()


def test_a_ray_backed_service_names_a_step_waiting_forever(cluster, tmp_path, procs):  # noqa: F811
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    service_file = directory / "service.json"
    proc = serve(procs, "--backend", "ray", "--address", cluster.address, "--service-file", str(service_file),
                 backend="ray")
    stuck = client(service_file, "stuck", procs)
    assert read_json(stuck) == {"stage": "checked", "objects": 3}       # results equal plain JAX
    operator = subprocess.run([sys.executable, "-c", CLOSE_ISLAND0, cluster.address], capture_output=True,
                              text=True, timeout=TIMEOUT)
    assert operator.returncode == 0, operator.stderr[-3000:]
    stuck.stdin.write("go\n")
    stuck.stdin.flush()
    assert read_json(stuck) == {"stage": "stuck"}

    with open_connection(str(service_file), timeout=TIMEOUT) as observer:
        deadline = time.monotonic() + 60
        status = observer.status(full=True)
        while not status["islands"]["island1"].get("runs") and time.monotonic() < deadline:
            time.sleep(0.1)
            status = observer.status(full=True)
    assert status["islands"]["island0"]["runs"] == [] and status["islands"]["island0"]["node"]
    [parked] = status["islands"]["island1"]["runs"]
    assert parked["program"] == "step" and parked["client"] in status["service"]["connections"]
    assert re.fullmatch(r"recv of buffer \d+ from island0 \(send step \d+\): its buffer \d+, the result of launch "
                        r"step \d+ 'encode#0'", parked["waits_for"])       # the step whose result never comes
    text = status_text(service_file)
    assert f"run {parked['run']} (step, client {parked['client']}) waits for {parked['waits_for']}" in text

    stuck.kill()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 0 and list(directory.iterdir()) == []
