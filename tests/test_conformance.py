"""One runtime, two backends: the same behaviour on the embedded islands and on Ray island actors.

Every test here runs on both backends through one parametrized fixture (2 islands of 4 CPU devices each):
what a user sees of a runtime (results, handles passed on, branches, cancels, failures, donation,
shared objects, reclaiming, status) must not depend on where the islands run. Backend-specific
behaviour (start paths, the data plane, actor deaths) is tested in test_ray_backend.py and
test_ray_elastic.py. The Ray half is skipped where Ray is not installed.
"""

import importlib.util
import operator
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.interface import ClusterRuntime, IslandEndpoint, IslandGroup
from pathways_mlir.runtime.island_work import RunCancelled
from pathways_mlir.runtime.runtime import Runtime
from across_islands import across, bend, expected, grow, left, right
from fetching import settled, until
from protocols import check_implements

WAIT = 60          # seconds: every wait is bounded
X = np.random.default_rng(5).normal(size=(8, 16)).astype(np.float32)


@pw.program
def on_right(x):
    return bend(x)


def value(handle):
    return np.asarray(handle.result(WAIT))


@pytest.fixture(scope="module", params=["embedded", "ray"])
def runtime(request):
    if request.param == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed")
    rt = Runtime(backend=request.param, islands=2, per_island=4)
    yield rt
    rt.close()
    if request.param == "ray":
        import ray

        ray.shutdown()        # the local Ray this runtime started: later modules start their own


def test_it_is_a_cluster_runtime_whose_islands_implement_the_island_interface(runtime):
    check_implements(runtime, ClusterRuntime)
    check_implements(runtime.islands, IslandGroup)
    for island in runtime.islands.values():
        check_implements(island, IslandEndpoint)
    version, topology = runtime.resources.snapshot()
    assert [(i.name, i.num_devices) for i in topology.islands] == [("island0", 4), ("island1", 4)]
    assert set(runtime.status()["islands"]) == {"island0", "island1"}


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_program_across_islands_matches_jax(runtime, dispatch):
    with Client(runtime) as client:
        outs = [across.run(X * k, client=client, dispatch=dispatch) for k in range(4)]
        for k, out in enumerate(outs):
            np.testing.assert_allclose(value(out), expected(X * k), rtol=1e-6)
    assert settled(runtime, WAIT)


def test_narrow_dtypes_move_between_islands(runtime):
    """Values of JAX's narrow dtypes (int4, fp4, fp8) cross from island0 to island1 and back in a program, as
    plain JAX computes them (where islands keep arguments, through the data plane's transfers)."""
    @pw.program
    def there_and_back(x):
        return left_halves(right_doubles(left_halves(x)))

    right_doubles = pw.jit(lambda x: (x.astype(jnp.float32) * 2).astype(x.dtype), slice=right,
                           in_specs=P("a"), out_specs=P("a"))
    left_halves = pw.jit(lambda x: (x.astype(jnp.float32) / 2).astype(x.dtype), slice=left, in_specs=P("x"),
                         out_specs=P("x"))
    with Client(runtime) as client:
        for dtype in ("int4", "float4_e2m1fn", "float8_e4m3fnuz", "float8_e8m0fnu"):
            x = np.array([4, 2, 4, 2], np.float32).astype(jnp.dtype(dtype))
            out = there_and_back.run(x, client=client).result(WAIT)
            assert out.dtype == jnp.dtype(dtype)
            np.testing.assert_array_equal(np.asarray(out).astype(np.float32), [2, 1, 2, 1])
    assert settled(runtime, WAIT)


def test_results_are_jax_arrays_and_a_weakly_typed_one_is_read_weakly_typed(runtime):
    """`result()` is a JAX array on both backends (on Ray it was the NumPy array the actor sent, so a handle's
    operators had NumPy's semantics and `h.at` failed), and a result jax.jit returns weakly typed (a learning
    rate computed from a Python float) is read as a weakly typed JAX array, so bf16 values it multiplies stay
    bf16."""
    halved = pw.jit(lambda x, lr: (x * lr, lr * 0.5), slice=left)
    with Client(runtime) as client:
        x, lr = halved.run(jnp.ones(4, jnp.bfloat16), 0.1, client=client)
        assert isinstance(x.result(WAIT), jax.Array) and x.at[0].set(2).dtype == jnp.bfloat16
        assert lr.weak_type and lr.result(WAIT).weak_type and float(lr) == np.float32(0.05)
        assert lr.aval == jax.core.ShapedArray((), jnp.float32, weak_type=True)
        assert (x * lr).dtype == (x.result(WAIT) * lr).dtype == jnp.bfloat16
        assert type(np.asarray(x)) is np.ndarray
        del x, lr
    assert settled(runtime, WAIT)


