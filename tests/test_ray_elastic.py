"""Losing an island on the Ray backend, on a real Ray cluster on this machine (`ray.cluster_utils.Cluster`).

Three nodes, all on 127.0.0.1: a head holding no island (this process
connects to it) and one node per island of 4 CPU devices, so either
island's node can be removed. The runtime's monitor notices an island
actor that dies (killed by name, or its node removed) and takes the island
out through the same path as `Runtime.lose_island` on the embedded
backend; a node offering the island's resource that joins in place of
the lost one brings it back. Every wait has a timeout, every runtime is
closed and the cluster is shut down at the end. Skipped where Ray is not
installed.
"""

import os
import re
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import ClusterError
from pathways_mlir.runtime.runtime import Runtime

ray = pytest.importorskip("ray")

from pathways_mlir.benchmarks import elastic as elastic_bench  # noqa: E402
from pathways_mlir.benchmarks import ray_backend as workloads  # noqa: E402
from pathways_mlir.runtime.ray_backend import NAMESPACE, island_name  # noqa: E402
from fetching import settled, until  # noqa: E402
from test_elastic import lost_and_restored_at_next_submit, started_while_restored  # noqa: E402
from training import (assert_same_training, batch, elastic_step, init, mesh_sizes, on_the_same_meshes,  # noqa: E402
                      preemption, train_elastic, train_step, training_island)

WAIT = 60          # seconds: every wait is bounded
X = np.full((256, 256), 0.01, np.float32)
THREE, _ = workloads.inputs()
OTHER = {"island0": "island1", "island1": "island0"}


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()      # an earlier module's runtime left this process connected to its own cluster
    c = workloads.start_cluster(nodes=2, spare_head=True)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture
def rt(cluster):
    runtime = Runtime(backend="ray", islands=2, per_island=4, address=cluster.address)
    yield runtime
    runtime.close()


def value(handle):
    """A handle's array on the host, waiting at most WAIT seconds."""
    return np.asarray(handle.result(timeout=WAIT))


def islands(rt) -> list[str]:
    return [i.name for i in rt.resources.topology.islands]


def heavy(x):
    """About a second of device work on a CPU slice of 4 (here, with other work on the machine)."""
    return jax.lax.fori_loop(0, 3000, lambda i, y: jnp.tanh(y @ y.T * 0.01), x)


def placed(fn, island, name):
    """`fn` placed on a slice of 4 devices pinned to `island`."""
    return pw.jit(fn, slice=pw.virtual_slice(4, axes="x", island=island, name=name), in_specs=P("x"),
                  out_specs=P("x"))


slow_on = {i: placed(heavy, i, f"ray_slow_{i}") for i in OTHER}
plus1_on = {i: placed(lambda x: x + 1.0, i, f"ray_plus1_{i}") for i in OTHER}
slow = {i: pw.program(slow_on[i]) for i in OTHER}
plus1 = {i: pw.program(plus1_on[i]) for i in OTHER}


def through(island):
    """A program that goes from the other island (about a second of work) to `island` and back: while the
    other island works, `island` waits for its value and the other island then waits for `island`'s."""
    def there_and_back(x):
        return plus1_on[OTHER[island]](plus1_on[island](slow_on[OTHER[island]](x)))
    return pw.program(there_and_back)


there_and_back = {i: through(i) for i in OTHER}
free = pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice(4, axes="x", name="ray_free"), in_specs=P("x"),
              out_specs=P("x"))


@pw.program
def anywhere(x):
    return free(x)


def kill_by_name(island):
    ray.kill(ray.get_actor(island_name(island), namespace=NAMESPACE))


def kill_its_process(island):
    actor = ray.get_actor(island_name(island), namespace=NAMESPACE)
    os.kill(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=WAIT), signal.SIGKILL)


