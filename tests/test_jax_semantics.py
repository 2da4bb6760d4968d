"""JAX semantics at the API's boundaries, each checked against plain JAX: typed PRNG keys, Python
scalars and weak types, jax.jit's static, donated and keyword arguments, and placed functions
inside JAX transformations."""

import dataclasses
import functools
import inspect
import pickle
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect import ops
from pathways_mlir.dialect.plan import PlanError, ProgramPlan
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.passes import lower, program_plans
from pathways_mlir.runtime.client import default_client
from pathways_mlir.runtime.island_work import RunFailed


def noisy(x, key):
    """Adds normal noise drawn with `key`, and returns the next key: code on jax.random.key."""
    key, sub = jax.random.split(key)
    return x + jax.random.normal(sub, x.shape), key


def key_bits(keys) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys.result() if hasattr(keys, "result") else keys))


# --- typed PRNG keys ------------------------------------------------------------------------------

def test_typed_keys_go_in_and_out_of_placed_functions_as_in_jax():
    s = pw.virtual_slice(2, axes="data")
    placed = pw.jit(noisy, slice=s)
    x, key = jnp.ones((4, 3)), jax.random.key(7)
    y, next_key = placed(x, key)
    want_y, want_key = jax.jit(noisy)(x, key)
    assert next_key.dtype == want_key.dtype and next_key.shape == ()
    np.testing.assert_array_equal(np.asarray(y), want_y)
    np.testing.assert_array_equal(key_bits(next_key), key_bits(want_key))
    # The returned key handle goes back in as the key it holds.
    y2, _ = placed(x, next_key)
    np.testing.assert_array_equal(np.asarray(y2), jax.jit(noisy)(x, want_key)[0])
    # JAX's transformations and indexing take it as the key array; it cannot change in place.
    np.testing.assert_array_equal(np.asarray(jax.jit(noisy)(x, next_key)[0]), jax.jit(noisy)(x, want_key)[0])
    np.testing.assert_array_equal(key_bits(next_key[...]), key_bits(want_key))
    # It is a jax.Array, as the key array is: jax.random's functions, jax.device_get and the key array's methods
    # take it (jax.random refused it: "unexpected PRNG key type").
    assert isinstance(next_key, jax.Array)
    np.testing.assert_array_equal(jax.random.normal(next_key, (3,)), jax.random.normal(want_key, (3,)))
    np.testing.assert_array_equal(key_bits(jax.random.split(next_key)), key_bits(jax.random.split(want_key)))
    np.testing.assert_array_equal(key_bits(jax.device_get(next_key)), key_bits(want_key))
    assert next_key.reshape(1).shape == (1,) and next_key.size == 1
    with pytest.raises(TypeError, match="add does not accept dtypes key<fry>"):
        next_key + 1
    assert re.fullmatch(r"KeyHandle\(shape=\(\), dtype=key<fry>, slice=\w+\)", repr(next_key))
    with pytest.raises(TypeError, match="KeyHandle refers to an immutable key array"):
        next_key[...] = want_key
    # NumPy takes it as the key array, which JAX refuses to convert (an array of one object was made, which
    # flax's msgpack checkpoints refused with an unrelated message; found by a fault finder).
    for keys in (want_key, next_key):
        with pytest.raises(TypeError, match="PRNGKey dtype cannot be converted to a NumPy array. Use jax.random.key_"):
            np.asarray(keys)


def test_a_key_handle_prints_as_its_key_array():
    """`str`, `print` and `format` of a key handle gave its repr (`KeyHandle(shape=..., ...)`), where a key array
    prints its value (`Array((2,), dtype=key<fry>) overlaying: ...`), as an array handle prints its array's."""
    s = pw.virtual_slice(1, axes="data")
    keys = pw.jit(jax.random.split, slice=s)(jax.random.key(0))
    want = jax.jit(jax.random.split)(jax.random.key(0))
    assert str(keys) == str(want) and f"{keys}" == f"{want}" and format(keys, "") == format(want, "")
    assert str(keys).startswith("Array((2,), dtype=key<fry>) overlaying:")
    assert repr(keys).startswith("KeyHandle(shape=(2,), dtype=key<fry>")


def test_typed_keys_in_programs_and_cond_branches():
    s = pw.virtual_slice(2, axes="data")
    draw = pw.jit(noisy, slice=s)
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=s)
    again = pw.jit(lambda x, key: noisy(2 * x, key), slice=s)

    @pw.program
    def step(x, key):
        y, key = draw(x, key)
        return pw.cond(positive(y), lambda y, k: again(y, k), lambda y, k: (y, k), y, key)

    def plain(x, key):
        y, key = noisy(x, key)
        return jax.lax.cond(jnp.sum(y) > 0, lambda y, k: noisy(2 * y, k), lambda y, k: (y, k), y, key)

    for shift in (5.0, -5.0):
        x, key = jnp.full((4, 3), shift), jax.random.key(3)
        y, next_key = step(x, key)
        want_y, want_key = jax.jit(plain)(x, key)
        np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-6)
        np.testing.assert_array_equal(key_bits(next_key), key_bits(want_key))
    assert "key<fry>" not in step.lower(x, key).as_text()      # the IR holds key data, ui32[2]


def test_a_typed_key_as_a_cond_predicate_is_refused_in_one_line():
    """A key predicate raised "AttributeError: 'KeyTy' object has no attribute 'kind'" (found by differential
    fuzzing)."""
    s = pw.virtual_slice(1, axes="data")
    triple, negate = pw.jit(lambda v: v * 3, slice=s), pw.jit(lambda v: -v, slice=s)
    x, key = np.ones(3, np.float32), jax.random.key(0)
    with pytest.raises(TypeError, match=r"cond at .*: the predicate must be a scalar boolean or number, not "
                                        r"key<fry>\[\]$"):
        pw.program(lambda v, p: pw.cond(p, triple, negate, v))(x, key)


def test_sharded_keys_follow_their_partition_spec():
    s = pw.virtual_slice(2, axes="data")

    def per_row(x, keys):
        return x + jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys), jax.vmap(jax.random.fold_in)(
            keys, jnp.arange(keys.shape[0]))

    placed = pw.jit(per_row, slice=s, in_specs=P("data"), out_specs=P("data"))
    x, keys = jnp.zeros((8, 3)), jax.random.split(jax.random.key(0), 8)

    @pw.program
    def step(x, keys):
        return placed(x, keys)

    [compute] = [op for op in step.lower(x, keys).module.body.operations[-1].regions[0].blocks[0].operations
                 if op.operation.name == "pw.compute"]
    # The keys (8,) split on "data"; their key data (8, 2) splits its first axis only.
    assert ops.in_shardings(compute.operation)[1] == Sharding((("data",), ()))
    y, folded = step(x, keys)
    want_y, want_folded = jax.jit(per_row)(x, keys)
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-6)
    np.testing.assert_array_equal(key_bits(folded), key_bits(want_folded))


# --- Python scalars and weak types ----------------------------------------------------------------

def test_python_scalars_are_weakly_typed_and_traced_by_type_not_value():
    s = pw.virtual_slice(2, axes="data")
    traces = []

    def scale(x, i):
        return x * i

    def counted(x, i):
        traces.append(jax.typeof(i))
        return scale(x, i)

    placed = pw.jit(counted, slice=s)
    x = jnp.ones(4, jnp.bfloat16)
    for i in (3, 4, 5):
        y = placed(x, i)
        assert y.dtype == jax.jit(scale)(x, i).dtype == jnp.bfloat16     # a weak int keeps bf16
        np.testing.assert_array_equal(np.asarray(y), np.full(4, i, np.float32))
    assert set(traces) == {jax.typeof(3)}             # ~int32[]: traced for the type, not each value
    once = len(traces)
    placed(x, 2.5)                                    # a float is another type: one more trace
    assert len(traces) == 2 * once
    # A NumPy scalar is strongly typed: it promotes bf16 to f32, as in jax.jit.
    assert placed(x, np.float32(2)).dtype == jax.jit(scale)(x, np.float32(2)).dtype == jnp.float32


@pytest.mark.parametrize("kind", ["placed function", "program"])
def test_a_python_int_out_of_range_is_refused_in_one_line_naming_its_argument(kind):
    """Without x64 a Python int traces as int32; one out of its range is refused, as `jax.jit` refuses it, naming
    the argument: it was an OverflowError from deep inside JAX naming nothing on a first call, NumPy's `Python
    integer ... out of bounds for int32` once the signature was traced (found by a fault finder), and JAX's own
    through a compiled stage."""
    placed = pw.jit(lambda a, n: a + n, slice=pw.virtual_slice(1, axes="d"))
    f = placed if kind == "placed function" else pw.program(lambda a, n: placed(a, n))
    a = jnp.ones(3, jnp.int32)
    for traced_before in (False, True):
        if traced_before:
            np.testing.assert_array_equal(np.asarray(f(a, 2**31 - 1)),
                                          np.asarray(jax.jit(lambda a, n: a + n)(a, 2**31 - 1)))
        for big in (2**40, 2**31, -2**31 - 1):
            with pytest.raises(OverflowError, match=rf"^lambda at .*: argument\[1\]: Python int {big} too large"):
                f(a, big)
    with pytest.raises(OverflowError, match=r"^argument leaf 1 of program @\S+: Python int 1099511627776 too large"):
        f.compiled(a, 5)(a, 2**40)


def test_a_scalar_and_an_array_of_its_abstract_value_are_one_signature():
    """A call is keyed as `jax.jit` keys it, by each leaf's abstract value: a Python int and the `WeakHandle` a
    step returns for `step + 1` (weakly typed int32) are one signature, and so are a NumPy scalar and a 0-d array
    of its dtype. A scalar was keyed by its type: a flax `TrainState`, whose step starts as the Python int 0,
    was traced, lowered and compiled again on its second call (found by a fault finder)."""
    traces = []

    def step(count, x):
        traces.append(1)
        return count + 1, x * 2

    placed = pw.jit(step, slice=pw.virtual_slice(1, axes="d"))
    x = jnp.ones(4, jnp.float32)
    count = 0
    for _ in range(3):
        count, x = placed(count, x)
    assert int(count) == 3 and len(traces) == 1
    for scalar in (np.float32(2), jnp.float32(2)):
        placed(scalar, x)
    assert len(traces) == 2


def test_weakly_typed_results_stay_weak_as_in_jax():
    """A result that `jax.jit` returns weakly typed (a Python scalar returned, or computed from one) is weakly
    typed here too: read, in operators, in JAX, passed to another placed function or program, and pickled, a
    learning rate of a Python float meets bf16 parameters as bf16 (its handle was strongly float32, so
    `params - lr * grads` made float32 parameters where `jax.jit` keeps bfloat16)."""
    s = pw.virtual_slice(2, axes="data")

    def schedule(x, lr):
        return x * 2, lr * 0.5, 1.0, jnp.asarray(3)

    x = jnp.ones(4, jnp.bfloat16)
    want = jax.jit(schedule)(x, 0.1)
    got = pw.jit(schedule, slice=s)(x, 0.1)
    assert [g.weak_type for g in got] == [g.result().weak_type for g in got] == [w.weak_type for w in want] == \
        [False, True, True, True]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    lr = got[1]
    assert (x * lr).dtype == (x * lr.result()).dtype == jax.jit(jnp.multiply)(x, lr).dtype == jnp.bfloat16
    sgd = pw.jit(lambda p, g, lr: p - lr * g, slice=s)
    assert sgd(x, x, lr).dtype == jax.jit(lambda p, g, lr: p - lr * g)(x, x, want[1]).dtype == jnp.bfloat16

    @pw.program
    def step(p, lr):
        _, half, _, _ = pw.jit(schedule, slice=s)(p, lr)
        return sgd(p, p, half), half

    params, half = step(x, lr)                 # its lr a handle of a weak value, traced weak
    assert params.dtype == jnp.bfloat16 and half.weak_type and float(half) == np.float32(0.025)
    assert pickle.loads(pickle.dumps(lr)) == np.float32(0.05)
    assert pw.cancel(lr) is False                              # its run is over; cancelled and shared as the
    assert float(default_client().share(lr)) == np.float32(0.05)       # handle it wraps (TypeError before)


def test_a_loop_passing_a_weak_result_back_takes_the_identity_path(monkeypatch):
    """A step that returns a weakly typed rate and takes it back goes, from its second call on, the way a
    strongly typed loop goes (`Compiled.call_plain`, no signature split): it went the general way every call,
    about 1.6x a tiny step's time. Values, dtypes and weak types are jax.jit's."""
    from pathways_mlir.frontend.compiled import Compiled

    plain, call_plain = [], Compiled.call_plain
    monkeypatch.setattr(Compiled, "call_plain", lambda self, *a: plain.append(self) or call_plain(self, *a))
    decay = pw.jit(lambda x, lr: (x * lr, lr * 0.5), slice=pw.virtual_slice(2, axes="data"))
    reference = jax.jit(decay.fn)
    x, lr = want_x, want_lr = jnp.ones(4, jnp.bfloat16), 1.0
    for _ in range(5):
        x, lr = decay(x, lr)
        want_x, want_lr = reference(want_x, want_lr)
    assert len(plain) == 4                  # the first call's rate was a Python float, a signature of its own
    assert x.dtype == want_x.dtype == jnp.bfloat16 and lr.weak_type and want_lr.weak_type
    np.testing.assert_array_equal(np.asarray(x), np.asarray(want_x))
    assert float(lr) == float(want_lr) == 1 / 32