def test_a_handle_says_where_its_value_lies_whether_it_is_ready_and_whether_it_was_deleted(runtime, tmp_path):
    """A JAX array's `sharding`, `devices()`, `is_ready()` and `is_deleted()` on a handle, as code written for
    `jax.jit` reads them: Orbax's restore target `jax.tree.map(ocp.utils.to_shape_dtype_struct, state)` of a
    state of handles (it read `h.sharding`, which a handle lacked) restores the saved values. `is_ready()` is
    False while the run is queued, True once it is over; a deleted handle says so."""
    import orbax.checkpoint as ocp

    with Client(runtime) as client:
        on_right.run(X, client=client).result(WAIT)                   # loaded and compiled before
        runtime.scheduler.hold()
        try:
            y = on_right.run(X, client=client)
            assert y.is_ready() is False and y.is_deleted() is False
        finally:
            runtime.scheduler.release()
        until(y.is_ready, "the released run over", WAIT)
        before = island_fetches(runtime)
        where = (y.sharding, y.device, y.devices(), y.committed, y.is_fully_addressable, y.is_fully_replicated)
        assert island_fetches(runtime) == before       # a Ray island's value came here for each of them
        here = y.result()
        assert where == (here.sharding, here.device, here.devices(), here.committed, here.is_fully_addressable,
                         here.is_fully_replicated)
        assert [s.index for s in y.addressable_shards] == [s.index for s in y.result().addressable_shards]
        state = {"y": y, "z": on_right.run(y, client=client)}
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        assert target["y"].sharding == y.sharding
        restored = checkpointer.restore(tmp_path / "state", target)
        np.testing.assert_array_equal(restored["y"], value(y))
        np.testing.assert_array_equal(restored["z"], value(state["z"]))
        assert restored["y"].sharding == y.sharding
        y.delete()
        assert y.is_deleted()
        with pytest.raises(ValueError, match="was released"):
            y.is_ready()
        del state, target, restored
    assert settled(runtime, WAIT)


def test_numpy_defers_to_a_handle_as_to_a_jax_array_and_a_handle_has_the_arrays_attributes(runtime):
    """`np_array + h`, `np.float64(2) * h`: NumPy's operator took the handle's value as a NumPy array (a float64
    NumPy array came back where `jax.jit`'s result gives a float32 JAX array), as a handle set no
    `__array_priority__`. `aval`, `x in h`, `__array_namespace__`, `addressable_data`, `global_shards`,
    `committed`, `format`, `on_device_size_in_bytes()` and `to_device` were missing; each is the JAX array's."""
    wide = np.ones(X.shape)                                             # float64
    with Client(runtime) as client:
        y = on_right.run(X, client=client)
        a = y.result(WAIT)
        for op in (operator.add, operator.mul, operator.truediv, operator.lt, operator.eq, operator.pow):
            for other in (wide, np.float64(2.0), np.int32(3)):
                got, want = op(other, y), op(other, a)
                assert type(got) is type(want) and got.dtype == want.dtype, (op, other)
                np.testing.assert_array_equal(got, want)
        assert type(wide @ y.T) is type(wide @ a.T) and (wide @ y.T).dtype == jnp.float32
        assert y.aval == a.aval.update(sharding=y.aval.sharding) and y.aval.shape == X.shape
        row = grow.run(X[0], client=client)
        assert (float(row.result(WAIT)[3]) in row) and (7.5 not in row)
        with pytest.raises(ValueError, match="one-dimensional"):
            0.0 in y
        assert y.__array_namespace__() is jnp
        assert y.committed == a.committed and y.format == a.format and len(y.global_shards) == len(a.global_shards)
        assert y.on_device_size_in_bytes() == a.on_device_size_in_bytes()
        np.testing.assert_array_equal(y.addressable_data(0), a.addressable_data(0))
        assert y.to_device(jax.devices()[0]).devices() == {jax.devices()[0]}
        del y, a, row
    assert settled(runtime, WAIT)