@pytest.mark.parametrize("kill", [kill_by_name, kill_its_process], ids=["by name", "its process"])
def test_an_island_actor_killed_is_lost_then_restored(rt, kill):
    want = np.asarray(jax.jit(heavy)(X))
    with Client(rt) as client:
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        victim = anywhere.compiled(X, runtime=rt).plan.slices["ray_free"].island
        survivor = OTHER[victim]
        kept = plus1[victim].run(X, client=client)          # a result that lives only on the victim
        value(kept)
        for program in (slow[victim], slow[survivor], there_and_back[victim]):
            value(program.run(X, client=client))        # compiled before the runs that matter
        doomed = client.start(slow[victim].compiled(X, runtime=rt).plan, [X])       # its result lives on the victim
        parked = client.start(there_and_back[victim].compiled(X, runtime=rt).plan, [X])   # both islands wait
        other = client.start(slow[survivor].compiled(X, runtime=rt).plan, [X])
        version = rt.resources.version
        kill(victim)                                    # well within parked's first second
        until(lambda: rt.resources.version > version, "the monitor takes the island out", WAIT)   # no call needed
        assert islands(rt) == [survivor]
        with pytest.raises(pw.IslandLost, match=f"island {victim} was lost: run {parked.id} of there_and_back"):
            client.wait(parked, timeout=WAIT)
        with pytest.raises(pw.IslandLost, match=f"island {victim} was lost: run {parked.id} of there_and_back"):
            value(client.handles(parked)[0])               # its result was to live on the survivor
        with pytest.raises(pw.IslandLost, match=f"island {victim} was lost"):
            client.wait(doomed, timeout=WAIT)
        client.wait(other, timeout=WAIT)
        np.testing.assert_allclose(value(client.handles(other)[0]), want, rtol=1e-5)
        assert not rt.status()["islands"][survivor]["runs"]     # nothing left waiting for the victim
        with pytest.raises(pw.IslandLost, match=f"island {victim} was lost"):
            value(kept)
        status = rt.status()
        assert status["islands"][victim]["unreachable"].startswith(f"IslandLost: island {victim} was lost")
        # Its cause is what saw the loss first: Ray's report of the dead actor, or the driver's connection to it
        # breaking (a killed process closes it at once, often before Ray reports).
        assert re.search(f"{victim}: unreachable: IslandLost: island {victim} was lost "
                         r"\((ActorDiedError|ConnectionBroken)", str(status)), status
        # The next call lowers again, onto the survivor.
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        assert anywhere.compiled(X, runtime=rt).plan.slices["ray_free"].island == survivor
        with pytest.raises(ValueError, match=f"cannot place slice .*: it asks for island '{victim}', which the "
                                             f"topology does not have"):
            plus1[victim].run(X, client=client)
        # Brought back by hand (its node is alive): a fresh actor, which its peer sends to and receives from.
        rt.restore_island(victim)
        assert islands(rt) == ["island0", "island1"]
        np.testing.assert_allclose(value(plus1[victim].run(X, client=client)), X + 1)
        want_three, _ = workloads.expected(THREE, workloads.inputs()[1])
        np.testing.assert_allclose(value(workloads.three_blocks.run(*THREE, client=client)), want_three, rtol=1e-6)
        with pytest.raises(pw.IslandLost, match=f"island {victim} was lost"):
            value(kept)                                    # a restored island does not bring results back
        # Lost by hand, as on the embedded backend: the actor is killed, and programs move.
        with pytest.raises(ValueError, match="there is no island 'island9' \\(islands: island0, island1\\)"):
            rt.lose_island("island9")
        with pytest.raises(ValueError, match=f"island '{victim}' is not lost"):
            rt.restore_island(victim)
        rt.lose_island(survivor)
        with pytest.raises(ValueError, match=f"Failed to look up actor with name '{island_name(survivor)}'"):
            ray.get_actor(island_name(survivor), namespace=NAMESPACE)
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        assert anywhere.compiled(X, runtime=rt).plan.slices["ray_free"].island == victim
    assert settled(rt, WAIT)


# -- training (pw.ElasticTrainer) that loses a node, resumes from a host snapshot, and gets the node back -----

def train(client, steps, at=None):
    """Trains `steps` steps with `pw.ElasticTrainer` (a host snapshot every 3 steps); `at` maps a step to what
    happens just after it is dispatched (once). Returns the final parameters on the host and the recoveries."""
    events = dict(at or {})

    def on_step(n, metrics):
        if n in events:
            events.pop(n)()

    trainer = pw.ElasticTrainer(train_step, batch, snapshot_every=3, client=client, on_step=on_step, timeout=WAIT)
    final = trainer.run(init(), steps)
    return jax.tree_util.tree_map(lambda leaf: np.asarray(leaf.result(WAIT) if hasattr(leaf, "result") else leaf),
                                  final), len(trainer.recoveries)


def test_a_run_whose_island_is_lost_and_restored_while_it_starts_fails_with_island_lost(rt, monkeypatch):
    """The island goes and comes back between a run's load and its delivery: the fresh actor was sent work of
    a plan it had never been given, and the run failed there with a KeyError."""
    program = there_and_back["island1"]
    with Client(rt) as client:
        plan = program.compiled(X, runtime=rt).plan
        lost_and_restored_at_next_submit(rt, monkeypatch, "island1")
        run = client.start(plan, [X])
        with pytest.raises(pw.IslandLost, match=f"island island1 was lost and restored while run {run.id} of "
                                                f"there_and_back was starting: its plan was loaded onto the lost"):
            value(client.handles(run)[0])
        np.testing.assert_allclose(value(program.run(X, client=client)), np.asarray(jax.jit(heavy)(X)) + 2,
                                   rtol=1e-5)
    assert settled(rt, WAIT)