def test_cond_branches_differing_in_weak_type_only_run_as_in_jax():
    """Branches returning a weakly and a strongly typed f32[] were refused ("returns f32[] but ... returns f32[]");
    `jax.lax.cond` takes them, its result typed as its false branch's (found by differential fuzzing)."""
    s = pw.virtual_slice(1, axes="data")
    positive = pw.jit(lambda a: a.sum() > 3, slice=s)
    weak, other_weak = pw.jit(lambda a: 1.0, slice=s), pw.jit(lambda a: 2.0, slice=s)
    strong = pw.jit(lambda a: a[0] * 0 + 1.0, slice=s)
    x = np.arange(4, dtype=np.float32)
    for true_fn, false_fn in ((weak, strong), (strong, weak), (weak, other_weak)):
        got = pw.program(lambda a: pw.cond(positive(a), true_fn, false_fn, a))(x)
        want = jax.jit(lambda a: jax.lax.cond(a.sum() > 3, true_fn.fn, false_fn.fn, a))(x)
        assert (float(got), got.dtype, got.weak_type) == (float(want), want.dtype, want.weak_type)


def test_python_and_numpy_scalars_inside_a_program_are_constants():
    """`sgd(params, grads, 0.01)` inside a program, as inside a `jax.jit` step: a Python scalar (weakly
    typed) or a NumPy scalar (strongly typed) passed to a placed function is a constant in that
    computation's code, one executable per function and constant; arrays are still refused in one line."""
    s = pw.virtual_slice(2, axes="data")
    traces = []

    def axpy(a, x, y, *, shift=0):
        traces.append(jax.typeof(a))
        return a * x + y + shift

    placed = pw.jit(axpy, slice=s)

    @pw.program
    def step(x, y):
        twice = placed(2, x, y)
        again = placed(2, twice, y)                       # the same constant: the same executable
        return placed(0.5, again, y, shift=np.float32(1)), placed(np.float32(3), x, y)

    x, y = jnp.ones(4, jnp.bfloat16), jnp.full(4, 2.0, jnp.bfloat16)
    weak, strong = step(x, y)

    def reference(x, y):
        return axpy(0.5, axpy(2, axpy(2, x, y), y), y, shift=np.float32(1)), axpy(np.float32(3), x, y)

    want_weak, want_strong = jax.jit(reference)(x, y)
    assert (weak.dtype, strong.dtype) == (want_weak.dtype, want_strong.dtype) == (jnp.float32, jnp.float32)
    np.testing.assert_array_equal(np.asarray(weak), want_weak)
    np.testing.assert_array_equal(np.asarray(strong), want_strong)
    assert len(ops.executables(step.lower(x, y).module)) == 3   # 2 (twice), 0.5 with the shift, np.float32(3)
    bf16 = pw.program(lambda x, y: placed(2.5, x, y))(x, y)
    assert bf16.dtype == jnp.bfloat16                         # a weak constant keeps bf16, as in jax.jit

    @pw.program
    def with_array_constant(x):
        return placed(jnp.ones(4), x, x)

    with pytest.raises(TypeError, match=r"argument\[0\] is a JAX array, not a program value: .*a Python or "
                                        r"NumPy scalar is taken as a constant"):
        with_array_constant(x)


def test_a_constant_inside_a_program_is_the_weakly_typed_array_a_jax_jit_trace_sees():
    """A Python scalar passed to a placed function inside a program reached it as the Python object: `c * c`
    was computed exactly (then overflowed int32 in one error naming another argument) where `jax.jit` wraps in
    int32, and `lr.astype` did not exist (found by differential fuzzing against `jax.jit`)."""
    s = pw.virtual_slice(2, axes="data")

    def squares(x, c):
        return x + c * c

    def scaled(x, lr):
        return x * lr.astype(x.dtype)

    x = np.ones(2, np.float32)
    program = pw.program(lambda x: (pw.jit(squares, slice=s)(x, 100_000), pw.jit(scaled, slice=s)(x, 0.5)))
    for got, want in zip(program(x), (jax.jit(squares)(x, 100_000), jax.jit(scaled)(x, 0.5))):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_a_program_returning_its_argument_returns_a_new_array():
    """As `jax.jit` does: the result was the caller's `jax.Array` itself, so deleting or donating the argument
    afterwards took the result with it (found by differential fuzzing against `jax.jit`)."""
    s = pw.virtual_slice(2, axes="data")
    double = pw.jit(lambda x: x * 2, slice=s)
    a = jnp.arange(3.0)
    kept, doubled = pw.program(lambda x: (x, double(x)))(a)
    a.delete()
    np.testing.assert_array_equal(np.asarray(kept), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(doubled), [0.0, 2.0, 4.0])


def test_a_program_returning_an_argument_no_computation_reads_returns_a_new_array():
    """The same where no placed function reads the argument (its buffer lives on the host): the result was the
    caller's `jax.Array` (or the array behind a handle) itself, so deleting or donating the argument took it
    (found by a README walk-through)."""
    s = pw.virtual_slice(1, axes="x")
    inc = pw.jit(lambda x: x + 1, slice=s)
    donating = pw.program(pw.jit(lambda x: x * 10, slice=s), donate_argnums=0)
    a = jnp.ones(2)
    kept = pw.program(lambda x: x)(a)
    a.delete()
    np.testing.assert_array_equal(np.asarray(kept), [1.0, 1.0])
    a = jnp.ones(2)
    _, passed = pw.program(lambda x, y: (inc(x), y))(np.ones(2, np.float32), a)
    jax.jit(lambda v: v * 2, donate_argnums=0)(a)
    np.testing.assert_array_equal(np.asarray(passed), [1.0, 1.0])
    handle = inc(np.ones(2, np.float32))
    kept = pw.program(lambda x: x)(handle)
    np.testing.assert_array_equal(np.asarray(donating(handle)), [20.0, 20.0])
    np.testing.assert_array_equal(np.asarray(kept), [2.0, 2.0])


def test_a_slice_no_island_can_hold_is_a_placement_error():
    """A slice bigger than any island, or pinned to an island that was lost, is `pw.PlacementError`, as the README
    says (it was the passes' `LoweringError`, which `except pw.PlacementError` missed; found by a README
    walk-through)."""
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    x = np.ones((16,), np.float32)
    too_big = pw.jit(lambda v: v + 1, slice=pw.virtual_slice(16, axes="x"), in_specs=P("x"), out_specs=P("x"))
    pinned = pw.jit(lambda v: v + 1, slice=pw.virtual_slice(4, axes="x", island="island0"), in_specs=P("x"),
                    out_specs=P("x"))
    rt = Runtime(embedded_device_map(2, 4))
    try:
        with pw.Client(rt) as client:
            with pytest.raises(pw.PlacementError, match="cannot place slice @\\w+: it needs 16 devices in one island"):
                too_big(x, client=client)
            np.testing.assert_array_equal(np.asarray(pinned(x, client=client)), x + 1)
            rt.lose_island("island0")
            with pytest.raises(pw.PlacementError, match="island0"):
                pinned(x, client=client)
    finally:
        rt.close()


