"""The small training loop the elastic tests run (both backends): an MLP on a 4-device slice, SGD, and
deterministic batches, with plain JAX's result to compare against."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

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


def batch(step):
    x = np.random.default_rng(step).normal(size=(8, 4)).astype(np.float32)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def init():
    rng = np.random.default_rng(0)
    return {"w1": rng.normal(size=(4, 16)).astype(np.float32) * 0.5, "b1": np.zeros(16, np.float32),
            "w2": rng.normal(size=(16, 1)).astype(np.float32) * 0.5, "b2": np.zeros(1, np.float32)}


def training_island(runtime) -> str:
    """The island the training step is placed on now."""
    return train_step.compiled(init(), batch(0), runtime=runtime).plan.slices["train"].island
