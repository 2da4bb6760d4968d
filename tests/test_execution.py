"""Programs run end to end: trace, lower onto the embedded cluster, run, compare to plain JAX.

8 CPU devices in 2 islands of 4. Plain JAX runs the same functions with
`jax.jit` one after the other, so elementwise results are bitwise equal.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

X = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(embedded_device_map(2, 4))
    yield rt
    rt.close()


@pytest.fixture
def client(runtime):
    with Client(runtime) as c:
        yield c


two_way = pw.virtual_slice(2, axes="x", name="two_way", island="island0")
four_way = pw.virtual_slice(4, axes="y", name="four_way", island="island1")
grid = pw.virtual_slice((2, 2), axes=("a", "b"), name="grid")


@partial(pw.jit, slice=two_way, in_specs=P("x"), out_specs=P("x"))
def scale(x):
    return x * 3.0 + 1.0


@partial(pw.jit, slice=four_way, in_specs=P("y"), out_specs=P("y"))
def square(x):
    return x * x


@partial(pw.jit, slice=grid, in_specs=P("a", "b"), out_specs=P("a", None))
def shift(x):
    return x - 0.5


def jitted(placed):
    return jax.jit(placed.fn)


@pw.program
def chain(x):
    return shift(square(scale(x)))


def expected_chain(x):
    return jitted(shift)(jitted(square)(jitted(scale)(x)))


def test_a_placed_function_runs_on_its_own(client):
    out = scale.run(X, client=client)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jitted(scale)(X)))
    assert out.shape == (8, 16) and out.dtype == np.float32


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_chained_program_matches_jax(client, dispatch):
    out = chain.run(X, dispatch=dispatch, client=client)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected_chain(X)))


def test_resharding_two_way_to_four_way_and_back(client, runtime):
    @pw.program
    def there_and_back(x):
        return scale(square(scale(x)))     # 2-way -> 4-way (scatter, across islands) -> 2-way (gather)

    plan = there_and_back.compiled(X, runtime=runtime).plan
    kinds = sorted(s.kind for steps in plan.islands.values() for s in steps)
    assert kinds.count("launch") == 3 and "send" in kinds and "recv" in kinds
    out = there_and_back.run(X, client=client)
    want = jitted(scale)(jitted(square)(jitted(scale)(X)))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_a_mesh_and_its_transpose_on_the_same_devices_have_their_own_executables(client):
    """Slices 1x2 and 2x1 of the same axis names, on the same two devices, split a value differently
    under the same spec: each runs its own compiled executable, not the other's."""
    def add_one(x):
        return x + 1.0

    wide = pw.jit(add_one, slice=pw.virtual_slice((1, 2), axes=("a", "b"), island="island0"),
                  in_specs=P(None, "b"), out_specs=P(None, "b"))
    tall = pw.jit(add_one, slice=pw.virtual_slice((2, 1), axes=("a", "b"), island="island0"),
                  in_specs=P(None, "b"), out_specs=P(None, "b"))
    for placed in (wide, tall, wide):
        out = placed.run(X, client=client)
        np.testing.assert_array_equal(np.asarray(out), X + 1.0)


def test_handles_feed_later_calls_and_pytrees_come_back(client):
    @partial(pw.jit, slice=grid, in_specs=(P("a"), P("a")), out_specs={"sum": P("a"), "diff": P("a")})
    def both(x, y):
        return {"sum": x + y, "diff": x - y}

    first = scale.run(X, client=client)
    result = both.run(first, X, client=client)
    assert set(result) == {"diff", "sum"}
    np.testing.assert_array_equal(np.asarray(result["sum"]), np.asarray(jitted(scale)(X)) + X)
    np.testing.assert_array_equal(np.asarray(result["diff"]), np.asarray(jitted(scale)(X)) - X)