# JAX's narrow dtypes (ml_dtypes'): every one jax.export serialises, with a value it represents exactly.
NARROW = ["int4", "uint4", "float4_e2m1fn", "float8_e3m4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
          "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]


@pytest.mark.parametrize("dtype", NARROW)
def test_narrow_dtypes_go_in_and_out_as_in_jax(dtype):
    """A value of each of JAX's narrow dtypes goes into a placed function on 2 devices and comes out of it, as
    an argument and as a result computed in it, as `jax.jit` has them, and a plan counts one byte an element
    (int4, uint4 and every fp8 but two were refused: 'unknown element type' from the plan, or 'no pw element
    type' from the front end)."""
    s = pw.virtual_slice(2, axes="data")
    narrow = jnp.dtype(dtype)

    def widen_and_narrow(a, b):
        return a, (a.astype(jnp.float32) * b).astype(narrow)

    a = jnp.asarray(np.array([[1, 2], [4, 2]], np.float32)).astype(narrow)
    b = np.float32(2.0) if dtype != "float8_e8m0fnu" else np.float32(4.0)    # (e8m0 holds powers of two only)
    placed = pw.jit(widen_and_narrow, slice=s)
    got = placed(a, b)
    want = jax.jit(widen_and_narrow)(a, b)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == narrow and g.nbytes == 4
        np.testing.assert_array_equal(np.asarray(g).astype(np.float32), np.asarray(w).astype(np.float32))
    plan = placed.compiled(a, b).plan
    assert [plan.buffers[o].bytes_per_device for o in plan.outputs] == [4, 4]     # replicated: all 4 elements


def test_a_dtype_jax_export_cannot_serialise_is_refused_naming_the_argument_or_result():
    """JAX's int2 and uint2 run under `jax.jit`, but `jax.export`, which carries a placed function's code,
    cannot serialise them: an argument or a result of one is refused in one line naming it (a result raised
    a KeyError from inside jax.export)."""
    s = pw.virtual_slice(1, axes="data")
    ints = np.arange(4, dtype=np.int32)
    with pytest.raises(TypeError, match=r"at .*: example argument\[0\] has dtype int2, which has no pw "
                                        r"element type: jax.export, .* cannot serialise it \(known: bool, int4,"):
        pw.jit(lambda x: x.astype(jnp.int32), slice=s)(ints.astype(jnp.int2))
    with pytest.raises(TypeError, match=r"at .*: result\['low'\] has dtype uint2, which has no pw element type"):
        pw.jit(lambda x: {"low": x.astype(jnp.uint2), "same": x}, slice=s)(ints)


def test_an_abstract_argument_of_a_negative_or_non_integer_dimension_is_refused_in_one_line():
    """A `jax.ShapeDtypeStruct((-1,), ...)` failed in two lines of MLIR ("Unable to parse type: ... tensor<-1xf32>")
    naming neither the argument nor the dimension (found by differential fuzzing)."""
    s = pw.virtual_slice(1, axes="data")
    double = pw.jit(lambda a: a * 2, slice=s)
    for shape in ((2, -1), (2.5,)):
        with pytest.raises(TypeError, match=rf"^lambda at .*: example argument\[0\]: an abstract value's "
                                            rf"dimensions are integers of 0 or more, not {re.escape(str(shape))}$"):
            double.lower(jax.ShapeDtypeStruct(shape, jnp.float32))
    assert double.lower(jax.ShapeDtypeStruct((np.int64(2), 0), jnp.float32)).as_text()


def test_lower_takes_any_object_with_a_shape_and_a_dtype_as_jax_does():
    """`jax.jit(f).lower` takes any object with `shape` and `dtype` as an abstract argument; pw's `.lower` refused
    one once calls were made to refuse such objects as arguments (found by a review). A call still refuses it."""
    class Spec:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    s = pw.virtual_slice(1, axes="data")
    double = pw.jit(lambda a: a * 2, slice=s)
    spec = Spec((4,), np.dtype(np.float32))
    [ours], [jaxs] = double.lower(spec).in_avals_flat, jax.jit(double.fn).lower(spec).in_avals[0]
    assert (ours.shape, ours.dtype) == (jaxs.shape, jaxs.dtype) == ((4,), np.float32)
    with pytest.raises(TypeError, match=r"expected an array, a scalar or a jax.ShapeDtypeStruct, not Spec"):
        double(spec)


def test_a_python_int_step_counter_as_in_jax_mnist_example():
    s = pw.virtual_slice(2, axes="data")

    def update(i, params, batch):
        lr = 0.1 / (1 + i)
        return jax.tree.map(lambda p, g: p - lr * g, params, jax.grad(lambda p: jnp.sum((batch @ p) ** 2))(params))

    placed = pw.jit(update, slice=s)

    @pw.program
    def step(i, params, batch):
        return placed(i, params, batch)

    params, batch = jnp.ones((3,)), jnp.arange(6.0).reshape(2, 3)
    lowered = step.lower(3, params, batch)
    assert lowered.in_avals_flat[0] == jax.ShapeDtypeStruct((), jnp.int32, weak_type=True)
    want = params
    got = params
    for i in range(3):
        want = jax.jit(update)(i, want, batch)
        got = step(i, got, batch)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


# --- jax.jit's arguments ---------------------------------------------------------------------------

def test_static_arguments_compile_once_per_value():
    s = pw.virtual_slice(2, axes="data")
    traces = []

    def power(x, n, *, mode="add"):
        return x ** n + 1 if mode == "add" else x ** n - 1

    def counted(x, n, *, mode="add"):
        traces.append((n, mode))
        return power(x, n, mode=mode)

    placed = pw.jit(counted, slice=s, static_argnums=1, static_argnames="mode")
    x = jnp.arange(4.0)
    for n, mode in [(2, "add"), (3, "add"), (2, "add"), (2, "sub")]:
        np.testing.assert_allclose(np.asarray(placed(x, n, mode=mode)), power(x, n, mode=mode))
    np.testing.assert_allclose(np.asarray(placed(x, n=3, mode="add")), x ** 3 + 1)   # by name: the same static
    per_value = traces.count((2, "sub"))
    assert sorted(set(traces)) == [(2, "add"), (2, "sub"), (3, "add")] and len(traces) == 3 * per_value

    @pw.program(static_argnames="n")
    def prog(x, n):
        return placed(x, n)

    np.testing.assert_allclose(np.asarray(prog(x, n=4)), x ** 4 + 1)
    np.testing.assert_allclose(np.asarray(prog(x, 4)), x ** 4 + 1)
    with pytest.raises(ValueError, match=r"static argument position 1 is a list, which is not hashable"):
        placed(x, [2])
    # A handle is hashable by identity, but jax.jit refuses arrays: it was taken, tracing again for each one.
    with pytest.raises(ValueError, match=r"static argument position 1 is a Handle, an array on devices, which "
                                        r"jax.jit refuses as not hashable: pass it as a traced argument"):
        placed(x, pw.jit(lambda v: v.sum().astype(jnp.int32), slice=s)(x))
    # A program's traced value for a static argument: one ValueError naming it, as jax.jit refuses a tracer there
    # (a PlacementError said the function used the value "without receiving it as an argument").
    with pytest.raises(ValueError, match=r"static argument Value\(i32\[\], argument #1 in @lambda\) has no value "
                                         r"while the program is traced: pass it as a traced argument"):
        pw.program(lambda x, n: placed(x, n))(x, 3)


def test_static_values_equal_in_python_but_of_other_types_trace_apart_as_in_jax_jit():
    """1, True and 1.0 are equal and hash alike; jax.jit traces each (its cache compares types too), and so do
    placed functions and programs (they shared the first one's trace: wrong numbers). A static value whose
    __eq__ raises is one ValueError, as in jax.jit."""
    s = pw.virtual_slice(1, axes="x")

    def f(x, n):
        return x * (2 if n is True else 3 if isinstance(n, float) else 5)

    placed = pw.jit(f, slice=s, static_argnums=1)
    prog = pw.program(lambda x, n: placed(x, n), static_argnums=1)
    x = np.ones(3, np.float32)
    for n in (1, True, 1.0, np.float32(1)):
        want = jax.jit(f, static_argnums=1)(x, n)
        np.testing.assert_array_equal(np.asarray(placed(x, n)), want)
        np.testing.assert_array_equal(np.asarray(prog(x, n)), want)

    class Incomparable:
        def __hash__(self):
            return 0

        def __eq__(self, other):
            raise RuntimeError("no comparison")

    scaled = pw.jit(lambda x, k: x * 2, slice=s, static_argnums=1)
    scaled(x, Incomparable())
    with pytest.raises(ValueError, match=r"^static arguments should be comparable using __eq__: comparing two "
                                         r"Incomparable values raised RuntimeError: no comparison$"):
        scaled(x, Incomparable())


def test_static_arguments_through_args_and_kwargs_as_in_jax_jit():
    """With `*args`, static numbers past the named parameters are taken, and a negative one counts from the end
    of each call's arguments (it was taken modulo the named parameters: an IndexError with none); with
    `**kwargs`, any static name is."""
    s = pw.virtual_slice(1, axes="x")
    x = np.ones(3, np.float32)

    def rest(x, *more):
        return x * more[0] * more[-1]

    def named(x, **options):
        return x * options["n"]

    cases = [(lambda *a: a[0] * a[-1], dict(static_argnums=-1), (x, 3), {}),
             (rest, dict(static_argnums=1), (x, 3), {}),
             (rest, dict(static_argnums=-1), (x, 2, 3), {}),
             (named, dict(static_argnames="n"), (x,), dict(n=3))]
    for fn, statics, args, kwargs in cases:
        want = jax.jit(fn, **statics)(*args, **kwargs)
        np.testing.assert_array_equal(np.asarray(pw.jit(fn, slice=s, **statics)(*args, **kwargs)), want)
    placed = pw.jit(rest, slice=s, static_argnums=(1, 2))
    prog = pw.program(lambda x, *more: placed(x, *more), static_argnums=(1, -1))
    np.testing.assert_array_equal(np.asarray(prog(x, 2, 3)), jax.jit(rest, static_argnums=(1, 2))(x, 2, 3))


def test_a_change_of_jax_trace_configuration_traces_again_as_jax_jit_does():
    """jax.jit keys its cache on JAX's trace context as well as its arguments; so does the call signature of a
    placed function or program (it kept the first trace: stale random numbers under another
    threefry_partitionable, no error under numpy_rank_promotion('raise')). Under jax.disable_jit() they run their
    functions eagerly, as jax.jit does, so Python control flow on values works."""
    s = pw.virtual_slice(1, axes="x")
    uniform = pw.jit(lambda k: jax.random.uniform(k, (4,)), slice=s)
    key = jax.random.key(1)
    for partitionable in (True, False, True):
        with jax.threefry_partitionable(partitionable):
            for _ in range(2):           # the second call is looked up by identity
                np.testing.assert_array_equal(np.asarray(uniform(key)), jax.random.uniform(key, (4,)))
    add = pw.jit(lambda a, b: a + b, slice=s)
    a, b = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    add(a, b)
    with jax.numpy_rank_promotion("raise"), pytest.raises(ValueError, match="could not be broadcast"):
        add(a, b)

    def branchy(x):
        return x * 2 if x.sum() > 0 else x

    placed = pw.jit(branchy, slice=s)
    prog = pw.program(lambda x: placed(x))
    with jax.disable_jit():
        np.testing.assert_array_equal(np.asarray(placed(np.ones(3, np.float32))), np.full(3, 2.0))
        np.testing.assert_array_equal(np.asarray(prog(-np.ones(3, np.float32))), -np.ones(3))


def test_a_numpy_argument_a_program_returns_as_it_is_is_copied_as_jax_jit_copies_it():
    """A program that returns its NumPy argument (the batch, for logging) handed the caller's buffer back as
    the result: a loader refilling the buffer changed it."""
    inc = pw.jit(lambda x: x + 1, slice=pw.virtual_slice(2, axes="x", island="island1"), in_specs=P("x"),
                 out_specs=P("x"))
    passthrough = pw.program(lambda batch, y: (batch, inc(y)))
    alone = pw.program(lambda batch: batch)
    batch = np.zeros(4, np.float32)
    beside, _ = passthrough(batch, np.ones(4, np.float32))
    itself = alone(batch)
    batch[:] = 9.0
    np.testing.assert_array_equal(np.asarray(beside), np.zeros(4))
    np.testing.assert_array_equal(np.asarray(itself), np.zeros(4))

def test_a_numpy_argument_refilled_right_after_the_call_does_not_reach_the_run():
    """XLA:CPU (jax 0.10.2) may read an executable's NumPy argument where it lies once the computation runs,
    after the call has returned: a batch buffer refilled at once reached the run in 19 of 50 calls of a
    one-device placed function here (plain jax.jit: 8 to 24 of 50). A run's launch is given a copy."""
    inc = pw.jit(lambda x: x + 1, slice=pw.virtual_slice(1, axes="x", island="island0"))
    across = pw.jit(lambda x: x * 2, slice=pw.virtual_slice(2, axes="x", island="island1"), in_specs=P("x"),
                    out_specs=P("x"))
    both = pw.program(lambda a, b: (inc(a), across(b)))
    for call, want in ((inc, (1.0,)), (lambda b: both(b, b), (1.0, 0.0))):
        for _ in range(50):
            batch = np.zeros(1 << 16, np.float32)      # (page-aligned: XLA:CPU reads such an array in place)
            results = call(batch)
            batch[:] = 1000.0
            for result, value in zip(jax.tree.leaves(results), want):
                np.testing.assert_array_equal(np.asarray(result), np.full(1 << 16, value, np.float32))

def test_keyword_arguments_for_placed_functions_and_programs():
    s = pw.virtual_slice(2, axes="data")
    affine = pw.jit(lambda a, b: a * 2 + b, slice=s, in_specs=P("data"))
    a, b = jnp.arange(4.0), jnp.ones(4)
    np.testing.assert_allclose(np.asarray(affine(b=b, a=a)), a * 2 + b)

    @pw.program
    def prog(a, *, b):
        return affine(a, b=b)

    np.testing.assert_allclose(np.asarray(prog(a, b=b)), a * 2 + b)
    assert prog.lower(a, b=b).in_tree == jax.tree_util.tree_structure(((a,), {"b": b}))


def test_keywords_named_as_run_options_are_the_functions_own_when_it_takes_them():
    """`client=`, `timeout=` and `dispatch=` in a call are run options, unless the function takes a keyword of
    that name, as `jax.jit` would pass it: `scale(x, timeout=5.0)` ran `scale(x)` (timeout 1.0) with a 5 s
    deadline, and `shift(x, dispatch=1.0)` was an unknown dispatch mode (found by differential fuzzing)."""
    s = pw.virtual_slice(2, axes="data")
    x = np.ones(4, np.float32)

    def scale(x, timeout=1.0):
        return x * timeout

    def shift(x, dispatch, **others):
        return x - dispatch + others.get("client", 0.0)

    placed = pw.jit(scale, slice=s)

    @pw.program
    def program(x, timeout=1.0):
        return placed(x, timeout=timeout)

    for call in (placed, program, pw.program(pw.jit(scale, slice=s))):
        np.testing.assert_array_equal(np.asarray(call(x, timeout=5.0)), jax.jit(scale)(x, timeout=5.0))
    np.testing.assert_array_equal(np.asarray(pw.jit(shift, slice=s)(x, dispatch=1.0, client=3.0)), x + 2.0)
    with pw.Client() as client:                  # a keyword the function does not take is still an option
        affine = pw.jit(lambda a: a * 2, slice=s)
        assert affine(x, client=client, timeout=60)._client is client


def test_a_compiled_stage_takes_a_keyword_named_as_a_run_option_when_traced_with_it():
    """A compiled stage took `timeout=`, `client=` and `dispatch=` as its own options always: one of
    `def f(a, *, timeout)` could not be called at all, as `StagedFunction._call` and `jax.jit`'s compiled stage
    pass it (found by differential fuzzing)."""
    s = pw.virtual_slice(1, axes="x")
    x, t = np.arange(4, dtype=np.float32), np.float32(3)

    def f(a, *, timeout):
        return a * timeout

    compiled = pw.jit(f, slice=s).lower(x, timeout=t).compile()
    want = jax.jit(f).lower(x, timeout=t).compile()(x, timeout=t)
    np.testing.assert_array_equal(np.asarray(compiled(x, timeout=t)), want)
    with pw.Client() as client:                  # a keyword it was not traced with is still an option
        double = pw.jit(lambda a: a * 2, slice=s).lower(x).compile()
        assert double(x, client=client, timeout=60)._client is client


def test_a_computation_no_device_can_hold_is_reported_at_its_code():
    """Placement's error that no island's devices can hold a computation's buffers pointed at the line that made
    the slice, not at the computation's call."""
    s = pw.virtual_slice(2, axes="data")

    def huge(x):
        return jnp.zeros((1 << 16, 1 << 16)) + x

    call = inspect.currentframe().f_lineno + 3
    with pytest.raises(pw.PlacementError, match=rf"test_jax_semantics.py:{call}:\d+: error: cannot place slice @\w+: "
                                            rf"computation 'huge#0' needs 17179869188 bytes per device"):
        pw.jit(huge, slice=s)(jnp.ones(()))


def test_in_specs_as_a_list_are_the_positional_arguments_specs_as_jax_jit_takes_in_shardings():
    """`jax.jit` canonicalises an `in_shardings` list to the tuple of its positional arguments' shardings; a list
    of in_specs was refused ("do not match the arguments PyTreeDef((*, *))")."""
    s = pw.virtual_slice(2, axes="data")
    add = pw.jit(lambda a, b: a + b, slice=s, in_specs=[P("data"), P()], out_specs=P(None, "data"))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    y = add(x, x)
    np.testing.assert_array_equal(np.asarray(y), 2 * x)
    assert y.sharding.spec == P(None, "data")
    assert add.lower(x, x).as_text().count('[["data"], []]') == 1      # the first argument's home only


def test_donated_handles_raise_when_used_again():
    s = pw.virtual_slice(2, axes="data")
    double = pw.jit(lambda x: x * 2, slice=s)
    step = pw.jit(lambda x, y: x + y, slice=s, donate_argnums=0)
    x = double(jnp.ones(4))
    y = step(x, jnp.ones(4))
    np.testing.assert_allclose(np.asarray(y), np.full(4, 3.0))
    with pytest.raises(ValueError, match=r"was donated to program @lambda: a donated handle cannot be used again"):
        np.asarray(x)
    kept = double(jnp.ones(4))
    pw.jit(lambda x, y: x + y, slice=s, donate_argnames="y")(jnp.ones(4), kept)
    with pytest.raises(ValueError, match=r"donated"):
        kept.result()


def test_other_jax_jit_options_raise_one_line_errors():
    s = pw.virtual_slice(2, axes="data")
    with pytest.raises(TypeError, match=r"^pathways_mlir.jit does not take jax.jit's in_shardings=: shard "
                                         r"arguments with in_specs over the slice's axis names$"):
        pw.jit(jnp.tanh, slice=s, in_shardings=None)
    with pytest.raises(TypeError, match=r"^pathways_mlir.program does not take jax.jit's device=: "):
        pw.program(jnp.tanh, device=None)
    with pytest.raises(TypeError, match=r"^pathways_mlir.jit got an unexpected keyword argument 'speed'$"):
        pw.jit(jnp.tanh, slice=s, speed=2)
    with pytest.raises(ValueError, match=r"static_argnames 'k' is not a parameter of"):
        pw.jit(lambda x, n: x, slice=s, static_argnames="k")
    with pytest.raises(ValueError, match=r"argument 0 is both static and donated"):
        pw.jit(lambda x, n: x, slice=s, static_argnums=0, donate_argnums=0)


def test_static_and_donated_numbers_of_positional_only_parameters_as_in_jax_jit():
    """`static_argnums=1` of `def f(a, n, /)` was handed to `jax.jit` as static_argnames {'n'}, which it refuses
    for a positional-only parameter; a NumPy integer as a number was "not iterable" (found by differential
    fuzzing)."""
    s = pw.virtual_slice(1, axes="x")
    x = np.arange(4, dtype=np.float32)

    def scaled(a, n, /):
        return a * n

    placed = pw.jit(scaled, slice=s, static_argnums=1)
    want = jax.jit(scaled, static_argnums=1)(x, 3)
    np.testing.assert_array_equal(np.asarray(placed(x, 3)), want)
    np.testing.assert_array_equal(np.asarray(pw.program(lambda a, n, /: placed(a, n), static_argnums=1)(x, 3)), want)
    for option, n in (("static_argnums", 3), ("donate_argnums", np.float32(3))):
        jax.jit(lambda a, n: a * n, **{option: np.int64(1)})
        f = pw.jit(lambda a, n: a * n, slice=s, **{option: np.int64(1)})
        np.testing.assert_array_equal(np.asarray(f(x, n)), x * 3)


def test_a_keyword_named_as_a_positional_only_parameter_is_kwargs_as_in_python():
    """`f(x, b=5.0)` of `def f(a, b=1.0, /, **kw)` bound 5.0 to the positional-only `b`, where Python and
    `jax.jit` put it in `kw` (found by differential fuzzing)."""
    s = pw.virtual_slice(1, axes="x")
    x = np.arange(4, dtype=np.float32)

    def f(a, b=1.0, /, **kw):
        return a * b + kw.get("b", 0.0)

    placed = pw.jit(f, slice=s)
    want = jax.jit(f)(x, b=5.0)
    for call in (placed, pw.program(lambda a, /, **kw: placed(a, **kw))):
        np.testing.assert_array_equal(np.asarray(call(x, b=5.0)), want)


def test_a_call_under_another_jax_enable_x64_traces_again_as_jax_jit_does():
    """A placed function called on a float64 NumPy array and Python scalars traces them as 32-bit without x64 and
    as 64-bit with it, whichever was first: its signature includes `jax_enable_x64` (a function traced before x64
    was switched once kept its trace), by identity of the arguments too."""
    scale = pw.jit(lambda a, b: a * b, slice=pw.virtual_slice(2, axes="x"))
    plain = jax.jit(lambda a, b: a * b)
    x = np.arange(4.0)
    for x64 in (False, True, False):
        with jax.enable_x64(x64):
            for b in (2.0, 2):
                for _ in range(2):       # the second call is looked up by identity
                    got = np.asarray(scale(x, b))
                    assert got.dtype == plain(x, b).dtype == (np.float64 if x64 else np.float32)
                    np.testing.assert_array_equal(got, x * b)


def test_host_callbacks_run_on_the_embedded_runtime_as_in_jax(capsys):
    """A placed function that calls back to the host (jax.debug.print, jax.debug.callback, pure_callback)
    runs on the embedded islands as under jax.jit, once per run, alone, in a program, on several devices and
    inside shard_map (jax.export cannot serialise it: it stays in the process that traced it)."""
    s1, s2 = pw.virtual_slice(1, axes="x"), pw.virtual_slice(2, axes="data")
    x = np.arange(4, dtype=np.float32)

    def printing(v):
        jax.debug.print("sum={s}", s=v.sum())
        return v + 1

    seen = []
    alone = pw.jit(printing, slice=s1)
    sharded = pw.jit(printing, slice=s2, in_specs=P("data"), out_specs=P("data"))
    recorded = pw.jit(lambda v: (jax.debug.callback(lambda a: seen.append(np.asarray(a)), v), v * 2)[1], slice=s1)
    tripled = pw.jit(lambda v: jax.pure_callback(lambda a: np.asarray(a) * 3, jax.ShapeDtypeStruct(v.shape, v.dtype),
                                                 v), slice=s1)

    def per_shard(v):
        def body(b):
            jax.debug.print("shard={b}", b=b)
            return jax.lax.psum(b, "data")
        return jax.shard_map(body, in_specs=P("data"), out_specs=P())(v)

    @pw.program
    def both(v):
        return sharded(alone(v))

    capsys.readouterr()
    np.testing.assert_array_equal(np.asarray(alone(x)), x + 1)
    np.testing.assert_array_equal(np.asarray(alone(x)), x + 1)
    assert capsys.readouterr().out == "sum=6.0\nsum=6.0\n"
    np.testing.assert_array_equal(np.asarray(both(x)), x + 2)
    assert capsys.readouterr().out == "sum=6.0\nsum=10.0\n"
    np.testing.assert_array_equal(np.asarray(recorded(x)), x * 2)
    np.testing.assert_array_equal(seen, [x])
    np.testing.assert_array_equal(np.asarray(tripled(x)), x * 3)
    np.testing.assert_array_equal(np.asarray(pw.jit(per_shard, slice=s2, in_specs=P("data"), out_specs=P())(x)),
                                  [2.0, 4.0])
    assert sorted(capsys.readouterr().out.splitlines()) == ["shard=[0. 1.]", "shard=[2. 3.]"]


def test_an_ordered_io_callback_is_refused_in_one_line_and_an_unordered_one_runs():
    """io_callback(ordered=True) threads a token through the computation, which a placed function (arrays in,
    arrays out) cannot carry: refused at trace, naming the function; ordered=False runs as under jax.jit."""
    seen = []

    def logging_sum(v, ordered):
        io_callback(lambda a: seen.append(float(a)), None, v.sum(), ordered=ordered)
        return v + 1

    x, s = np.arange(4, dtype=np.float32), pw.virtual_slice(1, axes="x")
    with pytest.raises(NotImplementedError, match=r"^logging_sum at .*test_jax_semantics.py:\d+ has an ordered "
                                                   r"effect \(io_callback\(..., ordered=True\)\).*use ordered=False$"):
        pw.jit(logging_sum, slice=s, static_argnums=1)(x, True)
    np.testing.assert_array_equal(np.asarray(pw.jit(logging_sum, slice=s, static_argnums=1)(x, False)), x + 1)
    assert seen == [6.0]


def test_a_plan_with_a_host_callback_runs_only_where_it_was_traced():
    """Its executable's pw.export names a function this process keeps: a plan naming one this process does not
    keep (read from another process's file) is refused in one line when loaded."""
    def printing(v):
        jax.debug.print("v={v}", v=v)
        return v + 1

    runtime = pw.get_runtime()
    lowered = pw.jit(printing, slice=pw.virtual_slice(2, axes="data")).lower(np.ones(2, np.float32))
    plan = program_plans(lower(lowered.module, runtime.resources.topology))[lowered.program]
    (name, blob), = plan.executables.items()
    assert blob.startswith("in-process:")
    elsewhere = dataclasses.replace(plan, executables={name: "in-process:" + "0" * 32})
    with pytest.raises(PlanError, match=rf"^plan: executable @{name} calls back to the host and was traced in "
                                        r"another process: only the process that traced it runs it"):
        runtime.load(elsewhere)


def test_a_function_calling_back_to_the_host_is_kept_while_a_program_or_loaded_plan_names_it():
    """The process kept every traced function that calls back to the host till it exited (`_KEPT`), with its
    jitted function and JAX's caches on it (about 4 MB each): a notebook cell defining one, run again, leaked.
    Now its `Lowered` holds it, and the runtime's record of each plan loaded that names it: a plan still held
    runs it after its program is gone, and once the plan goes too, so does the function."""
    import gc
    import weakref

    from pathways_mlir.runtime.executables import kept_in_process

    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    seen = []
    x = np.ones(2, np.float32)
    rt = Runtime(embedded_device_map(1, 2))       # (its own: what runs of the default runtime hold is not ours)
    try:
        lowered = pw.jit(lambda v: (jax.debug.callback(seen.append, v), v + 1)[1],
                         slice=pw.virtual_slice(1, axes="d")).lower(x)
        compiled = lowered.compile(rt)
        plan = compiled.plan
        (token,) = (blob for blob in plan.executables.values() if blob.startswith("in-process:"))
        kept = weakref.ref(kept_in_process(token))
        del lowered, compiled
        gc.collect()
        assert kept_in_process(token) is kept()
        with Client(rt) as client:
            np.testing.assert_array_equal(np.asarray(client.run(plan, [x])[0]), x + 1)
        assert len(seen) == 1
        del plan
        gc.collect()
        with Client(rt) as client:          # (a load forgets unused plans)
            np.asarray(pw.jit(lambda v: v * 3, slice=pw.virtual_slice(1, axes="d")).run(x, client=client))
        gc.collect()
        assert kept() is None and kept_in_process(token) is None
    finally:
        rt.close()


class Scaler:
    """Placed functions and a program in a class body: methods, as jax.jit functions are."""

    def __init__(self, k: float):
        self.k = k

    def __hash__(self):
        return hash(self.k)

    def __eq__(self, other):
        return isinstance(other, Scaler) and other.k == self.k

    @functools.partial(pw.jit, slice=pw.virtual_slice(2, axes="data"), static_argnums=0)
    def scale(self, x):
        return x * self.k

    @functools.partial(jax.jit, static_argnums=0)
    def scale_with_jax(self, x):
        return x * self.k

    @functools.partial(pw.program, static_argnums=0)
    def twice(self, x):
        return self.scale(self.scale(x))


def test_a_placed_function_or_program_in_a_class_is_a_method_as_with_jax_jit():
    x, scaler = np.arange(4, dtype=np.float32), Scaler(3.0)
    np.testing.assert_array_equal(np.asarray(scaler.scale(x)), scaler.scale_with_jax(x))
    np.testing.assert_array_equal(np.asarray(Scaler.scale(scaler, x)), scaler.scale_with_jax(x))   # unbound
    np.testing.assert_array_equal(np.asarray(scaler.twice(x)), x * 9)
    np.testing.assert_array_equal(np.asarray(Scaler(2.0).scale(x)), x * 2)       # another instance: its own trace


# --- inside JAX transformations --------------------------------------------------------------------

def test_a_placed_function_names_its_slices_axes_as_under_jax_set_mesh():
    """Code written for `jax.jit` under `jax.set_mesh`: `jax.shard_map` with collectives over the slice's
    axes, `axis_index`, sharding constraints by `PartitionSpec`, the abstract mesh. Equal to that code
    under `jax.set_mesh` on a mesh of the same shape; an elastic slice has no mesh to name."""
    s = pw.virtual_slice((2, 2), axes=("data", "model"))

    def layer(x, w):
        # Megatron-style: rows over "data", w's columns over "model", a row sum over "model" by hand.
        h = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), P("data", "model"))
        partial_sums = jax.shard_map(lambda block: jax.lax.psum(block.sum(1, keepdims=True), "model"),
                                     in_specs=P("data", "model"), out_specs=P("data", None))(h)
        ranks = jax.shard_map(lambda block: block * 0 + jax.lax.axis_index("data"), in_specs=P("data"),
                              out_specs=P("data"))(partial_sums)
        return partial_sums + ranks * jax.sharding.get_abstract_mesh().shape["model"]

    x, w = jnp.arange(32.0).reshape(8, 4) / 32, jnp.ones((4, 6)) / 4
    placed = pw.jit(layer, slice=s, in_specs=(P("data"), P(None, "model")), out_specs=P("data"))
    with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))):
        want = jax.jit(layer)(x, w)
    np.testing.assert_allclose(np.asarray(placed(x, w)), want, rtol=1e-6)
    elastic = pw.virtual_slice(("1..2", 2), axes=("data", "model"))
    with pytest.raises(pw.PlacementError, match=r"test_jax_semantics.py:\d+: the function names mesh axes .* but "
                                                r"Slice\(unnamed: data=1..2, model=2\) is elastic"):
        pw.jit(layer, slice=elastic, in_specs=(P("data"), P(None, "model")))(x, w)


