"""JAX's explicit sharding mode on a slice's axes (`pw.virtual_slice(..., axis_types=AxisType.Explicit)`).

A placed function on `Explicit` axes is traced with its arguments' `in_specs` in their types, as `jax.jit`
traces arguments laid out on a mesh of `Explicit` axes; its code may use `jax.sharding.reshard` and
`out_sharding=`, and a result without `out_specs` lands as its type says. The checks compare with plain JAX
in explicit mode on a concrete mesh of the same shape.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.plan import PlanError
from pathways_mlir.passes import lower_to_plans
from pathways_mlir.runtime.client import default_client
from pathways_mlir.runtime.plan_check import check_plan

EXPLICIT, AUTO = AxisType.Explicit, AxisType.Auto


def explicit_mesh(shape, axes, types):
    """A concrete mesh on this process's first devices, for plain JAX to compare with."""
    return jax.make_mesh(shape, axes, axis_types=types, devices=jax.devices()[:int(np.prod(shape))])


def test_the_types_carry_the_in_specs_and_results_land_as_typed_unless_out_specs_say_otherwise():
    """The function sees `float32[8@data,4]` for an argument sharded over an Explicit axis and an unsharded type
    for a replicated one; `jnp.einsum(..., out_sharding=)` and `reshard` work, and without out_specs each
    result lands as its type says (it was replicated); out_specs given win. Values are plain JAX's."""
    s = pw.virtual_slice(4, axes="data", axis_types=EXPLICIT)
    seen = []

    def layer(x, w):
        seen.append((str(jax.typeof(x)), str(jax.typeof(w))))
        y = jnp.tanh(jnp.einsum("bi,io->bo", x, w, out_sharding=P("data", None)))
        return y, jax.sharding.reshard(y * 2, P(None, None))

    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    w = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    typed, gathered = pw.jit(layer, slice=s, in_specs=(P("data"), None))(x, w)
    assert seen == [("float32[8@data,4]", "float32[4,6]")]
    with jax.set_mesh(explicit_mesh((4,), ("data",), (EXPLICIT,))):
        want, want_gathered = jax.jit(layer)(jax.device_put(x, P("data")), jax.device_put(w, P()))
    np.testing.assert_allclose(np.asarray(typed), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gathered), np.asarray(want_gathered), rtol=1e-6)
    assert typed.result().sharding.spec == P("data", None) and gathered.result().sharding.spec == P(None, None)
    assert want.sharding.spec == P("data", None)        # where plain JAX puts it too
    forced, _ = pw.jit(layer, slice=s, in_specs=(P("data"), None), out_specs=P())(x, w)
    assert forced.result().sharding.spec == P(None, None)
    np.testing.assert_allclose(np.asarray(forced), np.asarray(want), rtol=1e-6)


def test_a_program_across_an_explicit_slice_and_a_mixed_one_matches_plain_jax():
    """A program of two placed functions on two slices, one all Explicit and one with an Explicit and an Auto
    axis (only the Explicit one is in the types), the value moved between them by the plan, computes what plain
    JAX computes, fused or not."""
    first_slice = pw.virtual_slice(4, axes="data", axis_types=EXPLICIT)
    mixed = pw.virtual_slice((2, 2), axes=("data", "model"), axis_types=(EXPLICIT, AUTO))
    seen = []

    @pw.jit(slice=first_slice, in_specs=P("data"))
    def first(x):
        return jnp.tanh(jnp.einsum("bi,io->bo", x, jnp.ones((4, 6), x.dtype), out_sharding=P("data", None)))

    @pw.jit(slice=mixed, in_specs=P("data", "model"))
    def second(y):
        seen.append(str(jax.typeof(y)))
        return jax.sharding.reshard(y * 2, P()), y.sum(axis=1)

    @pw.program
    def both(x):
        return second(first(x))

    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    y = np.tanh(x @ np.ones((4, 6), np.float32))
    client = default_client()
    lowered = both.lower(x)
    for fuse in (True, False):
        plan = lower_to_plans(lowered.module, client.runtime.resources.snapshot()[1], fuse=fuse)[lowered.program]
        doubled, sums = client.run(plan, [x])
        np.testing.assert_allclose(np.asarray(doubled), y * 2, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(sums), y.sum(1), rtol=1e-5)
        assert sums.result().sharding.spec == P("data")
    assert seen == ["float32[8@data,6]"]


def test_consecutive_functions_on_explicit_axes_fuse_into_one_launch():
    """Three computations in a row on one slice of Explicit axes become one launch of a fused executable
    (pw-fuse-launches: each part called inside one `jax.jit` over the slice's mesh), computing what they
    compute apart."""
    s = pw.virtual_slice(4, axes="data", axis_types=EXPLICIT)
    scaled = pw.jit(lambda v: jnp.tanh(v) * 2, slice=s, in_specs=P("data"))
    gathered = pw.jit(lambda v: jax.sharding.reshard(v + 1, P()), slice=s, in_specs=P("data"))

    @pw.program
    def chain(v):
        return gathered(scaled(scaled(v)))

    x = np.arange(16, dtype=np.float32).reshape(8, 2) / 10
    np.testing.assert_allclose(np.asarray(chain(x)), np.tanh(np.tanh(x) * 2) * 2 + 1, rtol=1e-6)
    assert len(chain.compiled(x).plan.fused) == 1