def island_fetches(runtime) -> int:
    """The values fetched from islands in other processes so far (none counted for in-process islands)."""
    return sum(getattr(island, "calls", {}).get("fetch", 0) for island in runtime.islands.values())


@pytest.mark.filterwarnings("ignore:Sharding info not provided when restoring")   # restored as saved, on purpose
def test_orbax_pytree_checkpointing_saves_handles_as_their_values(runtime, tmp_path):
    """`ocp.PyTreeCheckpointer`, and `ocp.args.PyTreeSave` under a `CheckpointManager`, look each leaf's type up
    in Orbax's registry of type handlers, which had none for a handle: saving a state of handles failed
    ("TypeHandler lookup failed for: type=<class '...Handle'>"). They restore JAX arrays, laid out as saved."""
    import orbax.checkpoint as ocp

    with Client(runtime) as client:
        state = {"y": on_right.run(X, client=client), "rows": [grow.run(X[0], client=client)], "step": 3}
        want = jax.tree.map(np.asarray, state)
        before = island_fetches(runtime)
        ocp.PyTreeCheckpointer().save(tmp_path / "tree", state)
        assert island_fetches(runtime) - before <= 2          # each handle's value at most once (it was 9 times)
        restored = ocp.PyTreeCheckpointer().restore(tmp_path / "tree")
        jax.tree.map(np.testing.assert_array_equal, restored, want)
        assert isinstance(restored["y"], jax.Array) and restored["y"].sharding == state["y"].sharding
        with ocp.CheckpointManager(tmp_path / "managed") as manager:
            manager.save(1, args=ocp.args.PyTreeSave(state))
            manager.wait_until_finished()
            jax.tree.map(np.testing.assert_array_equal, manager.restore(1, args=ocp.args.PyTreeRestore()), want)
        # A handle is a jax.Array, so the standard checkpointer (flax NNX's guide's) saves it as one too, where it
        # saved NumPy's copy: without a target, it restored NumPy arrays.
        arrays = {"y": state["y"], "rows": state["rows"]}
        with ocp.StandardCheckpointer() as standard:
            standard.save(tmp_path / "standard", arrays)
            standard.wait_until_finished()
            restored = standard.restore(tmp_path / "standard")
        assert isinstance(restored["y"], jax.Array) and restored["y"].sharding == state["y"].sharding
        jax.tree.map(np.testing.assert_array_equal, restored, {"y": want["y"], "rows": want["rows"]})
        del state, restored
    assert settled(runtime, WAIT)


@pytest.mark.filterwarnings("ignore:Use `save` instead")        # Orbax's, of `ocp.v1.save_pytree`: tested on purpose
def test_orbax_v1_saves_handles_reading_each_value_once(runtime, tmp_path, monkeypatch):
    """Orbax's v1 API (`ocp.v1.save`, `ocp.v1.save_pytree`) makes its own `jax.Array` handler for each save, not
    the registry's that reads a handle's value once: it read each handle's `result()` nine times a save (a Ray
    island's value fetched for each). `ocp.v1.load` restores the values, laid out as saved, as from JAX arrays."""
    import orbax.checkpoint as ocp

    from pathways_mlir.runtime.handles import Handle

    read = []
    result = Handle.result
    monkeypatch.setattr(Handle, "result", lambda h, timeout=None: (read.append(id(h)), result(h, timeout))[1])
    with Client(runtime) as client:
        state = {"y": on_right.run(X, client=client), "rows": [grow.run(X[0], client=client)]}
        handles = sorted(id(h) for h in jax.tree.leaves(state))
        for name, save in (("save", ocp.v1.save), ("save_pytree", ocp.v1.save_pytree)):
            before = island_fetches(runtime)
            read.clear()
            save(tmp_path / name, state)
            assert sorted(read) == handles, name
            assert island_fetches(runtime) - before <= 2, name
        arrays = jax.tree.map(lambda h: h.result(WAIT), state)
        restored = ocp.v1.load(tmp_path / "save", state)
        assert jax.tree.map(lambda a: (np.asarray(a).tobytes(), a.dtype, a.sharding), restored) == \
            jax.tree.map(lambda a: (np.asarray(a).tobytes(), a.dtype, a.sharding), arrays)
        del state, arrays, restored
    assert settled(runtime, WAIT)