def test_a_shard_map_body_may_call_functions_jax_jits():
    """A helper JAX lowers as a call (`jax.nn.relu`, `jax.nn.one_hot`, `jnp.cumsum`, a user's `jax.jit`
    function) inside a `jax.shard_map` body failed the trace: 'func.call' op 'relu' does not reference a valid
    function (pw's MLIR context does not know the shard_map body's `sdy` op), so an expert-parallel MoE with
    `all_to_all` could not be written. The calls are now inlined in the IR pw keeps."""
    s = pw.virtual_slice(2, axes="data")
    double = jax.jit(lambda v: v * 2)

    def layer(x):
        body = lambda rows: jax.lax.psum(double(jnp.cumsum(jax.nn.relu(rows), axis=1)), "data")  # noqa: E731
        return jax.shard_map(body, in_specs=P("data"), out_specs=P())(x)

    x = jnp.arange(32.0).reshape(8, 4) / 16 - 1
    placed = pw.jit(layer, slice=s, in_specs=P("data"), out_specs=P())
    with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))):
        want = jax.jit(layer)(x)
    np.testing.assert_allclose(np.asarray(placed(x)), want, rtol=1e-6)


def test_a_sharding_of_a_concrete_mesh_inside_a_placed_function_is_refused_naming_it():
    """`with_sharding_constraint(x, NamedSharding(mesh, P("data")))` or a `device_put` inside a placed function
    puts values on devices of the user's choosing, which placement does not know: one line at trace naming the
    function and what to write instead (it was a PlanError at load, 'exported for 2 devices, not 1')."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    s, x = pw.virtual_slice(2, axes="data"), np.ones((4, 4), np.float32)

    def constrained(v):
        return jax.lax.with_sharding_constraint(v * 2, jax.sharding.NamedSharding(mesh, P("data")))

    for fn in (constrained, lambda v: jax.device_put(v, jax.sharding.NamedSharding(mesh, P()))):
        with pytest.raises(pw.PlacementError, match=r"^\S+ at .*test_jax_semantics.py:\d+ places values on 2 "
                                                    r"devices of its own .*name its slice's axes with a "
                                                    r"PartitionSpec instead"):
            pw.jit(fn, slice=s, in_specs=P("data"), out_specs=P("data"))(x)
    by_spec = pw.jit(lambda v: jax.lax.with_sharding_constraint(v * 2, P("data")), slice=s, in_specs=P("data"),
                     out_specs=P("data"))
    np.testing.assert_array_equal(np.asarray(by_spec(x)), x * 2)


def test_a_result_constrained_by_the_function_lands_as_constrained_unless_out_specs_say_otherwise():
    """A placed function without out_specs whose last word on a result is `with_sharding_constraint(r,
    P("data"))` returns it sharded so, as `jax.jit` keeps it (it was replicated); its other results stay
    replicated, and out_specs given win."""
    s, x = pw.virtual_slice(2, axes="data"), np.arange(16.0, dtype=np.float32).reshape(4, 4)

    def both(v):
        return jax.lax.with_sharding_constraint(v * 2, P("data")), v + 1

    sharded, plain = pw.jit(both, slice=s)(x)
    assert sharded.result().sharding.spec == P("data", None) and plain.result().sharding.spec == P(None, None)
    np.testing.assert_array_equal(np.asarray(sharded), x * 2)
    np.testing.assert_array_equal(np.asarray(plain), x + 1)
    told, _ = pw.jit(both, slice=s, out_specs=P())(x)
    assert told.result().sharding.spec == P(None, None)
    np.testing.assert_array_equal(np.asarray(told), x * 2)


def test_calls_inside_a_callers_jax_set_mesh_run_on_their_slices():
    """A caller's `jax.set_mesh` is for its own code: a placed function or program called inside it (traced
    anew, loaded and run inline on the caller's thread) still traces under its slice's mesh and runs on its
    devices. Before, JAX refused the run ('incompatible devices ... jit's context mesh') or the trace (a
    mesh of another size)."""
    s = pw.virtual_slice(2, axes="data")
    double = pw.jit(lambda a: 2 * a, slice=s, in_specs=P("data"), out_specs=P("data"))
    constrained = pw.jit(lambda a: jax.lax.with_sharding_constraint(a, P("data")) + 1, slice=s)

    @pw.program
    def both(a):
        return constrained(double(a))

    mine = jax.sharding.Mesh(np.array(jax.devices()[4:8]), ("d",))
    with jax.set_mesh(mine):
        mine_x = jax.device_put(jnp.arange(8.0), P("d"))
        np.testing.assert_array_equal(np.asarray(double(mine_x)), 2 * np.arange(8.0))
        np.testing.assert_array_equal(np.asarray(both(jnp.ones(16))), np.full(16, 3.0))
        assert jax.sharding.get_abstract_mesh() == mine.abstract_mesh     # the caller's mesh is left as it was


def test_placed_functions_inside_jax_transformations_trace_as_their_function():
    s = pw.virtual_slice(2, axes="data")

    def f(x):
        return jnp.sum(jnp.sin(x) * x)

    placed = pw.jit(f, slice=s)
    x = jnp.linspace(0.0, 1.0, 6)
    np.testing.assert_allclose(jax.grad(placed)(x), jax.grad(f)(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(placed)(x), jax.jit(f)(x), rtol=1e-6)
    rows = x.reshape(2, 3)
    np.testing.assert_allclose(jax.vmap(placed)(rows), jax.vmap(f)(rows), rtol=1e-6)

    def body(carry, row):
        return carry + placed(row), None

    np.testing.assert_allclose(jax.lax.scan(body, 0.0, rows)[0], jax.lax.scan(lambda c, r: (c + f(r), None),
                                                                            0.0, rows)[0], rtol=1e-6)

    @pw.program
    def prog(x):
        return placed(x)

    np.testing.assert_allclose(jax.grad(prog)(x), jax.grad(f)(x), rtol=1e-6)

    # A program's cond is `jax.lax.cond` there.
    above = pw.jit(lambda x, t: f(x) - t, slice=s)
    negated = pw.jit(lambda x: -f(x), slice=s)

    @pw.program
    def branching(x, t):
        return pw.cond(above(x, t), placed, negated, x)

    def reference(x, t):
        return jax.lax.cond(f(x) - t, f, lambda v: -f(v), x)

    for t in (0.0, 10.0):
        np.testing.assert_allclose(np.asarray(branching(x, t)), reference(x, t), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(branching)(x, t), jax.grad(reference)(x, t), rtol=1e-6)
        np.testing.assert_allclose(jax.jit(branching)(x, t), reference(x, t), rtol=1e-6)


def test_a_program_with_a_cond_runs_eagerly_under_disable_jit_as_jax_does():
    """Under `jax.disable_jit()` a program runs its Python function eagerly, but its `pw.cond` raised "works only
    inside a @pathways_mlir.program trace"; `jax.lax.cond` runs the branch its predicate picks there (found by
    differential fuzzing)."""
    s = pw.virtual_slice(1, axes="data")
    positive = pw.jit(lambda v: v.sum() > 0, slice=s)
    triple, negate = pw.jit(lambda v: v * 3, slice=s), pw.jit(lambda v: -v, slice=s)
    step = pw.program(lambda v: pw.cond(positive(v), triple, negate, v))
    for x in (np.ones(3, np.float32), -np.ones(3, np.float32)):
        want = jax.jit(lambda v: jax.lax.cond(v.sum() > 0, lambda u: u * 3, lambda u: -u, v))(x)
        with jax.disable_jit():
            np.testing.assert_array_equal(np.asarray(step(x)), want)


def test_a_placed_function_called_by_another_placed_functions_body_traces_as_a_nested_jax_jit():
    """A placed function's body may call another placed function, as a jax.jit body calls a nested jax.jit, in
    a call on its own and inside a program (it was recorded into the program: 'not a program value')."""
    s = pw.virtual_slice(2, axes="data")
    inner = pw.jit(lambda y: y + 1, slice=s)
    outer = pw.jit(lambda v: inner(v) * 2, slice=s)
    twice = pw.jit(pw.jit(lambda v: v * 2, slice=s), slice=s)
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(np.asarray(outer(x)), np.full(4, 4.0))
    np.testing.assert_array_equal(np.asarray(twice(x)), np.full(4, 2.0))
    np.testing.assert_array_equal(np.asarray(pw.program(lambda v: outer(twice(v)))(x)), np.full(4, 6.0))


def test_a_donated_argument_is_reused_by_the_memory_plan_admission_and_xla():
    """A result laid out as a donated input is written into its buffer: the plan's peak counts one of the
    two, admission hands the held handle's bytes to the run (which fits where the undonated run cannot),
    XLA reuses the buffer, and every byte comes back."""
    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    s = pw.virtual_slice(2, axes="data")
    double = pw.jit(lambda x: x * 2.0, slice=s, in_specs=P("data"), out_specs=P("data"))
    kept = pw.program(lambda x: double(x))
    reused = pw.program(lambda x: double(x), donate_argnums=0)
    x = np.ones((256, 64), np.float32)
    shard = x.nbytes // 2                                               # bytes per device of x, and of 2x
    rt = Runtime(embedded_device_map(2, 4), device_memory_bytes=shard * 5 // 2)
    try:
        client = Client(rt)
        undonated, donated = (f.lower(x).compile(runtime=rt) for f in (kept, reused))
        assert donated.plan.donated == donated.plan.inputs
        assert ProgramPlan.from_python(donated.plan.to_python()).donated == donated.plan.inputs   # plan JSON
        with pytest.raises(PlanError, match=r"^plan: donated buffer 7 is not an input of the program$"):
            ProgramPlan.from_python({**donated.plan.to_python(), "donated": [7]})
        assert undonated.plan.peak("island0") == [(0, 2, 2 * shard)]
        assert donated.plan.peak("island0") == [(0, 2, shard)]        # the result takes the input's place
        held = undonated(x, client=client)
        array = held.result()
        with pytest.raises(pw.OutOfDeviceMemory, match=r"held by live handles"):
            undonated(held, client=client)                             # held + input + result: 3 shards
        result = donated(held, client=client)                          # held, handed over, + nothing
        np.testing.assert_array_equal(np.asarray(result), np.full_like(x, 4.0))
        assert array.is_deleted()                                      # XLA wrote the result into it
        with pytest.raises(ValueError, match=r"was donated to program @lambda"):
            held.result()
        result.delete()
        client.close()
        assert sum(rt.usage().values()) == 0 and rt.object_count() == 0
    finally:
        rt.close()


def test_a_handle_passed_twice_cannot_be_donated():
    s = pw.virtual_slice(2, axes="data")
    add = pw.jit(lambda x, y: x + y, slice=s, donate_argnums=0)
    x = pw.jit(lambda x: x * 2, slice=s)(jnp.ones(4))
    with pytest.raises(ValueError, match=r"^the handle passed as argument 0 of program @lambda is donated, but "
                                         r"it is passed again as argument 1: donate a copy"):
        add(x, x)
    np.testing.assert_array_equal(np.asarray(x), np.full(4, 2.0))     # still usable


def test_a_jax_array_passed_twice_cannot_be_donated():
    """jax.jit refuses to donate a buffer it is also given elsewhere in the call (JaxRuntimeError); a placed
    function refuses it at the call, in one line. It failed the run on its island instead, and on a slice of
    several devices crashed the process (SIGSEGV in XLA): `{'params': w, 'ema': w}`, say."""
    s = pw.virtual_slice(2, axes="data")
    w = jnp.ones(4)
    state = pw.jit(lambda st: jax.tree.map(lambda v: v * 2, st), slice=s, donate_argnums=0)
    with pytest.raises(ValueError, match=r"^argument leaf 0 of program @lambda is donated, but the same array is "
                                         r"passed again as leaf 1: donate a copy, or neither$"):
        state({"ema": w, "params": w})
    add = pw.jit(lambda a, b: a + b, slice=s, donate_argnums=0)
    with pytest.raises(ValueError, match=r"leaf 0 .* passed again as leaf 1"):
        add(w, w)
    assert not w.is_deleted()
    np.testing.assert_array_equal(np.asarray(add(w, jnp.ones(4))), np.full(4, 2.0))
    assert w.is_deleted()


def test_a_value_sent_to_another_island_survives_a_later_run_donating_it():
    """Run A reads x on island0 and sends it to island1, busy meanwhile; run B, after it, donates x on island0.
    The send handed island1 the array itself, which island1 copied to its devices once its executor got to it:
    by then B had donated x, and A failed with "Array has been deleted" (found by a review; since 23d7ad7 for a
    reshaped result too). The copy starts at the send now, and XLA's donation waits for it, as `jax.jit` on
    other devices then a donating `jax.jit` keeps x for the first."""
    here, there = (pw.virtual_slice(1, axes="x", island=island) for island in ("island0", "island1"))
    keep, triple = pw.jit(lambda v: v + 1.0, slice=here), pw.jit(lambda v: v * 3.0, slice=there)

    def slow(m):
        for _ in range(20):
            m = jnp.tanh(m @ m)
        return m

    busy = pw.jit(slow, slice=there)

    @pw.program
    def both(v):
        return keep(v), triple(v)

    donors = {"same layout": pw.jit(lambda v: v * 2.0, slice=here, donate_argnums=0),
              "reshaped": pw.jit(lambda v: (v * 2.0).reshape(-1), slice=here, donate_argnums=0)}
    m = np.random.default_rng(0).random((512, 512), np.float32) / 512
    ones = np.ones((64, 64), np.float32)
    busy(m).block_until_ready()                       # compiled before: island1 is busy while x is donated
    for warm in (both, *donors.values()):
        jax.block_until_ready(warm(jax.device_put(ones, jax.devices()[0])))
    for kind in ("jax.Array", "handle"):
        for name, donor in donors.items():
            x = jax.device_put(ones, jax.devices()[0])
            if kind == "handle":
                x = keep(x)                           # a result island0 keeps
                x.block_until_ready()
            held = busy(m)
            _, sent = both(x)
            donor(x)
            np.testing.assert_array_equal(np.asarray(sent.result(timeout=120)),
                                          ones * 3.0 + (3.0 if kind == "handle" else 0.0), err_msg=f"{kind}, {name}")
            held.block_until_ready()


def test_a_donated_jax_array_is_deleted_where_jax_jit_placed_alike_deletes_it():
    """A donated `jax.Array` is deleted exactly where `jax.jit` with the same function, `donate_argnums` and the
    slice's sharding as `in_shardings` deletes it: lying where the slice keeps it, once XLA writes a result of
    its size into it (of another shape or type too: the launch was compiled with it donated only for a result
    laid out as it, so a reshaped result, or one of another type of the same width, left the array alive); not
    where it must be copied there first (another device, another sharding: the copy is donated), nor where no
    result fits. A deleted array then raises JAX's own error, and passed again to a placed function the
    runtime's one line."""
    one, two = pw.virtual_slice(1, axes="x", island="island0"), pw.virtual_slice(2, axes="x", island="island0")
    twice, reshaped = (lambda x: x * 2.0), (lambda x: (x * 2.0).reshape(2, 4))
    cases = [("twice", twice, one, P(), P()),
             ("reshape", reshaped, one, P(), P()),
             ("astype int32", lambda x: x.astype(jnp.int32), one, P(), P()),
             ("astype bfloat16", lambda x: x.astype(jnp.bfloat16), one, P(), P()),
             ("sum", lambda x: x.sum(), one, P(), P()),
             ("two results", lambda x: (x[:4], x.reshape(2, 4) + 1.0), one, P(), P()),
             ("sharded twice", twice, two, P("x"), P("x")),
             ("sharded reshape", reshaped, two, P("x"), P("x")),
             ("sharded to replicated", twice, two, P("x"), P())]
    deleted = {}
    for name, fn, s, in_spec, out_spec in cases:
        placed = pw.jit(fn, slice=s, in_specs=in_spec, out_specs=out_spec, donate_argnums=0)
        program = pw.program(lambda v, f=pw.jit(fn, slice=s, in_specs=in_spec, out_specs=out_spec): f(v),
                             donate_argnums=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                          # JAX's "donated buffers were not usable"
            compiled = placed.compiled(jnp.zeros(8))
        home = compiled.input_shardings[0][0]
        elsewhere = [d for d in jax.devices() if d not in home.device_set][-len(home.device_set):]
        away = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(elsewhere), ("x",)), in_spec)
        reference = jax.jit(fn, in_shardings=home, out_shardings=compiled.output_shardings, donate_argnums=0)
        for where, sharding in (("home", home), ("elsewhere", away)):
            # One call of the reference each: jax.jit (0.10.2) called again with an array sharded alike on other
            # devices skips the copy on its C++ path and crashes (`Buffer ... is on device cpu:6, but replica is
            # assigned to device cpu:0`, then SIGSEGV).
            theirs, *ours = (jax.device_put(np.arange(8, dtype=np.float32), sharding) for _ in range(3))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")                      # JAX's "donated buffers were not usable"
                expected = jax.block_until_ready(reference(theirs))
                results = [f(array) for f, array in zip((placed, program), ours)]
            for called, f, array, got in zip(("pw.jit", "pw.program"), (placed, program), ours, results):
                jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got), expected)
                assert array.is_deleted() == theirs.is_deleted(), (name, where, called, theirs.is_deleted())
                deleted[name, where, called] = array.is_deleted()
                if array.is_deleted():
                    with pytest.raises(RuntimeError) as jax_error:
                        theirs + 1
                    with pytest.raises(RuntimeError) as our_error:
                        array + 1
                    first_line = str(our_error.value).splitlines()[0]     # JAX's own "Array has been deleted ..."
                    assert first_line == str(jax_error.value).splitlines()[0] and "has been deleted" in first_line
                    with pytest.raises(RuntimeError, match=r"^argument 0 of program @\w+ is a deleted jax.Array "
                                                           r"\(deleted, or donated to another computation"):
                        f(array)
    assert all(deleted[name, "home", called] for name in ("reshape", "sharded reshape", "astype int32")
               for called in ("pw.jit", "pw.program"))
    assert not any(deleted[name, where, called] for name, where, called in deleted if where == "elsewhere")