def test_four_stage_pipeline_across_two_islands_with_microbatches(client, runtime):
    stages = [pw.virtual_slice(2, axes="x", name=f"stage{i}", island=f"island{i // 2}") for i in range(4)]
    weights = np.random.default_rng(2).normal(size=(4, 16, 16)).astype(np.float32) / 4
    fns = [pw.jit(lambda h, w: jnp.tanh(h @ w), slice=s, in_specs=(P("x"), P()), out_specs=P("x"))
           for s in stages]

    @pw.program
    def pipeline(microbatches, w):
        outs = []
        for mb in microbatches:
            h = mb
            for i, fn in enumerate(fns):
                h = fn(h, w[i])
            outs.append(h)
        return outs

    microbatches = [X * (k + 1) for k in range(3)]
    ws = [weights[i] for i in range(4)]
    plan = pipeline.compiled(microbatches, ws, runtime=runtime).plan
    used = {plan.slices[s.slice].island for steps in plan.islands.values() for s in steps if s.kind == "launch"}
    assert used == {"island0", "island1"}
    outs = pipeline.run(microbatches, ws, client=client)
    step = jax.jit(lambda h, w: jnp.tanh(h @ w))
    for mb, out in zip(microbatches, outs):
        h = mb
        for i in range(4):
            h = step(h, ws[i])
        np.testing.assert_allclose(np.asarray(out), np.asarray(h), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_data_dependent_branch(client, dispatch):
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=two_way, in_specs=P("x"), out_specs=P())

    @pw.program
    def route(x):
        return pw.cond(positive(x), square, shift, x)

    for sign in (1.0, -1.0):
        data = np.abs(X) * sign
        out = route.run(data, dispatch=dispatch, client=client)
        branch = square if sign > 0 else shift
        np.testing.assert_array_equal(np.asarray(out), np.asarray(jitted(branch)(data)))