def test_sequential_dispatch_with_a_timeout_runs_step_by_step_and_brings_nothing_back(runtime):
    """Sequential dispatch waits for each step's inputs to exist on their island before it sends the step,
    not for the run to be over (which, with a deadline, waited until the deadline cancelled it), and it
    brings no intermediate back to the driver: where islands keep arguments, the one fetch is the caller's."""
    with Client(runtime) as client:
        before = island_fetches(runtime)
        out = across.run(X, client=client, dispatch="sequential", timeout=WAIT)
        np.testing.assert_allclose(value(out), expected(X), rtol=1e-6)
        if runtime.islands.keep_arguments:
            assert island_fetches(runtime) - before == 1
    assert settled(runtime, WAIT)


def test_handles_go_on_to_later_runs_on_their_island_and_on_another(runtime):
    with Client(runtime) as client:
        y = across.run(X, client=client)
        same = across.run(y, client=client)          # its input is on island0, where y lives
        other = on_right.run(y, client=client)       # its input is on island1
        y.delete()
        np.testing.assert_allclose(value(same), expected(expected(X)), rtol=1e-5)
        np.testing.assert_allclose(value(other), np.asarray(jax.jit(bend.fn)(expected(X))), rtol=1e-5)
    assert settled(runtime, WAIT)


def test_a_queued_run_reads_a_numpy_argument_as_it_was_at_the_call(runtime):
    """A data loader refilling one batch buffer: each run, queued (admission held) and placed later, computes on
    the buffer's contents at its call, as jax.jit copies a NumPy argument when called."""
    buffer = X.copy()
    with Client(runtime) as client:
        on_right.run(buffer, client=client).result(WAIT)               # loaded and compiled before
        runtime.scheduler.hold()
        try:
            outs = []
            for k in range(3):
                buffer[...] = X * k
                outs.append(on_right.run(buffer, client=client))
            buffer[...] = np.nan
        finally:
            runtime.scheduler.release()
        for k, out in enumerate(outs):
            np.testing.assert_allclose(value(out), np.asarray(jax.jit(bend.fn)(X * k)), rtol=1e-6)
    assert settled(runtime, WAIT)


def test_a_data_dependent_branch_runs_the_chosen_program(runtime):
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=left, in_specs=P("x"), out_specs=P())

    @pw.program
    def route(x):
        return pw.cond(positive(x), grow, bend, x)

    with Client(runtime) as client:
        for data, branch in ((np.abs(X), grow), (-np.abs(X), bend)):
            np.testing.assert_allclose(value(route.run(data, client=client)), np.asarray(jax.jit(branch.fn)(data)),
                                       rtol=1e-6)
    assert settled(runtime, WAIT)


def test_a_conds_result_released_at_once_is_still_read_by_a_later_cond(runtime):
    """A program returns a cond's result y and passes y to a later cond; the caller keeps only the other result
    (`z = step(x)[0]`), releasing y's handle at once. Its island marked y released, and the later cond's read of
    its own run's buffer raised "buffer 2 of run 0 was released" (found by differential fuzzing). A released
    result is only not kept at its run's end."""
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=left, in_specs=P("x"), out_specs=P())

    @pw.program
    def twice(x):
        y = pw.cond(positive(x), grow, bend, x)
        return pw.cond(positive(y), bend, grow, y), y

    plain = jax.jit(bend.fn)(jax.jit(grow.fn)(np.abs(X)))
    with Client(runtime) as client:
        for _ in range(3):
            z = twice.run(np.abs(X), client=client)[0]
            np.testing.assert_allclose(value(z), np.asarray(plain), rtol=1e-6)
            del z
    assert settled(runtime, WAIT)


