"""The client front end: slices, placed functions and programs traced into pw IR."""

import base64
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from mlir import ir

import pathways_mlir as pw
from pathways_mlir.dialect import ops
from pathways_mlir.dialect.context import make_context
from pathways_mlir.dialect.diagnostics import DiagnosticEngine, SourceLocation
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.passes.verify import VerifyPass


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def verified(lowered) -> ir.Module:
    """Checks that the exported text parses in a fresh context and passes pw-verify."""
    with make_context():
        module = ir.Module.parse(lowered.as_text())
        diagnostics = DiagnosticEngine()
        VerifyPass().run(module.operation, diagnostics)
    assert not diagnostics.diagnostics, [d.format() for d in diagnostics.diagnostics]
    return lowered.module


def computes(module, program):
    return [op for op in ops.program_body(ops.programs(module)[program]).operations
            if op.operation.name in ("pw.compute", "pw.cond")]


def call_line(program, offset):
    """The source line `offset` lines below the first decorator of a program."""
    return program.__wrapped__.__code__.co_firstlineno + offset


slice_a = pw.virtual_slice(2, axes="data", name="a")
slice_b = pw.virtual_slice((2, 2), axes=("data", "model"), name="b")
slice_c = pw.virtual_slice((2, 2, 2), axes=("x", "y", "z"), name="c")
slice_d = pw.virtual_slice(4, axes="data", device_kind="cpu", min_memory_bytes=1 << 20, same_island=True)


def _tanh(x):
    return jnp.tanh(x)


def _square(x):
    return x * x


tanh_a = pw.jit(_tanh, slice=slice_a, in_specs=P("data"), out_specs=P("data"))
square_b = pw.jit(_square, slice=slice_b, in_specs=P("data", "model"), out_specs=P("data", "model"))


# -- programs ----------------------------------------------------------------

def test_placed_function_alone_is_a_one_computation_program():
    lowered, line = tanh_a.lower(jnp.ones((8, 16))), inspect.currentframe().f_lineno
    module = verified(lowered)
    [compute] = computes(module, lowered.program)
    assert SourceLocation.of(compute.location) == SourceLocation(__file__, line, 21)
    assert lowered.program == "_tanh"
    assert ops.attrs(compute) == {"callee": "_tanh_1", "slice": "a", "label": "_tanh#0",
                                  "in_shardings": [[["data"], []]], "out_shardings": [[["data"], []]]}
    assert list(ops.virtual_slices(module)) == ["a"]
    assert ops.attr(ops.executables(module)["_tanh_1"], ops.EXPORT)


def test_program_calls_become_computes_across_four_slices():
    cube_c = pw.jit(lambda x, y: x * y, slice=slice_c, in_specs=(P(("x", "y")), P(None, "z")))
    add_d = pw.jit(lambda x, y: x + y, slice=slice_d, in_specs=P("data"), out_specs=P("data"))

    @pw.program
    def four(x):
        a = tanh_a(x)
        b = square_b(a)
        c = cube_c(a, b)
        return add_d(c, tanh_a(b))

    lowered = four.lower(f32(8, 16))
    module = verified(lowered)
    found = [(ops.attr(op, "callee"), ops.attr(op, "slice"), ops.attr(op, "label"))
             for op in computes(module, "four")]
    # One compiled function per function and signature: both tanh_a calls share one.
    assert found == [("_tanh", "a", "_tanh#0"), ("_square", "b", "_square#0"),
                     ("lambda", "c", "lambda#0"), ("_tanh", "a", "_tanh#1"), ("lambda_1", "slice0", "lambda#1")]
    assert list(ops.virtual_slices(module)) == ["a", "b", "c", "slice0"]
    assert ops.virtual_slices(module)["slice0"].constraints == {
        "device_kind": "cpu", "min_memory_bytes": 1 << 20, "same_island": True}
    assert ops.in_shardings(computes(module, "four")[2]) == [
        Sharding((("x", "y"), ())), Sharding(((), ("z",)))]
    assert ops.out_shardings(computes(module, "four")[2]) == [Sharding(((), ()))]


def test_same_function_with_new_shapes_gets_a_new_executable():
    @pw.program
    def twice(x, y):
        return tanh_a(x), tanh_a(y)

    module = verified(twice.lower(f32(8, 16), f32(4, 2)))
    assert [ops.attr(op, "callee") for op in computes(module, "twice")] == ["_tanh", "_tanh_1"]