def test_a_training_step_in_explicit_mode_trains_as_plain_jax_does():
    """An optax SGD step whose batch is sharded over an Explicit axis and whose parameters are replicated: five
    steps give plain JAX's parameters and loss (the gradient's reduction over the batch axis is XLA's)."""
    s = pw.virtual_slice(4, axes="data", axis_types=EXPLICIT)
    opt = optax.sgd(0.1)

    def loss(params, x, y):
        return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

    def step(params, state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(4, 8)).astype(np.float32), "w2": rng.normal(size=(8, 1)).astype(np.float32)}
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 1)).astype(np.float32)
    placed = pw.jit(step, slice=s, in_specs=(None, None, P("data"), P("data")))
    ours, state = params, opt.init(params)
    for _ in range(5):
        ours, state, our_loss = placed(ours, state, x, y)
    with jax.set_mesh(explicit_mesh((4,), ("data",), (EXPLICIT,))):
        theirs, their_state = jax.device_put(params, P()), jax.device_put(opt.init(params), P())
        xs, ys = jax.device_put(x, P("data")), jax.device_put(y, P("data"))
        for _ in range(5):
            theirs, their_state, their_loss = jax.jit(step)(theirs, their_state, xs, ys)
    np.testing.assert_allclose(float(np.asarray(our_loss)), float(their_loss), rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(theirs[name]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, axis_types, message", [
    (4, (EXPLICIT, EXPLICIT), r"axis_types is one jax.sharding.AxisType \(Auto or Explicit\) for all its axes, or "
                              r"one per axis \(1\), not \("),
    (4, AxisType.Manual, r"axis_types is one .* not Manual"),
    (4, "explicit", r"axis_types is one .* not 'explicit'"),
    ("2..4", EXPLICIT, r"an elastic slice's axes are Auto .* not Explicit \['data'\]"),
])
def test_axis_types_a_slice_cannot_have_are_refused_in_one_line(shape, axis_types, message):
    with pytest.raises(ValueError, match=r"^a slice: " + message):
        pw.virtual_slice(shape, axes="data", axis_types=axis_types)


def test_a_host_callback_on_explicit_axes_is_refused_naming_the_function():
    """`jax.debug.print` in a function on Explicit axes is refused at trace in one line naming the function (its
    island would call it on values of its own mesh, whose types do not name the slice's axes); on Auto axes the
    same function runs."""
    def printing(v):
        jax.debug.print("sum {}", v.sum())
        return v + 1

    x = np.ones((8, 2), np.float32)
    with pytest.raises(NotImplementedError, match=r"^printing at .*test_explicit_sharding.py:\d+ calls back to the "
                                                  r"host .* on a slice with Explicit axes, which is not supported"):
        pw.jit(printing, slice=pw.virtual_slice(4, axes="data", axis_types=EXPLICIT), in_specs=P("data"))(x)
    np.testing.assert_array_equal(np.asarray(pw.jit(printing, slice=pw.virtual_slice(4, axes="data"),
                                                    in_specs=P("data"))(x)), x + 1)


def test_a_plan_launching_an_executable_on_another_number_of_devices_than_it_names_is_refused():
    """An executable traced on Explicit axes is exported for its slice's devices; a plan that launches it on a
    slice of another size (an executable swapped in from another plan) is refused when it is checked, in one
    line naming the executable, the step and the slice."""
    double = pw.jit(lambda v: v * 2, slice=pw.virtual_slice(4, axes="data", axis_types=EXPLICIT),
                    in_specs=P("data"))
    on_two = pw.jit(lambda v: v * 2, slice=pw.virtual_slice(2, axes="data"), in_specs=P("data"))
    x = np.ones((8, 2), np.float32)
    four, two = double.compiled(x).plan, on_two.compiled(x).plan
    check_plan(four)
    (name,), (blob,) = two.executables.keys(), four.executables.values()
    two.executables[name] = blob
    with pytest.raises(PlanError, match=rf"^plan: step \d+: executable @{name} was exported for 4 devices, but the "
                                        rf"step launches it on slice @\w+ of 2$"):
        check_plan(two)


def test_keys_scalars_and_axes_split_together_take_their_types_on_explicit_axes():
    """A typed PRNG key array sharded over an Explicit axis has its sharding in its key type (its key data
    crosses the boundary), a dimension split over two Explicit axes is typed over both, and a Python scalar
    is a replicated weak scalar: values are plain JAX's."""
    seen = []

    def noise(keys, x, scale):
        seen.append((str(jax.typeof(keys)), str(jax.typeof(x))))
        return x * scale + jax.vmap(lambda k: jax.random.normal(k, ()))(keys)[:, None]

    keys = jax.random.split(jax.random.key(0), 8)
    x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    want = x * 2.0 + jax.vmap(lambda k: jax.random.normal(k, ()))(keys)[:, None]
    on_one = pw.jit(noise, slice=pw.virtual_slice(4, axes="data", axis_types=EXPLICIT),
                    in_specs=(P("data"), P("data"), None))
    np.testing.assert_allclose(np.asarray(on_one(keys, x, 2.0)), want, rtol=1e-6)
    on_two = pw.jit(noise, slice=pw.virtual_slice((2, 2), axes=("data", "model"), axis_types=EXPLICIT),
                    in_specs=(P(("data", "model")), P(("data", "model")), None))
    np.testing.assert_allclose(np.asarray(on_two(keys, x, 2.0)), want, rtol=1e-6)
    assert seen == [("key<fry>[8@data]", "float32[8@data,2]"),
                    ("key<fry>[8@(data,model)]", "float32[8@(data,model),2]")]