def test_a_run_delivered_to_the_lost_island_while_it_is_restored_fails_with_island_lost(rt, monkeypatch):
    """A run delivered to the lost island after the fresh actor's proxy had copied what failed there (moments
    before it took the lost one's place): its failure stayed on the lost proxy, the fresh one asked its actor
    for the result, which had never had the run, and a fetch of it waited until its timeout."""
    program = plus1["island1"]
    with Client(rt) as client:
        plan = program.compiled(X, runtime=rt).plan
        run = started_while_restored(rt, monkeypatch, client, plan, [X], "island1")
        with pytest.raises(pw.IslandLost, match="island island1 was lost"):
            client.handles(run)[0].result(timeout=5)
        np.testing.assert_allclose(value(program.run(X, client=client)), X + 1)
    assert settled(rt, WAIT)


def test_an_island_is_restored_while_the_other_is_lost(rt):
    """Both islands lost, one restored: its fresh actor was connected to the other's dead actor too, and the
    restore failed (RayTaskError(ActorDiedError) from its `connect`)."""
    with Client(rt) as client:
        rt.lose_island("island0")
        rt.lose_island("island1")
        rt.restore_island("island1")
        np.testing.assert_allclose(value(plus1["island1"].run(X, client=client)), X + 1)
        rt.restore_island("island0")
        np.testing.assert_allclose(value(there_and_back["island1"].run(X, client=client)),
                                   np.asarray(jax.jit(heavy)(X)) + 2, rtol=1e-5)
    assert settled(rt, WAIT)


def test_an_island_is_restored_while_the_other_islands_actor_dies(rt):
    """The other island's actor dies while an island is restored, before the monitor sees it (stopped here): the
    fresh actor's connect to it raised RayTaskError(ActorDiedError), the restore failed, and its node counted as
    one a restart failed on (the monitor would never bring the island back there). The dead peer is lost
    instead, and the restore goes on."""
    with Client(rt) as client:
        rt.lose_island("island0")
        rt.islands.unwatch()
        kill_by_name("island1")
        rt.restore_island("island0")
        assert rt.islands["island1"].dying and not rt.islands.failed_nodes
        np.testing.assert_allclose(value(plus1["island0"].run(X, client=client)), X + 1)
    assert settled(rt, WAIT)


@pytest.mark.parametrize("graceful", [True, False], ids=["stopped", "killed"])
def test_training_survives_a_removed_node_and_uses_it_again_once_a_node_joins(cluster, rt, graceful):
    with Client(rt) as client:
        want, recoveries = train(client, 12)
        assert recoveries == 0
        home = training_island(rt)
        [node] = [n for n in cluster.worker_nodes if n.node_id == rt.status()["islands"][home]["node"]]
        joined = []

        def remove():
            version = rt.resources.version
            cluster.remove_node(node, allow_graceful=graceful)
            until(lambda: rt.resources.version > version, "the monitor takes the island out", WAIT)
            assert islands(rt) == [OTHER[home]]
            if graceful:           # a node killed hard counts as alive (offering the resource) for a while
                with pytest.raises(ClusterError, match=f"no node of the Ray cluster offers the resource of "
                                                       f"island {home}: start one with ray start"):
                    rt.restore_island(home)

        def join():
            joined.append(cluster.add_node(num_cpus=1, node_ip_address=workloads.LOOPBACK, include_dashboard=False,
                                           resources={island_name(home): 1}))
            until(lambda: home in islands(rt), "the monitor brings the island back", WAIT)

        got, recoveries = train(client, 12, at={7: remove, 9: join})
        assert recoveries == 1
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
        # The island is back, on the new node, and a later program uses it.
        assert islands(rt) == ["island0", "island1"]
        assert rt.status()["islands"][home]["node"] == joined[0].node_id
        np.testing.assert_allclose(value(plus1[home].run(X, client=client)), X + 1)
    assert settled(rt, WAIT)


def test_training_survives_its_island_actor_killed_by_name(rt):
    with Client(rt) as client:
        want, _ = train(client, 9)
        home = training_island(rt)
        # Returns once the runtime has taken the island out (see the benchmark's kill_actor for why).
        got, recoveries = train(client, 9, at={4: lambda: elastic_bench.kill_actor(rt, home)})
        assert recoveries == 1
        assert islands(rt) == [OTHER[home]]
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    rt.restore_island(home)                 # its node is alive: the island comes back by hand
    assert islands(rt) == ["island0", "island1"]
    assert settled(rt, WAIT)


# -- an elastic slice: the step shrinks onto the devices its island has left and grows back ---------------

elastic_train = elastic_step(pw.virtual_slice("1..4", axes="x", island="island0", name="ray_elastic_train"))


def test_training_shrinks_onto_the_devices_left_and_grows_back(rt):
    with Client(rt) as client:
        got = train_elastic(client, elastic_train, 8, preemption(rt, (2, 3), at=3, back_at=5), WAIT)
    sizes = mesh_sizes(got[2], 8, "ray_elastic_train")
    assert sizes == [4, 4, 4, 2, 2, 4, 4, 4]
    assert_same_training(got[:2], on_the_same_meshes(sizes, batch))
    assert settled(rt, WAIT)