def cancelled_while_computing(runtime, client):
    """Starts a loop of `cos` on island0 and cancels it; returns its handle. A loop that was over before the
    cancel (2,000,000 steps take 0.2-0.3 s here; a loaded machine can delay the cancel as long) is
    tried again ten times as long, at most twice."""
    for steps in (2_000_000, 20_000_000, 200_000_000):
        spin = pw.jit(lambda x: jax.lax.fori_loop(0, steps, lambda i, y: jnp.cos(y), x), slice=left,
                      in_specs=P("x"), out_specs=P("x"))
        spin.compiled(X, runtime=runtime)
        made = spin.run(X, client=client)
        if client.cancel(made):
            return made
        value(made)
    raise AssertionError("every loop was over before its cancel")


def test_a_cancelled_run_fails_its_handles_and_runs_that_take_them(runtime):
    with Client(runtime) as client:
        made = cancelled_while_computing(runtime, client)
        assert made.is_ready()                 # reading it would not wait: it raises the cancel at once
        with pytest.raises(RunCancelled, match=r"run \d+ of .* was cancelled by client"):
            value(made)
        with pytest.raises(RunCancelled, match=r"run \d+ of .* was cancelled by client"):     # Ray: sent by kind
            value(across.run(made, client=client))
    assert settled(runtime, WAIT)


def test_a_cancelled_run_fails_its_handles_although_its_island_heard_of_it_only_after_it_ended(runtime, monkeypatch):
    """A cancel tells each island of the run with a message of its own, and Ray runs an island actor's calls
    in no set order: a fetch sent after the cancel could be taken first, once the run had ended there, and
    handed out the value of a run the cancel had reported cancelled. The islands' messages are held back
    here until the run is over on its island."""
    held = []
    for island in runtime.islands.values():
        monkeypatch.setattr(island, "fail_run", lambda run_id, error, island=island: held.append((island, run_id,
                                                                                                  error)))
    with Client(runtime) as client:
        try:
            made = cancelled_while_computing(runtime, client)
            run = made._run
            until(lambda: all(runtime.islands[i].run_done(run.id) for i in run.islands), "the run over", WAIT)
            with pytest.raises(RunCancelled, match=r"run \d+ of .* was cancelled by client"):
                value(made)
        finally:
            monkeypatch.undo()
            for island, run_id, error in held:
                island.fail_run(run_id, error)
        assert held and all(run_id == run.id for _, run_id, _ in held)
        with pytest.raises(RunCancelled, match=r"run \d+ of .* was cancelled by client"):
            value(across.run(made, client=client))
    assert settled(runtime, WAIT)


def test_a_cond_program_cancelled_while_its_branch_computes_raises_its_cancel(runtime):
    """The cond's thread had the branch's result to hand on once the cancel had failed the program's result:
    setting it raised InvalidStateError in that thread, which then failed the run with that error instead of
    the cancel (the first failure is the run's). The branch computes over a second here: the test sees it in flight
    and cancels before it is over and retired (the watchdog retires a finished run within 0.1 s) on a busy
    machine too."""
    spin = pw.jit(lambda x: jax.lax.fori_loop(0, 4_000_000, lambda i, y: jnp.cos(y), x), slice=left,
                  in_specs=P("x"), out_specs=P("x"))
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=left, in_specs=P("x"), out_specs=P())

    @pw.program
    def slow_route(x):
        return pw.cond(positive(x), spin, bend, x)       # the program's result is the cond's

    with Client(runtime) as client:
        made = slow_route.run(np.abs(X), client=client)
        run = made._run
        until(lambda: any(r.parent is run for r in list(runtime.scheduler._in_flight.values())),
              "the branch run admitted", WAIT)
        assert client.cancel(made)
        until(lambda: not any(t.name == "pw-cond" and t.is_alive() for t in threading.enumerate()),
              "the cond's thread over", WAIT)
        with pytest.raises(RunCancelled, match=r"run \d+ of slow_route was cancelled by client"):
            value(made)
    assert settled(runtime, WAIT)


@pytest.mark.parametrize("predicate", [lambda x: (x > 0).sum(), lambda x: jnp.mean(x > 0),
                                       lambda x: (x > 0).sum().astype(jnp.uint8),
                                       lambda x: jnp.max(x).astype(jnp.float16)],
                         ids=["int32 count", "float32 fraction", "uint8", "float16"])