def test_ops_record_the_python_call_site():
    @pw.program
    def prog(x):
        return square_b(tanh_a(x))

    lowered = prog.lower(f32(8, 16))
    tanh_op, square_op = computes(lowered.module, "prog")
    assert SourceLocation.of(tanh_op.location) == SourceLocation(__file__, call_line(prog, 2), 25)
    assert SourceLocation.of(square_op.location) == SourceLocation(__file__, call_line(prog, 2), 16)
    text = lowered.as_text(debug_info=True)
    assert f'loc("square_b"' not in text and f'loc("_square"(' in text


def test_pytrees_of_arguments_and_results():
    def mix(params, x):
        return {"y": x @ params["w"] + params["b"], "z": (x - params["b"],)}

    mix_b = pw.jit(mix, slice=slice_b, in_specs=({"w": P(None, "model"), "b": P("model")}, P("data")),
                   out_specs={"y": P("data", "model"), "z": None})

    @pw.program
    def prog(params, x):
        out = mix_b(params, x)
        return out["z"], [out["y"]]

    params = {"w": f32(8, 8), "b": f32(8, 8)}
    lowered = prog.lower(params, f32(8, 8))
    module = verified(lowered)
    [op] = computes(module, "prog")
    # Leaves in pytree order: dict keys sorted.
    assert ops.in_shardings(op) == [Sharding((("model",), ())), Sharding(((), ("model",))),
                                    Sharding((("data",), ()))]
    assert ops.out_shardings(op) == [Sharding((("data",), ("model",))), Sharding(((), ()))]
    assert lowered.in_tree == jax.tree_util.tree_structure(((params, 0), {}))   # (args, kwargs), as jax.jit
    assert lowered.out_tree == jax.tree_util.tree_structure(((0,), [0]))
    assert len(lowered.in_avals_flat) == 3 and len(lowered.out_avals_flat) == 2


# The dialect's IRDL definition gives each variadic operand and result list one
# constraint variable, and IRDL binds a variable to the first type it sees: a
# pw.compute or pw.cond whose operands (or results) differ in type fails MLIR's
# verifier. Fixing it is the dialect's job; these cases record it.


def test_operands_of_different_types():
    mix_b = pw.jit(lambda w, x: x @ w, slice=slice_b, in_specs=(P(None, "model"), P("data")))
    verified(mix_b.lower(f32(16, 4), f32(8, 16)))


def test_results_of_different_types():
    verified(pw.jit(lambda x: (x, jnp.sum(x)), slice=slice_a).lower(f32(8)))


@pytest.mark.parametrize("dtype, element", [(jnp.float32, "f32"), (jnp.bfloat16, "bf16"),
                                            (jnp.int32, "i32"), (jnp.bool_, "i1"), (jnp.uint8, "ui8")])
def test_dtypes(dtype, element):
    flip = pw.jit(lambda x: ~x if dtype in (jnp.bool_, jnp.int32, jnp.uint8) else -x, slice=slice_a,
                  in_specs=P("data"), out_specs=P("data"))
    lowered = flip.lower(jax.ShapeDtypeStruct((4, 2), dtype))
    verified(lowered)
    assert f"(%arg0: tensor<4x2x{element}>) -> tensor<4x2x{element}> attributes {{pw.program}}" \
        in lowered.as_text()


def test_unused_arguments_stay_in_the_signature():
    first = pw.jit(lambda x, y: x, slice=slice_a)
    verified(first.lower(f32(2), f32(2)))


def test_programs_nest_by_inlining():
    @pw.program
    def inner(x):
        return tanh_a(x)

    @pw.program
    def outer(x):
        return inner(inner(x))

    module = verified(outer.lower(f32(8, 16)))
    assert [ops.attr(op, "label") for op in computes(module, "outer")] == ["_tanh#0", "_tanh#1"]
    assert list(ops.programs(module)) == ["outer"]


# -- data-dependent steps ----------------------------------------------------

def test_cond_traces_both_branches_into_programs():
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=slice_a, in_specs=P("data"))

    def on_b(x, y):
        return square_b(x), y

    def on_a(x, y):
        return tanh_a(x), y

    @pw.program
    def route(x, y):
        x = tanh_a(x)
        out, y = pw.cond(positive(x), on_b, on_a, x, y)
        return tanh_a(out), y

    lowered = route.lower(f32(8, 16), f32(8, 16))
    module = verified(lowered)
    names = [ops.attr(op, "label") for op in computes(module, "route")]
    assert names == ["_tanh#0", "lambda#0", "cond#0", "_tanh#2"]
    cond = computes(module, "route")[2]
    assert (ops.attr(cond, "then_program"), ops.attr(cond, "else_program")) == ("on_b", "on_a")
    assert list(ops.programs(module)) == ["route", "on_b", "on_a"]
    assert [ops.attr(op, "label") for op in computes(module, "on_b")] == ["_square#0"]
    assert [ops.attr(op, "label") for op in computes(module, "on_a")] == ["_tanh#1"]