def test_a_nan_under_jax_debug_nans_fails_the_run_with_jaxs_floating_point_error():
    """Under jax_debug_nans an executable raises JAX's internal error; the run fails with the FloatingPointError
    jax.jit raises, not JAX's internal exception."""
    log = pw.jit(lambda a: jnp.log(a - 10), slice=pw.virtual_slice(1, axes="x"))
    with jax.debug_nans(True):
        with pytest.raises(FloatingPointError):
            jax.jit(lambda a: jnp.log(a - 10))(np.ones(3, np.float32))
        result = log(np.ones(3, np.float32))
        with pytest.raises(RunFailed, match=r"FloatingPointError: invalid value \(nan\) encountered in "):
            np.asarray(result)



# --- handles as arrays ----------------------------------------------------------------------------

def test_handles_behave_like_jax_arrays_on_their_values():
    s = pw.virtual_slice(2, axes="data")
    stats = pw.jit(lambda x: (x * 2, jnp.mean(x), jnp.all(x > 5)), slice=s, in_specs=P("data"),
                   out_specs=(P("data"), P(), P()))
    x = jnp.arange(4.0)
    doubled, mean, none_big = stats(x)
    want_doubled, want_mean, want_none_big = jax.jit(lambda x: (x * 2, jnp.mean(x), jnp.all(x > 5)))(x)
    # Python's conversions, as on the JAX array: a False scalar is False (not a truthy object).
    assert float(mean) == float(want_mean) == 1.5 and int(mean) == 1 and f"{mean:.2f}" == "1.50"
    # print shows the value as the JAX array's print does; repr names the handle without waiting.
    assert str(mean) == f"{mean}" == str(want_mean) and str(doubled) == str(want_doubled)
    assert repr(doubled).startswith("Handle(shape=(4,), dtype=f32")
    assert bool(none_big) is False and not none_big and mean.item() == 1.5 and mean.size == 1
    assert (doubled.nbytes, doubled.itemsize) == (want_doubled.nbytes, want_doubled.itemsize) == (16, 4)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(doubled)
    assert len(doubled) == 4 and [float(v) for v in doubled] == [0.0, 2.0, 4.0, 6.0]
    assert doubled.tolist() == want_doubled.tolist() and doubled.astype(jnp.int32).dtype == jnp.int32
    with pytest.raises(TypeError, match="0-d"):
        len(mean)
    with pytest.raises(TypeError, match=r"Handle refers to an immutable array, as a JAX array is"):
        doubled[0] = 1.0
    # Operators give what the JAX array's give, on either side.
    for got, want in [(doubled + 1, want_doubled + 1), (1 - doubled, 1 - want_doubled), (-doubled, -want_doubled),
                      (doubled @ doubled, want_doubled @ want_doubled), (doubled < 3, want_doubled < 3),
                      (doubled == 2, want_doubled == 2), (x * doubled, x * want_doubled),
                      (abs(-doubled), want_doubled), (doubled[1:], want_doubled[1:]), (doubled[...], want_doubled)]:
        assert type(got) is type(x)           # a JAX array, not the handle
        np.testing.assert_array_equal(got, want)
    # The array's methods and properties that compute on its value, with their keywords: an eval loop's
    # `(logits.argmax(-1) == labels).mean()`.
    for got, want in [(doubled.sum(axis=0, keepdims=True), want_doubled.sum(axis=0, keepdims=True)),
                      ((doubled.argmax(-1) == 3).mean(), (want_doubled.argmax(-1) == 3).mean()),
                      (doubled.reshape(2, -1).T, want_doubled.reshape(2, -1).T), (doubled.max(), 6.0),
                      (doubled.clip(1, 5), want_doubled.clip(1, 5)), (doubled.real, want_doubled),
                      (doubled.at[0].set(9.0), want_doubled.at[0].set(9.0)), (doubled.copy(), want_doubled),
                      (doubled.searchsorted(3.0), want_doubled.searchsorted(3.0)), (doubled.ptp(), 6.0),
                      (doubled.nonzero()[0], want_doubled.nonzero()[0]), (doubled.clone(), want_doubled),
                      (doubled.argpartition(1), want_doubled.argpartition(1)), (doubled.conjugate(), want_doubled)]:
        assert type(got) is type(x)           # a JAX array, not the handle
        np.testing.assert_array_equal(got, want)
    assert doubled.tobytes() == want_doubled.tobytes()
    # JAX takes a handle wherever it takes an array: its constructors, its functions, jax.jit, jax.grad; a
    # handle stays a key by identity.
    np.testing.assert_array_equal(jnp.asarray(doubled), want_doubled)
    for got, want in [(jnp.sum(doubled), jnp.sum(want_doubled)), (jnp.where(doubled > 2, doubled, 0),
                                                                     jnp.where(want_doubled > 2, want_doubled, 0)),
                      (jax.jit(lambda v, m: v * m)(doubled, mean), want_doubled * want_mean),
                      (jax.grad(lambda v: (v ** 2).sum())(doubled), 2 * want_doubled),
                      (jax.jit(lambda v: v + doubled)(x), x + want_doubled)]:
        assert type(got) is type(x)           # a JAX array, not the handle
        np.testing.assert_array_equal(got, want)
    assert {doubled: "a", mean: "b"}[doubled] == "a" and doubled in {doubled}
    # It is a jax.Array, where a library checks for one; jax.device_get reads it as JAX's array.
    assert isinstance(doubled, jax.Array) and isinstance(mean, jax.Array)
    got = jax.device_get({"d": doubled, "m": mean})
    assert type(got["d"]) is np.ndarray and got["m"].shape == ()
    jax.tree.map(np.testing.assert_array_equal, got, jax.device_get({"d": want_doubled, "m": want_mean}))