def test_a_conds_predicate_may_be_an_integer_or_a_float_true_when_nonzero(runtime, predicate):
    """As `jax.lax.cond` takes it: a count of positives as the predicate was refused ("must be a scalar bool")."""
    decide = pw.jit(predicate, slice=left)

    @pw.program
    def route(x):
        return pw.cond(decide(x), grow, bend, x)

    with Client(runtime) as client:
        for x in (X, -np.abs(X), np.zeros_like(X)):
            plain = jax.lax.cond(predicate(x), jax.jit(grow.fn), jax.jit(bend.fn), x)
            np.testing.assert_allclose(value(route.run(x, client=client)), np.asarray(plain), rtol=1e-6)
    assert settled(runtime, WAIT)


def test_a_cond_program_with_a_timeout_finishes_well_within_it(runtime):
    """The cond's thread read its predicate as a client reads a result of a run with a deadline, which waits
    for the whole run to be over: the run waited for the cond, so every cond program run with `timeout=` was
    cancelled at its deadline however short its work."""
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=left, in_specs=P("x"), out_specs=P())

    @pw.program
    def route(x):
        return pw.cond(positive(x), grow, bend, x)

    with Client(runtime) as client:
        for x in (X, -np.abs(X)):
            plain = jax.lax.cond(jnp.sum(x) > 0, jax.jit(grow.fn), jax.jit(bend.fn), x)
            np.testing.assert_allclose(value(route.run(x, client=client, timeout=WAIT)), np.asarray(plain),
                                       rtol=1e-6)
    assert settled(runtime, WAIT)

def test_a_timeout_bounds_the_wait_for_a_result(runtime):
    """A run still computing when its deadline passes raises at once: its result was not handed out early
    (a JAX array still computing would have outlived the cancel)."""
    spin = pw.jit(lambda x: jax.lax.fori_loop(0, 10_000_000, lambda i, y: jnp.cos(y), x), slice=left,
                  in_specs=P("x"), out_specs=P("x"))
    with Client(runtime) as client:
        spin.compiled(X, runtime=runtime)
        with pytest.raises(RunCancelled, match=r"run \d+ of lambda did not finish within its deadline: cancelled"):
            value(spin.run(X, client=client, timeout=0.05))        # the loop takes about a second here
    assert settled(runtime, WAIT)


def test_a_bad_argument_is_the_same_one_line_error(runtime):
    plan = across.compiled(X, runtime=runtime).plan
    with Client(runtime) as client:
        with pytest.raises(TypeError, match=r"argument 0 of program @across has shape \(4, 16\), expected "
                                            r"\(8, 16\)"):
            client.run(plan, [X[:4]])
        with pytest.raises(TypeError, match="program across takes 1 arrays, got 2"):
            client.run(plan, [X, X])
        with pytest.raises(TypeError, match=r"^argument 0 of program @across is a PRNG key array \(key<fry>\[8\]\): "
                                            r"a plan takes a key's data, jax.random.key_data\(key\) "):
            client.run(plan, [jax.random.split(jax.random.key(0), 8)])


def test_a_handle_of_another_dtype_is_refused_at_the_call_as_an_array_is(runtime):
    """Where islands keep arguments (Ray), a handle passed for an input of another dtype than its result's went
    to the island as a reference after a check of its shape alone: the run failed there (RunFailed) instead of
    being refused at the call with the TypeError an array of that dtype gets."""
    as_int = pw.jit(lambda x: x.astype(jnp.int32), slice=left, in_specs=P("x"), out_specs=P("x"))
    plan = across.compiled(X, runtime=runtime).plan
    error = r"^argument leaf 0 of program @across has dtype int32, but it was compiled for float32\[8, 16\]$"
    with Client(runtime) as client:
        ints = as_int.run(X, client=client)
        with pytest.raises(TypeError, match=error):
            client.run(plan, [ints])
        np.testing.assert_allclose(value(client.run(plan, [X])[0]), expected(X), rtol=1e-6)
        del ints
    assert settled(runtime, WAIT)