def test_cond_rejects_bad_predicates_and_branches():
    @pw.program
    def not_bool(x):
        return pw.cond(tanh_a(x), lambda v: v, lambda v: v, x)

    with pytest.raises(TypeError, match=rf"cond at .*:{call_line(not_bool, 2)}: the predicate must be a scalar "
                                        rf"boolean or number, not f32\[8,16\]"):
        not_bool.lower(f32(8, 16))

    is_pos = pw.jit(lambda x: x[0] > 0, slice=slice_a)

    @pw.program
    def mismatched(x):
        return pw.cond(is_pos(x), lambda v: v, lambda v: (v, v), x)

    with pytest.raises(TypeError, match=r"branches return different structures"):
        mismatched.lower(f32(8))

    @pw.program
    def captures(x):
        y = tanh_a(x)
        return pw.cond(is_pos(x), lambda v: tanh_a(y), lambda v: v, x)

    with pytest.raises(pw.PlacementError, match=r"_tanh at .*: argument\[0\] is Value\(f32\[8\], _tanh#0 "
                                                r"result #0 in @captures\), a value of another trace"):
        captures.lower(f32(8))


# -- shard-count independence ------------------------------------------------

def _two_slice_program(devices):
    first = pw.virtual_slice(devices, axes="data")
    second = pw.virtual_slice((devices // 4, 4), axes=("data", "model"))
    a = pw.jit(_tanh, slice=first, in_specs=P("data"), out_specs=P("data"))
    b = pw.jit(_square, slice=second, in_specs=P("data", "model"), out_specs=P(("data", "model")))

    @pw.program
    def chain(x):
        return b(a(x))

    return chain.lower(f32(4096, 16))


def test_ir_size_does_not_depend_on_the_shard_count():
    small, large = _two_slice_program(8), _two_slice_program(2048)
    verified(small), verified(large)

    def op_names(lowered):
        names = []
        lowered.module.operation.walk(lambda op: names.append(op.name) or ir.WalkResult.ADVANCE)
        return names

    assert op_names(small) == op_names(large)
    masked = [re.sub(r"array<i64: [\d, ]+>", "array<i64: N>", x.as_text()) for x in (small, large)]
    assert masked[0] == masked[1]  # only the slice shapes differ
    assert "array<i64: 2048>" in large.as_text() and "array<i64: 512, 4>" in large.as_text()


# -- placement errors --------------------------------------------------------

def test_unknown_axis_names_the_call():
    bad = pw.jit(_tanh, slice=slice_a, in_specs=P("model"))

    @pw.program
    def prog(x):
        return bad(x)

    with pytest.raises(pw.PlacementError) as e:
        prog.lower(f32(8))
    assert str(e.value) == (f"_tanh at {__file__}:{call_line(prog, 2)}: input[0] f32[8] with spec "
                            f"P('model',) on slice @a: sharding [[\"model\"]] names axis 'model' which "
                            f"the slice does not have (axes: data)")


def test_sharding_that_does_not_divide_names_the_call():
    @pw.program
    def prog(x):
        return square_b(x)

    with pytest.raises(pw.PlacementError, match=rf"_square at .*test_frontend.py:{call_line(prog, 2)}: "
                                                r"input\[0\] f32\[8,3\] .* dimension 1 of size 3 is split 2 "
                                                r"ways"):
        prog.lower(f32(8, 3))
    bad_out = pw.jit(lambda x: x[:3], slice=slice_a, out_specs=P("data"))
    with pytest.raises(pw.PlacementError, match=r"lambda at .*: output f32\[3\] .* dimension 0 of size 3"):
        bad_out.lower(f32(8))


def test_mismatched_specs_name_the_call():
    two_specs = pw.jit(_tanh, slice=slice_a, in_specs=(P("data"), P()))
    with pytest.raises(pw.PlacementError, match=r"_tanh at .*: in_specs is a tuple of 2, but the arguments are a "
                                                r"tuple of 1: give a pytree prefix of the arguments \(one spec per "
                                                r"argument"):
        two_specs.lower(f32(8))
    too_long = pw.jit(_tanh, slice=slice_a, in_specs=P("data", None))
    with pytest.raises(pw.PlacementError, match=r"input\[0\] f32\[8\] has rank 1 but its spec"):
        too_long.lower(f32(8))
    pair_out = pw.jit(lambda x: (x, x), slice=slice_a, out_specs=(P(),))
    with pytest.raises(pw.PlacementError, match=r"out_specs is a tuple of 1, but the results are a tuple of 2: "
                                                r"give a pytree prefix of the results"):
        pair_out.lower(f32(8))
    with pytest.raises(pw.PlacementError, match=r"must be a PartitionSpec or None, not str"):
        pw.jit(_tanh, slice=slice_a, in_specs="data").lower(f32(8))


def test_value_captured_by_a_placed_function_must_be_sent_to_its_slice():
    @pw.program
    def prog(x):
        y = tanh_a(x)
        return pw.jit(lambda z: z + y, slice=slice_b)(x)

    with pytest.raises(pw.PlacementError) as e:
        prog.lower(f32(8, 16))
    assert str(e.value) == (f"lambda at {__file__}:{call_line(prog, 3)} uses Value(f32[8,16], _tanh#0 "
                            f"result #0 in @prog) without receiving it as an argument: pass it as an "
                            f"argument so that it is sent to slice @b")


def test_a_python_branch_on_a_traced_value_is_refused_not_taken():
    @pw.program
    def prog(x):
        if tanh_a(x):                     # was always taken: an object is true
            return tanh_a(x)
        return x

    with pytest.raises(pw.PlacementError, match=r"Value\(f32\[8,16\], _tanh#0 result #0 in @prog\) has no value "
                                                r"while the program is traced, .* branch on it with pw.cond"):
        prog.lower(f32(8, 16))


def test_a_jax_function_or_transformation_of_a_traced_value_says_where_it_belongs():
    """`jax.vmap` of a placed function, or `jnp.concatenate` of results, in a program's body: the refusal said
    "pass it to a placed function, or return it from the program", which the vmapped code did (found by a
    fault finder); it names JAX's functions and transformations and says to do that work in a placed function."""
    stacked = pw.jit(lambda w, x: jnp.tanh(x @ w), slice=pw.virtual_slice(2, axes="e"))
    for body in (lambda w, x: jax.vmap(stacked)(w, x), lambda w, x: jnp.concatenate([stacked(w, x)] * 2)):
        with pytest.raises(pw.PlacementError, match=r"has no data while the program is traced, so a JAX function or "
                                                    r"transformation \(jnp.\*, jax.vmap, ...\) cannot take it in the "
                                                    r"program's body: do that work inside a placed function"):
            pw.program(body).lower(f32(3, 4, 4), f32(3, 5, 4))


def test_arithmetic_on_a_traced_value_says_where_it_belongs():
    for body in (lambda x: tanh_a(x) + 1, lambda x: 2 * tanh_a(x), lambda x: tanh_a(x)[0]):
        with pytest.raises(pw.PlacementError, match=r"has no data while the program is traced, so it has no "
                                                    r"operator __\w+__: compute it in a placed function \(pw.jit\)"):
            pw.program(body).lower(f32(8, 16))
    # A JAX array's method or property: an AttributeError that says so (was "'Value' object has no attribute").
    for body, name in ((lambda x: tanh_a(x).sum(), "sum"), (lambda x: tanh_a(x).T, "T")):
        with pytest.raises(AttributeError, match=rf"has no data while the program is traced, so it has no "
                                                 rf"attribute '{name}' of a JAX array: compute it in a placed"):
            pw.program(body).lower(f32(8, 16))


def test_values_of_another_trace_are_rejected():
    leaked = []

    @pw.program
    def first(x):
        leaked.append(x)
        return tanh_a(x)

    @pw.program
    def second(x):
        return tanh_a(leaked[0])

    first.lower(f32(8))
    with pytest.raises(pw.PlacementError, match=rf"_tanh at .*:{call_line(second, 2)}: argument\[0\] is "
                                                r"Value\(f32\[8\], argument #0 in @first\), a value of another"):
        second.lower(f32(8))
    with pytest.raises(TypeError, match=r"argument\[0\] is a NumPy array, not a program value"):
        pw.program(lambda x: tanh_a(np.ones(8))).lower(f32(8))
    with pytest.raises(TypeError, match=r"result\[1\] is a float, not a program value"):
        pw.program(lambda x: (x, 1.0)).lower(f32(8))
    with pytest.raises(TypeError, match=r"result\[1\] is a JAX array, not a program value: .*a constant too"):
        pw.program(lambda x: (x, jnp.ones(3))).lower(f32(8))


def test_virtual_slice_checks_its_request():
    with pytest.raises(ValueError, match="1 to 3 positive integers"):
        pw.virtual_slice((2, 2, 2, 2), axes="abcd")
    with pytest.raises(ValueError, match="needs 2 distinct axis names"):
        pw.virtual_slice((2, 2), axes=("x", "x"))
    for axes in (3, None, ["x", 3]):              # was "'int' object is not iterable"
        with pytest.raises(TypeError, match="a slice's axes are a name or a sequence of names, not"):
            pw.virtual_slice(2, axes=axes)
    with pytest.raises(TypeError, match="unknown slice constraint 'color'"):
        pw.virtual_slice(2, axes="x", color="red")
    with pytest.raises(TypeError, match="'min_memory_bytes' must be a int"):
        pw.virtual_slice(2, axes="x", min_memory_bytes=True)
    # None is no constraint (a caller passing its own optional argument on)
    assert pw.virtual_slice(2, axes="x", island=None, device_kind=None).constraints == {}
    assert pw.virtual_slice(2, axes="x", island="island1", same_island=None).constraints == {"island": "island1"}


# -- the exported compiled functions run -------------------------------------

def test_exports_run_like_jax_jit_on_one_device_and_sharded_on_a_mesh():
    lowered = _two_slice_program(8)
    x = jnp.arange(4096 * 16, dtype=jnp.float32).reshape(4096, 16) / 1000
    expected = {"_tanh": jnp.tanh(x), "_square": x * x}
    slices = ops.virtual_slices(lowered.module)
    for op in computes(lowered.module, "chain"):
        blob = ops.attr(ops.executables(lowered.module)[ops.attr(op, "callee")], ops.EXPORT)
        exported = jax.export.deserialize(base64.b64decode(blob))
        # Executables take and return flat leaves: one array in, a tuple of one out.
        assert exported.in_tree == jax.tree_util.tree_structure(((x,), {}))
        with jax.default_device(jax.devices()[0]):
            (result,) = exported.call(x)
            np.testing.assert_allclose(result, expected[ops.attr(op, "callee")])
        # As the runtime will: on a mesh of the slice's shape, with the recorded shardings.
        s = slices[ops.attr(op, "slice")]
        mesh = jax.make_mesh(s.shape, s.axes, devices=jax.devices()[:s.size])
        spec = lambda sharding: NamedSharding(mesh, P(*(axes or None for axes in sharding.dims)))
        (sharded,) = jax.jit(exported.call, in_shardings=[spec(h) for h in ops.in_shardings(op)],
                             out_shardings=spec(ops.out_shardings(op)[0]))(x)
        np.testing.assert_allclose(sharded, expected[ops.attr(op, "callee")])
        assert len(sharded.sharding.device_set) == s.size


def test_saved_ir_is_read_by_pw_opt(tmp_path, capsys):
    from pathways_mlir.cli import pw_opt

    path = tmp_path / "tanh.mlir"
    tanh_a.lower(f32(8, 16)).save(path)
    assert pw_opt.main([str(path), "--pw-verify"]) == 0
    assert '"pw.compute"' in capsys.readouterr().out


def test_input_and_output_shardings_name_where_values_kept_on_the_host_lie():
    """A program that returns an argument as it is, or leaves one unused, keeps it on the host (no slice):
    `compiled.input_shardings` and `output_shardings` raised `KeyError: None` for it (found by differential
    fuzzing). They say where reading it puts it, as the handle's `sharding` does: the default device."""
    s = pw.virtual_slice(2, axes="x")
    double = pw.jit(lambda x: x * 2, slice=s, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def passing(x, y, unused):
        return double(x), y

    x = np.ones((8, 4), np.float32)
    compiled = passing.compiled(x, x, x)
    (on_slice, kept, unused), _ = compiled.input_shardings
    doubled, returned = compiled.output_shardings
    assert on_slice == doubled == NamedSharding(on_slice.mesh, P("x", None))
    out = passing(x, x, x)
    assert kept == unused == returned == out[1].sharding == jnp.asarray(x).sharding
    np.testing.assert_array_equal(np.asarray(out[1]), x)