def test_a_handle_lies_where_its_value_does_as_a_jax_array_says():
    """`sharding`, `devices()`, `addressable_shards` and DLPack are the value's (on the embedded backend, the
    devices it lives on), for a key handle too; JAX's own refusals hold (DLPack of an array on two devices)."""
    s = pw.virtual_slice(2, axes="data")
    split = pw.jit(lambda x: (x * 2, x.sum(), jax.random.split(jax.random.key(0), 2)), slice=s, in_specs=P("data"),
                   out_specs=(P("data"), P(), P()))
    doubled, total, keys = split(jnp.arange(4.0))
    assert doubled.sharding == doubled.result().sharding and doubled.sharding.spec == P("data")
    assert doubled.devices() == doubled.result().devices() and len(doubled.devices()) == 2
    assert doubled.is_fully_addressable and not doubled.is_fully_replicated and total.is_fully_replicated
    assert [shard.index for shard in doubled.addressable_shards] == [(slice(0, 2),), (slice(2, 4),)]
    assert keys.sharding == keys.result().sharding and not keys.is_deleted()
    assert keys.block_until_ready().is_ready()       # once computed, whether or not its run is seen over yet
    with pytest.raises(BufferError, match="singular device"):
        np.from_dlpack(doubled)
    one = pw.jit(lambda x: x + 1, slice=pw.virtual_slice(1, axes="d"))(jnp.arange(3.0))
    np.testing.assert_array_equal(np.from_dlpack(one), [1.0, 2.0, 3.0])
    assert one.device == one.result().device and doubled.device == doubled.sharding
    # Values on two islands are committed there, as JAX arrays with those shardings: JAX refuses to combine them
    # until one is moved (README, Known limits).
    other = "island1" if min(d.id for d in doubled.devices()) < 4 else "island0"    # (2 islands of 4 devices)
    elsewhere = pw.jit(lambda x: x * 3, slice=pw.virtual_slice(2, axes="data", island=other), in_specs=P("data"),
                       out_specs=P("data"))(jnp.arange(4.0))
    with pytest.raises(ValueError, match="incompatible devices"):
        doubled + elsewhere
    np.testing.assert_array_equal(doubled + jax.device_put(elsewhere, doubled.sharding), jnp.arange(4.0) * 5)


# Where an array lies, as a deleted JAX array is asked (`is_ready()` is left out: JAX 0.10.2's crashes the
# process on a deleted array).
PLACEMENT = {"sharding": lambda a: a.sharding, "is_fully_addressable": lambda a: a.is_fully_addressable,
             "is_fully_replicated": lambda a: a.is_fully_replicated, "committed": lambda a: a.committed,
             "format": lambda a: a.format, "device": lambda a: a.device, "devices()": lambda a: a.devices(),
             "addressable_shards": lambda a: a.addressable_shards, "global_shards": lambda a: a.global_shards,
             "addressable_data(0)": lambda a: a.addressable_data(0),
             "on_device_size_in_bytes()": lambda a: a.on_device_size_in_bytes()}


def placement_of(array) -> dict:
    """What `array` answers to each question of `PLACEMENT`, or the exception it raises."""
    answers = {}
    for name, ask in PLACEMENT.items():
        try:
            answers[name] = ask(array)
        except Exception as error:  # noqa: BLE001
            answers[name] = error
    return answers


def test_a_released_handle_says_where_it_lay_as_a_deleted_jax_array_does():
    """A deleted or donated JAX array still says its `sharding` (and `is_fully_*`, `committed`, `format`); a
    released handle read its value for them, and raised (`... was donated to program @lambda: a donated handle
    cannot be used again`). Now it answers them from where its plan placed it, as a JAX array on that sharding
    answers once deleted (key and weakly typed handles, and a shared reference its owner released, too), and
    raises its one-line error where that array raises."""
    s = pw.virtual_slice(2, axes="data")
    make = pw.jit(lambda x: (x * 2, x.sum(), 0.5 * 2, jax.random.split(jax.random.key(0), 2)), slice=s,
                  in_specs=P("data"), out_specs=(P("data"), P(), P(), P()))
    step = pw.jit(lambda w, total, lr, keys: (w + 1, total * 2, lr * 2, jax.random.split(keys[0], 2)), slice=s,
                  in_specs=(P("data"), P(), P(), P()), out_specs=(P("data"), P(), P(), P()),
                  donate_argnums=(0, 1, 2, 3))
    donated, deleted, (owned, *_) = make(jnp.arange(4.0)), make(jnp.arange(4.0)), make(jnp.arange(4.0))
    shared = default_client().share(owned)
    # Results a plan keeps on the host, which no slice places: a cond's, and an argument returned as it is.
    positive = pw.jit(lambda v: v.sum() > 0, slice=s, in_specs=P("data"))
    up = pw.jit(lambda v: v + 1, slice=s, in_specs=P("data"), out_specs=P("data"))
    double = pw.jit(lambda v: v * 2, slice=s, in_specs=P("data"), out_specs=P("data"), donate_argnums=0)
    on_host = [pw.program(lambda v: pw.cond(positive(v), up, up, v))(np.arange(4.0, dtype=np.float32)),
               pw.program(lambda v: v)(np.arange(4.0, dtype=np.float32))]
    cases = [(ref, "was donated to program @lambda: a donated handle cannot be used again")
             for ref in (*donated, *on_host)]
    cases += [(ref, "was released") for ref in deleted] + [(shared, "was released by its owner")]
    live = [placement_of(ref) for ref, _ in cases]
    # JAX arrays laid out as they are, committed as they are (host data read here is not: an argument returned)
    twins = [jax.device_put(ref.result(), ref.sharding) if ref.committed else jnp.array(ref.result())
             for ref, _ in cases]
    assert [type(ref).__name__ for ref, _ in cases[:4]] == ["Handle", "Handle", "WeakHandle", "KeyHandle"]
    step(*donated)
    for ref in on_host:
        double(ref)
    for ref in deleted:
        ref.delete()
    owned.delete()
    for (ref, line), before, twin in zip(cases, live, twins):
        assert ref.is_deleted()
        twin.delete()
        want, got = placement_of(twin), placement_of(ref)
        for name in PLACEMENT:
            if isinstance(want[name], Exception):                   # JAX raises: so does the handle, in one line
                assert type(got[name]) is ValueError and line in str(got[name]), (ref, name, got[name])
                assert "\n" not in str(got[name])
            else:
                assert got[name] == want[name], (ref, name, got[name], want[name])
        assert got["sharding"] == before["sharding"]                # where it lay while it was there
        with pytest.raises(ValueError, match=re.escape(line)):
            np.asarray(ref)


