"""Losing an island (embedded backend): runs that use it fail with IslandLost, programs move, training resumes."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

X = np.full((512, 512), 0.01, np.float32)
WAIT = 30       # seconds: every wait is bounded


def value(handle):
    """A handle's array on the host, waiting at most WAIT seconds."""
    return np.asarray(handle.result(timeout=WAIT))


def heavy(x):
    """About half a second of device work on a CPU slice of 4."""
    return jax.lax.fori_loop(0, 300, lambda i, y: jnp.tanh(y @ y.T * 0.01), x)


def settled(rt):
    """Whether, within WAIT seconds, the islands hold no results and no device memory is reserved (the
    device work of failed runs may still be finishing)."""
    deadline = time.monotonic() + WAIT
    while rt.object_count() or sum(rt.usage().values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def pinned(island, name):
    return pw.virtual_slice(4, axes="x", island=island, name=name)


slow0 = pw.jit(heavy, slice=pinned("island0", "slow0"), in_specs=P("x"), out_specs=P("x"))
plus1 = pw.jit(lambda x: x + 1.0, slice=pinned("island1", "plus1"), in_specs=P("x"), out_specs=P("x"))
slow1 = pw.jit(heavy, slice=pinned("island1", "slow1"), in_specs=P("x"), out_specs=P("x"))
free = pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice(4, axes="x", name="free"), in_specs=P("x"),
              out_specs=P("x"))


@pw.program
def across(x):                  # island0, then island1
    return plus1(slow0(x))


@pw.program
def on_island0(x):
    return slow0(x)


@pw.program
def on_island1(x):
    return slow1(x)


@pw.program
def anywhere(x):
    return free(x)


@pytest.fixture
def rt():
    runtime = Runtime(embedded_device_map(2, 4))
    yield runtime
    runtime.close()


def test_runs_in_flight_on_a_lost_island_fail_and_others_finish(rt):
    want = np.asarray(jax.jit(heavy)(X))
    with Client(rt) as client:
        doomed = [client.start(across.compiled(X, runtime=rt).plan, [X]) for _ in range(3)]
        other = client.start(on_island1.compiled(X, runtime=rt).plan, [X])
        assert not rt.run_done(doomed[-1])
        start = time.monotonic()
        rt.lose_island("island0")
        with pytest.raises(pw.IslandLost, match=f"island island0 was lost: run {doomed[-1].id} of across"):
            client.wait(doomed[-1], timeout=10)
        assert time.monotonic() - start < 1
        for run in doomed:             # each failed, or was over before the loss (its result is on island1)
            try:
                np.testing.assert_allclose(value(client.handles(run)[0]), want + 1, rtol=1e-5)
            except pw.IslandLost as error:
                assert "island0" in str(error)
        with pytest.raises(pw.IslandLost, match="island0"):
            value(client.handles(doomed[-1])[0])
        client.wait(other, timeout=WAIT)
        np.testing.assert_allclose(value(client.handles(other)[0]), want, rtol=1e-5)
    assert settled(rt)


def test_results_that_lived_only_on_the_lost_island_raise(rt):
    with Client(rt) as client:
        there, here = on_island0.run(X, client=client), plus1.run(X, client=client)
        value(there), value(here)
        rt.lose_island("island0")
        with pytest.raises(pw.IslandLost, match="island island0 was lost"):
            value(there)
        with pytest.raises(pw.IslandLost):
            plus1.run(there, client=client)            # using it as an argument raises too
        np.testing.assert_allclose(value(here), X + 1)
        rt.restore_island("island0")
        with pytest.raises(pw.IslandLost):             # a restored island does not bring results back
            value(there)
    assert settled(rt)


def test_queued_runs_that_need_the_lost_island_fail(rt):
    with Client(rt) as client:
        rt.scheduler.hold()
        queued0 = client.start(on_island0.compiled(X, runtime=rt).plan, [X])
        queued1 = client.start(on_island1.compiled(X, runtime=rt).plan, [X])
        rt.lose_island("island0")
        with pytest.raises(pw.IslandLost, match="on_island0"):
            client.wait(queued0, timeout=10)
        rt.scheduler.release()
        client.wait(queued1, timeout=WAIT)
    assert settled(rt)


def test_programs_move_off_a_lost_island_and_back_when_it_returns(rt):
    with Client(rt) as client:
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        home = anywhere.compiled(X, runtime=rt).plan.slices["free"].island
        version = rt.lose_island(home)
        assert rt.resources.version == version and home not in [i.name for i in rt.resources.topology.islands]
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        assert anywhere.compiled(X, runtime=rt).plan.slices["free"].island != home
        # A slice pinned to the lost island cannot be placed: the error names what is free.
        pinned_there = on_island0 if home == "island0" else on_island1
        with pytest.raises(ValueError, match=f"cannot place slice .* in island '{home}'; free: island"):
            pinned_there.run(X, client=client)
        rt.restore_island(home)
        np.testing.assert_allclose(value(anywhere.run(X, client=client)), X * 2)
        assert anywhere.compiled(X, runtime=rt).plan.slices["free"].island == home
        np.testing.assert_allclose(value(pinned_there.run(X, client=client)), np.asarray(jax.jit(heavy)(X)),
                                   rtol=1e-5)
    assert settled(rt)


# -- a training loop that loses an island and resumes from a host snapshot ---------------------------------

def loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


sgd = pw.jit(lambda params, x, y: jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params,
                                                         jax.grad(loss)(params, x, y)),
             slice=pw.virtual_slice(4, axes="x", name="train"), in_specs=(None, P("x"), P("x")), out_specs=None)


@pw.program
def train_step(params, x, y):
    return sgd(params, x, y)


def batch(step):
    x = np.random.default_rng(step).normal(size=(8, 4)).astype(np.float32)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def init():
    rng = np.random.default_rng(0)
    return {"w1": rng.normal(size=(4, 16)).astype(np.float32) * 0.5, "b1": np.zeros(16, np.float32),
            "w2": rng.normal(size=(16, 1)).astype(np.float32) * 0.5, "b2": np.zeros(1, np.float32)}


def train(rt, client, steps, lose_at=None, every=3):
    """Trains `steps` steps keeping a host snapshot every `every` steps; on IslandLost resumes from it."""
    params, step, snapshot, recoveries = init(), 0, (0, init()), 0
    while step < steps:
        try:
            if step == lose_at and not recoveries:
                rt.lose_island(train_step.compiled(params, *batch(0), runtime=rt).plan.slices["train"].island)
            params = train_step.run(params, *batch(step), client=client)
            step += 1
            if step % every == 0:
                snapshot = (step, jax.tree_util.tree_map(value, params))
        except pw.IslandLost:
            (step, params), recoveries = snapshot, recoveries + 1
    return jax.tree_util.tree_map(value, params), recoveries


def test_training_loses_an_island_and_resumes_from_a_snapshot(rt):
    with Client(rt) as client:
        want, _ = train(rt, client, 12)
        first = train_step.compiled(init(), *batch(0), runtime=rt).plan.slices["train"].island
        got, recoveries = train(rt, client, 12, lose_at=7)
        assert recoveries == 1
        assert train_step.compiled(init(), *batch(0), runtime=rt).plan.slices["train"].island != first
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert settled(rt)