def test_a_big_endian_numpy_argument_is_read_as_its_values(runtime):
    """A NumPy array read from a file or a socket may be big-endian (`>f4`): the program takes its values as the
    native dtype's (a float64 one narrowed to float32, as any float64 argument is). Its trace failed inside JAX
    (`dtype('>f4') is not a valid dtype for JAX type promotion`); a compiled stage refused it as `float32`
    compiled for float32. A key array for a uint32 input is refused in one line (canonicalising it raised
    JAX's internal ValueError)."""
    want = np.asarray(jax.jit(bend.fn)(X))
    with Client(runtime) as client:
        for dtype in (">f4", ">f8"):
            np.testing.assert_allclose(value(on_right.run(X.astype(dtype), client=client)), want, rtol=1e-6)
        compiled = on_right.compiled(X, runtime=runtime)
        np.testing.assert_allclose(value(compiled(X.astype(">f4"), client=client)), want, rtol=1e-6)
        as_ints = pw.jit(lambda x: x + 1, slice=left).compiled(np.ones(2, np.uint32), runtime=runtime)
        np.testing.assert_array_equal(value(as_ints(np.ones(2, ">u4"), client=client)), [2, 2])
        with pytest.raises(TypeError, match=r"has dtype key<fry>, but it was compiled for uint32\[2\]$"):
            as_ints(jax.random.key(0), client=client)
    assert settled(runtime, WAIT)


def test_a_donated_handle_cannot_be_used_again(runtime):
    twice = pw.jit(lambda x: x * 2.0, slice=left, in_specs=P("x"), out_specs=P("x"), donate_argnums=0)
    with Client(runtime) as client:
        y = across.run(X, client=client)
        doubled = twice.run(y, client=client)
        np.testing.assert_allclose(value(doubled), expected(X) * 2, rtol=1e-6)
        with pytest.raises(ValueError, match="donated"):
            value(y)
    assert settled(runtime, WAIT)


def test_a_shared_object_is_read_by_another_client_and_reclaimed_after(runtime):
    owner, reader = Client(runtime), Client(runtime)
    try:
        base = across.run(X, client=owner)
        ref = owner.share(base)
        np.testing.assert_allclose(value(across.run(ref, client=reader)), expected(expected(X)), rtol=1e-5)
        with pytest.raises(ValueError, match="read-only"):
            pw.jit(lambda x: x, slice=left, in_specs=P("x"), out_specs=P("x"), donate_argnums=0).run(ref, client=reader)
        base.delete()                            # the owner releases it: no run reads it any more
        with pytest.raises(ValueError, match="released"):
            value(across.run(ref, client=reader))
    finally:
        reader.close()
        owner.close()
    assert settled(runtime, WAIT)


def test_a_closed_client_leaves_nothing_on_the_islands(runtime):
    client = Client(runtime)
    handles = [across.run(X, client=client) for _ in range(3)]
    for h in handles:
        value(h)
    assert len(client.objects()) == 3 and sum(runtime.usage().values()) > 0
    client.close()
    assert settled(runtime, WAIT)


def test_an_option_of_one_backend_given_to_the_other_is_one_line_error():
    with pytest.raises(ValueError, match=r"^unknown backend 'tpu' \(choose from embedded, ray\)$"):
        Runtime(backend="tpu")
    with pytest.raises(ValueError, match=r"^address= is an option of the ray backend: it needs backend='ray'$"):
        Runtime(address="auto")
    with pytest.raises(ValueError, match=r"^wedge_timeout= is an option of the embedded backend: it needs "
                                         r"backend='embedded'$"):
        Runtime(backend="ray", wedge_timeout=1.0)


def test_a_nan_under_jax_debug_nans_fails_the_run_or_is_refused_at_the_call(runtime):
    """Under `jax_debug_nans` a NaN fails an embedded run with JAX's FloatingPointError, as `jax.jit` raises.
    Ray's island actors call their executables under their own JAX configuration, where the run returned the
    NaN: the call is refused there in one line, as a host callback is."""
    from pathways_mlir.runtime.island_work import RunFailed

    bad = -np.ones((8, 16), np.float32)
    log = pw.jit(jnp.log, slice=pw.virtual_slice(2, axes="d", island="island0"), in_specs=P("d"), out_specs=P("d"))
    with Client(runtime) as client, jax.debug_nans(True):
        if runtime.islands.in_process:
            with pytest.raises(RunFailed, match=r"FloatingPointError: invalid value \(nan\)"):
                value(log.run(bad, client=client))
        else:
            with pytest.raises(NotImplementedError, match=r"^jax_debug_nans is on, but this runtime's islands are "
                                                          r"Ray actors"):
                log.run(bad, client=client)
    assert settled(runtime, WAIT)