def test_the_last_checkpoint_restores_onto_a_state_a_step_took_as_in_jax(tmp_path):
    """The step took (donated) the state, and the loop restores the last checkpoint onto its layout, with the
    state's `ocp.utils.to_shape_dtype_struct` as the target, or the state itself: JAX's deleted arrays still say
    their shardings, so it works after `jax.jit`'s step; after a placed step it raised `... was donated to
    program @update: a donated handle cannot be used again`."""
    import orbax.checkpoint as ocp

    def init(x):
        return {"w": x * 1.0, "b": x[0], "lr": 0.5 * 2}

    def update(state):
        return {"w": state["w"] + 1.0, "b": state["b"] * 2.0, "lr": state["lr"] * 0.5}

    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    specs = {"w": P("data"), "b": P(), "lr": P()}
    s = pw.virtual_slice(2, axes="data")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    shardings = jax.tree.map(lambda spec: jax.sharding.NamedSharding(mesh, spec), specs)
    sides = {"jax": (jax.jit(init, out_shardings=shardings), jax.jit(update, donate_argnums=0)),
             "pw": (pw.jit(init, slice=s, in_specs=P("data"), out_specs=specs),
                    pw.jit(update, slice=s, in_specs=(specs,), out_specs=specs, donate_argnums=0))}
    restored = {}
    for side, (start, step) in sides.items():
        state = start(x)
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(tmp_path / side, state)
            checkpointer.wait_until_finished()
            shardings = jax.tree.map(lambda a: a.sharding, state)
            step(state)
            assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state)), side
            target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            assert jax.tree.map(lambda t: t.sharding, target) == shardings, side
            restored[side] = [checkpointer.restore(tmp_path / side, target),
                              checkpointer.restore(tmp_path / side, state)]
        for tree in restored[side]:
            assert jax.tree.map(lambda a: a.sharding, tree) == shardings, side
    jax.tree.map(np.testing.assert_array_equal, restored["pw"], restored["jax"])
    jax.tree.map(np.testing.assert_array_equal, restored["jax"][0], init(x))


def test_a_donated_key_handle_gives_orbax_its_restore_target_as_a_deleted_key_array_does(tmp_path):
    """A state with an RNG key (an NNX model's streams) that a step donated: Orbax's target
    `to_shape_dtype_struct` takes a key's `jax.random.key_data`, which a deleted JAX key array gives without
    its value; a donated `KeyHandle` raised `... a donated handle cannot be used again`. Its key data says
    shape, dtype and sharding, the checkpoint restores onto it as in JAX, and its value still raises."""
    import orbax.checkpoint as ocp

    def step(state):
        key, sub = jax.random.split(state["key"])
        return {"key": key, "w": state["w"] + jax.random.normal(sub, state["w"].shape)}

    sides = {"jax": jax.jit(step, donate_argnums=0),
             "pw": pw.jit(step, slice=pw.virtual_slice(2, axes="data"), donate_argnums=0)}
    targets, restored = {}, {}
    for side, placed in sides.items():
        state = placed({"key": jax.random.key(0), "w": jnp.zeros(4)})
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(tmp_path / side, state)
            checkpointer.wait_until_finished()
            key_data_sharding = jax.random.key_data(state["key"]).sharding
            placed(state)
            assert state["key"].is_deleted(), side
            targets[side] = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            assert targets[side]["key"].sharding == key_data_sharding, side
            restored[side] = checkpointer.restore(tmp_path / side, targets[side])
    assert [(t.shape, t.dtype) for t in jax.tree.leaves(targets["pw"])] == \
        [(t.shape, t.dtype) for t in jax.tree.leaves(targets["jax"])]
    assert jax.random.key_data(state["key"]).is_deleted()
    with pytest.raises(ValueError, match=r"was donated to program @step: a donated handle cannot be used again"):
        jax.random.split(state["key"])
    jax.tree.map(np.testing.assert_array_equal, jax.random.key_data(restored["pw"]["key"]),
                 jax.random.key_data(restored["jax"]["key"]))
    np.testing.assert_array_equal(restored["pw"]["w"], restored["jax"]["w"])


def test_copying_and_pickling_handles():
    """`copy.copy`/`copy.deepcopy` of a pytree of handles (an EMA of the parameters, a "best" state) share
    the handles: a copy was a second owner of one result, whose drop released it, and the original's
    read then waited forever. `pickle` writes values, loaded as NumPy arrays (key handles as key arrays)."""
    import copy
    import gc
    import pickle

    s = pw.virtual_slice(2, axes="data")
    step = pw.jit(lambda x, key: (2 * x, jax.random.split(key)), slice=s)
    state = step(jnp.ones(4), jax.random.key(0))
    for copied in (copy.copy(state), copy.deepcopy(state)):
        assert all(a is b for a, b in zip(copied, state))
    del copied
    gc.collect()
    np.testing.assert_array_equal(np.asarray(state[0].result(timeout=30)), np.full(4, 2.0))
    values, keys = pickle.loads(pickle.dumps(state))
    assert type(values) is np.ndarray and values.tolist() == [2.0] * 4
    np.testing.assert_array_equal(jax.random.key_data(keys), jax.random.key_data(jax.random.split(jax.random.key(0))))
    # A value of its own (a backup before a donating step) is a copy: the handle's own array goes with it.
    inc = pw.jit(lambda x: x + 1, slice=s, donate_argnums=0)
    h = inc(jnp.zeros(4))
    backup, own = jnp.array(h, copy=True), h.result()
    inc(h).block_until_ready()
    assert own.is_deleted() and not backup.is_deleted() and backup.tolist() == [1.0] * 4


def test_arguments_jax_would_refuse_are_refused_at_the_call():
    s = pw.virtual_slice(2, axes="data")
    double = pw.jit(lambda x: x * 2, slice=s, in_specs=P("data"), out_specs=P("data"))
    compiled = double.compiled(np.ones(4, np.float32))
    for wrong in (np.arange(4, dtype=np.int32), jnp.arange(4, dtype=jnp.int32)):
        with pytest.raises(TypeError, match=r"leaf 0 of program @lambda has dtype int32, but it was compiled for "
                                            r"float32\[4\]"):
            compiled(wrong)
    # A NumPy float64 is float32 here, as jax.jit takes it without x64.
    np.testing.assert_array_equal(np.asarray(compiled(np.ones(4, np.float64))), np.full(4, 2.0, np.float32))
    with pytest.raises(TypeError, match="expected an array, a scalar or a jax.ShapeDtypeStruct, not str 'abc'"):
        double("abc")
    # An abstract value traces (`lower`, `compiled`) but has no value to run on: its run failed on the island.
    abstract = jax.ShapeDtypeStruct((4,), jnp.float32)
    assert double.lower(abstract).as_text() and double.compiled(abstract) is compiled
    for call in (lambda: double(abstract), lambda: compiled(abstract), lambda: pw.program(double)(abstract)):
        with pytest.raises(TypeError, match=r"argument leaf 0 of program @\w+ is a jax.ShapeDtypeStruct, which has "
                                            r"no value to run on: a call takes arrays; trace with abstract values"):
            call()
    # A deleted jax.Array (or one donated to a jax.jit computation) is refused at the call, as jax.jit refuses
    # it, on the fast lane's path too: its run failed, and reading the result raised RunFailed.
    deleted, donated = jnp.ones(4), jnp.ones(4)
    deleted.delete()
    jax.jit(lambda v: v * 2, donate_argnums=0)(donated)
    for call in (lambda: double(deleted), lambda: double(donated), lambda: pw.program(double)(deleted)):
        with pytest.raises(RuntimeError, match=r"argument 0 of program @\w+ is a deleted jax.Array \(deleted, or "
                                               r"donated to another computation, before the call\)"):
            call()
    # A NumPy masked array, which JAX refuses: taken by its data, its mask was lost (a compiled stage's run
    # failed on the island); a memoryview raised AttributeError ('no attribute dtype').
    masked = np.ma.masked_array(np.ones(4, np.float32), mask=[0, 1, 0, 0])
    for call in (lambda: double(masked), lambda: compiled(masked), lambda: pw.program(double)({"x": masked}["x"])):
        with pytest.raises(ValueError, match=r"^a NumPy masked array is not an argument, as JAX refuses it \(its "
                                             r"mask would be lost\): pass arr.filled\(value\)"):
            call()
    with pytest.raises(TypeError, match="expected an array, a scalar or a jax.ShapeDtypeStruct, not memoryview"):
        double(memoryview(b"abcd"))


def test_a_compiled_stage_refuses_a_scalar_of_another_dtype_as_jax_jits_does():
    """A compiled stage traced for an int took a Python float, a np.float64 or a complex and truncated it (2.7 ran
    as 2), where `jax.jit`'s compiled stage refuses it; a scalar of the traced dtype, strong or weak, runs (found by
    differential fuzzing)."""
    s = pw.virtual_slice(1, axes="x")
    x = np.arange(4, dtype=np.int32)

    def outcome(compiled, passed):
        try:
            return np.asarray(compiled(x, passed)).tolist()
        except TypeError:
            return TypeError

    for traced in (2, np.int32(2), 2.0, np.float32(2), True):
        ours = pw.jit(lambda a, b: a * b, slice=s).lower(x, traced).compile()
        theirs = jax.jit(lambda a, b: a * b).lower(x, traced).compile()
        for passed in (3, 2.7, np.float64(2.7), np.complex128(2 + 1j), np.int32(3), np.int64(3), False):
            assert outcome(ours, passed) == outcome(theirs, passed), (traced, passed)
    with pytest.raises(TypeError, match=r"^argument leaf 1 of program @lambda has dtype float32, but it was "
                                        r"compiled for int32\[\]$"):
        pw.jit(lambda a, b: a * b, slice=s).lower(x, 2).compile()(x, 2.7)


def test_a_compiled_stage_called_inside_a_jax_transformation_refuses_its_tracers_at_the_call():
    """A compiled stage called on tracers (inside `jax.jit`) sent them to an island, where the run failed; `jax.jit`'s
    compiled stage refuses them at the call (found by differential fuzzing)."""
    x = np.arange(4, dtype=np.float32)
    reference = jax.jit(lambda a: a * 2).lower(x).compile()
    with pytest.raises(TypeError, match="Cannot apply JAX transformations to a function lowered and compiled"):
        jax.jit(lambda v: reference(v))(x)
    compiled = pw.jit(lambda a: a * 2, slice=pw.virtual_slice(1, axes="x")).lower(x).compile()
    with pytest.raises(TypeError, match=r"^argument leaf 0 of program @lambda is a JAX tracer: a compiled program "
                                        r"cannot be called inside a JAX transformation"):
        jax.jit(lambda v: compiled(v))(x)
    placed = pw.jit(lambda a: a * 2, slice=pw.virtual_slice(1, axes="x"))
    for dispatch in ("parallel", "sequential"):              # `.run`, which asks for a run (found by a review)
        with pytest.raises(TypeError, match=r"^argument leaf 0 of program @lambda is a JAX tracer"):
            jax.jit(lambda v: placed.run(v, dispatch=dispatch))(x)


def test_a_compiled_stage_refuses_a_key_of_another_implementation_or_raw_key_data_as_jax_jits_does():
    """A compiled stage traced for a threefry key ran raw uint32[2] key data, and refused an rbg key as "buffer 0
    of lambda has shape (4,), expected (2,)" (found by differential fuzzing)."""
    s = pw.virtual_slice(1, axes="x")
    compiled = pw.jit(lambda k: jax.random.normal(k, (3,)), slice=s).lower(jax.random.key(0)).compile()
    reference = jax.jit(lambda k: jax.random.normal(k, (3,))).lower(jax.random.key(0)).compile()
    for other, dtype in ((jax.random.key(0, impl="rbg"), "key<rbg>"), (np.zeros(2, np.uint32), "uint32")):
        with pytest.raises(TypeError):
            reference(other)
        with pytest.raises(TypeError, match=rf"^argument leaf 0 of program @lambda has dtype {dtype}, but it was "
                                            rf"compiled for key<fry>\[\]$"):
            compiled(other)


def test_a_compiled_stage_refuses_an_argument_of_another_shape_naming_it():
    """A compiled stage refused an argument of another shape as "argument for buffer 1 of p", a plan's buffer
    (found by differential fuzzing); `jax.jit`'s names the argument, `d['m']`."""
    f = pw.jit(lambda d: d["a"] + d["m"].sum(), slice=pw.virtual_slice(1, axes="x"))
    d = {"a": np.ones(4, np.float32), "m": np.ones(2, np.float32)}
    with pytest.raises(TypeError, match=r"^argument leaf 1 of program @lambda \(argument\[0\]\['m'\]\) has "
                                        r"shape \(7,\), but it was compiled for float32\[2\]$"):
        pw.program(lambda d: f(d)).lower(d).compile()({"a": d["a"], "m": np.ones(7, np.float32)})


def test_a_compiled_stage_refuses_a_client_of_no_client_as_a_call_does():
    """`client=` of no client raised "AttributeError: 'str' object has no attribute 'runtime'" from a compiled
    stage, where a call says what it takes (found by differential fuzzing)."""
    double = pw.jit(lambda a: a * 2, slice=pw.virtual_slice(1, axes="x"))
    x = np.arange(4, dtype=np.float32)
    for call in (double.lower(x).compile(), double.run):
        with pytest.raises(TypeError, match=r"^client= takes a pw.Client \(or the connection pw.connect makes\), "
                                            r"not str$"):
            call(x, client="me")