def test_removing_a_device_mid_run_relowers_and_continues(client):
    rt = client.runtime
    anywhere = pw.virtual_slice(2, axes="x", name="anywhere")
    double = pw.jit(lambda x: x * 2.0, slice=anywhere, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def movable(x):
        return double(scale(x))

    want = [np.asarray(jitted(double)(jitted(scale)(X * k))) for k in range(3)]
    plan = movable.compiled(X, runtime=rt).plan
    placement = plan.slices["anywhere"]
    removed = (placement.island, placement.device_ids()[0])
    in_flight = [movable.run(X * k, client=client) for k in range(3)]   # running when the device goes
    rt.resources.remove_device(*removed)
    try:
        after = [movable.run(X * k, client=client) for k in range(3)]
        for k in range(3):
            np.testing.assert_array_equal(np.asarray(in_flight[k]), want[k])
            np.testing.assert_array_equal(np.asarray(after[k]), want[k])
        new_plan = movable.compiled(X, runtime=rt).plan
        moved = new_plan.slices["anywhere"]
        assert removed[1] not in moved.device_ids() or moved.island != removed[0]
    finally:
        rt.resources.add_device(*removed)


def test_a_slice_that_no_longer_fits_fails_clearly(client):
    rt = client.runtime
    for d in range(4):
        rt.resources.remove_device("island1", d)
    try:
        with pytest.raises(ValueError, match="cannot place slice @four_way: it needs 4 devices in island 'island1'"):
            chain.run(X, client=client)
    finally:
        for d in range(4):
            rt.resources.add_device("island1", d)


def test_a_jax_array_already_on_its_inputs_one_device_is_used_as_it_is(client, runtime, monkeypatch):
    """A JAX array on the one device of its input's home is not put there again (a `jax.device_put` to another
    sharding object for the same place cost about 40 us a call); one elsewhere is, and so is a donated one."""
    from pathways_mlir.runtime import island_executor

    placed = []

    def counted(array, sharding):
        placed.append(array)
        return jax.device_put(array, sharding)
    monkeypatch.setattr(island_executor, "copy_to", counted)
    one = pw.virtual_slice(1, axes="d", island="island0")
    double = pw.jit(lambda a: a * 2.0, slice=one, in_specs=None, out_specs=None)
    home = runtime.islands["island0"].device_map.device("island0", 0)
    here, there = jax.device_put(X, home), jax.device_put(X, jax.devices()[7])
    assert home is not jax.devices()[7]
    for value, moved in ((here, False), (there, True)):
        out = double.run(value, client=client)
        np.testing.assert_allclose(np.asarray(out), X * 2.0, rtol=1e-6)
        assert [a is value for a in placed] == ([True] if moved else [])
        placed.clear()
    eaten = pw.program(lambda a: double(a), donate_argnums=0)
    out = eaten.run(jax.device_put(X, home), client=client)
    np.testing.assert_allclose(np.asarray(out), X * 2.0, rtol=1e-6)
    assert len(placed) == 1                                  # donated: the run's own copy


def test_a_launch_calling_xla_directly_does_what_jaxs_call_does_with_any_argument():
    """`direct_call` hands a run's own intermediates to XLA's executable itself; anything else goes through
    JAX's call. XLA crashed the process on a deleted array (found trying it), so each argument below must end
    as JAX's call ends: the same value, or the same error."""
    from jax.sharding import Mesh, NamedSharding

    from pathways_mlir.runtime.executables import direct_call

    devices = jax.devices()[:2]
    home = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    compiled = jax.jit(lambda x: (x * 2.0 + 1.0,), in_shardings=(home,), out_shardings=(home,)).lower(
        jax.ShapeDtypeStruct((4,), np.float32, sharding=home)).compile()
    direct = direct_call(compiled)
    assert direct is not compiled                # this executable is one it calls directly
    data = np.arange(4, dtype=np.float32)

    def arguments():
        deleted = jax.device_put(data, home)
        deleted.delete()
        reversed_devices = NamedSharding(Mesh(np.array(devices[::-1]), ("x",)), P("x"))
        return [jax.device_put(data, home), compiled(jax.device_put(data, home))[0] * 0 + data, deleted, data,
                jax.device_put(data, devices[0]), jax.device_put(data, reversed_devices)]

    def outcome(call, argument):
        try:
            return np.asarray(call(argument)[0]).tolist()
        except Exception as error:  # noqa: BLE001  (the error is the outcome compared)
            return type(error), str(error)

    theirs = [outcome(compiled, a) for a in arguments()]
    assert [outcome(direct, a) for a in arguments()] == theirs
    assert theirs[0] == [1.0, 3.0, 5.0, 7.0] and theirs[2][0] is RuntimeError


def test_a_launch_reading_an_intermediate_laid_out_for_another_mesh_fails_as_jaxs_call_does(runtime, plan_builder):
    """A plan is untrusted input, and its checks let a launch read a buffer of another slice of its island. An
    intermediate of its own run the launch hands to XLA itself (`direct_call`) must lie on the sharding its
    executable was compiled for, not merely on its buffer's home: the same devices in another mesh order
    read its shards as laid out otherwise (wrong numbers), and other devices crashed the process."""
    from pathways_mlir.runtime.island_work import RunFailed

    p = plan_builder(runtime.resources.topology, program="another_mesh")
    v0 = p.slice("v0", (2, 2), ("x", "y"), "island0", (0, 4))
    v1 = p.slice("v1", (2, 2), ("y", "x"), "island0", (0, 4))      # v0's devices, its axes the other way
    made = p.launch(lambda x: x * 2.0, [p.input((8,), v0, [("x",)])], v0, [("x",)], name="double")
    plan = p.build([p.launch(lambda x: x + 1.0, [made], v1, [("x",)], name="plus_one")])
    with Client(runtime) as client:
        with pytest.raises(RunFailed, match="input shardings that disagree"):
            np.asarray(client.run(plan, [np.arange(8, dtype=np.float32)])[0].result(60))


def test_a_caller_deleting_a_result_while_its_run_waits_leaves_the_run_its_own_arrays(runtime, plan_builder):
    """A handle gives its array once it is made, while its run may still wait (here for island1, held by a
    callback until the caller has deleted its result). The result is a copy of an intermediate that a later
    launch reads, on the same devices: JAX's move returned the intermediate itself, so the caller deleted the
    launch's argument (and XLA crashed the process on one whose shards the result shared, in place)."""
    import threading

    from pathways_mlir.runtime.executables import InProcessFunction, keep_in_process

    deleted = threading.Event()

    def held(x):                                   # island1's launch: waits until the caller deleted its result
        waited = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return (jax.pure_callback(lambda value: (deleted.wait(60), value)[1], waited, x),)

    p = plan_builder(runtime.resources.topology, program="waits")
    v0 = p.slice("v0", (2,), ("x",), "island0", (0, 2))
    also_v0 = p.slice("also_v0", (2,), ("x",), "island0", (0, 2))
    v1 = p.slice("v1", (1,), ("x",), "island1", (0, 1))
    made = p.launch(lambda x: x * 2.0, [p.input((8,), v0)], v0, [()], name="double")
    result = p.copy(made, also_v0, [()])
    aval = jax.ShapeDtypeStruct((8,), jnp.float32)
    kept = InProcessFunction(held, (aval,), (aval,))     # (kept in the process while held: here, by the test)
    p.executables["held"] = keep_in_process(kept)                               # (launch keeps it)
    waited = p.launch(lambda x: x, [p.input((8,), v1)], v1, [()], name="held")
    total = p.launch(lambda a, b: a + b, [made, p.dcn(waited, v0, [()])], v0, [()], name="add")
    plan = p.build([result, total])
    x = np.arange(8, dtype=np.float32)
    with Client(runtime) as client:
        handles = client.run(plan, [x, x], inline=False)           # (inline, this thread would run the callback)
        handles[0].result(60).delete()
        deleted.set()
        np.testing.assert_array_equal(np.asarray(handles[1].result(60)), x * 3.0)


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("how", ["deleted", "donated"])
def test_a_result_a_later_launch_reads_is_the_runs_own_while_the_caller_deletes_or_donates_it(runtime, devices, how):
    """`y, z = p(x)` with `z = g(y, ...)`: y is readable while the run waits before g (here for island1, held by a
    callback until the caller acted). What the caller read of y was the very array g was to take: deleting it,
    or donating y to a later run, failed the run with 'Array has been deleted' (or crashed the process, on
    several devices), where `jax.jit` gives z whatever the caller does with y."""
    import threading

    from pathways_mlir.passes import lower_to_plans

    acted = threading.Event()

    def held(v):                                 # island1's computation: waits until the caller acted
        return jax.pure_callback(lambda a: (acted.wait(60), a)[1], jax.ShapeDtypeStruct(v.shape, v.dtype), v)

    near = pw.virtual_slice(devices, axes="d", island="island0")
    far = pw.virtual_slice(1, axes="d", island="island1")
    double = pw.jit(lambda v: v * 2.0, slice=near, in_specs=P("d"), out_specs=P("d"))
    wait = pw.jit(held, slice=far)
    add = pw.jit(lambda a, b: a + b, slice=near, in_specs=(P("d"), P("d")), out_specs=P("d"))
    eat = pw.jit(lambda a: a * 10.0, slice=near, in_specs=P("d"), out_specs=P("d"), donate_argnums=0)

    @pw.program
    def step(x):
        y = double(x)
        return y, add(y, wait(x))
    lowered = step.lower(jax.ShapeDtypeStruct((8,), np.float32))
    plan = lower_to_plans(lowered.module, runtime.resources.snapshot()[1], fuse=False)[lowered.program]
    x = np.arange(8, dtype=np.float32)
    with Client(runtime) as client:
        y, z = client.run(plan, [x], inline=False)     # (inline, this thread would run the callback)
        try:
            np.testing.assert_array_equal(np.asarray(y.result(60)), x * 2.0)     # read while the run waits
            if how == "deleted":
                y.result(60).delete()
            else:
                np.testing.assert_array_equal(np.asarray(eat.run(y, client=client)), x * 20.0)
        finally:
            acted.set()
        np.testing.assert_array_equal(np.asarray(z.result(60)), x * 3.0)


def test_a_result_copied_from_the_callers_argument_onto_its_own_sharding_is_an_array_of_its_own(runtime,
                                                                                                plan_builder):
    """A plan's copy of a program argument to a result on an equal sharding (a slice on the same devices, as a
    plan file may have it) moved nothing: the result was the caller's own array, so deleting the argument took
    the result, and a later run donating the result deleted the caller's argument."""
    from jax.sharding import NamedSharding

    p = plan_builder(runtime.resources.topology, program="moved")
    v0 = p.slice("v0", (2,), ("x",), "island0", (0, 2))
    also_v0 = p.slice("also_v0", (2,), ("x",), "island0", (0, 2))
    plan = p.build([p.copy(p.input((8,), v0, [("x",)]), also_v0, [("x",)])])
    home = NamedSharding(runtime.islands["island0"].mesh(plan, "v0"), P("x"))
    eat = pw.jit(lambda a: a * 10.0, slice=pw.virtual_slice(2, axes="x", island="island0"), in_specs=P("x"),
                 out_specs=P("x"), donate_argnums=0)
    data = np.arange(8, dtype=np.float32)
    with Client(runtime) as client:
        x = jax.device_put(data, home)
        [deleted_under] = client.run(plan, [x])
        assert deleted_under.result(60) is not x
        x.delete()
        np.testing.assert_array_equal(np.asarray(deleted_under), data)
        x = jax.device_put(data, home)
        [donated] = client.run(plan, [x])
        np.testing.assert_array_equal(np.asarray(eat.run(donated, client=client)), data * 10.0)
        assert not x.is_deleted()
        np.testing.assert_array_equal(np.asarray(x), data)
