"""The Ray backend on a real 2-node Ray cluster on this machine (`ray.cluster_utils.Cluster`).

Each node holds one island of 4 CPU devices (it offers the resource
`pw-island-<island>`); the runtime connects to the cluster by address, as it
would to one spanning hosts. Everything binds to 127.0.0.1. The three-block
program, a 4-stage pipeline and two clients run on it and must equal the
embedded backend; a run costs one actor call per island; when an island
never sends, its peer waits and the status names what it waits for. Every wait has a timeout,
and the cluster is shut down at the end. Skipped where Ray is not installed.
"""

import os
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import ClusterError
from pathways_mlir.runtime.runtime import Runtime

ray = pytest.importorskip("ray")

from pathways_mlir.benchmarks import ray_backend as workloads  # noqa: E402
from pathways_mlir.runtime.ray_backend import NAMESPACE, island_name  # noqa: E402

THREE, PIPELINE = workloads.inputs()
ISLANDS = ("island0", "island1")


@pytest.fixture(scope="module")
def cluster():
    c = workloads.start_cluster(nodes=2)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def runtime(cluster):
    rt = Runtime(backend="ray", islands=2, per_island=4, address=cluster.address)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def embedded():
    rt = Runtime(islands=2, per_island=4)
    yield rt
    rt.close()


def values(out):
    """The arrays of a program's result handles, each waited for at most a minute."""
    return jax.tree.map(lambda handle: np.asarray(handle.result(timeout=60)), out)


def test_each_island_is_a_named_actor_on_the_node_holding_its_devices(runtime):
    status = runtime.status()
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes.values()} == {"127.0.0.1"}
    for island in ISLANDS:
        node = nodes[status["islands"][island]["node"]]
        assert node["Resources"].get(island_name(island)) == 1       # the node that offers the island
        assert ray.get_actor(island_name(island), namespace=NAMESPACE) is not None
    assert status["islands"]["island0"]["node"] != status["islands"]["island1"]["node"]


def test_a_cluster_without_an_islands_resource_is_refused(runtime):
    # A ClusterError: pw-serve says it in one line as a user's error (a RuntimeError was its "internal error").
    with pytest.raises(ClusterError, match="offers the resource of island.* island2"):
        Runtime(backend="ray", islands=3, per_island=2)


def test_three_blocks_and_a_4_stage_pipeline_equal_the_embedded_backend(runtime, embedded):
    three_plan = workloads.three_blocks.compiled(*THREE, runtime=runtime).plan
    assert {s.kind for steps in three_plan.islands.values() for s in steps} >= {"send", "recv"}
    with Client(runtime) as ours, Client(embedded) as reference:
        for program, args in ((workloads.three_blocks, THREE), (workloads.pipeline4, PIPELINE)):
            for dispatch in ("parallel", "sequential"):
                jax.tree.map(np.testing.assert_array_equal, values(program.run(*args, client=ours, dispatch=dispatch)),
                             values(program.run(*args, client=reference)))


def test_a_run_is_one_start_call_per_island(runtime):
    runs = 5
    before = {name: dict(island.calls) for name, island in runtime.islands.items()}
    with Client(runtime) as client:
        for program, args in ((workloads.three_blocks, THREE), (workloads.pipeline4, PIPELINE)):
            outs = [program.run(*args, client=client) for _ in range(runs)]
            for out in outs:
                values(out)
    for name, island in runtime.islands.items():
        assert island.calls["start"] - before[name].get("start", 0) == 2 * runs


def test_two_clients_at_once_see_only_their_objects(runtime, embedded):
    results, errors = {}, []

    def work(client, k):
        try:
            outs = [workloads.three_blocks.run(THREE[0] * k, client=client) for _ in range(3)]
            results[k] = outs          # the handles: the clients keep their objects
        except BaseException as error:  # noqa: BLE001  (reported by the test thread)
            errors.append(error)

    first, second = Client(runtime), Client(runtime)
    try:
        threads = [threading.Thread(target=work, args=(c, k)) for c, k in ((first, 1.0), (second, -2.0))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads)
        with Client(embedded) as reference:
            for k, outs in results.items():
                want = values(workloads.three_blocks.run(THREE[0] * k, client=reference))
                for out in outs:
                    np.testing.assert_array_equal(values(out), want)
        assert len(first.objects()) == 3 and len(second.objects()) == 3
        assert not set(first.objects()) & set(second.objects())
        clients = runtime.status()["clients"]
        assert clients[first.id]["objects"] == 3 and clients[second.id]["objects"] == 3
        first.close()
        assert first.id not in runtime.status()["clients"] and len(second.objects()) == 3
    finally:
        first.close()
        second.close()
    assert runtime.object_count() == 0


def test_zz_a_step_waiting_forever_is_named_by_the_status(cluster, runtime):
    """Last in the module: an operator closes island0's actor (found by name) on purpose, so it never sends."""
    plan = workloads.three_blocks.compiled(*THREE, runtime=runtime).plan
    ray.get(ray.get_actor(island_name("island0"), namespace=NAMESPACE).close.remote(), timeout=30)
    client = Client(runtime)
    try:
        workloads.three_blocks.run(*THREE, client=client)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not runtime.status()["islands"]["island1"].get("runs"):
            time.sleep(0.1)
        status = runtime.status()
        assert status["islands"]["island0"]["runs"] == []
        [parked] = status["islands"]["island1"]["runs"]
        recv = next(s for s in plan.islands["island1"] if s.kind == "recv")
        launch = next(s for s in plan.islands["island0"] if s.kind == "launch" and s.id < recv.id)
        assert parked["waits_for"].startswith(f"recv of buffer {recv.dst_buffer} from island0 (send step ")
        assert parked["waits_for"].endswith(f"the result of launch step {launch.id} '{launch.label}'")
        assert f"waits for recv of buffer {recv.dst_buffer} from island0" in str(status)
        own = runtime.status(client.id)["islands"]["island1"]     # a client's own view, asked of the island actor
        assert own["runs"] == [parked] and own["runs_count"] == 1
        assert runtime.status(client.id + 1)["islands"]["island1"]["runs_count"] == 0
        serve = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_serve", "--status", "--address", "auto",
                                "--timeout", "100"],
                               env={**os.environ, "RAY_ADDRESS": cluster.address}, capture_output=True, text=True,
                               timeout=120)
        assert serve.returncode == 0, serve.stderr[-2000:]
        assert f"island1 on node {status['islands']['island1']['node']}: 1 run(s) under way" in serve.stdout
        assert f"waits for {parked['waits_for']}" in serve.stdout
    finally:
        runtime.close()       # fails the parked run, so the client closes at once
        client.close()
