"""The small training loop the elastic tests run (both backends): an MLP on a 4-device slice, SGD, and
deterministic batches, with plain JAX's result to compare against."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw


def loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def sgd_step(params, batch):
    value, grads = jax.value_and_grad(loss)(params, *batch)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), value


sgd = pw.jit(sgd_step, slice=pw.virtual_slice(4, axes="x", name="train"), in_specs=(None, (P("x"), P("x"))),
             out_specs=None)


@pw.program
def train_step(params, batch):
    return sgd(params, batch)


def batch(step, rows=8):
    x = np.random.default_rng(step).normal(size=(rows, 4)).astype(np.float32)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def init():
    rng = np.random.default_rng(0)
    return {"w1": rng.normal(size=(4, 16)).astype(np.float32) * 0.5, "b1": np.zeros(16, np.float32),
            "w2": rng.normal(size=(16, 1)).astype(np.float32) * 0.5, "b2": np.zeros(1, np.float32)}


def training_island(runtime) -> str:
    """The island the training step is placed on now."""
    return train_step.compiled(init(), batch(0), runtime=runtime).plan.slices["train"].island


# -- elastic training: a data-parallel step on an elastic slice, and plain JAX on the same meshes ----------

def elastic_step(data_slice):
    """The training step as a program on `data_slice`, an elastic slice with one axis "x"."""
    return pw.program(pw.jit(sgd_step, slice=data_slice, in_specs=(None, (P("x"), P("x"))), out_specs=None))


def train_elastic(client, step, steps, at, wait, **options):
    """Trains `steps` steps of `step` with `pw.ElasticTrainer` (a host snapshot every 2 steps); `at` maps a
    step to what happens just after it is dispatched (once). Returns the final parameters on the host, each
    step's loss (of its latest run) and the trainer."""
    events, losses = dict(at), {}

    def on_step(n, metrics):
        losses[n - 1] = float(np.asarray(metrics[0].result(wait)))   # now: a lost island takes its results
        if n in events:
            events.pop(n)()

    trainer = pw.ElasticTrainer(step, options.pop("batch", batch), snapshot_every=2, client=client,
                                on_step=on_step, timeout=wait, **options)
    final = trainer.run(init(), steps)
    params = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf.result(wait) if hasattr(leaf, "result") else leaf),
                                    final)
    return params, [losses[i] for i in range(steps)], trainer


def preemption(runtime, devices, at: int, back_at: int, island: str = "island0") -> dict:
    """`train_elastic` events: `devices` of `island` out of service after step `at`, back after `back_at`."""
    def change(how):
        return lambda: [how(island, device) for device in devices]
    return {at: change(runtime.resources.remove_device), back_at: change(runtime.resources.add_device)}


def mesh_sizes(trainer, steps, name):
    """The size of slice `name` each of the first `steps` steps ran on."""
    return [trainer.shapes[i][name][0] for i in range(steps)]


def on_the_same_meshes(sizes, batches):
    """Plain JAX on a schedule of meshes: step i's batch split over the first `sizes[i]` devices, the
    parameters replicated. Returns the final parameters and each step's loss."""
    params, losses = init(), []
    for i, size in enumerate(sizes):
        mesh = Mesh(np.array(jax.devices()[:size]), ("x",))
        split, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
        params, loss = jax.jit(sgd_step, in_shardings=(whole, (split, split)), out_shardings=whole)(params, batches(i))
        losses.append(float(loss))
    return jax.tree_util.tree_map(np.asarray, params), losses


def assert_same_training(got, want):
    """Asserts two (parameters, losses) pairs agree to float32 reduction order."""
    (params, losses), (want_params, want_losses) = got, want
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    for name in want_params:
        np.testing.assert_allclose(params[name], want_params[name], rtol=1e-5, atol=1e-6)