def test_a_result_neither_array_nor_scalar_is_refused_naming_the_result():
    """A function that returns a string was refused with JAX's message for an argument (`Argument 's' of type
    <class 'str'> is not a valid JAX type`), naming nothing; `jax.jit` names the output component (found by a
    fault finder)."""
    placed = pw.jit(lambda a: (a, {"name": "hello"}), slice=pw.virtual_slice(1, axes="d"))
    for f in (placed, pw.program(lambda a: placed(a))):
        with pytest.raises(TypeError, match=r"^lambda at .*: result\[1\]\['name'\] is a str, which is not a "
                                            r"valid JAX type"):
            f(jnp.ones(3))


def test_an_argument_neither_array_nor_scalar_is_refused_at_the_call():
    """An object with a shape and a dtype was taken as an array: its run was admitted and failed on the island
    (found by differential fuzzing). `jax.jit` refuses it at the call."""
    s = pw.virtual_slice(1, axes="x")
    x = np.arange(4, dtype=np.float32)

    class Duck:
        shape, dtype = (4,), np.dtype(np.float32)

    double = pw.jit(lambda a: a * 2, slice=s)
    with pytest.raises(TypeError):
        jax.jit(lambda a: a * 2)(Duck())
    for call in (double, pw.program(double)):
        call(x)                    # the same signature, with an array: a Duck is refused at the call all the same
        with pytest.raises(TypeError, match=r"argument\[0\]: expected an array, a scalar or a "
                                            r"jax.ShapeDtypeStruct, not Duck <"):
            call(Duck())
    with pytest.raises(TypeError, match=r"^argument leaf 0 of program @lambda is a Duck: expected an array or a "
                                        r"scalar$"):
        double.lower(x).compile()(Duck())


def test_a_bad_argument_leaf_is_named_with_its_function_and_path():
    """A call with a leaf neither array nor scalar said "expected an array, ... not str 'str'", naming neither
    the function nor the leaf (found by differential fuzzing), as `jax.jit` and `lower` name both."""
    s = pw.virtual_slice(1, axes="x")
    x = np.arange(4, dtype=np.float32)

    def f(a, b):
        return a

    with pytest.raises(TypeError, match=r"path b\['k'\]"):
        jax.jit(f)(x, {"k": "str"})
    line = inspect.getsourcelines(f)[1]
    for call in (pw.jit(f, slice=s), pw.program(pw.jit(f, slice=s))):
        with pytest.raises(TypeError, match=rf"^f at {re.escape(__file__)}:{line}: argument\[1\]\['k'\]: "
                                            rf"expected an array, a scalar or a jax.ShapeDtypeStruct, not str 'str'$"):
            call(x, {"k": "str"})


def test_a_failing_trace_names_the_function_and_its_arguments_as_jax_jit_does():
    """JAX's message of a value needed in Python while tracing named our wrapper and its leaves ("while tracing
    the function flat at .../frontend/executables.py:82 ... the argument wire_leaves[1]"), not the user's code."""
    s = pw.virtual_slice(2, axes="data")

    def clipped(params, x, *, scale):
        if params["w"].sum() > 0:                      # Python control flow on a traced value
            return x * scale
        return -x

    def message(f, error):
        with pytest.raises(error) as info:
            f({"b": jnp.zeros(2), "w": jnp.ones(2)}, jnp.ones(2), scale=2.0)
        return str(info.value).split("The error occurred", 1)[1].split("\n")[0]

    want = message(jax.jit(clipped), jax.errors.TracerBoolConversionError)
    assert "clipped at" in want and "argument params['w']" in want
    for placed in (pw.jit(clipped, slice=s), pw.program(pw.jit(clipped, slice=s))):
        assert message(placed, jax.errors.TracerBoolConversionError) == want


# --- arrays of zero size ------------------------------------------------------------------------------

def test_arrays_of_zero_size_go_through_placed_functions_and_programs_as_in_jax():
    """A dimension of 0 (an empty batch, an empty list of boxes) works as under `jax.jit`, whatever the specs
    say: a zero-size buffer is replicated (no data to split; JAX lays out a sharded zero-size jit result
    wrongly), also across islands."""
    s = pw.virtual_slice(2, axes="data")
    other = pw.virtual_slice(2, axes="data", island="island1")
    double = pw.jit(lambda x: x * 2, slice=s, in_specs=P("data"), out_specs=P("data"))
    shifted = pw.jit(lambda x: x - 1, slice=other, in_specs=P("data"), out_specs=P("data"))

    @pw.program
    def across(x):
        return shifted(double(x))

    empty = np.ones((4, 0), np.float32)
    assert np.asarray(across(empty)).shape == (4, 0)
    assert np.asarray(shifted(double(empty))).shape == (4, 0)              # handles from island to island
    plan = across.compiled(empty).plan
    assert {b.sharding for b in plan.buffers.values()} == {((), ())}
    total = pw.jit(lambda x, y: (x.sum(), jnp.concatenate([y, y])), slice=s, in_specs=P("data"))
    got, want = total(np.ones((2, 0), np.float32), np.zeros(0, np.int32)), jax.jit(
        lambda x, y: (x.sum(), jnp.concatenate([y, y])))(np.ones((2, 0), np.float32), np.zeros(0, np.int32))
    assert float(got[0]) == float(want[0]) == 0.0 and np.asarray(got[1]).shape == want[1].shape == (0,)


def test_stages_answer_what_jax_jits_stages_answer():
    """`lower(...)` and `compile()` give the arguments, results, donations and a run's cost as `jax.jit`'s stages
    do; `compile()` adds the plans as text and the memory one run needs; `eval_shape` runs nothing."""
    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    s = pw.virtual_slice(2, axes="data")

    def step(w, batch, *, scale):
        return {"loss": (batch["x"] @ w).sum() * scale, "w": w * 0.5}

    placed = pw.jit(step, slice=s, in_specs=None, donate_argnums=0)
    reference = jax.jit(step, donate_argnums=0)
    w, batch = jnp.ones((32, 16)), {"x": jnp.ones((64, 32))}
    ours, theirs = placed.lower(w, batch, scale=2.0), reference.lower(w, batch, scale=2.0)
    assert ours.in_tree == theirs.in_tree and ours.out_tree == theirs.out_tree
    assert ours.donate_argnums == theirs.donate_argnums == (0,)
    assert ours.in_avals == theirs.in_avals == ours.compile().in_avals
    assert jax.tree.map(lambda a: (a.shape, a.dtype, a.donated), ours.args_info) == \
        jax.tree.map(lambda a: (a.shape, a.dtype, a.donated), theirs.args_info)
    assert ours.out_info == theirs.out_info == placed.eval_shape(w, batch, scale=2.0) == \
        reference.eval_shape(w, batch, scale=2.0)
    weak = jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)      # out_info drops weak types, as JAX's does
    assert pw.jit(lambda a: a * 2, slice=s).lower(weak).out_info == jax.jit(lambda a: a * 2).lower(weak).out_info
    # The matmul's FLOPs are XLA's count; the sum, the scale's conversion and product, and w * 0.5 add one
    # per element each.
    matmul = 2 * 64 * 16 * 32
    assert ours.cost_analysis()["flops"] == matmul + 64 * 16 + 1 + 1 + 32 * 16
    assert theirs.compile().cost_analysis()["flops"] >= matmul
    assert ours.compiler_ir() is ours.module and ours.as_text("pw") == ours.as_text()
    with pytest.raises(ValueError, match=r"^program @step is lowered to the pw dialect, not 'stablehlo'"):
        ours.compiler_ir("stablehlo")

    # A program counts each computation it calls, and its costlier branch of a cond.
    square = pw.jit(lambda x: x @ x, slice=s)
    total = pw.jit(lambda x: x.sum(), slice=s)
    bump = pw.jit(lambda x: x + 1.0, slice=s)

    @pw.program
    def branching(x):
        y = square(square(x))
        return pw.cond(total(y), lambda v: square(v), lambda v: bump(v), y)

    x = jnp.ones((8, 8))
    one_square = 2 * 8 * 8 * 8
    assert branching.lower(x).cost_analysis() == {"flops": 3 * one_square + 64.0,      # the sum: 64
                                                   "bytes accessed": 3 * 512.0 + 256.0 + 4.0}
    assert branching.eval_shape(x) == jax.ShapeDtypeStruct((8, 8), jnp.float32)

    # The compiled stage: the plans as pw-opt prints them, and the memory admission reserves for a run.
    double = pw.jit(lambda v: v * 2.0, slice=s, in_specs=P("data"), out_specs=P("data"))
    kept, reused = pw.program(lambda v: double(v)), pw.program(lambda v: double(v), donate_argnums=0)
    v = np.ones((256, 64), np.float32)
    rt = Runtime(embedded_device_map(2, 4))
    try:
        undonated, donated = (f.lower(v).compile(runtime=rt) for f in (kept, reused))
        assert "pw.island_plan" in undonated.as_text() and "pw.placement" in undonated.as_text()
        assert undonated.in_tree == undonated.lowered.in_tree and donated.donate_argnums == (0,)
        assert undonated.cost_analysis() == undonated.lowered.cost_analysis()
        # Where the plan puts arguments and results: a result lies as `output_shardings` says.
        [[placed_at], _] = undonated.input_shardings
        assert placed_at.spec == P("data", None) and len(placed_at.device_set) == 2
        result = undonated(jax.device_put(v, placed_at), client=Client(rt))
        assert result.sharding == undonated.output_shardings == placed_at
        result.delete()
        shard = v.nbytes // 2                                # one device's half of v, and of 2v
        for compiled, peak in ((undonated, 2 * shard), (donated, shard)):
            memory = compiled.memory_analysis()
            assert memory.argument_bytes == memory.output_bytes == v.nbytes
            assert memory.peak_memory_in_bytes == peak
            [(devices, nbytes)] = memory.peak_bytes.items()
            assert re.fullmatch(r"island\d devices \d-\d", devices) and nbytes == peak
    finally:
        rt.close()


def test_stages_refuse_a_debug_info_that_is_not_true_or_false(tmp_path):
    """`debug_info="false"` reached nanobind, whose error of several lines does not name the parameter; by then
    `Lowered.save` had emptied the file."""
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    double = pw.jit(lambda v: v * 2.0, slice=pw.virtual_slice(2, axes="data"))
    lowered = pw.program(lambda v: double(v)).lower(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"^Lowered.as_text: debug_info must be True or False, not 'false'$"):
        lowered.as_text(debug_info="false")
    path = tmp_path / "kept.mlir"
    path.write_text("kept")
    with pytest.raises(TypeError, match=r"^Lowered.save: debug_info must be True or False, not 'false'$"):
        lowered.save(path, debug_info="false")
    assert path.read_text() == "kept"
    rt = Runtime(embedded_device_map(2, 4))
    try:
        with pytest.raises(TypeError, match=r"^Compiled.as_text: debug_info must be True or False, not 1$"):
            lowered.compile(runtime=rt).as_text(debug_info=1)
    finally:
        rt.close()

def test_a_placed_function_of_no_arrays_traces_inside_a_jax_trace():
    """A placed function called with no array argument inside a JAX trace (`jax.eval_shape`, a `jax.jit`
    trace) ran on the cluster at trace time, its value baked in as a constant, there being no tracer among its
    arguments to show the trace (found by differential fuzzing); once called outside, its call was looked up
    by identity and ran too. It traces as its function, as a nested `jax.jit` does, and so does a program's
    `eval_shape` with a cond on such a value (which raised)."""
    runs = []

    def make_ones():
        jax.debug.callback(lambda: runs.append(1))       # counts executions, not traces
        return jnp.ones((4, 4), jnp.float32)

    s = pw.virtual_slice(2, axes="x")
    ones = pw.jit(make_ones, slice=s, out_specs=P("x"))
    add = pw.jit(lambda a, b: a + b, slice=s, in_specs=P("x"), out_specs=P("x"))
    positive = pw.jit(lambda v: v.sum() > 0, slice=s)

    @pw.program
    def step(x):
        c = ones()
        return pw.cond(positive(c), lambda v: add(v, v), lambda v: v, add(x, c))

    for called_before in (False, True):
        if called_before:
            np.testing.assert_array_equal(np.asarray(ones()), np.ones((4, 4)))
        jax.effects_barrier()
        before = len(runs)
        assert jax.eval_shape(ones) == jax.ShapeDtypeStruct((4, 4), jnp.float32)
        jax.jit(lambda: ones() + 1).lower()
        jax.effects_barrier()
        assert len(runs) == before, called_before
    assert step.eval_shape(np.zeros((4, 4), np.float32)).shape == (4, 4)


def test_a_placed_function_of_arrays_captured_outside_a_jax_trace_traces_inside_it():
    """Inside `jax.jit`, a placed function called on a concrete array the trace captured (no tracer) traces as
    its function, as a nested `jax.jit` does, also once an earlier call outside made its call one looked up by
    identity: that lookup ran it on the cluster at trace time, under the outer trace, so its host callback saw
    the trace's values and failed the run, and its result was baked in as a constant (found by a fault
    finder)."""
    def record(v):
        return np.asarray(v) + 0.0                    # (a host callback reading its value)

    def double(a):
        return jax.pure_callback(record, jax.ShapeDtypeStruct(a.shape, a.dtype), a * 2)

    c = jnp.arange(4.0, dtype=jnp.float32)
    for called_before in (False, True):
        placed = pw.jit(double, slice=pw.virtual_slice(1, axes="d"))
        if called_before:
            np.testing.assert_array_equal(np.asarray(placed(c)), np.arange(4.0) * 2)
        outer = jax.jit(lambda y: placed(c) + y)
        for y in (1.0, 2.0):
            np.testing.assert_array_equal(np.asarray(outer(y)), np.arange(4.0) * 2 + y, err_msg=str(called_before))
        assert any(e.primitive.name in ("pjit", "jit") for e in jax.make_jaxpr(outer)(1.0).jaxpr.eqns), \
            called_before
