"""The README's `ray start` recipe on one machine: a head and a worker node started with the `ray start` CLI.

Each node offers one island's resource (`pw-island-island0` on the head,
`pw-island-island1` on the worker). With Ray 2.60 a second node cannot take
127.0.0.1 (its `ray start` either refuses, or swaps 127.0.0.1 for the
machine's outward address), so, as the README says, the nodes take loopback
addresses of their own: the head 127.0.0.2, the worker 127.0.0.3. Token
authentication is on for every process (a token file of the test's own).
A driver in a subprocess runs the three-block program across both islands
with `pw.configure(backend="ray", address=...)`; its result must equal plain
JAX. Each node runs under its own `ray start --block`, with a private
`--temp-dir`, and the test stops exactly the processes those commands
started (never `ray stop`, which stops every Ray on the machine). Every wait
has a timeout. Skipped where Ray is not installed.

Opt-in: at any node address other than 127.0.0.1, Ray 2.60's nodes listen on
every interface (`ss` shows the GCS and raylets on `*:port`), which the
project's tests must not do (their sockets stay on 127.0.0.1). So the test
runs only with `PW_TEST_RAY_START=1`, on a machine where that is acceptable
(token authentication is on; the traffic itself stays on loopback).
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
if os.environ.get("PW_TEST_RAY_START") != "1":
    pytest.skip("ray start nodes at 127.0.0.2/3 listen on every interface: set PW_TEST_RAY_START=1 to run this",
                allow_module_level=True)
psutil = pytest.importorskip("psutil")     # a dependency of Ray

from pathways_mlir.benchmarks import ray_backend as workloads  # noqa: E402

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
START_TIMEOUT = 120        # seconds for one `ray start` to report its node up
DRIVER_TIMEOUT = 300
RAY = str(Path(sys.executable).parent / "ray")

DRIVER = """
import json, sys
import numpy as np
import pathways_mlir as pw
from pathways_mlir.benchmarks import ray_backend as workloads

pw.configure(backend="ray", address=sys.argv[1], islands=2, per_island=4)
(x,), _ = workloads.inputs()
np.save(sys.argv[2], np.asarray(workloads.three_blocks(x)))
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in __import__("ray").nodes() if n["Alive"]}
print(json.dumps({island: nodes[s["node"]] for island, s in pw.status()["islands"].items()}))
"""


def free_port() -> int:
    """A TCP port free on every interface now (the head's GCS binds them all at 127.0.0.2)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Node:
    """One `ray start --block` command and every process it started, stopped together."""

    def __init__(self, name: str, args: list[str], env: dict, log: Path):
        self.name, self.args, self.env, self.log = name, args, env, log
        self.started: set[psutil.Process] = set()
        self.process = None

    def start(self, timeout: float = START_TIMEOUT, tries: int = 3) -> None:
        """Starts the node and waits until the command reports it up; fails with its log's tail otherwise.

        Ray gives a raylet a fixed 30 s to register with the GCS (`node.py`,
        not configurable in Ray 2.60), which a loaded machine can exceed; a
        node that timed out so is started again, up to `tries` times.
        """
        for _ in range(tries):
            with open(self.log, "w") as out:
                self.process = subprocess.Popen([RAY, "start", "--block", *self.args], env=self.env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + timeout
            while "Ray runtime started." not in self.log.read_text():
                self.remember()
                if self.process.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            else:
                self.remember()
                return
            self.stop()
            if "timed out during startup" not in self.log.read_text():
                break
        tail = "\n".join(self.log.read_text().splitlines()[-5:])
        pytest.fail(f"ray start did not bring the {self.name} node up (within {timeout} s):\n{tail}")

    def remember(self) -> None:
        """Adds the command's descendants alive now to the processes it started."""
        try:
            self.started |= set(psutil.Process(self.process.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass

    def stop(self, timeout: float = 30) -> None:
        """Stops the command (SIGTERM stops its node), then kills whatever it started that is still alive."""
        if self.process is None:
            return
        self.remember()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        _, alive = psutil.wait_procs(list(self.started), timeout=timeout)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    """A head (island0) and a worker node (island1) started with `ray start`; yields (address, env)."""
    tmp = Path(tempfile.mkdtemp(prefix="pw-ray-"))     # short: Ray's socket paths under it have a length limit
    token = tmp / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    address = f"{HEAD_IP}:{free_port()}"
    common = ["--num-cpus=1", "--disable-usage-stats", "--include-log-monitor=false"]
    nodes = []
    try:
        nodes.append(Node("head", ["--head", f"--port={address.split(':')[1]}", f"--node-ip-address={HEAD_IP}",
                                   f"--temp-dir={tmp / 'ray'}", "--include-dashboard=false",
                                   '--resources={"pw-island-island0": 1}', *common], env, tmp / "head.log"))
        nodes[-1].start()
        nodes.append(Node("worker", [f"--address={address}", f"--node-ip-address={WORKER_IP}",
                                     '--resources={"pw-island-island1": 1}', *common], env, tmp / "worker.log"))
        nodes[-1].start()
        yield address, env
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_three_block_program_runs_across_two_ray_start_nodes(cluster, tmp_path):
    address, env = cluster
    result = tmp_path / "result.npy"
    try:
        driver = subprocess.run([sys.executable, "-c", DRIVER, address, str(result)], env=env,
                                capture_output=True, text=True, timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the driver did not finish within {DRIVER_TIMEOUT} s:\n{(error.stderr or b'')[-2000:]}")
    assert driver.returncode == 0, driver.stderr[-3000:]
    islands = json.loads(driver.stdout.strip().splitlines()[-1])
    assert islands == {"island0": HEAD_IP, "island1": WORKER_IP}      # each island on its own node
    three, pipeline = workloads.inputs()
    expected, _ = workloads.expected(three, pipeline)
    np.testing.assert_array_equal(np.load(result, allow_pickle=False), expected)
