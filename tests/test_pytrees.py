"""Every pytree JAX accepts crosses programs: optax states, flax structs, NamedTuples, None leaves.

Executables take and return flat leaves and the tree structure stays on the
client, so nothing about a custom pytree node is serialised. The training
tests check flax.linen + optax (adamw with a schedule) against plain JAX
running the same steps.
"""

from typing import NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from fetching import fetch
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw


class Pair(NamedTuple):
    first: jax.Array
    second: jax.Array


@flax.struct.dataclass
class State:
    pair: Pair
    scale: jax.Array
    missing: None = None
    name: str = flax.struct.field(pytree_node=False, default="state")


def assert_trees_close(actual, expected, rtol=1e-5, atol=1e-6):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def test_custom_pytree_nodes_cross_slices_and_islands(two_islands):
    def swap(state):
        return State(Pair(state.pair.second * state.scale, state.pair.first), state.scale + 1, name="swapped")

    a = pw.virtual_slice(2, axes="x", island="island0")
    b = pw.virtual_slice(2, axes="x", island="island1")
    on_a, on_b = pw.jit(swap, slice=a), pw.jit(swap, slice=b)

    @pw.program
    def twice(state, extra):
        return on_b(on_a(state)), (extra, None)

    state = State(Pair(np.arange(4, dtype=np.float32), np.ones(4, np.float32)), np.float32(2))
    result, (extra, nothing) = fetch(twice.run(state, {"k": np.zeros(2, np.int32)}, client=two_islands))
    expected = jax.jit(swap)(jax.jit(swap)(state))
    assert isinstance(result, State) and isinstance(result.pair, Pair) and result.name == "swapped"
    assert nothing is None and result.missing is None
    assert_trees_close(result, expected)
    np.testing.assert_array_equal(np.asarray(extra["k"]), np.zeros(2, np.int32))


def test_results_with_no_array_come_back_as_jax_jit_returns_them(two_islands):
    """A function returning `()`, `None` or `{}` (no leaf) returns that, called alone or inside a program."""
    s = pw.virtual_slice(2, axes="x")
    x = np.ones(4, np.float32)
    for empty in ((), None, {}):
        nothing = pw.jit(lambda v, empty=empty: empty, slice=s)
        assert nothing.run(x, client=two_islands) == jax.jit(lambda v: empty)(x) == empty
    double, nothing = pw.jit(lambda v: v * 2, slice=s), pw.jit(lambda v: (), slice=s)

    @pw.program
    def both(v):
        return nothing(v), double(v)

    empty, doubled = both.run(x, client=two_islands)
    assert empty == ()
    np.testing.assert_array_equal(fetch(doubled), x * 2)


class MLP(nn.Module):
    width: int
    out: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.out)(nn.tanh(nn.Dense(self.width)(x)))


def adamw():
    return optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=2, decay_steps=10),
                       weight_decay=1e-3)


def data(rows=32, features=8, outputs=4):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(rows, features)).astype(np.float32),
            rng.normal(size=(rows, outputs)).astype(np.float32))


def test_flax_optax_data_parallel_training_matches_jax(two_islands):
    model, optimizer = MLP(16, 4), adamw()

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = pw.jit(train_step, slice=pw.virtual_slice(4, axes="data"),
                  in_specs=(None, None, P("data"), P("data")), out_specs=None)
    x, y = data()
    params = model.init(jax.random.key(0), x)
    ours = expected = (params, optimizer.init(params))
    for _ in range(4):
        *ours, loss = step.run(*ours, x, y, client=two_islands)
        *expected, expected_loss = jax.jit(train_step)(*expected, x, y)
        np.testing.assert_allclose(fetch(loss), expected_loss, rtol=1e-5)
    assert_trees_close(fetch(ours), expected)
    assert isinstance(ours[1][0], optax.ScaleByAdamState)


def test_flax_optax_pipeline_across_two_islands_matches_jax(two_islands):
    first, second, optimizer = MLP(16, 12), MLP(16, 4), adamw()
    x, y = data()
    params = [first.init(jax.random.key(1), x), second.init(jax.random.key(2), np.zeros((1, 12), np.float32))]

    def mse(out, target):
        return jnp.mean((out - target) ** 2)

    slices = [pw.virtual_slice(2, axes="x", island=f"island{i}") for i in range(2)]
    step = pw.pipeline([first.apply, second.apply], slices, loss=mse, micro_batches=4, optimizer=optimizer)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: mse(second.apply(p[1], first.apply(p[0], x)), y))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    ours = (params, [optimizer.init(p) for p in params])
    expected = (params, optimizer.init(params))
    for _ in range(3):
        *ours, loss = step.run(*ours, x, y, client=two_islands)
        *expected, expected_loss = jax.jit(train_step)(*expected, x, y)
        np.testing.assert_allclose(fetch(loss), expected_loss, rtol=1e-5)
    assert_trees_close(fetch(ours[0]), expected[0], rtol=1e-4, atol=1e-6)
    plan = step.compiled(*ours, x, y, runtime=two_islands.runtime).plan
    assert {p.island for p in plan.slices.values()} == {"island0", "island1"}
